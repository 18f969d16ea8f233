"""The web console over plain HTTP: who may open it, chat through the `web` channel with streamed
text, approvals decided by an admin, the status numbers, and pages that never run or show what
they should not (escaping, redaction). The browser tests are in test_console_browser.py."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hermes_core import Agent
from hermes_core.config import ConfigError, ConsoleConfig, GatewayConfig, Settings, WebhookConfig
from hermes_core.console.access import is_loopback
from hermes_core.console.channel import TextStreams
from hermes_core.kernel.redaction import Redactor, default_redactor
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.observe.traces import SQLiteTraceStore, Tracer
from hermes_core.server import serve
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from invoicing import RAN, send_invoice
from serve_process import clean_environ
from waiting import eventually

TOKEN = "console-token-4f9a1c77"
SECRET = "s3cr3t-Value-9QxZ41kP"  # the value of a secret variable: redacted wherever it shows up


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    RAN.clear()
    monkeypatch.delenv("HERMES_CONSOLE_TOKEN", raising=False)


@asynccontextmanager
async def console(
    tmp_path: Path,
    agent: Agent | None,
    *,
    host: str = "127.0.0.1",
    config: ConsoleConfig | None = None,
    **sections: Any,
) -> AsyncIterator[str]:
    """`serve` in this event loop (the real mounting path) on a free port; yields its base URL.
    `sections`: more of the settings (`model=ModelSettings(…)`); without `agent`, serve builds it."""
    settings = Settings(
        gateway=GatewayConfig(data_dir=str(tmp_path)), console=config or ConsoleConfig(),
        webhook=WebhookConfig(allow_unsigned=host != "127.0.0.1"),  # its own rules: test_security_webhook.py
        **sections,
    )  # fmt: skip
    threshold = gc.get_threshold()  # serve tunes the collector for a long-lived process: undo that
    stop, ready = asyncio.Event(), asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve(settings, host=host, port=0, ready=ready.set_result, stop=stop, agent=agent)
    )
    try:
        await asyncio.wait({server, ready}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            server.result()  # raises what stopped it
        yield ready.result().replace("0.0.0.0", "127.0.0.1")
    finally:
        stop.set()
        await asyncio.wait({server}, timeout=20)
        gc.unfreeze()
        gc.set_threshold(*threshold)


async def fetch(
    url: str, *, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None, **options: Any
) -> tuple[int, str, Any]:
    async with aiohttp.ClientSession(**options) as session:
        async with session.request(method, url, json=body, headers=headers, allow_redirects=False) as answer:
            return answer.status, await answer.text(), answer.headers


def events(body: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in body.splitlines() if line.strip()]


def traced(agent: Agent, tmp_path: Path) -> SQLiteTraceStore:
    """Give the agent a tracer over a real trace store (serve keeps a tracer it is given)."""
    store = SQLiteTraceStore(tmp_path / "gateway.db")
    agent.tracer = Tracer(store)  # type: ignore[attr-defined]
    return store


def trace_record(task_id: str, **fields: Any) -> dict[str, Any]:
    now = time.time()
    record = {
        "task_id": task_id,
        "conversation": "webhook:u1",
        "channel": "webhook",
        "caller": None,
        "input": "what is 6*7",
        "history": [],
        "messages": [],
        "model_calls": [
            {
                "turn": 1,
                "started_at": now,
                "elapsed": 0.2,
                "request_messages_count": 2,
                "response": {
                    "content": None,
                    "tool_calls": [{"id": "c1", "name": "calculator", "arguments": '{"expression": "6*7"}'}],
                    "usage": {"total_tokens": 30},
                    "model": "m",
                    "finish_reason": "tool_calls",
                },
                "error": None,
            },
            {
                "turn": 2,
                "started_at": now + 0.3,
                "elapsed": 0.1,
                "request_messages_count": 4,
                "response": {
                    "content": "42",
                    "tool_calls": [],
                    "usage": {"total_tokens": 40},
                    "model": "m",
                    "finish_reason": "stop",
                },
                "error": None,
            },
        ],
        "tool_calls": [
            {
                "turn": 1,
                "id": "c1",
                "name": "calculator",
                "arguments": '{"expression": "6*7"}',
                "result": "42",
                "ok": True,
                "error": None,
                "elapsed": 0.05,
                "started_at": now + 0.2,
            }
        ],
        "approvals": [],
        "reply": "42",
        "stop_reason": "completed",
        "ok": True,
        "usage": {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70},
        "timings": {},
        "started_at": now,
        "finished_at": now + 0.5,
        "error": None,
    }
    record.update(fields)
    return record


# -- access -------------------------------------------------------------------------------------


def test_loopback_addresses() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.0.1.1", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.0.0.5", "example.org", ""]))


async def test_on_loopback_without_a_token_only_local_requests_by_a_local_name_are_answered(
    tmp_path: Path,
) -> None:
    async with console(tmp_path, Agent(model=ScriptedModel([]))) as url:
        status, page, headers = await fetch(f"{url}/console/")
        assert status == 200 and 'id="chat"' in page
        assert "script-src 'self'" in headers["Content-Security-Policy"]
        assert (await fetch(f"{url}/console"))[0] == 302
        rebound = await fetch(f"{url}/console/status", headers={"Host": "attacker.example:80"})
        assert rebound[0] == 403 and "HERMES_CONSOLE_TOKEN" in rebound[1]
        proxied = await fetch(f"{url}/console/api/status", headers={"X-Forwarded-For": "203.0.113.9"})
        assert proxied[0] == 403 and json.loads(proxied[1])["error"]
        assert (await fetch(f"{url}/healthz"))[0] == 200  # the rest of the server is not the console's


async def test_exposed_console_requires_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_CONSOLE_TOKEN", TOKEN)
    async with console(tmp_path, Agent(model=ScriptedModel([])), host="0.0.0.0") as url:
        status, page, _ = await fetch(f"{url}/console/status")
        assert status == 401 and 'name="token"' in page and TOKEN not in page
        assert (await fetch(f"{url}/console/api/status"))[0] == 401
        wrong = {"Authorization": "Bearer not-the-token"}
        assert (await fetch(f"{url}/console/api/status", headers=wrong))[0] == 401
        right = {"Authorization": f"Bearer {TOKEN}"}
        status, body, _ = await fetch(f"{url}/console/api/status", headers=right)
        assert status == 200 and json.loads(body)["gateway"]["ok"] is True

        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            async with browser.post(f"{url}/console/login", data={"token": "guess"}) as answer:
                assert answer.status == 401 and "Wrong token" in await answer.text()
            async with browser.get(f"{url}/console/tasks") as answer:
                assert answer.status == 401
            async with browser.post(
                f"{url}/console/login", data={"token": TOKEN}, allow_redirects=False
            ) as answer:
                assert answer.status == 303
                cookie = answer.cookies["hermes_console"]
                assert cookie.value != TOKEN and cookie["httponly"] and cookie["samesite"] == "Strict"
            async with browser.get(f"{url}/console/tasks") as answer:
                assert answer.status == 200 and TOKEN not in await answer.text()


async def test_a_non_loopback_console_without_a_token_is_off_or_refused(tmp_path: Path) -> None:
    async with console(tmp_path / "a", Agent(model=ScriptedModel([])), host="0.0.0.0") as url:
        assert (await fetch(f"{url}/console/"))[0] == 404  # off by default beyond localhost
        assert (await fetch(f"{url}/healthz"))[0] == 200
    with pytest.raises(ConfigError, match="HERMES_CONSOLE_TOKEN"):
        async with console(
            tmp_path / "b", Agent(model=ScriptedModel([])), host="0.0.0.0", config=ConsoleConfig(enabled=True)
        ):
            pass
    async with console(
        tmp_path / "c", Agent(model=ScriptedModel([])), config=ConsoleConfig(enabled=False)
    ) as url:
        assert (await fetch(f"{url}/console/"))[0] == 404


async def test_changes_only_from_the_consoles_own_pages(tmp_path: Path) -> None:
    model = ScriptedModel([reply("never")])
    async with console(tmp_path, Agent(model=model)) as url:
        async with aiohttp.ClientSession() as session:
            form = await session.post(f"{url}/console/api/chat", data={"message": "hi there"})
            assert form.status == 403
            foreign = await session.post(
                f"{url}/console/api/chat",
                json={"message": "hi there"},
                headers={"Origin": "http://attacker.example"},
            )
            assert foreign.status == 403
    assert model.calls == []


# -- chat ---------------------------------------------------------------------------------------


async def test_chat_runs_through_the_gateway_and_streams_the_text(tmp_path: Path) -> None:
    long_reply = "The answer, as the model writes it piece by piece: " + "forty-two " * 20
    async with FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(long_reply.strip(), chunk_delay=0.005))
        agent = Agent(model="fake-model", base_url=fake.base_url)
        async with console(tmp_path, agent) as url:
            status, body, headers = await fetch(
                f"{url}/console/api/chat",
                method="POST",
                body={"message": "Tell me the answer", "conversation": "t1"},
            )
            _, health, _ = await fetch(f"{url}/healthz")
        assert fake.requests[0].body is not None and fake.requests[0].body.get("stream") is True
    assert status == 200 and headers["Content-Type"].startswith("application/x-ndjson")
    seen = events(body)
    assert seen[0]["type"] == "accepted" and seen[0]["task_id"].startswith("web:")
    assert seen[0]["trace"] == "/console/tasks/" + seen[0]["task_id"].replace(":", "%3A")
    texts = [e["text"] for e in seen if e["type"] == "text"]
    assert texts and all(long_reply.startswith(text) for text in texts)
    assert all(text.endswith(" ") for text in texts)  # its last word waits: it may still become a secret
    assert seen[-1] == {"type": "reply", "text": long_reply.strip(), "approval": None}
    assert json.loads(health)["replies_sent"] == 1  # the web channel's send, through the outbox


async def test_chat_input_is_checked(tmp_path: Path) -> None:
    async with console(tmp_path, Agent(model=ScriptedModel([]))) as url:
        for body in ({"message": ""}, {"message": "x" * 20_001}, {"message": "hi", "conversation": "../x"}):
            status, text, _ = await fetch(f"{url}/console/api/chat", method="POST", body=body)
            assert status == 400 and "error" in json.loads(text)


def test_streamed_text_never_shows_a_secret_split_across_pieces() -> None:
    redactor = Redactor([SECRET])
    streams = TextStreams(redactor)
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    streams.open("web:1", queue)
    on_text = streams.on_text("web:1")
    assert on_text is not None and streams.on_text("web:2") is None
    text = "x" * 80 + f" the key is {SECRET} " + "y" * 100
    for start in range(0, len(text), 5):
        on_text(text[start : start + 5])
    shown = [queue.get_nowait()["text"] for _ in range(queue.qsize())]
    assert shown and not any(SECRET[:6] in piece for piece in shown)
    assert "[REDACTED]" in shown[-1]


def test_a_short_chinese_reply_streams_before_the_turn_ends() -> None:
    """Issue 29: the console held back the last 64 characters, so a short reply (most short Chinese
    answers) was never streamed; now only a last word that could still be a secret waits."""
    streams = TextStreams(Redactor([SECRET]))
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    streams.open("web:1", queue)
    on_text = streams.on_text("web:1")
    assert on_text is not None
    for piece in ("好的，", "已经为你", "记下了。"):
        on_text(piece)
    shown = [queue.get_nowait()["text"] for _ in range(queue.qsize())]
    assert shown == ["好的，", "好的，已经为你", "好的，已经为你记下了。"]


# -- approvals ----------------------------------------------------------------------------------


def invoice_agent(*extra: Any) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(
        [call("send_invoice", {"customer": "ACME", "amount": 120}), reply("Invoice sent."), *extra]
    )
    return Agent(
        model=model, tools=[send_invoice], permissions=Policy.from_lists(admins=["webhook:boss"])
    ), model


async def test_an_admin_decides_in_the_console_a_call_asked_on_another_channel(tmp_path: Path) -> None:
    agent, model = invoice_agent()
    async with console(tmp_path, agent) as url:
        _, asked, _ = await fetch(
            f"{url}/webhook", method="POST", body={"message": "invoice", "user_id": "alice"}
        )
        approval = json.loads(asked)["approval"]
        status, page, _ = await fetch(f"{url}/console/approvals")
        assert status == 200 and approval["id"] in page and "send_invoice" in page and "ACME" in page
        _, numbers, _ = await fetch(f"{url}/console/api/status")
        assert json.loads(numbers)["approvals_waiting"] == 1

        decide = f"{url}/console/api/approvals/{approval['id']}"
        assert (await fetch(decide, method="POST", body={"decision": "maybe"}))[0] == 400
        status, body, _ = await fetch(decide, method="POST", body={"decision": "approve"})
        decided = json.loads(body)
        assert status == 200 and decided["status"] == "approved" and decided["task_id"].startswith("webhook:")
        # the task resumes on its own channel (the webhook's): no one waits here
        await eventually(lambda: len(model.calls) == 2, what="the resumed task's model call")
        assert RAN == ["invoice ACME 120"]
        again = await fetch(decide, method="POST", body={"decision": "reject"})
        assert again[0] == 409 and json.loads(again[1])["error"] == "approval_already_decided"
        assert (
            await fetch(f"{url}/console/api/approvals/ap_none", method="POST", body={"decision": "approve"})
        )[0] == 404
        _, page, _ = await fetch(f"{url}/console/approvals")
        assert "approved by console" in page


async def test_a_chat_that_pauses_for_approval_streams_the_resumed_reply(tmp_path: Path) -> None:
    agent, _ = invoice_agent()
    async with console(tmp_path, agent) as url:
        _, body, _ = await fetch(f"{url}/console/api/chat", method="POST", body={"message": "invoice ACME"})
        approval = events(body)[-1]["approval"]
        assert approval["tool"] == "send_invoice" and approval["requested_by"] == "console" and RAN == []
        status, body, _ = await fetch(
            f"{url}/console/api/approvals/{approval['id']}",
            method="POST",
            body={"decision": "approve", "stream": True},
        )
    resumed = events(body)
    assert resumed[0]["type"] == "accepted" and resumed[0]["status"] == "approved"
    assert resumed[-1]["type"] == "reply" and resumed[-1]["text"] == "Invoice sent."
    assert RAN == ["invoice ACME 120"]


# -- tasks and status ---------------------------------------------------------------------------


async def test_timeline_shows_each_turn_and_tool_call_with_arguments_and_filters(tmp_path: Path) -> None:
    agent = Agent(model=ScriptedModel([]))
    store = traced(agent, tmp_path)
    await store.record(trace_record("webhook:ok1"))
    failing = {
        "turn": 1,
        "started_at": time.time(),
        "elapsed": 1.0,
        "request_messages_count": 2,
        "response": None,
        "error": "ModelUnavailable: 503",
    }
    await store.record(
        trace_record(
            "webhook:bad1",
            ok=False,
            stop_reason="model_unavailable",
            reply="sorry",
            model_calls=[failing],
            tool_calls=[],
        )
    )
    async with console(tmp_path, agent) as url:
        _, listing, _ = await fetch(f"{url}/console/tasks")
        assert "webhook:ok1" in listing and "webhook:bad1" in listing
        _, failed, _ = await fetch(f"{url}/console/tasks?failed=1")
        assert "webhook:bad1" in failed and "webhook:ok1" not in failed
        _, by_tool, _ = await fetch(f"{url}/console/tasks?tool=calculator")
        assert "webhook:ok1" in by_tool and "webhook:bad1" not in by_tool

        status, page, _ = await fetch(f"{url}/console/tasks/webhook%3Aok1")
        assert status == 200 and 'class="tool-name">calculator<' in page
        assert "&quot;expression&quot;: &quot;6*7&quot;" in page  # the arguments, pretty-printed
        assert page.count("<rect ") == 3 and "70 tokens" in page
        _, bad, _ = await fetch(f"{url}/console/tasks/webhook%3Abad1")
        assert "ModelUnavailable: 503" in bad and "model_unavailable" in bad
        status, raw, _ = await fetch(f"{url}/console/api/tasks/webhook%3Aok1")
        assert status == 200 and json.loads(raw)["tool_calls"][0]["name"] == "calculator"
        assert (await fetch(f"{url}/console/tasks/webhook%3Anone"))[0] == 404

        _, numbers, _ = await fetch(f"{url}/console/api/status")
    model = json.loads(numbers)["model"]
    assert model["tasks"] == 2 and model["model_calls"] == 3 and model["model_errors"] == 1
    assert model["stop_reasons"] == {"completed": 1, "model_unavailable": 1}


async def test_status_shows_turns_in_flight_per_conversation(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def slow(messages: Any, tools: Any) -> Any:
        await release.wait()
        return reply("done")

    agent = Agent(model=ScriptedModel(slow))
    async with console(tmp_path, agent) as url:
        async with aiohttp.ClientSession() as session:
            posts = [
                asyncio.create_task(
                    session.post(f"{url}/webhook", json={"message": f"task {i}", "user_id": "u1"})
                )
                for i in range(2)
            ]

            async def both_in_the_lane() -> dict[str, Any] | None:
                numbers: dict[str, Any] = json.loads((await fetch(f"{url}/console/api/status"))[1])
                return numbers if numbers["lanes"]["turns"].get("webhook:u1") == 2 else None

            numbers = await eventually(both_in_the_lane)
            assert numbers["gateway"]["conversations_busy"] == 1
            _, page, _ = await fetch(f"{url}/console/status")
            assert "<td>webhook:u1</td><td>1</td><td>1</td>" in page  # one in flight, one waiting
            release.set()
            for answer in await asyncio.gather(*posts):
                answer.close()
        numbers = json.loads((await fetch(f"{url}/console/api/status"))[1])
    assert numbers["lanes"]["turns"] == {} and numbers["gateway"]["turns_done"] == 2
    assert numbers["rates"]["sends_per_minute"] == 2.0  # both within the first minute
    assert numbers["model"]["tasks"] == 2 and numbers["model"]["model_calls"] == 2  # serve records traces


# -- what pages never do ------------------------------------------------------------------------


async def test_a_reply_with_markup_is_rendered_inert(tmp_path: Path) -> None:
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    agent = Agent(model=ScriptedModel([]))
    store = traced(agent, tmp_path)
    await store.record(trace_record("webhook:evil", input=evil, reply=evil, conversation=f"c{evil}"))
    async with console(tmp_path, agent) as url:
        for path in (
            "/console/tasks",
            "/console/tasks/webhook%3Aevil",
            "/console/tasks?conversation=%3Cscript%3E",
        ):
            status, page, headers = await fetch(url + path)
            assert status == 200 and "<script>alert" not in page and "<img src=x" not in page
            assert "default-src 'none'" in headers["Content-Security-Policy"]
        _, page, _ = await fetch(f"{url}/console/tasks/webhook%3Aevil")
    assert '<pre id="reply" class="reply">&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&lt;img' in page


async def test_pages_never_show_a_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BILLING_API_KEY", SECRET)
    default_redactor().add_environment()  # as at start-up, after .env is loaded
    shaped = "sk-proj-" + "a1B2c3D4" * 4  # an unknown key, found by its shape
    agent, _ = invoice_agent()
    store = traced(agent, tmp_path)
    leaky = f"use {SECRET} and {shaped}"
    call_with_secret = {
        "turn": 1,
        "id": "c1",
        "name": "calculator",
        "arguments": json.dumps({"key": SECRET}),
        "result": leaky,
        "ok": False,
        "error": leaky,
        "elapsed": 0.1,
        "started_at": time.time(),
    }
    await store.record(
        trace_record(
            "webhook:leak",
            input=leaky,
            reply=leaky,
            error=leaky,
            tool_calls=[call_with_secret],
            messages=[{"role": "user", "content": leaky}],
        )
    )
    async with console(tmp_path, agent) as url:
        await fetch(
            f"{url}/webhook", method="POST", body={"message": f"invoice {SECRET}", "user_id": "alice"}
        )
        pages = [
            "/console/",
            "/console/tasks",
            "/console/tasks/webhook%3Aleak",
            "/console/api/tasks/webhook%3Aleak",
            "/console/approvals",
            "/console/status",
            "/console/api/status",
            "/console/tasks?tool=" + SECRET,
        ]
        for path in pages:
            status, page, _ = await fetch(url + path)
            assert status == 200, path
            assert SECRET not in page and shaped not in page, path
        _, page, _ = await fetch(f"{url}/console/tasks/webhook%3Aleak")
        assert "[REDACTED]" in page


async def test_a_browser_that_leaves_mid_turn_loses_nothing(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def slow(messages: Any, tools: Any) -> Any:
        await release.wait()
        return reply("finished anyway")

    async with console(tmp_path, Agent(model=ScriptedModel(slow))) as url:
        async with aiohttp.ClientSession() as session:
            answer = await session.post(f"{url}/console/api/chat", json={"message": "take your time"})
            first = json.loads(await answer.content.readline())
            answer.close()  # the tab is closed while the model is still thinking
        release.set()

        async def replied() -> dict[str, Any] | None:
            health: dict[str, Any] = json.loads((await fetch(f"{url}/healthz"))[1])
            return health if health["replies_sent"] == 1 else None

        health = await eventually(replied)
        _, page, _ = await fetch(url + "/console/tasks/" + first["task_id"].replace(":", "%3A"))
    assert health["turns_done"] == 1 and health["replies_sent"] == 1 and health["outbox_pending"] == 0
    assert "finished anyway" in page  # its trace, with the reply nobody was waiting for


@pytest.mark.slow
def test_serve_refuses_a_public_console_without_a_token_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "hermes.yaml").write_text("console:\n  enabled: true\n", encoding="utf-8")
    env = clean_environ()
    env["HERMES_WEBHOOK_SECRET"] = "webhook-secret"  # else the unsigned webhook is refused first
    done = subprocess.run(
        [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "serve", "--host", "0.0.0.0",
         "--port", "0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "HERMES_CONSOLE_TOKEN" in done.stderr


# -- issue 29: what a new team meets in the console ---------------------------------------------


class EventStream:
    """The chat page's `EventSource`, as a client: the `data:` events of /console/api/events
    (the text/event-stream format of the HTML standard, "Server-sent events"), collected as they come."""

    def __init__(self, url: str) -> None:
        self.url, self.received = url, []  # type: ignore[var-annotated]
        self.opened = asyncio.Event()

    async def __aenter__(self) -> EventStream:
        self._session = aiohttp.ClientSession()
        self._task = asyncio.create_task(self._read())
        await asyncio.wait_for(self.opened.wait(), 10)
        return self

    async def _read(self) -> None:
        async with self._session.get(self.url) as answer:
            assert answer.headers["Content-Type"].startswith("text/event-stream")
            async for line in answer.content:
                self.opened.set()
                if line.startswith(b"data: "):
                    self.received.append(json.loads(line[6:]))

    async def collected(self, count: int) -> list[dict[str, Any]]:
        """The events received, once there are `count` of them."""
        await eventually(lambda: len(self.received) >= count, what=f"{count} events")
        return self.received

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        await self._session.close()


def reminder_model(fire_at: str) -> ScriptedModel:
    """A model that sets a reminder when asked ("remind me"), and, when the job fires, posts with
    `send_message` and then says the reminder."""

    def answer(messages: list[dict[str, Any]], tools: Any) -> Any:
        last = messages[-1]
        content = str(last.get("content") or "")
        if last["role"] == "user" and "remind me" in content:
            return call("schedule_task", {"prompt": "remind the user to drink water", "at": fire_at,
                                          "timezone": "UTC"})  # fmt: skip
        if last["role"] == "user" and content.startswith("[scheduled task"):
            return call("send_message", {"target": "team", "text": "Water break in 5 minutes"})
        if last["role"] == "tool" and "queued" in content:
            return reply("Reminder: drink water.")
        return reply("Reminder set.")

    return ScriptedModel(answer)


async def test_a_reminder_set_in_the_chat_shows_live_in_the_open_chat_and_in_its_history(
    tmp_path: Path,
) -> None:
    """Issue 29, item 2: a reminder set from the console chat fired on time and its reply was sent
    to the web channel, where no browser waited for it: lost. Now the reply and the job's
    `send_message` post reach every chat page open on the conversation (server-sent events), in
    the order they are sent, and a page opened later reads the conversation back from the session
    store: the user's message, the answer, then the proactive ones, marked as such."""
    from hermes_core.config import ScheduleConfig

    fire_at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 3))
    policy = Policy.from_lists(admins=["web:console"], allow_irreversible=["send_message"])
    agent = Agent(model=reminder_model(fire_at), permissions=policy)
    async with console(tmp_path, agent, schedule=ScheduleConfig(min_delay_minutes=0)) as url:  # 3 s ahead
        async with EventStream(f"{url}/console/api/events?conversation=r1") as feed:
            status, body, _ = await fetch(
                f"{url}/console/api/chat", method="POST",
                body={"message": "remind me in a moment to drink water", "conversation": "r1"},
            )  # fmt: skip
            assert status == 200 and events(body)[-1]["text"] == "Reminder set."
            live = await feed.collected(2)
        _, history, _ = await fetch(f"{url}/console/api/history?conversation=r1")
        _, other, _ = await fetch(f"{url}/console/api/history?conversation=r2")
        assert (await fetch(f"{url}/console/api/history?conversation=../x"))[0] == 400
    assert [(e["type"], e["text"]) for e in live] == [
        ("message", "Reminder: drink water."),
        ("message", "→ team: Water break in 5 minutes"),
    ]
    assert json.loads(history)["messages"] == [
        {"role": "user", "text": "remind me in a moment to drink water", "proactive": False},
        {"role": "agent", "text": "Reminder set.", "proactive": False},
        {"role": "agent", "text": "Reminder: drink water.", "proactive": True},
        {"role": "agent", "text": "→ team: Water break in 5 minutes", "proactive": True},
    ]
    assert json.loads(other) == {"messages": []}


def test_the_history_shown_is_bounded_and_leaves_tool_steps_out() -> None:
    """The chat history a page reloads is the last 50 items; tool calls and results, a picture's
    bytes and a job's prompt are not shown (they stay in the task's trace)."""
    from hermes_core.console.history import chat_items

    turns: list[dict[str, Any]] = []
    for n in range(40):
        turns += [
            {"role": "user", "content": f"question {n}"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{n}", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": "42"},
            {"role": "assistant", "content": f"answer {n}"},
        ]  # fmt: skip
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    turns.append({"role": "user", "content": [{"type": "text", "text": "what is this?"}, picture]})
    items = chat_items(turns)
    assert len(items) == 50 and items[0] == {"role": "agent", "text": "answer 15", "proactive": False}
    assert items[-1] == {"role": "user", "text": "what is this?\n[picture]", "proactive": False}
    assert not any("42" == item["text"] or "base64" in item["text"] for item in items)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("zh-CN,zh;q=0.9,en;q=0.8", "zh"),  # a browser set to Chinese
        ("en-US,en;q=0.9,zh-CN;q=0.8", "en"),
        ("da, en-gb;q=0.8, en;q=0.7", "en"),  # RFC 9110 §12.5.4's own example
        ("fr-FR, en;q=0.3, zh-TW;q=0.5", "zh"),  # the higher q wins, not the order
        ("zh;q=0, en;q=0.1", "en"),  # q=0: "not acceptable"
        ("zh;q=abc", "en"),  # a broken weight is skipped
        ("fr", "en"),
        ("", "en"),
    ],
)
def test_the_language_follows_accept_language(header: str, expected: str) -> None:
    """Cases: RFC 9110 §12.5.4 (Accept-Language, q values), and the headers Chrome and Firefox send."""
    from hermes_core.console.words import accepted

    assert accepted(header) == expected


async def test_pages_speak_chinese_or_english_by_the_browser_or_a_switch_kept_in_a_cookie(
    tmp_path: Path,
) -> None:
    """Issue 29, item 9: the console was English-only around Chinese replies. The console's own words
    (navigation, headings, buttons, table heads, empty states) follow Accept-Language; `?lang=`
    switches and is kept in a cookie."""
    async with console(tmp_path, Agent(model=ScriptedModel([]))) as url:
        zh = {"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.8"}
        _, chinese, _ = await fetch(f"{url}/console/approvals", headers=zh)
        _, english, _ = await fetch(f"{url}/console/approvals", headers={"Accept-Language": "en-US,en"})
        _, chat, _ = await fetch(f"{url}/console/", headers=zh)
        jar = aiohttp.CookieJar(unsafe=True)  # keeps cookies of an IP address, as a browser does
        async with aiohttp.ClientSession(cookie_jar=jar) as session:  # the switch, then a plain visit
            async with session.get(f"{url}/console/schedule?lang=zh", headers={"Accept-Language": "en"}) as a:
                switched, cookie = await a.text(), a.cookies.get("hermes_console_lang")
            async with session.get(f"{url}/console/tasks", headers={"Accept-Language": "en"}) as b:
                kept = await b.text()
    assert '<html lang="zh">' in chinese and ">审批</a>" in chinese and ">定时任务</a>" in chinese
    assert "<th>工具</th>" in chinese and "没有等待审批的调用。" in chinese and "最近的决定" in chinese
    assert '<html lang="en">' in english and ">Approvals</a>" in english and "Nothing waits" in english
    assert ">发送</button>" in chat and ">新对话</button>" in chat and "批准" in chat  # data-words too
    assert cookie is not None and cookie.value == "zh" and "没有定时任务。" in switched
    assert "<h1>任务</h1>" in kept and "只看失败" in kept


async def test_a_picture_sent_from_the_chat_reaches_the_model_as_an_image_part(tmp_path: Path) -> None:
    """Issue 29, item 9: the console could not send a picture. A chat message carries one as a
    `data:` URL; the model receives it as an OpenAI image part after the text, as a Feishu or a
    webhook picture (docs/media.md). One over `media.max_image_mb`, or bytes that are no picture,
    is refused with a clear error and never reaches the model."""
    from hermes_core.channels.media import MediaLimits
    from hermes_core.models.settings import ModelSettings
    from test_media_e2e import data_url, png

    picture = data_url(png(4, 4))
    async with FakeOpenAIServer() as fake:
        fake.script(FakeReply.text("A small grey square."))
        model = ModelSettings(model="fake-model", base_url=fake.base_url, vision=True, max_retries=0)
        async with console(tmp_path, None, model=model, media=MediaLimits(max_image_mb=0.05)) as url:
            chat = f"{url}/console/api/chat"
            body = {"message": "what is this?", "conversation": "p1", "image": picture}
            status, answer, _ = await fetch(chat, method="POST", body=body)
            large = data_url(png(4, 4) + bytes(60_000))
            too_large = await fetch(chat, method="POST", body={**body, "image": large})
            huge = await fetch(chat, method="POST", body={**body, "image": data_url(bytes(300_000))})
            not_a_picture = await fetch(chat, method="POST", body={**body, "image": data_url(b"<svg/>")})
            _, history, _ = await fetch(f"{url}/console/api/history?conversation=p1")
        requests = [r for r in fake.requests if r.body.get("max_tokens") != 1]  # not the start-up probe
    assert status == 200 and events(answer)[-1]["text"] == "A small grey square."
    assert len(requests) == 1 and requests[0].images == [picture]
    parts = [m for m in requests[0].messages if m["role"] == "user"][-1]["content"]
    assert [part["type"] for part in parts] == ["text", "image_url"] and parts[0]["text"] == "what is this?"
    for refused, status_code in ((too_large, 400), (huge, 413)):  # huge: not even read to its end
        assert refused[0] == status_code and "larger than the limit of" in json.loads(refused[1])["error"]
    assert not_a_picture[0] == 400 and "PNG, JPEG, GIF or WebP" in json.loads(not_a_picture[1])["error"]
    shown = json.loads(history)["messages"][0]["text"]  # as the session store keeps it: named, no bytes
    assert shown.startswith("what is this?\n[image") and "base64" not in history


async def test_the_status_page_names_the_model_configured_and_never_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29, item 9: the status page did not say which model is configured. It shows the
    provider, the model name and the endpoint's host; the key is never on it (nor in its JSON)."""
    from hermes_core.models.settings import ModelSettings

    key = "sk-test-ab12cd34ef56gh78ij90"
    monkeypatch.setenv("DEEPSEEK_API_KEY", key)
    async with FakeOpenAIServer() as fake:  # the preset's endpoint moved to the fake: nothing leaves here
        model = ModelSettings(provider="deepseek", model="deepseek-chat", base_url=fake.base_url)
        async with console(tmp_path, None, model=model) as url:
            _, page, _ = await fetch(f"{url}/console/status", headers={"Accept-Language": "zh-CN"})
            _, numbers, _ = await fetch(f"{url}/console/api/status")
    configured = json.loads(numbers)["configured"]
    assert configured == {"provider": "deepseek", "model": "deepseek-chat", "host": "127.0.0.1"}
    assert json.loads(numbers)["degraded"] == []
    assert "<th>提供方</th><td>deepseek</td>" in page and "<td>deepseek-chat</td>" in page
    assert "<th>接口地址</th><td>127.0.0.1</td>" in page and "已完成轮次" in page and "模型错误率" in page
    assert key not in page and key not in numbers
