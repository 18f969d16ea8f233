"""Trust at the edges: who a caller is, which task a message starts, who may open the console, and
which MCP tool a configured name means. Each test performs an attack end to end — HTTP to a real
gateway on 127.0.0.1 (tests/gateway_harness.py or `serve`), the fake Feishu open platform, a
ScriptedModel, the MCP demo server (tests/mcp_demo_server.py) — and checks that it fails."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway_harness import serving
from hermes_core import Agent, tool
from hermes_core.config import (
    ConfigError,
    ConsoleConfig,
    FeishuConfig,
    GatewayConfig,
    MCPServerConfig,
    PermissionsConfig,
    Settings,
    WebhookConfig,
    build_agent,
)
from hermes_core.gateway.server import build_gateway
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.server import serve
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_feishu.cards import buttons as card_buttons
from invoicing import RAN, send_invoice
from serve_process import CLEAN_ENV
from waiting import eventually

ADMIN = "feishu:ou_admin"  # the Feishu admin, as the configuration lists them
TOKEN = "console-token-7c1e90ab"
DEMO_SERVER = Path(__file__).with_name("mcp_demo_server.py")


@tool(level=1, required_role="admin")
def broadcast(text: str) -> str:
    """Send a message to every user of the company (admins only)."""
    RAN.append(f"broadcast {text}")
    return "sent to 5,000 users"


@tool
def balance(who: str) -> str:
    """The account balance of a user."""
    RAN.append(f"balance {who}")
    return f"{who} has {len(who) * 1000} EUR"


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    RAN.clear()
    for name in ("HERMES_WEBHOOK_SECRET", "HERMES_CONSOLE_TOKEN"):
        monkeypatch.delenv(name, raising=False)


async def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers) as answer:
        return answer.status, await answer.json()


async def get(url: str, headers: dict[str, str] | None = None) -> int:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as answer:
        return answer.status


@asynccontextmanager
async def both_channels(
    tmp_path: Path, feishu: FakeFeishu, agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Any, str]]:
    """The real gateway of `serve` (build_gateway) with the webhook and the Feishu channel."""
    monkeypatch.setenv("FEISHU_APP_SECRET", feishu.app_secret)
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", feishu.verification_token)
    settings = Settings(
        gateway=GatewayConfig(data_dir=str(tmp_path)),
        feishu=FeishuConfig(app_id=feishu.app_id, base_url=feishu.base_url, send_rate=1000),
    )
    gateway, routes = build_gateway(settings, agent)
    async with serving(gateway, routes) as url:
        yield gateway, url
    await gateway.runner.aclose()


# -- 1. identities are qualified by channel ----------------------------------------------------


async def test_a_webhook_caller_claiming_a_feishu_admins_open_id_is_not_an_admin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: POST /webhook with `user_id: "ou_admin"` — the open_id of a Feishu admin — to run an
    admin-only tool. The webhook caller is `webhook:ou_admin`, not `feishu:ou_admin`: the tool is
    neither offered nor run. The real Feishu admin still runs it."""
    model = ScriptedModel(
        [
            call("broadcast", {"text": "forged"}),
            reply("refused"),
            call("broadcast", {"text": "real"}),
            reply("sent"),
        ]
    )
    agent = Agent(model=model, tools=[broadcast], permissions=Policy.from_lists(admins=[ADMIN]))
    async with FakeFeishu() as feishu, both_channels(tmp_path, feishu, agent, monkeypatch) as (_, url):
        status, answer = await post(f"{url}/webhook", {"message": "broadcast forged", "user_id": "ou_admin"})
        assert status == 200 and answer["reply"] == "refused"
        assert RAN == []
        assert "broadcast" not in [t["function"]["name"] for t in model.calls[0].tools or []]  # not offered
        assert "requires the admin role" in model.calls[1].messages[-1]["content"]

        real = feishu.user_message("broadcast real", chat_id="oc_admin", sender="ou_admin")
        assert (await feishu.push(real, f"{url}/feishu/events")).ok
        await eventually(lambda: len(feishu.sent) == 1)
    assert RAN == ["broadcast real"] and feishu.sent[0].text == "sent"


async def test_a_webhook_caller_cannot_decide_a_feishu_users_approval_with_a_forged_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: a Feishu user's task waits for approval; POST /webhook/approvals/<id> with that user's
    open_id, then with the Feishu admin's open_id. Both are webhook identities: 403, the approval
    stays pending and the tool does not run. The Feishu admin's card click still decides it."""
    model = ScriptedModel([call("send_invoice", {"customer": "ACME", "amount": 120}), reply("Invoice sent.")])
    agent = Agent(model=model, tools=[send_invoice], permissions=Policy.from_lists(admins=[ADMIN]))
    async with FakeFeishu() as feishu, both_channels(tmp_path, feishu, agent, monkeypatch) as (_, url):
        events = f"{url}/feishu/events"
        ask = feishu.user_message("给 ACME 开 120 的发票", chat_id="oc_alice", sender="ou_alice")
        assert (await feishu.push(ask, events)).ok
        await eventually(lambda: len(feishu.sent) == 1 and "审批编号" in feishu.sent[0].text)  # streamed card
        card = feishu.sent[0]  # patched to the approval request once the task paused
        buttons = {value["decision"]: value for value in card_buttons(card.content)}
        approval = buttons["approve"]["approval_id"]

        for forged in ("ou_alice", "ou_admin"):
            status, answer = await post(
                f"{url}/webhook/approvals/{approval}", {"user_id": forged, "decision": "approve"}
            )
            assert (status, answer["error"]) == (403, "approval_not_allowed"), forged
        pending = await agent.interactions.get(approval)  # type: ignore[union-attr]
        assert pending is not None and pending.status == "pending" and RAN == []

        clicked = await feishu.push(
            feishu.card_action("ou_admin", card.message_id, buttons["approve"]), events
        )
        assert clicked.ok and json.loads(clicked.body)["toast"]["type"] == "success"
        await eventually(lambda: len(feishu.sent) == 2 and feishu.sent[1].text == "Invoice sent.")
    assert RAN == ["invoice ACME 120"] and feishu.sent[1].text == "Invoice sent."


@pytest.mark.slow
def test_an_unqualified_identity_in_the_configuration_stops_the_start(tmp_path: Path) -> None:
    """Attack (by mistake): `admins: [ou_admin]` would make anyone who claims `ou_admin` on any
    channel an admin. `hermes-kernel serve` refuses to start and names the entry and the fix."""
    (tmp_path / "hermes.yaml").write_text("permissions:\n  admins: [ou_admin]\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "serve", "--port", "0"],
        cwd=tmp_path, env=CLEAN_ENV, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "permissions.admins: 'ou_admin'" in done.stderr and "'feishu:ou_admin'" in done.stderr
    with pytest.raises(ConfigError, match="no channel is named 'feishi'"):
        build_agent(Settings(permissions=PermissionsConfig(roles={"feishi:ou_hr": "hr"})))
    with pytest.raises(ValueError, match="names no channel"):
        Policy.from_lists(admins=["ou_admin"])


# -- 2. task ids cannot collide across users -----------------------------------------------------


async def test_a_reused_message_id_after_pruning_starts_a_fresh_task(tmp_path: Path) -> None:
    """Attack: alice's webhook message `message_id: "m1"` runs a tool; once its dedup key is pruned,
    bob sends `message_id: "m1"` too. Were the task id derived from the message id, bob's task would
    replay alice's journal and hand him her recorded reply. Bob's task runs fresh."""

    def model(messages: list[dict[str, Any]], tools: Any) -> Any:
        last = messages[-1]
        if last["role"] == "tool":
            return reply(f"Balance: {last['content']}")
        return call("balance", {"who": str(last["content"]).split()[-1]})

    scripted = ScriptedModel(model)
    agent = Agent(model=scripted, tools=[balance])
    gateway, routes = build_gateway(Settings(gateway=GatewayConfig(data_dir=str(tmp_path))), agent)
    async with serving(gateway, routes) as url:
        status, first = await post(
            f"{url}/webhook", {"message": "balance alice", "user_id": "alice", "message_id": "m1"}
        )
        assert status == 200 and "alice has 5000 EUR" in first["reply"]
        await gateway.store.prune(time.time() + 3600)  # the dedup keys' 48 hours have passed
        status, second = await post(
            f"{url}/webhook", {"message": "balance bob", "user_id": "bob", "message_id": "m1"}
        )
    await gateway.runner.aclose()  # type: ignore[attr-defined]
    assert status == 200 and "bob has 3000 EUR" in second["reply"] and "alice" not in second["reply"]
    assert RAN == ["balance alice", "balance bob"] and len(scripted.calls) == 4


# -- 3. the console's "local only" is the bind address's --------------------------------------------


@asynccontextmanager
async def console_server(
    tmp_path: Path, host: str, config: ConsoleConfig | None = None
) -> AsyncIterator[int]:
    """`serve` in this event loop on `host` and a free port; yields the port."""
    settings = Settings(
        gateway=GatewayConfig(data_dir=str(tmp_path)),
        console=config or ConsoleConfig(),
        webhook=WebhookConfig(enabled=False),
    )  # only the console is served here
    threshold = gc.get_threshold()  # serve tunes the collector for a long-lived process: undo that
    stop, ready = asyncio.Event(), asyncio.get_running_loop().create_future()
    agent = Agent(model=ScriptedModel([]))
    server = asyncio.create_task(
        serve(settings, host=host, port=0, ready=ready.set_result, stop=stop, agent=agent)
    )
    try:
        await asyncio.wait({server, ready}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        if server.done():
            server.result()  # raises what stopped it
        yield int(ready.result().rsplit(":", 1)[1])
    finally:
        stop.set()
        await asyncio.wait({server}, timeout=20)
        gc.unfreeze()
        gc.set_threshold(*threshold)


@asynccontextmanager
async def tcp_relay(target_port: int) -> AsyncIterator[int]:
    """A plain TCP relay on 127.0.0.1 (what socat or a port forward does): every connection it
    accepts is piped to the target, so the target sees a loopback remote address."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def relay(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer),
                             return_exceptions=True)  # fmt: skip

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def test_a_relayed_request_to_a_public_console_needs_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: the console is served on 0.0.0.0 with a token; a TCP relay on the machine makes the
    request's remote address 127.0.0.1, and the request says `Host: 127.0.0.1` and carries no
    forwarding header — it looks local in every way. Without the token it is refused (401), with
    it answered. A console on a public address without a token does not start; and no `Access`
    without a token can be made for a non-loopback address. (The relayed refusal already held
    before this test was written; the tokenless `Access` for a public bind is what is new.)"""
    from hermes_core.console.access import Access

    monkeypatch.setenv("HERMES_CONSOLE_TOKEN", TOKEN)
    async with console_server(tmp_path / "a", "0.0.0.0") as port, tcp_relay(port) as relay:
        status_url = f"http://127.0.0.1:{relay}/console/api/status"
        assert await get(status_url) == 401
        assert await get(status_url, {"Host": "127.0.0.1", "X-Forwarded-For": "127.0.0.1"}) == 401
        assert await get(status_url, {"Authorization": f"Bearer {TOKEN}"}) == 200
        assert await get(f"http://127.0.0.1:{relay}/console/tasks") == 401
    monkeypatch.delenv("HERMES_CONSOLE_TOKEN")
    with pytest.raises(ConfigError, match="HERMES_CONSOLE_TOKEN"):
        async with console_server(tmp_path / "b", "0.0.0.0", ConsoleConfig(enabled=True)):
            pass
    with pytest.raises(ConfigError, match="needs a token"):
        Access(None, "0.0.0.0")


async def test_a_console_on_loopback_without_a_token_is_open_to_what_reaches_loopback(tmp_path: Path) -> None:
    """The documented limit, not an attack that fails: served on 127.0.0.1 without a token, the
    console answers whatever reaches that port — a relay on the machine included. Forwarding
    headers (a reverse proxy) and a foreign Host (DNS rebinding) are still refused."""
    async with console_server(tmp_path, "127.0.0.1") as port, tcp_relay(port) as relay:
        status_url = f"http://127.0.0.1:{relay}/console/api/status"
        assert await get(status_url) == 200
        assert await get(status_url, {"X-Forwarded-For": "203.0.113.9"}) == 403
        assert await get(status_url, {"Host": "attacker.example"}) == 403


# -- 4. MCP `confirm` and `levels` match the names `hermes-kernel tools` shows --------------------------


def demo_server(**options: Any) -> MCPServerConfig:
    return MCPServerConfig(
        name="pay", command=sys.executable, args=[str(DEMO_SERVER)], env=["DEMO_CALL_LOG"], **options
    )


def calls_seen(log: Path) -> list[str]:
    lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    return [json.loads(line)["tool"] for line in lines]


async def test_an_mcp_tool_confirmed_by_its_shown_name_waits_for_approval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack (on the operator): the server's tool `pay.out` is listed by `hermes-kernel tools` as
    `pay_out`, and `confirm: [pay_out]` is written from that listing. The model calls it over the
    webhook: it waits for approval and reaches the server only once approved."""
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("DEMO_CALL_LOG", str(log))
    settings = Settings(gateway=GatewayConfig(data_dir=str(tmp_path)), mcp=[demo_server(confirm=["pay_out"])])
    model = ScriptedModel([call("pay_out", {"account": "mallory", "amount": 900}), reply("Paid.")])
    agent = build_agent(settings, model=model)
    gateway, routes = build_gateway(settings, agent)
    try:
        async with serving(gateway, routes) as url:
            status, asked = await post(f"{url}/webhook", {"message": "pay mallory 900", "user_id": "alice"})
            assert status == 200 and asked["approval"]["tool"] == "pay_out"
            assert calls_seen(log) == []
            status, done = await post(
                f"{url}/webhook/approvals/{asked['approval']['id']}",
                {"user_id": "alice", "decision": "approve"},
            )
            assert status == 200 and done["reply"] == "Paid."
    finally:
        await gateway.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()
    assert calls_seen(log) == ["pay.out"]


async def test_an_mcp_level_written_as_shown_applies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attack (on the operator): `levels: {pay_out: 2}` marks the tool irreversible; the model's call
    over the webhook is refused and never reaches the server."""
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("DEMO_CALL_LOG", str(log))
    settings = Settings(
        gateway=GatewayConfig(data_dir=str(tmp_path)), mcp=[demo_server(levels={"pay_out": 2})]
    )
    model = ScriptedModel([call("pay_out", {"account": "mallory", "amount": 900}), reply("I may not.")])
    agent = build_agent(settings, model=model)
    gateway, routes = build_gateway(settings, agent)
    try:
        async with serving(gateway, routes) as url:
            status, answer = await post(f"{url}/webhook", {"message": "pay mallory 900", "user_id": "alice"})
    finally:
        await gateway.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()
    assert status == 200 and answer["reply"] == "I may not." and "approval" not in answer
    assert "irreversible tools are disabled" in model.calls[1].messages[-1]["content"]
    assert calls_seen(log) == []


@pytest.mark.slow
def test_an_mcp_name_that_matches_no_tool_stops_the_start(tmp_path: Path) -> None:
    """Attack (on the operator): `confirm: [nope]` names no tool of the server, so nothing would
    wait for approval. `hermes-kernel tools`, `serve` and `run` (which now starts the servers before
    its turn) stop with one line naming it and the server's tools."""
    config = tmp_path / "hermes.yaml"
    config.write_text(
        f"mcp:\n  - name: pay\n    command: {json.dumps(sys.executable)}\n"
        f"    args: [{json.dumps(str(DEMO_SERVER))}]\n    confirm: [nope]\n",
        encoding="utf-8",
    )
    for command in (["tools"], ["serve", "--port", "0"], ["run", "hello"]):
        done = subprocess.run(
            [sys.executable, "-m", "hermes_core", "--config", str(config), *command],
            cwd=tmp_path, env=CLEAN_ENV, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert done.returncode == 2 and "Traceback" not in done.stderr, (command, done.stderr)
        assert "MCP server 'pay': confirm names 'nope'" in done.stderr
        assert "pay_out (pay.out)" in done.stderr
