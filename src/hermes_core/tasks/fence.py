"""A turn's fence: the epoch of the claim it runs under, so a node that lost the claim stops.

Where several nodes share one store (postgres/gateway.py), a turn runs under its conversation's
claim, a lease. A node that stops for longer than the lease (paused, swapped out, a long garbage
collection) loses it without knowing: another node takes the conversation up and runs the turn,
and the paused one, when it wakes, would go on where it was — call the tool again, write its
journal over the other's. Lease-based systems answer this with a fencing token: each take of the
claim gets a new number (the epoch), and every durable step carries it and is refused once the
claim has moved on.

Here the token is a `Fence` (conversation, node, epoch), made current for the turn by the store's
`turn_claim` (`CURRENT_FENCE`, a context variable: the turn's tasks inherit it, no signature
widens). The store's journal checks it in the transaction of each write — the model's answer, a
tool's start (before the tool runs), its result, the task's end — and the gateway's `complete`
in the transaction of the done mark; a write under a lost claim raises `ClaimLost`, writes nothing,
and the gateway ends the turn without a reply (the node holding the claim answers).

Without a claim (the embedded gateway, the terminal, a Temporal worker) there is no fence:
`CURRENT_FENCE` is None and nothing is checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class Fence:
    """The claim a turn runs under: its conversation, the node holding it, the epoch it was taken at."""

    conversation: str
    node: str
    epoch: int


class ClaimLost(Exception):
    """The claim a turn ran under was taken by another node: the turn stops, nothing is written."""

    def __init__(self, fence: Fence) -> None:
        super().__init__(
            f"the claim on conversation {fence.conversation} (epoch {fence.epoch}) was taken by "
            "another node while this one was stopped"
        )
        self.fence = fence


CURRENT_FENCE: ContextVar[Fence | None] = ContextVar("hermes_turn_fence", default=None)


@contextmanager
def fenced(fence: Fence) -> Iterator[None]:
    """`fence` is the current turn's, for the code (and the tasks it starts) inside the block."""
    token = CURRENT_FENCE.set(fence)
    try:
        yield
    finally:
        CURRENT_FENCE.reset(token)


__all__ = ["CURRENT_FENCE", "ClaimLost", "Fence", "fenced"]
