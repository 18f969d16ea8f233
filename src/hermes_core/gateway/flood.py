"""Per-sender limits at the door: how many messages one person may send a minute, and how many may
wait in one conversation, before new ones are answered with a fixed reply instead of a turn.

Without them one member could send 300 messages and get 300 turns on the operator's model account,
and push everyone else's messages behind theirs. A message over a limit is still stored (its
duplicates are still dropped, and it is answered exactly once), but its answer is the polite
`throttled` reply (kernel/replies.py, zh and en) instead of a model call; `/stop` and scheduled
jobs' fires are never limited. The counts live in the process: with several `serve` nodes each
counts what reaches it. `hermes_messages_throttled_total` counts what was refused, by channel and
limit.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from ..channels.seam import InboundMessage
from .commands import is_stop

WINDOW = 60.0  # seconds of the per-sender rate
KEPT_SENDERS = 10_000  # senders whose recent messages are remembered; the quietest go first


class FloodGate:
    """`take(message, waiting)` → None, or the limit the message is over ("rate" or "queue")."""

    def __init__(
        self, per_minute: int | None, queue: int | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_minute, self.queue, self.clock = per_minute, queue, clock
        self._seen: dict[str, deque[float]] = {}

    def take(self, message: InboundMessage, waiting: int) -> str | None:
        """Count the message against its sender, unless it is over a limit. `waiting`: messages
        already queued in its conversation."""
        if message.kind == "scheduled" or is_stop(message.text):
            return None
        if self.queue is not None and waiting >= self.queue:
            return "queue"
        if self.per_minute is None:
            return None
        now, sender = self.clock(), f"{message.channel}:{message.sender}"
        times = self._seen.pop(sender, deque())
        while times and times[0] <= now - WINDOW:
            times.popleft()
        self._seen[sender] = times  # most recent last: the dict's order is the eviction order
        if len(times) >= self.per_minute:
            return "rate"
        times.append(now)
        if len(self._seen) > KEPT_SENDERS:
            self._seen.pop(next(iter(self._seen)))
        return None

    def give_back(self, message: InboundMessage) -> None:
        """A duplicate after all: its count is returned."""
        times = self._seen.get(f"{message.channel}:{message.sender}")
        if times:
            times.pop()
