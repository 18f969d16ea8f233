"""`hermes-core serve` with `engine: temporal`: the channels and /healthz, no turns.

A gateway node takes events (webhook, Feishu callbacks or its own Feishu long connection),
verifies them as the embedded gateway does (the same channel code), and hands each to its
conversation's workflow (client.py `TemporalInbox`); `hermes-core worker` nodes run the turns.
The HTTP safety net (400/503, never 500), the read deadlines and the refusal of an unsigned
webhook on a public address are the embedded server's own (gateway/server.py). The console and
/metrics are served by the embedded engine only (docs/scale-out.md).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn

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
    inbox = TemporalInbox(client, settings.temporal, policy(settings.permissions))
    channels, routes = channels_for(settings, inbox)
    for channel in channels:
        inbox.add_channel(channel)

    async def healthz(request: web.Request) -> web.Response:
        body = {
            "ok": inbox.accepting,
            "engine": "temporal",
            "accepted": inbox.accepted,
            "task_queue": settings.temporal.task_queue,
        }
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
        await inbox.stop()
        await runner.cleanup()


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
