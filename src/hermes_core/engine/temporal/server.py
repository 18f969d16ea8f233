"""`hermes-kernel serve` with `engine: temporal`: the channels and /healthz, no turns.

A gateway node takes events (webhook, Feishu callbacks or its own Feishu long connection),
verifies them as the embedded gateway does (the same channel code), and hands each to its
conversation's workflow (client.py `TemporalInbox`); `hermes-kernel worker` nodes run the turns.
The HTTP safety net (400/503, never 500), the read deadlines and the refusal of an unsigned
webhook on a public address are the embedded server's own (gateway/server.py). With `database.url`
(required on this engine) every node also fires the scheduled jobs into their workflows
(engine/temporal/schedules.py).

The console (console/app.py, under /console/ with the embedded engine's access rules: a token, or
this machine only) reads what the workers keep in PostgreSQL (state.py): tasks and their traces,
the approvals list, dead letters. A decision taken there is the workflow's `decide` update
(`TemporalInbox.decide`, as an admin), a Resend hands the reply back to its conversation's
workflow, and the console's chat is answered like the webhook's synchronous requests. GET /metrics
(`gateway.metrics`) is guarded as the embedded one: the counters of this node and the dead letters.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from ...channels.webhook import MAX_BODY as WEBHOOK_MAX_BODY
from ...config import Settings, policy, require_database
from ...gateway.deadlines import DeadlineSite, ReadDeadlines
from ...gateway.server import (
    KEEPALIVE_TIMEOUT,
    channels_for,
    error_middleware,
    metrics_route,
    refuse_open_webhook,
    route_summary,
    site_address,
)
from ...kernel.approvals import DecisionRefused, Pending, PendingStore
from ...kernel.messages import JSON
from ...kernel.tools.permissions import Caller
from ...postgres.database import then_close_pools
from .client import TemporalInbox, connect

if TYPE_CHECKING:
    from ...channels.seam import InboundMessage, OutboundMessage
    from ...gateway.store import GatewayStore
    from ...gateway.view import TextFor
    from ...kernel.tools.permissions import Policy
    from ...observe.metrics import Sample
    from ...schedule.jobs import ScheduleStore
    from ...sessions.store import SessionStore
    from .schedules import TemporalScheduler
    from .state import SharedState

log = logging.getLogger("hermes_core.server")
RESEND_INTERVAL = 2.0  # seconds between looks for resends asked for from another process


async def serve(
    settings: Settings,
    *,
    host: str | None = None,
    port: int | None = None,
    ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    banner: Callable[[str, str], None] | None = None,
) -> None:
    """Run a gateway node until SIGTERM/SIGINT (or `stop`); see the module docstring."""
    from aiohttp import web

    from ...console.app import mount_console
    from ...gateway.server import to_console, what_is_served
    from .state import SharedState

    bind = host or settings.gateway.host
    refuse_open_webhook(settings, bind)
    require_database(settings)
    client = await connect(settings.temporal)
    permissions = policy(settings.permissions)
    state = SharedState.of(settings)
    inbox = TemporalInbox(client, settings.temporal, permissions, stored_reply=state.stored_reply)
    channels, routes = channels_for(settings, inbox)
    for channel in channels:
        inbox.add_channel(channel)
    scheduler = scheduler_for(settings, inbox, permissions)
    gateway = ConsoleGateway(inbox, state, scheduler.store if scheduler is not None else None)

    async def healthz(request: web.Request) -> web.Response:
        body: dict[str, Any] = {
            "ok": inbox.accepting,
            "engine": "temporal",
            "accepted": inbox.accepted,
            "task_queue": settings.temporal.task_queue,
        }
        if scheduler is not None:  # this node's fires: queued (signalled), skipped, refused
            body["scheduled"] = {**scheduler.counts, "resignalled": scheduler.resignalled}
        return web.json_response(body, status=200 if inbox.accepting else 503)

    deadlines = ReadDeadlines(settings.gateway.header_timeout, settings.gateway.body_timeout)
    app = web.Application(
        client_max_size=WEBHOOK_MAX_BODY, middlewares=[error_middleware, deadlines.middleware]
    )
    app.add_routes([*routes, web.get("/healthz", healthz)])
    if settings.gateway.metrics:
        app.add_routes([metrics_route(gateway, settings, bind, os.environ, samples=gateway.samples)])
    console = mount_console(app, gateway, settings, host=bind)
    app.router.add_get("/", to_console if console is not None else what_is_served)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=KEEPALIVE_TIMEOUT)
    await runner.setup()
    stop = stop or asyncio.Event()
    _on_signals(stop)
    resender: asyncio.Task[None] | None = None
    try:
        await inbox.start()
        if scheduler is not None:
            scheduler.start()
        resender = asyncio.create_task(gateway.resend_requested())
        site = DeadlineSite(runner, bind, settings.gateway.port if port is None else port, deadlines)
        await site.start()
        address = site_address(site)
        log.info(
            "hermes-kernel serving on %s (engine: temporal, %s at %s, task queue %s)",
            address,
            settings.temporal.namespace,
            settings.temporal.address,
            settings.temporal.task_queue,
        )
        if ready is not None:
            ready(address)
        if banner is not None:
            banner(address, route_summary(app))
        await stop.wait()
    finally:
        if scheduler is not None:
            await scheduler.stop()
        if resender is not None:
            resender.cancel()
        await inbox.stop()
        await runner.cleanup()
        await state.close()


class ConsoleGateway:
    """What the console reads of a gateway (gateway/view.py `GatewayView`), on this engine: the
    channels are the inbox's; the dead letters, queue depths, traces and approvals the shared
    stores' (state.py), decisions going to the workflows. No turns run here: no text to stream, no
    lanes, no turns done or replies sent; the Status page names the model the settings configure."""

    turns_done = 0  # this node runs no turns; the workers do
    replies_sent = 0
    sessions: SessionStore | None = None  # the chat's earlier messages are not read on this engine

    def __init__(
        self, inbox: TemporalInbox, state: SharedState, schedules: ScheduleStore | None = None
    ) -> None:
        """`schedules`: the jobs this node fires (serve's scheduler), for the console's schedule page."""
        self.inbox, self.state = inbox, state
        self.traces = state.traces
        self.approvals = WorkflowApprovals(state, inbox)
        self.schedules = schedules

    @property
    def accepting(self) -> bool:
        return self.inbox.accepting

    @property
    def store(self) -> GatewayStore:
        return self.state.gateway

    def status(self) -> dict[str, JSON]:
        return {"engine": "temporal", "accepted": self.inbox.accepted}

    def lanes(self) -> dict[str, dict[str, int]]:
        return {"turns": {}, "replies": {}}

    def degraded(self) -> list[dict[str, JSON]]:
        return []

    def stream_text(self, text_for: TextFor) -> None:
        return None  # the workers run the turns: the chat gets each reply when it is sent

    def add_channel(self, channel: Any) -> None:
        self.inbox.add_channel(channel)

    async def accept(self, message: InboundMessage) -> int | None:
        return await self.inbox.accept(message)

    async def resend(self, outbox_id: int) -> OutboundMessage | None:
        """A dead letter back to its conversation's workflow, which sends it again (same uuid)."""
        reply = await self.state.gateway.resend(outbox_id)
        if reply is not None:
            await self._hand_back(reply)
        return reply

    async def _hand_back(self, reply: OutboundMessage) -> None:
        try:
            await self.inbox.resend(reply)
        except Exception as exc:  # Temporal unreachable: it stays a dead letter, nothing lost
            assert reply.id is not None
            await self.state.gateway.dead_letter(reply.id, f"could not be handed back to resend: {exc}")
            raise
        log.info("dead letter %s to %s is sent again", reply.id, reply.conversation)

    async def resend_requested(self, every: float = RESEND_INTERVAL) -> None:
        """Take up the resends asked for through the store (`hermes-kernel deadletters resend`), on
        whichever node claims them first (postgres/gateway.py `claim_resends`)."""
        while True:
            await asyncio.sleep(every)
            try:
                for reply in await self.state.gateway.claim_resends():
                    await self._hand_back(reply)
            except Exception:
                log.exception("picking up dead letters to resend failed")

    async def samples(self) -> list[Sample]:
        """/metrics gauges read when scraped: the dead letters of every node (the shared store)."""
        from ...observe.metrics import Sample

        counts = await self.state.gateway.counts()
        text = "Replies given up on (the dead-letter table)."
        return [Sample("hermes_dead_letters", text, counts.get("dead_letters"))]


class WorkflowApprovals(PendingStore):
    """The approvals list of the shared store (state.py keeps it current); a decision is the
    workflow's `decide` update, which refuses what the embedded store refuses."""

    def __init__(self, state: SharedState, inbox: TemporalInbox) -> None:
        self.store, self.inbox = state.pending, inbox

    async def decide(self, pending_id: str, decider: Caller, approve: bool) -> Pending:
        pending, _ = await self.inbox.decide(pending_id, decider.user_id, decider.channel, approve)
        pending.resume = None  # the workflow goes on by itself: there is no message to run again
        return pending

    async def get(self, pending_id: str) -> Pending | None:
        return await self.store.get(pending_id)

    async def open_for_task(self, task_id: str) -> builtins.list[Pending]:
        return await self.store.open_for_task(task_id)

    async def list(self, status: str | None = "pending", limit: int = 100) -> builtins.list[Pending]:
        return await self.store.list(status, limit)

    async def approval(self, task_id: str, call_id: str, tool: str, arguments: str, caller: Caller | None,
                       conversation: str | None) -> Pending:  # fmt: skip
        raise DecisionRefused("approval_unknown")  # asked by the workflows, never by a gateway node

    async def question(self, task_id: str, call_id: str, question: str, caller: Caller | None,
                       conversation: str | None) -> Pending:  # fmt: skip
        raise DecisionRefused("approval_unknown")

    async def answer(self, conversation: str, sender: str, text: str, *, channel: str) -> Pending | None:
        return None  # the workflow reads the asker's next message itself

    async def expire_due(self, now: float | None = None) -> builtins.list[Pending]:
        return []  # each workflow expires its own

    async def set_resume(self, task_id: str, resume: dict[str, JSON]) -> None:
        return None

    async def close(self) -> None:
        return None


def scheduler_for(settings: Settings, inbox: TemporalInbox, permissions: Policy) -> TemporalScheduler | None:
    """This node's firing loop over the jobs in PostgreSQL (engine/temporal/schedules.py), or None:
    scheduling off, or no database.url (the jobs need a store every node and worker shares)."""
    import time

    from ... import stores

    options = settings.schedule
    if not options.enabled:
        return None
    if stores.database_url(settings) is None:
        log.warning("scheduled jobs with engine temporal live in PostgreSQL (database.url), shared by "
                    "every node and worker: without it schedule is off")  # fmt: skip
        return None
    from ...config import ConfigError
    from ...gateway.schedules import declare_jobs, role_refusal
    from ...postgres.database import driver
    from ...postgres.schedules import PostgresScheduleStore
    from .schedules import TemporalScheduler

    try:
        driver()
    except ImportError as exc:
        raise ConfigError(str(exc)) from None

    store = stores.schedule_store(settings, inbox=False)
    assert isinstance(store, PostgresScheduleStore)
    scheduler = TemporalScheduler(store, inbox, misfire_grace=options.misfire_grace, tick=options.tick,
                                  refusal=role_refusal(permissions),
                                  retention=settings.gateway.retention_days * 86400)  # fmt: skip
    scheduler.declared = lambda: declare_jobs(store, options, permissions, time.time())
    scheduler.owns_store = True
    return scheduler


def _on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or not POSIX
            pass


def run(settings: Settings, args: Any) -> NoReturn:
    """`hermes-kernel serve` on this engine, then exit (a refusal or no cluster: one line, 2 or 1)."""
    from ...config import ConfigError
    from .client import Unreachable, leave

    def banner(address: str, routes: str) -> None:
        print(f"hermes-kernel serving on {address} ({routes})", flush=True)

    try:
        asyncio.run(then_close_pools(serve(settings, host=args.host, port=args.port, banner=banner)))
    except (ConfigError, Unreachable) as exc:
        print(f"hermes-kernel: {exc}", file=sys.stderr)
        leave(2 if isinstance(exc, ConfigError) else 1)
    leave(0)
