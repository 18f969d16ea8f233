"""The turn's fence checked inside a PostgreSQL transaction (tasks/fence.py): the claim still ours.

`hold_claim` reads the current turn's claim row with `FOR SHARE`: the row must still carry this
node and this epoch, or `ClaimLost` is raised and the caller's transaction writes nothing. The lock
is held until the caller commits, so a node taking the conversation over (an UPDATE of that row)
waits for the write to land and then reads it in its journal: a write is either before the
takeover, and seen by it, or refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..tasks.fence import CURRENT_FENCE, ClaimLost

if TYPE_CHECKING:
    from psycopg import AsyncConnection


async def hold_claim(db: AsyncConnection) -> None:
    """Raise `ClaimLost` unless the current turn's claim (if it runs under one) is still its own."""
    fence = CURRENT_FENCE.get()
    if fence is None:
        return
    held = await (
        await db.execute(
            "SELECT 1 FROM turn_claims WHERE conversation = %s AND node = %s AND epoch = %s FOR SHARE",
            (fence.conversation, fence.node, fence.epoch),
        )
    ).fetchone()
    if held is None:
        raise ClaimLost(fence)
