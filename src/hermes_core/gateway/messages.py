"""The gateway's view of the channel seam: channels/seam.py declares the messages (re-exported here
for code that imports them from the gateway); `Turn` is the runner's result, the gateway's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..channels.seam import InboundMessage, OutboundMessage, Reply, clean_text, has_surrogate

if TYPE_CHECKING:
    from ..sessions.store import TurnAppend

__all__ = ["InboundMessage", "OutboundMessage", "Reply", "Turn", "clean_text", "has_surrogate"]


@dataclass
class Turn:
    """What a runner returns when its turn leaves session history to store: the replies, and the
    history, which `GatewayStore.complete` stores with the message's done mark, atomically."""

    replies: list[str | Reply]
    history: TurnAppend | None = None
