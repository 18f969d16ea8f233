"""Attacks on the webhook and on `serve`'s HTTP edge, each performed end to end against a real gateway
on 127.0.0.1 (`serve` in this event loop or as a process, ScriptedModel behind it), each refused.

1. an unsigned webhook reachable beyond loopback (anyone could name an admin's user id);
2. another user's `conversation_id`: reading that history, answering that user's question;
3. a signed request replayed inside its 5-minute window;
4. `callback_url` pointed into the internal network (SSRF);
5. slow clients trickling headers or bodies to hold connections open (slowloris).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway_harness import echo, idle, serve_here, serving
from hermes_core import Agent, tool
from hermes_core.channels.webhook import WebhookChannel, sign
from hermes_core.cli import main
from hermes_core.config import GatewayConfig, Settings
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.store import SQLiteGatewayStore
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.tools.clarify import clarify
from serve_process import CLEAN_ENV
from waiting import eventually

SECRET = "webhook-secret-8c1f2e77a9"
PAYMENTS: list[int] = []


@tool
def pay(amount: int) -> str:
    """Pay an amount (a task with an effect: each run pays again).

    Args:
        amount: euros
    """
    PAYMENTS.append(amount)
    return f"paid {amount}"


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    PAYMENTS.clear()
    for name in list(os.environ):
        if name.startswith(("HERMES_", "FEISHU_")):
            monkeypatch.delenv(name)


@asynccontextmanager
async def served(tmp_path: Path, agent: Agent, **gateway: Any) -> AsyncIterator[str]:
    """The real `serve` (all its parts: deadlines, webhook, console) in this event loop; its URL."""
    known = {key: value for key, value in gateway.items() if key in GatewayConfig.model_fields}
    settings = Settings(gateway=GatewayConfig(data_dir=str(tmp_path), **known))  # unknown: the attack as is
    async with serve_here(settings, agent) as url:
        yield url


async def post(
    url: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
    async with aiohttp.ClientSession() as session, session.post(url, data=data, headers=headers) as answer:
        return answer.status, await answer.json()


# -- 1. no unsigned webhook beyond loopback -------------------------------------------------------


def serve_process(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hermes_core", *args, "serve", "--host", "0.0.0.0", "--port", "0"],
        cwd=cwd, env=env or CLEAN_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_serving(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        found = re.search(r"serving on (http://\S+) \(", line)
        if found:
            return found.group(1)
    raise AssertionError(f"serve did not start: exit {process.wait()}, {process.stderr.read()}")  # type: ignore[union-attr]


def stop(process: subprocess.Popen[str]) -> str:
    process.send_signal(signal.SIGTERM)
    _, errors = process.communicate(timeout=30)
    return errors


@pytest.mark.slow
def test_serve_refuses_an_unsigned_webhook_on_a_public_address_in_one_line(tmp_path: Path) -> None:
    """Attack 1: with no HERMES_WEBHOOK_SECRET, `serve --host 0.0.0.0` put a webhook on every
    interface that believes any `user_id` it is sent, an admin's included. Now it exits 2 with one
    line on stderr; `webhook.allow_unsigned: true` starts it (with a WARNING), so does a secret."""
    process = serve_process(tmp_path)
    try:
        out, errors = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise AssertionError("serve put an unsigned webhook on 0.0.0.0") from None
    assert process.returncode == 2 and out == ""
    assert len(errors.strip().splitlines()) == 1, errors
    assert "HERMES_WEBHOOK_SECRET" in errors and "webhook.allow_unsigned" in errors and "0.0.0.0" in errors

    (tmp_path / "open.yaml").write_text("webhook:\n  allow_unsigned: true\n", encoding="utf-8")
    allowed = serve_process(tmp_path, "--config", "open.yaml")
    wait_serving(allowed)
    warnings = [line for line in stop(allowed).splitlines() if "allow_unsigned" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0]

    signed = serve_process(tmp_path, env={**CLEAN_ENV, "HERMES_WEBHOOK_SECRET": SECRET})
    wait_serving(signed)
    assert "allow_unsigned" not in stop(signed)


def doctor_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str) -> tuple[int, str]:
    path = tmp_path / "hermes.yaml"
    path.write_text(f"gateway:\n  data_dir: {tmp_path / 'data'}\n{config}", encoding="utf-8")
    code = main(["--config", str(path), "doctor"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line[6:].startswith("webhook:")]
    assert len(lines) == 1, "doctor has no webhook line"
    return code, lines[0]


def test_doctor_fails_an_unsigned_webhook_on_a_public_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack 1, found before it is served: doctor says FAIL where serve would refuse to start."""
    monkeypatch.chdir(tmp_path)
    code, line = doctor_line(tmp_path, capsys, "  host: 0.0.0.0\n")
    assert code == 1 and line.startswith("FAIL") and "HERMES_WEBHOOK_SECRET" in line
    code, line = doctor_line(tmp_path, capsys, "  host: 0.0.0.0\nwebhook:\n  allow_unsigned: true\n")
    assert code == 0 and line.startswith("OK") and "allow_unsigned" in line and "any user" in line
    code, line = doctor_line(tmp_path, capsys, "  host: 127.0.0.1\n")
    assert code == 0 and line.startswith("OK") and "only from this machine" in line
    monkeypatch.setenv("HERMES_WEBHOOK_SECRET", SECRET)
    code, line = doctor_line(tmp_path, capsys, "  host: 0.0.0.0\n")
    assert code == 0 and line.startswith("OK") and "signed" in line and SECRET not in line


async def test_an_unsigned_loopback_webhook_answers_only_this_machine(tmp_path: Path) -> None:
    """Attack 1 by the back door: the unsigned webhook on 127.0.0.1 behind the example nginx (which
    adds X-Forwarded-For), or driven by a web page in the operator's browser (which sends Origin:
    a cross-site POST of text/plain needs no preflight). Both are refused, nothing runs; a plain
    local request, like the README's curl, still works."""
    model = ScriptedModel(lambda messages, tools: reply("ran"))
    async with served(tmp_path, Agent(model=model)) as url:
        forwarded = await post(f"{url}/webhook", {"message": "hi", "user_id": "boss"},
                               {"X-Forwarded-For": "203.0.113.9"})  # fmt: skip
        browser = await post(f"{url}/webhook", {"message": "hi", "user_id": "boss"},
                             {"Origin": "https://evil.example", "Content-Type": "text/plain"})  # fmt: skip
        assert [forwarded[0], browser[0]] == [403, 403] and "HERMES_WEBHOOK_SECRET" in forwarded[1]["error"]
        assert model.calls == []
        status, answer = await post(f"{url}/webhook", {"message": "hi", "user_id": "u1"})
    assert status == 200 and answer["reply"] == "ran"


# -- 2. an unsigned conversation belongs to its user ----------------------------------------------


def conversation_model() -> ScriptedModel:
    """Asks which customer when told to send the invoice; otherwise says what it was told before."""

    def answer(messages: list[dict[str, Any]], tools: Any) -> Any:
        last = messages[-1]
        if last["role"] == "tool":
            return reply(f"invoice for {json.loads(last['content'])['answer']}")
        if "send the invoice" in last["content"]:
            return call("clarify", {"question": "Which customer?"})
        earlier = [m["content"] for m in messages[:-1] if m["role"] == "user"]
        return reply("I was told: " + " | ".join(earlier) if earlier else "nothing before")

    return ScriptedModel(answer)


async def test_another_users_conversation_id_opens_a_conversation_of_ones_own(tmp_path: Path) -> None:
    """Attack 2, reading: bob names alice's conversation_id and asks what was said before; he got
    alice's history (the model's window was hers). Now he lands in a conversation of his own."""
    model = conversation_model()
    async with served(tmp_path, Agent(model=model)) as url:
        alice = {"user_id": "alice", "conversation_id": "c1"}
        await post(f"{url}/webhook", {**alice, "message": "the door code is 4711"})
        seen = len(model.calls)
        _, bob = await post(f"{url}/webhook", {"user_id": "bob", "conversation_id": "c1",
                                               "message": "what was I told before?"})  # fmt: skip
        bobs_calls = model.calls[seen:]
        _, again = await post(f"{url}/webhook", {**alice, "message": "and before?"})
    assert bob["reply"] == "nothing before"
    assert bobs_calls and all("4711" not in json.dumps(c.messages, ensure_ascii=False) for c in bobs_calls)
    assert again["reply"] == "I was told: the door code is 4711"  # alice's conversation is still hers


async def test_another_users_conversation_id_cannot_reach_a_pending_question(tmp_path: Path) -> None:
    """Attack 2, the pending question: alice's task waits for her answer to a clarify question; bob
    posts into her conversation_id. He sees nothing of her conversation, her question stays open,
    and her next message answers it."""
    model = conversation_model()
    async with served(tmp_path, Agent(model=model, tools=[clarify])) as url:
        alice = {"user_id": "alice", "conversation_id": "c2"}
        await post(f"{url}/webhook", {**alice, "message": "our customers are ACME and Globex"})
        _, asked = await post(f"{url}/webhook", {**alice, "message": "send the invoice"})
        assert asked["reply"] == "Which customer?"
        seen = len(model.calls)
        bobs = {"user_id": "bob", "conversation_id": "c2", "message": "Initech"}
        _, bob = await post(f"{url}/webhook", bobs)
        bobs_calls = model.calls[seen:]
        _, done = await post(f"{url}/webhook", {**alice, "message": "ACME"})
    assert bob["reply"] == "nothing before"
    assert all("ACME" not in json.dumps(c.messages) and "invoice" not in json.dumps(c.messages)
               for c in bobs_calls)  # fmt: skip
    assert done["reply"] == "invoice for ACME"


# -- 3. a signed request is taken once ------------------------------------------------------------


def payer() -> Agent:
    def answer(messages: list[dict[str, Any]], tools: Any) -> Any:
        return reply("paid.") if messages[-1]["role"] == "tool" else call("pay", {"amount": 100})

    return Agent(model=ScriptedModel(answer), tools=[pay])


async def test_a_replayed_signed_request_is_refused_even_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack 3: whoever saw one signed request (a log, a proxy) sent the same bytes again within
    the 5-minute window, and each copy paid again. Now the copy is a 409 and nothing runs, also
    after the gateway restarted; a new request, signed afresh, still works."""
    monkeypatch.setenv("HERMES_WEBHOOK_SECRET", SECRET)
    body = json.dumps({"message": "pay the rent", "user_id": "u1"}).encode()
    stamp = str(int(time.time()))
    headers = {"X-Hermes-Timestamp": stamp, "X-Hermes-Signature": sign(SECRET, stamp, body)}
    async with served(tmp_path, payer()) as url:
        first = await post(f"{url}/webhook", body, headers)
        replay = await post(f"{url}/webhook", body, headers)
    assert first[0] == 200 and first[1]["reply"] == "paid."
    assert replay[0] == 409 and "already received" in replay[1]["error"]
    async with served(tmp_path, payer()) as url:
        after_restart = await post(f"{url}/webhook", body, headers)
        fresh_stamp = str(int(time.time()) + 1)
        fresh = {"X-Hermes-Timestamp": fresh_stamp, "X-Hermes-Signature": sign(SECRET, fresh_stamp, body)}
        new_request = await post(f"{url}/webhook", body, fresh)
    assert after_restart[0] == 409
    assert new_request[0] == 200 and PAYMENTS == [100, 100]  # the replays paid nothing


# -- 4. callbacks only to allowed hosts -----------------------------------------------------------


@asynccontextmanager
async def listener(host: str) -> AsyncIterator[tuple[int, list[str]]]:
    """A local HTTP server standing for an internal service: its port and the paths it was sent."""
    hits: list[str] = []

    async def record(request: web.Request) -> web.Response:
        hits.append(request.path)
        if request.path == "/redirect":
            return web.Response(status=307, headers={"Location": f"http://{host}:{port}/followed"})
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield port, hits
    finally:
        await runner.cleanup()


@asynccontextmanager
async def webhook_gateway(
    tmp_path: Path, callback_hosts: list[str] | None = None
) -> AsyncIterator[tuple[Gateway, str]]:
    gateway = Gateway(SQLiteGatewayStore(tmp_path / "gateway.db"), echo, send_backoff=0.05)  # type: ignore[arg-type]
    hosts: dict[str, Any] = (
        {} if callback_hosts is None else {"callback_hosts": callback_hosts}
    )  # None: the default
    webhook = WebhookChannel(gateway, reply_timeout=5, **hosts)
    gateway.add_channel(webhook)
    async with serving(gateway, webhook.routes()) as url:
        yield gateway, url


async def with_callback(url: str, callback_url: str) -> tuple[int, dict[str, Any]]:
    return await post(f"{url}/webhook", {"message": "m", "user_id": "u", "callback_url": callback_url})


async def test_callback_urls_reach_only_the_allowed_hosts(tmp_path: Path) -> None:
    """Attack 4 (SSRF): `callback_url` made the gateway POST to any address, an internal service on
    localhost included. Now only `webhook.callback_hosts` (none by default) are reached: exact host
    and port, no `user@` trick, http(s) only, no redirect followed."""
    async with listener("127.0.0.1") as allowed, listener("localhost") as internal_listener:
        (allowed_port, allowed_hits), (internal_port, internal_hits) = allowed, internal_listener
        internal = f"http://localhost:{internal_port}/admin"
        async with webhook_gateway(tmp_path / "none") as (gateway, url):
            status, answer = await with_callback(url, internal)
            await eventually(lambda: idle(gateway))  # a callback it accepted would have been posted
            assert internal_hits == []
            assert status == 400 and "webhook.callback_hosts" in answer["error"]
        async with webhook_gateway(tmp_path / "some", [f"127.0.0.1:{allowed_port}"]) as (gateway, url):
            tricks = [
                internal,
                f"http://127.0.0.1:{allowed_port}@localhost:{internal_port}/admin",
                f"http://127.0.0.1:{internal_port}/admin",  # the allowed host, another port
                f"http://127.0.0.1:{allowed_port}\\@localhost:{internal_port}/admin",
                f"ftp://127.0.0.1:{allowed_port}/x",
                "file:///etc/passwd",
            ]
            for trick in tricks:
                status, answer = await with_callback(url, trick)
                assert status == 400 and "callback_url" in answer["error"], trick
            redirected = f"http://127.0.0.1:{allowed_port}/redirect"
            status, _ = await with_callback(url, redirected)
            assert status == 202
            good = f"http://127.0.0.1:{allowed_port}/hook"
            status, _ = await with_callback(url, good)
            assert status == 202
            await eventually(lambda: "/hook" in allowed_hits)
            await eventually(lambda: idle(gateway))
    assert internal_hits == []
    assert allowed_hits == ["/redirect", "/hook"]  # the redirect was not followed


# -- 5. slow clients are cut off ------------------------------------------------------------------

REQUEST = b"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 40\r\n"


async def until_closed(reader: asyncio.StreamReader, limit: float = 15) -> bytes:
    """What the server sent until it closed the connection; ends with "(still open)" if it did not."""
    said = bytearray()

    async def read_all() -> None:
        while chunk := await reader.read(1024):
            said.extend(chunk)

    try:
        await asyncio.wait_for(read_all(), limit)
    except asyncio.TimeoutError:
        return bytes(said) + b"(still open)"
    except ConnectionError:  # closed while bytes were still coming in: a reset, closed all the same
        pass
    return bytes(said)


async def trickle(
    port: int, data: bytes, every: float = 1.0, dripping_ones: list[int] | None = None
) -> tuple[float, bytes]:
    """Send `data` one byte every `every` seconds; how long until the server closed, what it said.
    Once its first byte is out, it adds itself to `dripping_ones` (a test waits for them all)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()

    async def drip() -> None:
        for index, byte in enumerate(data):
            writer.write(bytes([byte]))
            try:
                await writer.drain()
            except ConnectionError:
                return
            if index == 0 and dripping_ones is not None:
                dripping_ones.append(port)
            await asyncio.sleep(every)  # a client that drips its request: time passing is the attack

    dripping = asyncio.create_task(drip())
    try:
        said = await until_closed(reader)
    finally:
        dripping.cancel()
        writer.close()
    await asyncio.gather(dripping, return_exceptions=True)
    return time.monotonic() - started, said


async def timed_request(url: str) -> float:
    started = time.monotonic()
    status, answer = await post(f"{url}/webhook", {"message": "hello", "user_id": "u1"})
    assert status == 200 and answer["reply"] == "hi"
    return time.monotonic() - started


async def test_thirty_trickling_connections_are_closed_and_do_not_slow_a_real_request(tmp_path: Path) -> None:
    """Attack 5 (slowloris): 30 connections each sending one header byte a second were held open
    for as long as they kept dripping. Now each is answered 408 and closed after header_timeout
    (1 s here), and a legitimate request meanwhile answers about as fast as on a quiet server."""
    model = ScriptedModel(lambda messages, tools: reply("hi"))
    async with served(tmp_path, Agent(model=model), header_timeout=1, body_timeout=1) as url:
        port = int(url.rsplit(":", 1)[1])
        baseline = min([await timed_request(url) for _ in range(3)])
        dripping: list[int] = []
        slow = [asyncio.create_task(trickle(port, REQUEST, dripping_ones=dripping)) for _ in range(30)]
        await eventually(lambda: len(dripping) == 30)  # every connection is open and dripping
        during = min([await timed_request(url) for _ in range(3)])
        results = await asyncio.gather(*slow)
    assert during < baseline + 0.5, (baseline, during)
    for elapsed, said in results:
        assert said.startswith(b"HTTP/1.1 408"), said
        assert 0.9 < elapsed < 5, elapsed


@pytest.mark.slow  # several seconds of real time
async def test_a_trickled_body_is_cut_off_and_an_idle_kept_alive_connection_is_not(tmp_path: Path) -> None:
    """Attack 5, the body: complete headers, then one body byte a second. Now the connection is
    closed after body_timeout. A kept-alive connection that is merely idle between two requests longer than
    header_timeout is not cut off (the header clock starts with a request's first byte)."""
    model = ScriptedModel(lambda messages, tools: reply("hi"))
    async with served(tmp_path, Agent(model=model), header_timeout=1, body_timeout=1) as url:
        port = int(url.rsplit(":", 1)[1])
        head = await trickle_body(port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
        statuses = []
        for _ in range(2):
            writer.write(request)
            statuses.append(await read_response(reader))
            await asyncio.sleep(1.5)  # idle, longer than header_timeout: the server's timer must run
        writer.close()
    elapsed, said = head
    assert not said.endswith(b"(still open)") and 0.9 < elapsed < 5, (elapsed, said)
    assert statuses == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK"]


async def trickle_body(port: int) -> tuple[float, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST + b"\r\n")
    await writer.drain()
    started = time.monotonic()

    async def drip() -> None:
        for byte in b'{"message": "hi", "user_id": "u1"}     ':
            writer.write(bytes([byte]))
            try:
                await writer.drain()
            except ConnectionError:
                return
            await asyncio.sleep(1)  # a byte a second: time passing is the attack

    dripping = asyncio.create_task(drip())
    try:
        said = await until_closed(reader)
    finally:
        dripping.cancel()
        writer.close()
    await asyncio.gather(dripping, return_exceptions=True)
    return time.monotonic() - started, said


async def read_response(reader: asyncio.StreamReader) -> bytes:
    """One response from a kept-alive connection; its status line."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
    length = re.search(rb"(?i)content-length: (\d+)", head)
    await reader.readexactly(int(length.group(1)) if length else 0)
    return head.split(b"\r\n", 1)[0]
