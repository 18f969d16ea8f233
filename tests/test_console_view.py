"""The console reads a gateway only through gateway/view.py (`GatewayView`): an object with those
members and nothing else — no `Gateway`, no runner, no agent — serves every page of the console,
its chat included. The console once probed what it was handed (the gateway's runner, the runner's
memory, the scheduler's store, the agent's approvals), so anything but the embedded gateway or the
Temporal node's stand-ins failed to mount. The embedded `Gateway` and engine/temporal's
`ConsoleGateway` are `GatewayView`s for mypy: server.py and engine/temporal/server.py pass them to
`mount_console`, whose parameter is typed so."""

from __future__ import annotations

import ast
import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from aiohttp import web

import hermes_core
from hermes_core.channels.base import Channel
from hermes_core.channels.seam import InboundMessage, OutboundMessage, task_id_of
from hermes_core.config import GatewayConfig, Settings
from hermes_core.console.app import mount_console
from hermes_core.gateway.schedules import SQLiteScheduleStore
from hermes_core.gateway.store import SQLiteGatewayStore
from hermes_core.kernel.messages import JSON
from hermes_core.kernel.tools.permissions import Caller
from hermes_core.observe.traces import SQLiteTraceStore
from hermes_core.schedule.jobs import Job
from hermes_core.sessions.store import SQLiteSessionStore
from hermes_core.tasks.pending import SQLiteInteractions

if TYPE_CHECKING:
    from hermes_core.gateway.view import TextFor

CONSOLE = Path(hermes_core.__file__).parent / "console"


class BareView:
    """`GatewayView`'s members and nothing more, over SQLite stores in one folder. It runs no
    turns: a chat message it accepts is answered at once, its text streamed first."""

    def __init__(self, folder: Path) -> None:
        database = folder / "gateway.db"
        self.store = SQLiteGatewayStore(database)
        self.traces = SQLiteTraceStore(database)
        self.approvals = SQLiteInteractions(database)
        self.sessions = SQLiteSessionStore(database)
        self.schedules = SQLiteScheduleStore(database)
        self.accepting = True
        self.turns_done, self.replies_sent = 7, 5
        self.accepted: list[InboundMessage] = []
        self.web: Channel | None = None
        self.text_for: TextFor | None = None

    async def accept(self, message: InboundMessage) -> int | None:
        self.accepted.append(message)
        inbound_id = len(self.accepted)
        asyncio.get_running_loop().call_later(
            0.05, lambda: asyncio.create_task(self._answer(message, inbound_id))
        )
        return inbound_id

    async def _answer(self, message: InboundMessage, inbound_id: int) -> None:
        on_text = self.text_for(task_id_of(message)) if self.text_for is not None else None
        if on_text is not None:
            on_text("answered by the view")
            await asyncio.sleep(0.1)  # the page reads the text before the reply
        assert self.web is not None
        await self.web.send(OutboundMessage("web", message.conversation, "answered by the view", "u1",
                                            inbound_id=inbound_id))  # fmt: skip

    def add_channel(self, channel: Channel) -> None:
        self.web = channel

    def stream_text(self, text_for: TextFor) -> None:
        self.text_for = text_for

    async def resend(self, outbox_id: int) -> OutboundMessage | None:
        return await self.store.resend(outbox_id)

    def status(self) -> dict[str, Any]:
        return {"turns_in_flight": 1, "turns_done": self.turns_done, "replies_sent": self.replies_sent}

    def lanes(self) -> dict[str, dict[str, int]]:
        return {"turns": {"web:bare": 1}, "replies": {}}

    def degraded(self) -> list[dict[str, JSON]]:
        return [{"component": "model", "reason": "the view says so"}]


async def dead_letter(store: SQLiteGatewayStore) -> int:
    """A reply given up on: accepted, done, its reply dead-lettered. Its outbox id."""
    inbound = InboundMessage("webhook", "webhook:alice", "alice", "hi", "m1")
    inbound_id = await store.accept(inbound)
    assert inbound_id is not None
    [reply] = await store.complete(inbound_id, [OutboundMessage("webhook", "webhook:alice", "gone", "x1")])
    assert reply.id is not None
    await store.dead_letter(reply.id, "DeliveryError: the bot was removed")
    return reply.id


def trace(task_id: str) -> dict[str, Any]:
    now = time.time()
    return {
        "task_id": task_id, "conversation": "web:bare", "channel": "web", "caller": None, "model": "m",
        "input": "what is 6*7", "history": [], "messages": [], "model_calls": [], "tool_calls": [],
        "approvals": [], "reply": "42", "stop_reason": "completed", "ok": True, "usage": {"total_tokens": 30},
        "timings": {"total": 0.5}, "started_at": now, "finished_at": now + 0.5, "error": None,
    }  # fmt: skip


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, BareView]]:
    """The console mounted on the bare view, served on a free local port: (base URL, view)."""
    view = BareView(tmp_path)
    app = web.Application()
    settings = Settings(gateway=GatewayConfig(data_dir=str(tmp_path)))
    assert mount_console(app, view, settings, host="127.0.0.1", environ={}) is not None
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", view
    finally:
        await runner.cleanup()
        for store in (view.store, view.traces, view.approvals, view.sessions, view.schedules):
            await store.close()


async def fetch(url: str, body: Any = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        method = "GET" if body is None else "POST"
        async with session.request(method, url, json=body, allow_redirects=False) as answer:
            return answer.status, await answer.text()


async def test_a_bare_view_serves_every_page_of_the_console(served: tuple[str, BareView]) -> None:
    url, view = served
    await view.traces.record(trace("web:bare~t1"))
    bob = Caller("bob", channel="web")
    waiting = await view.approvals.approval("web:bare~t1", "c1", "pay", '{"amount": 3}', bob, "web:bare")
    earlier = [
        {"role": "user", "content": "earlier words"},
        {"role": "assistant", "content": "an earlier reply"},
    ]
    await view.sessions.append("web:bare", earlier)
    job = Job(id="nightly", prompt="deploy staging", channel="web", conversation="web:bare", sender="console",
              timezone="UTC", at=time.time() + 3600)  # fmt: skip
    await view.schedules.add(job)
    letter = await dead_letter(view.store)

    pages = {
        "/console/": "<form", "/console/tasks": "web:bare~t1", "/console/tasks/web:bare~t1": "what is 6*7",
        "/console/approvals": waiting.id, "/console/deadletters": "the bot was removed",
        "/console/schedule": "deploy staging", "/console/status": "the view says so",
    }  # fmt: skip
    for path, shown in pages.items():
        status, page = await fetch(url + path)
        assert (status, shown in page) == (200, True), (path, page[:400])

    status, body = await fetch(url + "/console/api/status")
    numbers = json.loads(body)
    assert status == 200 and numbers["gateway"]["turns_done"] == 7 and numbers["approvals_waiting"] == 1
    assert numbers["lanes"] == {"turns": {"web:bare": 1}, "replies": {}} and numbers["model"]["tasks"] == 1
    assert numbers["gateway"]["dead_letters"] == 1 and numbers["degraded"][0]["component"] == "model"
    status, body = await fetch(url + "/console/api/history?conversation=bare")
    assert [m["text"] for m in json.loads(body)["messages"]] == ["earlier words", "an earlier reply"]
    status, body = await fetch(url + "/console/api/schedule")
    assert [job["id"] for job in json.loads(body)["jobs"]] == ["nightly"]
    status, body = await fetch(url + "/console/api/deadletters")
    assert [row["id"] for row in json.loads(body)["dead_letters"]] == [letter]


async def test_a_bare_view_takes_the_consoles_chat_decisions_and_resends(
    served: tuple[str, BareView],
) -> None:
    url, view = served
    status, body = await fetch(url + "/console/api/chat", {"message": "hello", "conversation": "bare"})
    events = [json.loads(line) for line in body.splitlines()]
    assert status == 200 and [e["type"] for e in events] == ["accepted", "text", "reply"], events
    assert events[1]["text"].startswith("answered by") and events[2]["text"] == "answered by the view"
    assert view.accepted[0].text == "hello" and events[0]["task_id"] == task_id_of(view.accepted[0])

    pending = await view.approvals.approval(
        "web:bare~t2", "c1", "pay", "{}", Caller("bob", channel="web"), None
    )
    status, body = await fetch(url + f"/console/api/approvals/{pending.id}", {"decision": "approve"})
    assert (status, json.loads(body)["status"]) == (200, "approved")

    letter = await dead_letter(view.store)
    status, body = await fetch(url + f"/console/api/deadletters/{letter}/resend", {})
    assert (status, json.loads(body)["resent"]) == (200, letter)
    assert await view.store.dead_letters() == []


def test_the_console_asks_no_object_what_it_is() -> None:
    """Attack: a probe creeping back (`hasattr(gateway, …)`, `getattr(runner, "memory", None)`).
    The console's modules call neither; what a gateway may lack is a member answering None."""
    probes = [
        f"{path.name}:{node.lineno} {ast.unparse(node)[:80]}"
        for path in sorted(CONSOLE.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("hasattr", "getattr")
    ]
    assert not probes, probes
