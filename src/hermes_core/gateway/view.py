"""What the console reads of a gateway: `GatewayView`.

The web console (console/app.py) shows a gateway and acts through it with these members and no
others. Two implement it, structurally: the embedded `Gateway` (dispatcher.py; `build_gateway` in
server.py hands it the stores its turns write) and, with `engine: temporal`, a serve node's
`ConsoleGateway` (engine/temporal/server.py: the shared PostgreSQL stores; the node runs no turns).
What a gateway does not have is a member that answers None or nothing, never a missing attribute:
the console asks no object what it happens to be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..channels.base import Channel
    from ..channels.seam import InboundMessage, OutboundMessage
    from ..kernel.approvals import PendingStore
    from ..kernel.messages import JSON
    from ..kernel.model import TextCallback
    from ..observe.traces import TraceStore
    from ..schedule.jobs import ScheduleStore
    from ..sessions.store import SessionStore
    from .store import GatewayStore

# task id → the callback its running text goes to, or None when nobody is watching that task
TextFor = Callable[[str], "TextCallback | None"]


class GatewayView(Protocol):
    """A gateway as the console sees it: an inbox to hand messages to, the stores it keeps, numbers."""

    # -- the inbox: the console's chat, its decisions' resume messages, its resends

    @property
    def accepting(self) -> bool:
        """False before the start and once stopping: the console then refuses changes (503)."""
        ...

    async def accept(self, message: InboundMessage) -> int | None:
        """Store and queue `message`: its inbox id, or None for a duplicate."""
        ...

    def add_channel(self, channel: Channel) -> None:
        """The console's `web` channel joins the others: its replies are sent through it."""
        ...

    def stream_text(self, text_for: TextFor) -> None:
        """Give each turn's text, as the model writes it, to `text_for(task id)` (the console's chat
        streams it). A gateway that runs no turns itself ignores it."""
        ...

    async def resend(self, outbox_id: int) -> OutboundMessage | None:
        """Dead letter `outbox_id` sent again, under the same uuid; None when there is no such one."""
        ...

    # -- the stores, handed to the gateway where it is built; None: this gateway keeps none

    @property
    def store(self) -> GatewayStore:
        """The inbox and outbox: dead letters (`dead_letters`) and queue depths (`counts`)."""
        ...

    @property
    def traces(self) -> TraceStore | None:
        """Each task's record (the tasks pages, the model's errors); None: no traces are kept."""
        ...

    @property
    def approvals(self) -> PendingStore | None:
        """Approvals waiting for a decision, and decided ones; None: approvals are asked in place
        (a terminal), so none waits here."""
        ...

    @property
    def sessions(self) -> SessionStore | None:
        """The conversations (the chat's earlier messages); None: not read here."""
        ...

    @property
    def schedules(self) -> ScheduleStore | None:
        """The scheduled jobs; None: scheduling is off."""
        ...

    # -- numbers: the status page

    @property
    def turns_done(self) -> int:
        """Turns this process has finished since it started (0 where it runs none)."""
        ...

    @property
    def replies_sent(self) -> int:
        """Replies this process has sent since it started (0 where it sends none)."""
        ...

    def status(self) -> dict[str, Any]:
        """What /healthz says besides the queue depths: turns in flight, messages waiting…"""
        ...

    def lanes(self) -> dict[str, dict[str, int]]:
        """Per conversation, `turns` (messages in its lane) and `replies` (to send); both empty
        where no turns run."""
        ...

    def degraded(self) -> list[dict[str, JSON]]:
        """What does not work yet (a channel, the model's key), as /healthz reports it; empty: all well."""
        ...
