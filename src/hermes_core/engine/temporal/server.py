"""`hermes-core serve` with `engine: temporal`: the channels and /healthz, no turns.

A gateway node takes events (webhook, Feishu callbacks or its own Feishu long connection),
verifies them as the embedded gateway does (the same channel code), and hands each to its
conversation's workflow (client.py `TemporalInbox`); `hermes-core worker` nodes run the turns.
The HTTP safety net (400/503, never 500), the read deadlines and the refusal of an unsigned
webhook on a public address are the embedded server's own (gateway/server.py). With `database.url`
every node also fires the scheduled jobs into their workflows (engine/temporal/schedules.py). The
console and /metrics are served by the embedded engine only (docs/scale-out.md).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from ...config import Settings, policy
from ...gateway.deadlines import DeadlineSite, ReadDeadlines
from ...gateway.server import (
    KEEPALIVE_TIMEOUT,
    WEBHOOK_MAX_BODY,
    _address,
    channels_for,
    error_middleware,
    refuse_open_webhook,
    route_summary,
)
from .client import TemporalInbox, connect

if TYPE_CHECKING:
    from ...kernel.tools.permissions import Policy
    from .schedules import TemporalScheduler

log = logging.getLogger("hermes_core.server")


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

    bind = host or settings.gateway.host
    refuse_open_webhook(settings, bind)
    client = await connect(settings.temporal)
    permissions = policy(settings.permissions)
    inbox = TemporalInbox(client, settings.temporal, permissions)
    channels, routes = channels_for(settings, inbox)
    for channel in channels:
        inbox.add_channel(channel)
    scheduler = scheduler_for(settings, inbox, permissions)

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
    runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=KEEPALIVE_TIMEOUT)
    await runner.setup()
    stop = stop or asyncio.Event()
    _on_signals(stop)
    try:
        await inbox.start()
        if scheduler is not None:
            scheduler.start()
        site = DeadlineSite(runner, bind, settings.gateway.port if port is None else port, deadlines)
        await site.start()
        address = _address(site)
        log.info(
            "hermes-core serving on %s (engine: temporal, %s at %s, task queue %s)",
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
        await inbox.stop()
        await runner.cleanup()


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
                                  refusal=role_refusal(permissions))  # fmt: skip
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
    """`hermes-core serve` on this engine, then exit (a refusal or no cluster: one line, 2 or 1)."""
    from ...config import ConfigError
    from .client import Unreachable, leave

    def banner(address: str, routes: str) -> None:
        print(f"hermes-core serving on {address} ({routes})", flush=True)

    try:
        asyncio.run(serve(settings, host=args.host, port=args.port, banner=banner))
    except (ConfigError, Unreachable) as exc:
        print(f"hermes-core: {exc}", file=sys.stderr)
        leave(2 if isinstance(exc, ConfigError) else 1)
    leave(0)
