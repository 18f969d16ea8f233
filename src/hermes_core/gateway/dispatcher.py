"""The gateway: accepted messages become agent turns, replies go out through the outbox.

One turn in flight per conversation, in arrival order; different conversations run concurrently.
Across processes sharing one PostgreSQL store, the store's `turn_claim` keeps that true (each turn
runs under its conversation's claim, postgres/gateway.py); in one process the lanes do.
A message that arrives while its conversation is busy waits its turn. Replies of one conversation
are sent in order too; a reply that cannot be delivered is retried with backoff and finally kept
in the dead-letter table, never dropped. Only real failures count towards that: while the platform
answers "wait" (rate limited, `DeliveryError.throttled`) the reply waits as long as it is told to,
however long that takes. A dead letter can be sent again (`resend`; from another process through
`store.request_resend`, which the gateway picks up every `resend_interval` seconds).

While the store's database cannot be reached (`StoreUnavailable`, PostgreSQL restarting) a lane
waits and tries its first item again — the turn under its claim, or the send with its same uuid —
instead of failing it: nothing is apologised for or dropped, and the order holds.

Where several processes share the store (PostgreSQL), a node can die mid-turn with no node
restarting and no new message coming for that conversation: every `store.sweep_seconds` (a third of
the claim's lease, jittered) each node looks for pending messages whose conversation has no live
claim and that are not in its own lanes (`store.orphaned_inbound`), and runs them as a restart
would: in their conversation's lane, under `turn_claim` — so a turn is run once however many nodes
sweep at once, or a new message races the sweep — with the attempt counted, the journal replaying
what the dead turn had done (a tool call cut off at level ≥ 1 is not run again: its outcome is
unknown), and a message already run `poison_attempts` times set aside instead, under the claim.
A node that was only paused (not dead) past its lease wakes up to a claim another node holds: its
turn's next durable write — the journal's, `complete` — is refused (`ClaimLost`, tasks/fence.py)
and the turn ends here quietly, no tool run and no reply: the claim's holder answers.

The same goes for replies: each is held by the process that queued it while that process lives
(renewed at every sweep); the replies a dead node queued and did not send are taken by the next
sweep after their hold expired (`store.orphaned_outbound`) and sent in queue order, under the
idempotency key they were queued with. At its start a process on a shared store loads only the
replies no live process holds.

A message its sender took back before its turn started (a Feishu recall: `store.withdraw`) is
not run: `begin_attempt` answers 0 for it, in this process and after a restart.

A message that takes the process down (a tool that kills it, a native crash) would run again at
every start and take it down again. So each run is counted durably before it starts; at start-up,
a message that was run `poison_attempts` times (2) and never finished is set aside — an ERROR log
line, a record the operator can list (store `set_aside_messages`, the `set_aside` count on
/healthz and the console), and a polite reply to its sender — and its conversation goes on with
the next message. A graceful stop that interrupts a turn takes its count back: it was no crash.
The same rule holds under the claim, whichever way a message reaches a lane (`_begin`): a message
whose count, taken as its run begins, shows `poison_attempts` earlier runs that never finished is
set aside then. That is what stops a node restarted within the lease (systemd's 5 s, a 30 s
lease): at its start the crashed process's claim still looks live, so start-up leaves the message
to its lane, which runs it once the claim expires — and a second crash there is the last one.

Acknowledgements come first. Turns share the event loop with the HTTP handlers that acknowledge
platform events, and a loop busy with hundreds of turns' JSON, redaction and bookkeeping makes
every ack wait (Feishu pushes again after 3 s, adding load). So turns start only through
`TurnSlots`: at most `max_turns_in_flight` at once, and fewer while the loop is slow to answer —
the limit shrinks when the loop's lag exceeds `loop_lag_target` and grows back when it is idle
again. A message waiting for a slot stays persisted and in its lane, so order and exactly-once
are as before; the accept path (verify, dedup, durable insert) takes no slot, and its inbox write
overtakes turn writes in the database writer's queue (storage/sqlite.py).

The console reads a gateway through gateway/view.py (`GatewayView`), which `Gateway` implements:
besides its own store and numbers, the stores its turns write (`traces`, `approvals`, `sessions`,
`schedules`), handed to it where it is built, and whoever wants a turn's text as it is written.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ..channels.base import Channel, DeliveryError
from ..channels.seam import InboundMessage, OutboundMessage, Reply, resume_message, task_id_of
from ..kernel.approvals import ApprovalDesk, Pending
from ..kernel.messages import JSON
from ..kernel.redaction import redact_text
from ..kernel.replies import detect_language, fixed_reply
from ..observe.metrics import ACKS, SENDS, THROTTLED, TURN_SECONDS, TURNS
from ..storage import StoreUnavailable
from ..tasks.fence import ClaimLost
from ..tools.secret_handles import hide
from .commands import is_stop
from .flood import FloodGate
from .messages import Turn
from .store import GatewayStore

if TYPE_CHECKING:
    from ..kernel.approvals import PendingStore
    from ..kernel.model import TextCallback
    from ..observe.traces import TraceStore
    from ..schedule.jobs import ScheduleStore
    from ..sessions.store import SessionStore
    from .view import TextFor

log = logging.getLogger("hermes_core.gateway")

T = TypeVar("T")
UNAVAILABLE_BACKOFF = (0.2, 5.0)  # seconds: first and longest wait before a lane tries its item again
DEDUP_RETENTION = 48 * 3600.0  # ≥ 24 h: Feishu retries for about 7 h, redeliveries can come later


class Runner(Protocol):
    """Turns one inbound message into replies (the agent, with the conversation's session).

    Decisions on approvals go to the `desk` the gateway is given (approvals.ApprovalDesk:
    `decide(pending_id, user_id, channel, approve)`, `expire_due()`; gateway/runner.py's runner is
    one): then the gateway runs decided tasks again. Without a desk it takes no decisions.

    A runner whose turn leaves session history returns a `Turn`: the gateway stores the history in
    the transaction that marks the message done and queues its replies (`GatewayStore.complete`)."""

    async def __call__(self, message: InboundMessage) -> list[str | Reply] | Turn: ...


class Background(Protocol):
    """A service that runs beside the gateway's lanes (the scheduler): started last, stopped first."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class Lanes(Generic[T]):
    """Run the items of one key strictly one after another; different keys run concurrently."""

    def __init__(self, handle: Callable[[T], Awaitable[None]]) -> None:
        self._handle = handle
        self._queues: dict[str, deque[T]] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def push(self, key: str, item: T) -> None:
        self._queues.setdefault(key, deque()).append(item)
        if key not in self._tasks:
            self._tasks[key] = asyncio.create_task(self._drain(key), name=f"lane:{key}")

    async def _drain(self, key: str) -> None:
        queue = self._queues[key]
        delay = UNAVAILABLE_BACKOFF[0]
        try:
            while queue:
                try:
                    await self._handle(queue[0])
                except StoreUnavailable as exc:  # the database is back soon: the same item again
                    log.warning("lane %s waits %.1fs for the database: %s", key, delay, exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, UNAVAILABLE_BACKOFF[1])
                    continue
                delay = UNAVAILABLE_BACKOFF[0]
                queue.popleft()
        finally:
            del self._tasks[key]
            if not queue:
                del self._queues[key]

    async def idle(self, key: str) -> None:
        """Returns once the items of `key` queued so far (and any pushed meanwhile) are handled."""
        task = self._tasks.get(key)
        if task is not None:
            await asyncio.wait({task})  # a waiter cancelled here leaves the lane running

    def __contains__(self, key: object) -> bool:
        return key in self._queues

    def depth(self, key: str) -> int:
        """Items of `key` queued, the one being handled included."""
        return len(self._queues.get(key, ()))

    @property
    def busy(self) -> int:
        return len(self._tasks)

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def depths(self) -> dict[str, int]:
        """Items per key, the one being handled included (it leaves its queue when done)."""
        return {key: len(queue) for key, queue in self._queues.items() if queue}

    async def stop(self, grace: float) -> None:
        """Let running items finish for up to `grace` seconds, then cancel (they stay persisted)."""
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._queues.clear()


class TurnSlots:
    """At most `limit` turns at once, first come first served; the limit adapts to the loop's lag.

    A probe sleeps `interval` s and measures how late it wakes: the lag any ready callback, an ack
    among them, now sees. Lag above `lag_target`: the limit drops by a quarter (never below
    `floor`); below half of it: it grows by two (never above `ceiling`), 80 a second at most — a
    faster rise (measured: by an eighth per probe) starts bursts of turns that the next probe sees
    too late. The probe runs only while turns run or wait; an idle gateway starts again from
    `floor`, so a restart with a full inbox does not start everything at once.
    `lag_target` 0 turns adapting off: the limit is `ceiling`.

    Two priorities: interactive turns (a person waits) before batch turns (scheduled jobs). A free
    slot goes to the oldest interactive waiter first, and batch turns together hold at most
    `batch_share` of the limit, so a thousand jobs firing at once leave room for the next person."""

    def __init__(
        self,
        ceiling: int,
        *,
        floor: int = 4,
        lag_target: float = 0.005,
        interval: float = 0.025,
        batch_share: float = 0.75,
    ) -> None:
        self.ceiling, self.floor = ceiling, min(floor, ceiling)
        self.lag_target, self.interval = lag_target, interval
        self.limit = self.floor if lag_target > 0 else ceiling
        self.batch_share = batch_share
        self.in_flight = 0
        self.batch_in_flight = 0
        self.lag = 0.0  # the last probe's, seconds
        self._waiters: deque[asyncio.Future[None]] = deque()  # interactive
        self._batch: deque[asyncio.Future[None]] = deque()  # batch (scheduled jobs)
        self._probe: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters) + len(self._batch)

    def _batch_room(self) -> bool:
        return self.batch_in_flight < max(1, int(self.limit * self.batch_share))

    async def acquire(self, batch: bool = False) -> None:
        if self.lag_target > 0 and self._probe is None:
            self._probe = asyncio.create_task(self._watch(), name="turn-slots-probe")
        free = self.in_flight < self.limit and not self._waiters
        if free and (not batch or (not self._batch and self._batch_room())):
            self._take(batch)
            return
        waiter = asyncio.get_running_loop().create_future()
        queue = self._batch if batch else self._waiters
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted just before the cancel: pass it on
                self.release(batch)
            elif waiter in queue:  # (a cancelled waiter may have been skipped by _grant)
                queue.remove(waiter)
            raise

    def _take(self, batch: bool) -> None:
        self.in_flight += 1
        self.batch_in_flight += batch

    def release(self, batch: bool = False) -> None:
        self.in_flight -= 1
        self.batch_in_flight -= batch
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.in_flight < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._take(False)
                waiter.set_result(None)
        while self._batch and self.in_flight < self.limit and self._batch_room():
            waiter = self._batch.popleft()
            if not waiter.done():
                self._take(True)
                waiter.set_result(None)

    def slot(self, batch: bool = False) -> _Slot:
        """`async with slots.slot(batch):` one turn's slot, at its priority."""
        return _Slot(self, batch)

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.in_flight or self._waiters or self._batch:
                due = loop.time() + self.interval
                await asyncio.sleep(self.interval)
                self.lag = max(0.0, loop.time() - due)
                self._adapt(self.lag)
        finally:
            self._probe = None
            self.limit = self.floor

    def _adapt(self, lag: float) -> None:
        if lag > self.lag_target:
            self.limit = max(self.floor, int(self.limit * 0.75))
        elif lag < self.lag_target / 2 and self.limit < self.ceiling:
            self.limit = min(self.ceiling, self.limit + 2)  # slowly: a jump starts a burst of turns
            self._grant()

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.cancel()


class _Slot:
    def __init__(self, slots: TurnSlots, batch: bool) -> None:
        self.slots, self.batch = slots, batch

    async def __aenter__(self) -> None:
        await self.slots.acquire(self.batch)

    async def __aexit__(self, *exc: object) -> None:
        self.slots.release(self.batch)


class Gateway:
    def __init__(
        self,
        store: GatewayStore,
        runner: Runner,
        *,
        max_turns_in_flight: int = 256,
        min_turns_in_flight: int = 4,
        loop_lag_target: float = 0.005,
        send_attempts: int = 8,
        send_backoff: float = 1.0,
        max_send_backoff: float = 300.0,
        poison_attempts: int = 2,
        desk: ApprovalDesk | None = None,
        flood: FloodGate | None = None,
    ) -> None:
        self.store = store
        self.flood = flood or FloodGate(None, None)  # per-sender limits at the door (gateway/flood.py)
        self._arriving: dict[str, int] = {}  # conversation → messages being stored by `accept`
        self.runner = runner
        self.desk = desk  # who takes approval decisions (kernel/approvals.py); None: this gateway takes none
        self.channels: dict[str, Channel] = {}
        self.send_attempts = send_attempts
        self.send_backoff = send_backoff
        self.max_send_backoff = max_send_backoff
        self.poison_attempts = poison_attempts  # unfinished runs of a message before it is set aside
        self.accepting = False
        self.turns_done = 0
        self.replies_sent = 0
        # Monotonic counts since start, for /metrics: replies dead-lettered, resent, and "wait" answers.
        self.counters: dict[str, int] = {"dead_letters": 0, "dead_letters_resent": 0, "send_waits": 0}
        self.resend_interval = 5.0  # how often resends asked for from another process are picked up
        self._resender: asyncio.Task[None] | None = None
        self.turn_slots = TurnSlots(
            max_turns_in_flight, floor=min_turns_in_flight, lag_target=loop_lag_target
        )
        self._inbound: Lanes[InboundMessage] = Lanes(self._process)
        self._outbound: Lanes[OutboundMessage] = Lanes(self._deliver)
        self._pruner: asyncio.Task[None] | None = None
        self._expirer: asyncio.Task[None] | None = None
        self.pruners: list[Callable[[], Awaitable[None]]] = []  # hourly, with the store's own pruning
        self.expiry_interval = 15.0  # how often undecided approvals are checked for expiry
        # the turn running in each conversation, for /stop: (its message, the runner's task)
        self._running: dict[str, tuple[InboundMessage, asyncio.Task[list[str | Reply] | Turn]]] = {}
        self._stopped: set[int] = set()  # inbox ids of turns a /stop cancelled
        self._sweeper: asyncio.Task[None] | None = None
        self._begun: set[int] = set()  # inbox ids whose run this process counted and has not finished
        self.swept = 0  # messages other processes left unfinished that this one took up
        self.scheduler: Background | None = None  # fires scheduled jobs (gateway/schedules.py)
        # parts besides the channels that report trouble: the model (gateway/model_health.py)
        self.health_reports: list[Callable[[], list[dict[str, JSON]]]] = []
        # what the console reads besides (gateway/view.py): the stores the turns write, set where the
        # gateway is built (server.py `build_gateway`), and who wants a turn's text as it is written
        self.traces: TraceStore | None = None
        self.approvals: PendingStore | None = None
        self.sessions: SessionStore | None = None
        self.schedules: ScheduleStore | None = None
        self._text_for: TextFor | None = None

    def add_channel(self, channel: Channel) -> None:
        self.channels[channel.name] = channel

    def stream_text(self, text_for: TextFor) -> None:
        """Give each turn's text as it is written to `text_for(task id)` (the runner asks `text_for`)."""
        self._text_for = text_for

    def text_for(self, task_id: str) -> TextCallback | None:
        """Where `task_id`'s text goes as the model writes it: None when nobody is watching it."""
        return self._text_for(task_id) if self._text_for is not None else None

    async def start(self) -> None:
        """Resume what a previous process left: unfinished turns first, then unsent replies."""
        for channel in self.channels.values():
            await channel.start()
        shared = bool(getattr(self.store, "sweep_seconds", None))  # other processes share the store
        await self._set_aside_poison(push=shared)  # alone: before the outbox is loaded, sent with it
        await self._claim_resends(push=shared)  # alone: back in the outbox, loaded just below
        # shared: the replies no live process holds (another one's are sent by it, ours are pushed)
        unsent = self.store.orphaned_outbound(time.time()) if shared else self.store.pending_outbound()
        for reply in await unsent:
            self._outbound.push(reply.conversation, reply)
        pending = await self.store.pending_inbound()
        for message in pending:
            self._inbound.push(message.conversation, message)
        if pending:
            log.info("resuming %d unfinished message(s)", len(pending))
        self._pruner = asyncio.create_task(self._prune_periodically())
        self._resender = asyncio.create_task(self._resend_periodically())
        if self.desk is not None:
            self._expirer = asyncio.create_task(self._expire_periodically())
        if getattr(self.store, "sweep_seconds", None):  # other processes share the store
            self._sweeper = asyncio.create_task(self._sweep_periodically())
        self.accepting = True
        if self.scheduler is not None:  # after the inbox is loaded: a fire claimed before a crash is in it
            self.scheduler.start()

    async def accept(self, message: InboundMessage) -> int | None:
        """Persist and schedule a message; None for a duplicate. Returns before the turn runs, so a
        caller may register interest in its replies before any can be sent."""
        if not self.accepting:
            ACKS.inc(channel=message.channel, outcome="refused")
            raise RuntimeError("the gateway is not accepting messages (starting or shutting down)")
        message.received_at = message.received_at or time.time()
        message.text = hide(message.conversation, message.text)  # pasted credentials: handles, from here on
        task_id_of(message)  # stored with the message: a run after a crash finds its own journal
        running = self._stoppable(message)
        if running is not None:  # said before it is stored: its reply says what it stopped
            message.extra["stopping"] = task_id_of(running[0])
        key = message.conversation
        over = self.flood.take(message, self._inbound.depth(key) + self._arriving.get(key, 0))
        if over is not None:  # stored all the same, and answered once: with the fixed reply, no turn
            message.extra["throttled"] = over
        self._arriving[key] = self._arriving.get(key, 0) + 1  # being stored: counts as waiting
        try:
            inbound_id = await self.store.accept(message)
        except BaseException:
            ACKS.inc(channel=message.channel, outcome="error")
            if over is None:
                self.flood.give_back(message)
            raise
        finally:
            self._arriving[key] -= 1
            if not self._arriving[key]:
                del self._arriving[key]
        if inbound_id is None:
            if over is None:
                self.flood.give_back(message)
            ACKS.inc(channel=message.channel, outcome="duplicate")
            log.info("duplicate %s message %s ignored", message.channel, message.message_id)
            return None
        ACKS.inc(channel=message.channel, outcome="accepted")
        if running is not None and not running[1].done():
            assert running[0].id is not None
            self._stopped.add(running[0].id)
            running[1].cancel()
            log.info("/stop from %s: the turn of %s message %s is cancelled", message.sender,
                     running[0].channel, running[0].message_id)  # fmt: skip
        self._inbound.push(message.conversation, message)
        return inbound_id

    async def delivered(self, conversation: str) -> None:
        """Returns once the replies queued in `conversation` are sent or dead-lettered (`Inbox`)."""
        await self._outbound.idle(conversation)

    def enqueue(self, message: InboundMessage) -> None:
        """Queue a message already stored in the inbox by someone else (a scheduled job's fire,
        gateway/schedules.py): it runs in its conversation's lane like an accepted one."""
        if message.id is None:
            raise ValueError("enqueue takes a stored message (with its inbox id)")
        self._inbound.push(message.conversation, message)

    def _stoppable(self, message: InboundMessage) -> tuple[InboundMessage, asyncio.Task[Any]] | None:
        """The running turn a `/stop` message cancels: its conversation's, started by the same person."""
        if message.kind != "text" or not is_stop(message.text):
            return None
        running = self._running.get(message.conversation)
        if running is None or running[1].done():
            return None
        started = running[0]
        same = started.sender == message.sender and started.channel == message.channel
        return running if same else None

    async def stop(self, grace: float = 10.0) -> None:
        """Stop accepting, let in-flight turns and sends finish for up to `grace` s, persist the rest."""
        self.accepting = False
        if self.scheduler is not None:
            await self.scheduler.stop()
        for task in (self._pruner, self._expirer, self._resender, self._sweeper):
            if task is not None:
                task.cancel()
        await self._inbound.stop(grace)
        self.turn_slots.stop()
        await self._outbound.stop(max(0.5, grace / 2))
        for channel in self.channels.values():
            await channel.stop()
        await self.store.close()

    def status(self) -> dict[str, Any]:
        """The numbers /healthz, /metrics and the console show, and what is `degraded`."""
        return {
            "degraded": self.degraded(),
            "conversations_busy": self._inbound.busy,
            "messages_waiting": self._inbound.waiting,
            "turns_in_flight": self.turn_slots.in_flight,
            "turns_waiting_for_slot": self.turn_slots.waiting,
            "turn_limit": self.turn_slots.limit,
            "replies_waiting": self._outbound.waiting,
            "turns_done": self.turns_done,
            "replies_sent": self.replies_sent,
        }

    def degraded(self) -> list[dict[str, JSON]]:
        """What does not work yet: the channels' reports (e.g. Feishu unreachable at start, retrying)
        and `health_reports` (the model refusing the key)."""
        parts: list[dict[str, JSON]] = []
        for channel in self.channels.values():
            report = getattr(channel, "degraded", None)
            if callable(report):
                parts += report()
        for report in self.health_reports:
            parts += report()
        return parts

    def lanes(self) -> dict[str, dict[str, int]]:
        """Per conversation: messages in its lane (the first is the turn in flight), replies to send."""
        return {"turns": self._inbound.depths(), "replies": self._outbound.depths()}

    async def decide(
        self, pending_id: str, user_id: str, channel: str, approve: bool
    ) -> tuple[Pending, int | None]:
        """A person's decision on an approval, and the task run again with it.

        Returns the decided record and the inbox id of the message that resumes its task (None if
        the task cannot be resumed). Raises `DecisionRefused` when this person may not decide, the
        approval expired or was decided already: then nothing runs.
        """
        if self.desk is None:
            raise RuntimeError("this gateway's runner takes no decisions")
        pending = await self.desk.decide(pending_id, user_id, channel, approve)
        log.info("approval %s %s by %s", pending.id, pending.status, user_id)
        message = resume_message(pending)
        return pending, (await self.accept(message) if message is not None else None)

    async def expire_approvals(self) -> list[Pending]:
        """Expire undecided approvals past their time; their tasks resume, the model reads 'expired'."""
        expired = await self.desk.expire_due() if self.desk is not None else []
        for pending in expired:
            log.info("approval %s expired undecided", pending.id)
            message = resume_message(pending)
            if message is not None and self.accepting:
                await self.accept(message)
        return list(expired)

    async def _expire_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.expiry_interval)
            try:
                await self.expire_approvals()
            except Exception:
                log.exception("expiring approvals failed")

    async def _set_aside_poison(self, *, push: bool) -> None:
        """Set aside the messages whose runs took the process down `poison_attempts` times; their
        replies are sent at once with `push`, else with the outbox loaded next."""
        for message, attempts in await self.store.crashed_inbound(self.poison_attempts):
            for reply in await self._set_aside(message, attempts):
                if push:
                    self._outbound.push(reply.conversation, reply)

    async def _set_aside(self, message: InboundMessage, attempts: int) -> list[OutboundMessage]:
        assert message.id is not None
        reason = f"the process stopped during each of its {attempts} runs; not run again"
        reply = reply_for(message, fixed_reply("set_aside", detect_language(message.text)), 0)
        queued = await self.store.set_aside(message.id, reason, [reply])
        if queued:
            log.error("message %s (inbox %s) from %s in %s set aside: %s; its sender was told",
                      message.message_id, message.id, message.sender, message.conversation,
                      reason)  # fmt: skip
        return queued

    async def sweep(self) -> list[InboundMessage]:
        """Take up the messages other processes left unfinished (module docstring): those pending
        for a sweep period whose conversation no process runs and that are not in this one's
        lanes; and the replies a stopped process left unsent (`orphaned_outbound`, which keeps
        this process's own held too). Returns the messages queued."""
        interval = getattr(self.store, "sweep_seconds", None) or 0.0
        found = await self.store.orphaned_inbound(time.time() - interval)
        here = {message.conversation for message, _ in found if message.conversation in self._inbound}
        taken: list[InboundMessage] = []
        for message, _ in found:
            if message.conversation in here:  # this process has it in hand already
                continue
            self._inbound.push(message.conversation, message)  # crashed before? decided under the claim
            taken.append(message)
        if taken:
            self.swept += len(taken)
            log.warning("taking up %d message(s) no node is running (a node stopped mid-turn?): inbox %s",
                        len(taken), ", ".join(str(m.id) for m in taken))  # fmt: skip
        unsent = await self.store.orphaned_outbound(time.time() - interval)  # and renews ours
        for reply in unsent:
            self._outbound.push(reply.conversation, reply)
        if unsent:
            log.warning("sending %d reply(ies) a stopped node left unsent: outbox %s",
                        len(unsent), ", ".join(str(r.id) for r in unsent))  # fmt: skip
        return taken

    async def _sweep_periodically(self) -> None:
        interval = getattr(self.store, "sweep_seconds", None) or 10.0
        while True:
            await asyncio.sleep(interval * random.uniform(0.75, 1.25))  # nodes apart: fewer collisions
            try:
                await self.sweep()
            except StoreUnavailable as exc:  # the next sweep tries again
                log.warning("looking for unfinished messages failed: %s", exc)
            except Exception:
                log.exception("looking for unfinished messages failed")

    async def _process(self, message: InboundMessage) -> None:
        """Run `message`'s turn under the store's claim on its conversation (`turn_claim`: one turn
        in flight across every process sharing the store); an earlier message of the conversation
        that another process left pending runs first. Whether it took processes down before is
        decided under the claim too (`_begin`): no other process runs it meanwhile. A turn whose
        claim another process took over (`ClaimLost`) is that process's to answer; `message`, if it
        was not that turn, waits for the claim again."""
        while True:
            async with self.store.turn_claim(message) as turn:
                if turn is None:  # done already, by another process
                    self._begun.discard(message.id or 0)
                    return
                assert turn.id is not None
                try:
                    await self._run_turn(turn)
                except ClaimLost as lost:  # paused past the lease: the claim's new holder answers
                    self._begun.discard(turn.id)
                    log.warning("inbox %s not answered here: %s", turn.id, lost)
            if turn.id == message.id:
                return

    async def _run_turn(self, message: InboundMessage) -> None:
        assert message.id is not None
        outcome = "replied"
        async with self.turn_slots.slot(batch=message.kind == "scheduled"):  # jobs after people
            started = time.perf_counter()
            over = message.extra.get("throttled")
            if over is not None:  # over a per-sender limit at the door (gateway/flood.py): no turn
                THROTTLED.inc(channel=message.channel, limit=str(over))
                polite = Reply(fixed_reply("throttled", detect_language(message.text)))
                await self._finish(message, [polite], "throttled", started)
                return
            try:
                if not await self._begin(message):
                    return
                run = asyncio.ensure_future(self.runner(message))
                self._running[message.conversation] = (message, run)
                try:
                    texts = await run
                finally:
                    self._running.pop(message.conversation, None)
            except asyncio.CancelledError:
                self._begun.discard(message.id)
                if message.id not in self._stopped:  # a graceful stop, not a crash: the run does not count
                    await asyncio.shield(self.store.release_attempt(message.id))
                    raise
                self._stopped.discard(message.id)  # a person's /stop: the message is answered, done
                stopped = fixed_reply("task_stopped", detect_language(message.text))
                texts, outcome = [Reply(stopped, error="stopped")], "stopped"
            except (StoreUnavailable, ClaimLost):  # not the turn's failure: run later, or elsewhere
                raise
            except Exception:  # the agent loop does not raise; this guards a broken runner or tool host
                log.exception("turn for %s message %s failed", message.channel, message.message_id)
                apology = fixed_reply("internal_error", detect_language(message.text))
                texts = [Reply(apology, error="internal_error")]
                outcome = "failed"
        self._begun.discard(message.id)
        await self._finish(message, texts, outcome, started)

    async def _begin(self, message: InboundMessage) -> bool:
        """Count this run of `message` durably before it starts (a crash from now on counts against
        it); False when it must not run: withdrawn by its sender, or set aside because it was run
        `poison_attempts` times already and never finished — each of those runs took its process
        down, here or on another node, whatever start-up or sweep found it (a run this process
        began and is still alive for, tried again after the database was away, is counted once)."""
        assert message.id is not None
        if message.id in self._begun:
            return True
        runs = await self.store.begin_attempt(message.id)
        if not runs:
            log.info("%s message %s was withdrawn by its sender before its turn: not answered",
                     message.channel, message.message_id)  # fmt: skip
            return False
        if runs > self.poison_attempts:
            await self.store.release_attempt(message.id)  # not run: its count stays the runs it had
            for reply in await self._set_aside(message, runs - 1):
                self._outbound.push(reply.conversation, reply)
            return False
        self._begun.add(message.id)
        return True

    async def _finish(
        self, message: InboundMessage, texts: list[str | Reply] | Turn, outcome: str, started: float
    ) -> None:
        """Store the turn's result with the message's done mark, and queue its replies."""
        assert message.id is not None
        turn = texts if isinstance(texts, Turn) else Turn(list(texts))
        replies = [reply_for(message, text, index) for index, text in enumerate(turn.replies)]
        queued = await self._complete(message.id, replies, turn)
        for reply in queued:
            self._outbound.push(reply.conversation, reply)
        self.turns_done += 1
        TURNS.inc(channel=message.channel, outcome=outcome if queued or not replies else "already_done")
        TURN_SECONDS.observe(time.perf_counter() - started, channel=message.channel)

    async def _complete(
        self, inbound_id: int, replies: list[OutboundMessage], turn: Turn
    ) -> list[OutboundMessage]:
        """Store the finished turn; while the database cannot be reached, wait and try again, so
        the turn's result is kept rather than the turn run again (`complete` is idempotent).

        A try that failed may still have committed (the connection broke during the commit): the
        next try then finds the turn done and queues nothing, yet nobody here has its replies.
        They are read back from the store by their uuids, so they are sent, once, by this lane."""
        delay, failed = UNAVAILABLE_BACKOFF[0], False
        while True:
            try:
                queued = await self.store.complete(inbound_id, replies, turn.history)
                if queued or not failed or not replies:
                    return queued
                first = replies[0]
                earlier = await self.store.replies_of(first.channel, first.message_id or "")
                ours = {reply.uuid for reply in replies}
                return [reply for reply in (earlier.replies if earlier else []) if reply.uuid in ours]
            except StoreUnavailable as exc:
                failed = True
                log.warning(
                    "storing the turn of inbox %s waits %.1fs for the database: %s", inbound_id, delay, exc
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, UNAVAILABLE_BACKOFF[1])

    async def _deliver(self, reply: OutboundMessage) -> None:
        assert reply.id is not None
        channel = self.channels.get(reply.channel)
        while True:
            try:
                if channel is None:
                    raise DeliveryError(f"no channel named {reply.channel!r} is configured", permanent=True)
                platform_id = await channel.send(reply)
                await self.store.mark_sent(reply.id, platform_id)
                self.replies_sent += 1
                SENDS.inc(channel=reply.channel, outcome="sent")
                return
            except Exception as exc:
                delay = await self._failed_attempt(reply, exc)
                if delay is None:
                    return
                await asyncio.sleep(delay)

    async def _failed_attempt(self, reply: OutboundMessage, exc: Exception) -> float | None:
        """Record a failed send; the delay before the next try, or None once it is dead-lettered.

        A "wait" from the platform (`DeliveryError.throttled`) is not a failure: no attempt is
        counted, and the reply tries again when the platform said it may."""
        assert reply.id is not None
        error = _one_line(f"{type(exc).__name__}: {exc}")
        hint = exc.retry_after if isinstance(exc, DeliveryError) else None
        if isinstance(exc, DeliveryError) and exc.throttled:
            self.counters["send_waits"] += 1
            SENDS.inc(channel=reply.channel, outcome="wait")  # the platform said wait: not a failure
            delay = min(hint if hint is not None else self.send_backoff, self.max_send_backoff)
            log.warning("reply %s to %s: the platform asks to wait (%s); trying again in %.1fs, "
                        "not counted as a failure", reply.id, reply.conversation, error, delay)  # fmt: skip
            return delay
        reply.attempts += 1
        await self.store.record_attempt(reply.id, error)
        permanent = isinstance(exc, DeliveryError) and exc.permanent
        dead = permanent or reply.attempts >= self.send_attempts
        SENDS.inc(channel=reply.channel, outcome="dead" if dead else "retry")
        if dead:
            await self.store.dead_letter(reply.id, error)
            self.counters["dead_letters"] += 1
            log.error("reply %s to %s dead-lettered after %d failed attempt(s): %s",
                      reply.id, reply.conversation, reply.attempts, error)  # fmt: skip
            return None
        delay = hint if hint is not None else self.send_backoff * 2 ** (reply.attempts - 1)
        log.warning("reply %s to %s failed (%s); retry in %.1fs", reply.id, reply.conversation, error, delay)
        return min(delay, self.max_send_backoff)

    async def resend(self, outbox_id: int) -> OutboundMessage | None:
        """Send dead letter `outbox_id` again, from the start (same uuid: never sent twice if an
        earlier try did reach the platform). None when there is no such dead letter."""
        reply = await self.store.resend(outbox_id)
        if reply is not None:
            self._requeue(reply)
        return reply

    async def _claim_resends(self, *, push: bool = True) -> None:
        """Take up the resends asked for through the store (by `hermes-kernel deadletters resend`)."""
        for reply in await self.store.claim_resends():
            if push:
                self._requeue(reply)
            else:
                log.info("dead letter %s back in the outbox", reply.id)

    def _requeue(self, reply: OutboundMessage) -> None:
        self.counters["dead_letters_resent"] += 1
        log.info("dead letter %s to %s is sent again", reply.id, reply.conversation)
        self._outbound.push(reply.conversation, reply)

    async def _resend_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.resend_interval)
            try:
                await self._claim_resends()
            except Exception:
                log.exception("picking up dead letters to resend failed")

    async def prune(self) -> None:
        """Forget old dedup keys and finished rows, then run the other `pruners` (journal, traces)."""
        for prune in [lambda: self.store.prune(time.time() - DEDUP_RETENTION), *self.pruners]:
            try:
                await prune()
            except Exception:
                log.exception("pruning old records failed")

    async def _prune_periodically(self) -> None:
        while True:
            await self.prune()
            await asyncio.sleep(3600)


def _one_line(text: str, limit: int = 2000) -> str:
    """An error as logged and stored: redacted, on one line, cut."""
    return " ".join(redact_text(text).split())[:limit]


def reply_for(message: InboundMessage, reply: str | Reply, index: int) -> OutboundMessage:
    """The outbound message for reply `index` of `message`, with its idempotency key (of its task:
    two users' messages with the same client-chosen id must not share one)."""
    key = f"{task_id_of(message)}|{message.message_id}|{index}".encode()
    reply = reply if isinstance(reply, Reply) else Reply(reply)
    outbound = OutboundMessage(
        channel=message.channel,
        conversation=message.conversation,
        text=reply.text,
        approval=reply.approval,
        uuid=hashlib.sha256(key).hexdigest()[:40],
        chat_id=message.chat_id,
        reply_to=message.reply_to,
        thread_id=message.thread_id,
        callback_url=message.callback_url,
        inbound_id=message.id,
        index=index,
        message_id=message.message_id,
        error=reply.error,
    )
    return outbound if reply.to is None else posted_elsewhere(outbound, reply.to)


def posted_elsewhere(outbound: OutboundMessage, to: str) -> OutboundMessage:
    """A reply addressed to `to` on its channel (gateway/outgoing.py): a Feishu chat or user gets it
    in its own conversation, a webhook as a callback, the console (no other chats) marked."""
    if outbound.channel == "feishu":
        return dataclasses.replace(outbound, conversation=f"feishu:{to}", chat_id=to, reply_to=None)
    if outbound.channel == "webhook":
        return dataclasses.replace(outbound, callback_url=to, reply_to=None)
    return dataclasses.replace(outbound, text=f"→ {to}: {outbound.text}")
