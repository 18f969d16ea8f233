"""`hermes-kernel serve` on the embedded engine: the gateway, its channels, /healthz, /metrics and
the web console on one port.

The gateway and the pieces of its HTTP server are built by gateway/server.py (`build_gateway`, the
safety net, the read deadlines, /metrics, the refusal of an unsigned public webhook: its docstring
says what each does); the console by console/app.py (`mount_console`). This module puts them
together as one process, above both: the gateway never imports the console, which reads it through
gateway/view.py. `engine: temporal` has its own process (engine/temporal/server.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable

from aiohttp import web

from .agent import Agent
from .channels.webhook import MAX_BODY as WEBHOOK_MAX_BODY
from .config import Settings, build_agent
from .console.app import mount_console
from .gateway.deadlines import DeadlineSite, ReadDeadlines
from .gateway.server import (
    KEEPALIVE_TIMEOUT,
    RedactingRunner,
    build_gateway,
    error_middleware,
    log_model,
    metrics_route,
    refuse_open_webhook,
    route_summary,
    site_address,
    to_console,
    watch_model,
    what_is_served,
)

log = logging.getLogger("hermes_core.server")


async def serve(
    settings: Settings,
    *,
    host: str | None = None,
    port: int | None = None,
    ready: Callable[[str], None] | None = None,
    stop: asyncio.Event | None = None,
    agent: Agent | None = None,
    banner: Callable[[str, str], None] | None = None,
) -> None:
    """Run until SIGTERM/SIGINT (or until `stop` is set). Once listening, `ready(address)` and
    `banner(address, routes)` are called; `routes` names only what this process serves."""
    bind = host or settings.gateway.host
    refuse_open_webhook(settings, bind)  # before anything is built or logged: the refusal is one line
    agent = agent or build_agent(settings)
    gateway, routes = build_gateway(settings, agent)
    model_health = watch_model(gateway, settings, agent)

    async def healthz(request: web.Request) -> web.Response:
        counts = await gateway.store.counts()
        # `degraded` (in the status) keeps it 200: a healthcheck must not kill a process that retries
        body = {"ok": gateway.accepting, **gateway.status(), **counts}
        return web.json_response(body, status=200 if gateway.accepting else 503)

    routes = [*routes, web.get("/healthz", healthz)]
    if settings.gateway.metrics:
        routes.append(metrics_route(gateway, settings, bind, os.environ))
    deadlines = ReadDeadlines(settings.gateway.header_timeout, settings.gateway.body_timeout)
    # 1 MiB, the channels' limit and nginx's client_max_body_size (docs/webhook.md)
    middlewares = [error_middleware, deadlines.middleware]  # the safety net outermost
    app = web.Application(client_max_size=WEBHOOK_MAX_BODY, middlewares=middlewares)
    app.add_routes(routes)
    console = mount_console(app, gateway, settings, host=bind, model=agent.model)  # the web console, if on
    app.router.add_get("/", to_console if console is not None else what_is_served)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=KEEPALIVE_TIMEOUT)
    await runner.setup()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or not POSIX
            pass
    try:
        if agent.mcp is not None:  # connected now: a misnamed `confirm` or `levels` entry stops the start
            await agent.mcp.start(agent.registry)
        await gateway.start()
        # Everything loaded so far lives for the whole process: keep it out of the collector's
        # generations, and collect young objects less often, so that full collections (which stop
        # the event loop for tens of ms under load) are rare and short. Measured with bench_gateway.
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)
        site = DeadlineSite(runner, bind, settings.gateway.port if port is None else port, deadlines)
        await site.start()
        address = site_address(site)
        log.info("hermes-kernel serving on %s", address)
        log_model(settings, agent)
        if model_health is not None:  # in the background: start-up does not wait for the endpoint
            model_health.start()
        from .stores import describe

        log.info("state: %s", describe(settings))
        if ready is not None:
            ready(address)
        if banner is not None:
            banner(address, route_summary(app))
        await stop.wait()
        log.info("stopping: finishing in-flight turns (up to %.0fs)", settings.gateway.shutdown_grace)
    finally:
        gateway.accepting = False
        if model_health is not None:
            await model_health.stop()
        await gateway.stop(settings.gateway.shutdown_grace)
        if isinstance(gateway.runner, RedactingRunner):
            await gateway.runner.aclose()
        await runner.cleanup()
        await agent.aclose()
