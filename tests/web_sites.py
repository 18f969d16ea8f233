"""Local web sites for the web tools' tests: aiohttp servers on 127.0.0.1 that count their hits,
a DNS stand-in the fetcher takes instead of the system resolver, and a registry runner that shows
what the model would read."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from hermes_core.kernel.messages import ToolCall
from hermes_core.tools import Tool, ToolRegistry

Handler = Callable[[web.Request], Any]


class Site:
    """A running local server: its base URL, port and how often each path was asked for."""

    def __init__(self, port: int, hits: Counter[str], seen: list[web.Request]) -> None:
        self.port, self.hits, self.seen = port, hits, seen
        self.url = f"http://127.0.0.1:{port}"


@asynccontextmanager
async def local_site(routes: Mapping[str, Handler], *, ssl_context: Any = None) -> AsyncIterator[Site]:
    """Serve `routes` (path → handler) on 127.0.0.1 until the block ends."""
    hits: Counter[str] = Counter()
    seen: list[web.Request] = []

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> Any:
        hits[request.path] += 1
        seen.append(request)
        return await handler(request)

    app = web.Application(middlewares=[count])
    for path, handler in routes.items():
        app.router.add_route("*", path, handler)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Site(port, hits, seen)
    finally:
        await runner.cleanup()


def fake_dns(table: Mapping[str, list[str]]) -> Callable[[str], Any]:
    """A resolver answering from `table` as DNS would (a name it lacks does not exist); it counts
    its calls in `.calls`."""
    calls: list[str] = []

    async def resolve(host: str) -> list[str]:
        calls.append(host)
        name = host.rstrip(".").lower()
        if name not in table:
            raise OSError(f"[Errno -2] Name or service not known: {host}")
        return list(table[name])

    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


async def run_tool(tool: Tool, **arguments: Any) -> tuple[bool, Any]:
    """Run `tool` as the agent does (ToolRegistry.execute): (ok, what the model reads, parsed)."""
    outcome = await ToolRegistry([tool]).execute(
        ToolCall(id="c1", name=tool.name, arguments=json.dumps(arguments)), timeout=60, max_chars=100_000
    )
    assert outcome.error in (None, "tool_error"), outcome.content  # never an exception or a timeout
    try:
        return outcome.ok, json.loads(outcome.content)
    except ValueError:
        return outcome.ok, outcome.content
