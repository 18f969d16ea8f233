"""Shared by the gateway tests: serve a gateway's routes on a free local port, and tell when a
gateway has nothing left to do (`idle`) and when its scheduler has looked at the clock the test
moved (`scheduler_looked`)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from hermes_core.agent import Agent
from hermes_core.channels.feishu.api import FeishuAPI
from hermes_core.channels.feishu.channel import FeishuChannel
from hermes_core.channels.feishu.ratelimit import SendLimiter
from hermes_core.config import Settings, build_agent, load_settings
from hermes_core.gateway.dispatcher import Gateway, Runner
from hermes_core.gateway.messages import InboundMessage
from hermes_core.gateway.runner import AgentRunner
from hermes_core.gateway.server import build_gateway, watcher_of
from hermes_core.gateway.store import SQLiteGatewayStore
from hermes_core.server import serve
from hermes_core.testing.fake_feishu import FakeFeishu
from serve_process import IDLE
from waiting import eventually


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


@asynccontextmanager
async def gateway_for(config: Path) -> AsyncIterator[str]:
    """The gateway `hermes-kernel serve` would build from the file `config` (no environment, no
    .env), served on a free local port: its base URL; its runner and agent closed afterwards."""
    settings = load_settings(config, env={}, dotenv=None)
    agent = build_agent(settings)
    gateway, routes = build_gateway(settings, agent)
    try:
        async with serving(gateway, routes) as url:
            yield url
    finally:
        await gateway.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()


@asynccontextmanager
async def serve_here(settings: Settings, agent: Agent | None = None) -> AsyncIterator[str]:
    """The real `serve` (all its parts: deadlines, webhook, console, the model's start-up check) in
    this event loop, on a free local port: its URL; stopped afterwards, and the garbage collector's
    tuning for a long-lived process undone."""
    threshold = gc.get_threshold()
    stop, ready = asyncio.Event(), asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve(settings, host="127.0.0.1", port=0, ready=ready.set_result, stop=stop, agent=agent)
    )
    try:
        await asyncio.wait({server, ready}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            server.result()  # raises what stopped it
        yield ready.result()
    finally:
        stop.set()
        await asyncio.wait({server}, timeout=20)
        gc.unfreeze()
        gc.set_threshold(*threshold)


async def serve_idle(url: str) -> bool:
    """Whether the `serve` at `url` (say, `serve_here`'s) has nothing left to do, by its /healthz:
    `idle`, and nothing pending in its store; asked without blocking the event loop it may run on."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/healthz") as response:
        health = await response.json() if response.status == 200 else {}
    return bool(health) and all(health.get(key) == 0 for key in IDLE)


async def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST `body` as JSON; the status and the parsed JSON answer."""
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.json()


def idle(gateway: Gateway) -> bool:
    """Whether `gateway` has nothing left to do: every message it accepted has had its turn and
    every reply queued is sent or dead-lettered (its lanes are empty). From then on nothing more is
    sent without a new event, so `await eventually(lambda: idle(gateway))` is the moment a test can
    check that nothing else arrived (a duplicate, a second card, a reply to an ignored message)."""
    return gateway.lanes() == {"turns": {}, "replies": {}}


class CountedSleep:
    """A scheduler's sleep that counts its calls: each pass of the scheduler ends in one."""

    def __init__(self, sleep: Callable[[float], Awaitable[Any]]) -> None:
        self.sleep, self.calls = sleep, 0

    async def __call__(self, seconds: float) -> None:
        self.calls += 1
        await self.sleep(seconds)


def look_often(gateway: Gateway) -> None:
    """`gateway`'s scheduler looks at its clock every 20 ms (the test moves the clock) and counts its
    passes, for `scheduler_looked`."""
    scheduler = gateway.scheduler
    assert scheduler is not None
    scheduler.tick = 0.02
    scheduler.sleep = CountedSleep(scheduler.sleep)


async def scheduler_looked(gateway: Gateway) -> None:
    """Until `gateway`'s scheduler has made a whole pass since now — it read the clock as the test
    set it and queued whatever was due — and the gateway is idle: a fire that was due has been run
    and answered by then, so a check that nothing fired can be made. Needs `look_often` first."""
    sleep = gateway.scheduler.sleep if gateway.scheduler is not None else None
    assert isinstance(sleep, CountedSleep), "the scheduler's passes are not counted: look_often(gateway)"
    seen = sleep.calls  # a pass under way may have read the clock before the test moved it: two more
    await eventually(lambda: sleep.calls >= seen + 2 and idle(gateway), what="a whole pass of the scheduler")


class TurnLog:
    """A runner that echoes after `seconds`, recording each turn (conversation, text) and every
    conversation that had two turns running at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ran: list[tuple[str, str]] = []
        self.overlaps: list[str] = []
        self._running: set[str] = set()

    async def __call__(self, message: InboundMessage) -> list[str]:
        if message.conversation in self._running:
            self.overlaps.append(message.conversation)
        self._running.add(message.conversation)
        await asyncio.sleep(self.seconds)  # a turn that takes this long: the behaviour under test
        self.ran.append((message.conversation, message.text))
        self._running.discard(message.conversation)
        return [f"echo: {message.text}"]


async def echo(message: InboundMessage) -> list[str]:
    return [f"echo: {message.text}"]


@asynccontextmanager
async def feishu_gateway(
    tmp_path: Path,
    feishu: FakeFeishu,
    runner: Runner = echo,
    *,
    mode: str = "webhook",
    send_rate: float = 1000.0,
    stream: bool = False,
) -> AsyncIterator[tuple[Gateway, str]]:
    """A gateway with the Feishu channel against `feishu`; with `stream` (and an `AgentRunner`)
    replies stream into cards, wired as serve wires them."""
    store = SQLiteGatewayStore(tmp_path / "gateway.db")
    desk = runner if isinstance(runner, AgentRunner) else None  # an agent's runner takes decisions
    gateway = Gateway(store, runner, desk=desk)
    api = FeishuAPI(
        feishu.app_id, feishu.app_secret, base_url=feishu.base_url,
        limiter=SendLimiter(rate_per_s=send_rate), retry_base_delay=0.05,
    )  # fmt: skip
    channel = FeishuChannel(
        gateway,
        app_id=feishu.app_id,
        app_secret=feishu.app_secret,
        verification_token=feishu.verification_token,
        encrypt_key=feishu.encrypt_key,
        base_url=feishu.base_url,
        mode=mode,  # type: ignore[arg-type]
        api=api,
        stream=stream,
    )
    gateway.add_channel(channel)
    if stream and isinstance(runner, AgentRunner):
        runner.watch_for = lambda message: watcher_of(gateway, message)
    async with serving(gateway, channel.routes()) as url:
        yield gateway, f"{url}/feishu/events"
