"""Shared by the gateway tests: serve a gateway's routes on a free local port, and wait for a condition."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from hermes_core.gateway.dispatcher import Gateway


@asynccontextmanager
async def serving(gateway: Gateway, routes: list[web.RouteDef]) -> AsyncIterator[str]:
    """Start the gateway and an HTTP server with `routes`; yields its base URL; stops both."""
    app = web.Application()
    app.add_routes(routes)
    site_runner = web.AppRunner(app, access_log=None)
    await site_runner.setup()
    site = web.TCPSite(site_runner, "127.0.0.1", 0)
    await gateway.start()
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await gateway.stop(grace=2)
        await site_runner.cleanup()


async def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
