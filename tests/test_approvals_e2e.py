"""Approvals and clarify end to end: the webhook, the Feishu card through the fake open platform, the
terminal's y/n prompt. Each channel renders the request its own way; the tool runs once, if ever."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway_harness import feishu_gateway, idle, post, serving
from hermes_core import Agent
from hermes_core.config import GatewayConfig, PermissionsConfig, Settings
from hermes_core.gateway.runner import AgentRunner
from hermes_core.gateway.server import build_gateway
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.pending import SQLiteInteractions
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_feishu.cards import buttons
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from hermes_core.tools.clarify import clarify
from invoicing import RAN, send_invoice
from serve_process import clean_environ
from waiting import eventually


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


def invoice_model() -> ScriptedModel:
    return ScriptedModel([call("send_invoice", {"customer": "ACME", "amount": 120}), reply("Invoice sent.")])


@asynccontextmanager
async def webhook_server(tmp_path: Path, model: ScriptedModel, ttl: float = 600) -> AsyncIterator[str]:
    settings = Settings(gateway=GatewayConfig(data_dir=str(tmp_path)),
                        permissions=PermissionsConfig(admins=["webhook:boss"], approval_ttl=ttl))  # fmt: skip
    admins = Policy.from_lists(admins=["webhook:boss"])
    agent = Agent(model=model, tools=[send_invoice, clarify], permissions=admins)
    gateway, routes = build_gateway(settings, agent)
    gateway.expiry_interval = 0.05
    async with serving(gateway, routes) as url:
        yield url
    await gateway.runner.aclose()  # type: ignore[attr-defined]


async def test_webhook_approval_named_by_id_and_decided_by_a_follow_up_request(tmp_path: Path) -> None:
    model = invoice_model()
    async with webhook_server(tmp_path, model) as url:
        status, answer = await post(f"{url}/webhook", {"message": "invoice ACME 120", "user_id": "alice"})
        assert status == 200 and RAN == []
        approval = answer["approval"]
        assert approval["tool"] == "send_invoice" and approval["requested_by"] == "webhook:alice"
        assert approval["arguments"] == {"customer": "ACME", "amount": 120}
        assert approval["id"] in answer["reply"]
        decide = f"{url}/webhook/approvals/{approval['id']}"

        assert (await post(decide, {"user_id": "mallory", "decision": "approve"}))[0] == 403
        assert (await post(decide, {"user_id": "alice", "decision": "maybe"}))[0] == 400
        assert (await post(f"{url}/webhook/approvals/ap_nope", {"user_id": "alice", "decision": "approve"}))[
            0
        ] == 404
        assert RAN == []
        status, decided = await post(decide, {"user_id": "alice", "decision": "approve"})
        assert status == 200 and decided["status"] == "approved" and decided["reply"] == "Invoice sent."
        assert RAN == ["invoice ACME 120"]
        status, again = await post(decide, {"user_id": "boss", "decision": "approve"})
        assert status == 409 and again["error"] == "approval_already_decided"
    assert RAN == ["invoice ACME 120"] and len(model.calls) == 2


async def test_webhook_approval_expires_and_the_model_hears_it(tmp_path: Path) -> None:
    model = ScriptedModel([call("send_invoice", {"customer": "ACME", "amount": 1}), reply("It expired.")])
    async with webhook_server(tmp_path, model, ttl=0.3) as url:
        _, answer = await post(f"{url}/webhook", {"message": "invoice ACME", "user_id": "alice"})
        await eventually(lambda: len(model.calls) == 2)  # the expiry resumed the task
        status, late = await post(
            f"{url}/webhook/approvals/{answer['approval']['id']}", {"user_id": "alice", "decision": "approve"}
        )
    assert status == 409 and late["error"] == "approval_expired" and RAN == []
    assert "expired" in model.calls[1].messages[-1]["content"]


async def test_webhook_clarify_question_then_the_next_message_is_the_answer(tmp_path: Path) -> None:
    model = ScriptedModel([call("clarify", {"question": "Which customer?"}), reply("Globex, noted.")])
    async with webhook_server(tmp_path, model) as url:
        _, asked = await post(f"{url}/webhook", {"message": "send the invoice", "user_id": "alice"})
        assert asked["reply"] == "Which customer?" and "approval" not in asked
        _, done = await post(f"{url}/webhook", {"message": "Globex", "user_id": "alice"})
    assert done["reply"] == "Globex, noted."
    assert json.loads(model.calls[1].messages[-1]["content"]) == {
        "question": "Which customer?",
        "answer": "Globex",
    }
    assert [m["content"] for m in model.calls[1].messages if m["role"] == "user"] == ["send the invoice"]


def card_buttons(content: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {value["decision"]: value for value in buttons(content)}


async def test_feishu_approval_card_button_callback_runs_the_tool_once_and_updates_the_card(
    tmp_path: Path,
) -> None:
    model = invoice_model()
    database = tmp_path / "agent.db"
    agent = Agent(model=model, tools=[send_invoice], journal=SQLiteTaskJournal(database),
                  interactions=SQLiteInteractions(database),
                  permissions=Policy.from_lists(admins=["feishu:ou_boss"]))  # fmt: skip
    async with FakeFeishu(encrypt_key="card-key", time_scale=0.001) as feishu:
        async with feishu_gateway(tmp_path, feishu, AgentRunner(agent)) as (gateway, url):
            ask = feishu.user_message("给 ACME 开 120 的发票", chat_id="oc_p2p", sender="ou_alice")
            assert (await feishu.push(ask, url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            card = feishu.sent[0]
            assert card.msg_type == "interactive" and "send_invoice" in card.text and "审批编号" in card.text
            buttons = card_buttons(card.content)
            assert set(buttons) == {"approve", "reject"}

            other = await feishu.push(
                feishu.card_action("ou_mallory", card.message_id, buttons["approve"]), url
            )
            assert other.ok and json.loads(other.body)["toast"]["type"] == "error"
            assert "管理员" in json.loads(other.body)["toast"]["content"]
            await eventually(lambda: idle(gateway))  # a wrongly resumed task would have run by now
            assert RAN == [] and len(feishu.sent) == 1 and feishu.patches == []

            clicked = await feishu.push(
                feishu.card_action("ou_alice", card.message_id, buttons["approve"]), url
            )
            assert clicked.ok and json.loads(clicked.body)["toast"]["type"] == "success"
            assert card_buttons(json.loads(clicked.body)["card"]["data"]) == {}  # decided at once
            await eventually(lambda: len(feishu.sent) == 2 and len(feishu.patches) == 1)
            again = await feishu.push(
                feishu.card_action("ou_alice", card.message_id, buttons["approve"]), url
            )
            assert json.loads(again.body)["toast"]["type"] == "error"
            await eventually(lambda: idle(gateway))
    assert RAN == ["invoice ACME 120"]
    assert (
        feishu.sent[1].text == "Invoice sent."
        and feishu.sent[1].reply_to == ask["event"]["message"]["message_id"]
    )
    patched = feishu.patches[0]  # the card the click's answer carried, applied by the platform
    assert patched.message_id == card.message_id and patched.method == "CALLBACK"
    assert "已批准" in patched.text and "User alice" in patched.text and "ou_alice" not in patched.text
    assert card_buttons(patched.content) == {}  # the buttons are gone once decided


def run_chat(tmp_path: Path, fake: FakeOpenAIServer, stdin: str) -> subprocess.CompletedProcess[str]:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    config = tmp_path / "hermes.yaml"
    config.write_text(
        f"model:\n  name: m\n  base_url: {fake.base_url}\nagent:\n  workspace: {workspace}\n"
        "permissions:\n  confirm: [write_file]\n",
        encoding="utf-8",
    )
    env = clean_environ()
    return subprocess.run(
        [sys.executable, "-m", "hermes_core", "--config", str(config), "chat"],
        input=stdin, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("answer", "written"), [("y", True), ("n", False)])
def test_cli_asks_yes_or_no_before_a_confirm_tool_runs(tmp_path: Path, answer: str, written: bool) -> None:
    with FakeOpenAIServer() as fake:  # served from its own thread
        fake.script(
            FakeReply.tool_call("write_file", {"path": "note.txt", "content": "hello"}),
            FakeReply.text("Done." if written else "Not written."),
        )
        done = run_chat(tmp_path, fake, f"save a note\n{answer}\nexit\n")
        tool_result = fake.requests[1].messages[-1]["content"]
    assert done.returncode == 0, done.stderr
    assert "Approve write_file" in done.stdout
    assert (tmp_path / "ws" / "note.txt").exists() is written
    assert ("rejected" in tool_result) is not written


async def test_the_gateway_forgets_journals_and_traces_past_their_retention(tmp_path: Path) -> None:
    import time

    settings = Settings(gateway=GatewayConfig(data_dir=str(tmp_path), retention_days=1))
    agent = Agent(model=ScriptedModel(lambda messages, tools: "ok"))
    gateway, _ = build_gateway(settings, agent)
    journal, traces = agent.journal, agent.tracer.store  # type: ignore[union-attr]
    await agent.run("old task", task_id="old")
    await agent.run("new task", task_id="new")
    two_days_ago = time.time() - 2 * 86400
    await journal.db.transaction(  # type: ignore[union-attr]
        lambda db: db.execute("UPDATE task_journal SET at = ? WHERE task_id = 'old'", (two_days_ago,))
    )
    await traces.db.transaction(  # type: ignore[union-attr]
        lambda db: db.execute("UPDATE traces SET started_at = ? WHERE task_id = 'old'", (two_days_ago,))
    )
    await gateway.prune()
    assert await journal.entries("old") == [] and await journal.entries("new") != []  # type: ignore[union-attr]
    assert await traces.get("old") is None and await traces.get("new") is not None  # type: ignore[union-attr]
    await gateway.store.close()
    await gateway.runner.aclose()  # type: ignore[attr-defined]


@pytest.mark.slow
def test_cli_asks_a_clarify_question_in_place(tmp_path: Path) -> None:
    with FakeOpenAIServer() as fake:
        fake.script(
            FakeReply.tool_call("clarify", {"question": "Which file, notes.txt or todo.txt?"}),
            FakeReply.text("Using todo.txt."),
        )
        done = run_chat(tmp_path, fake, "open my file\ntodo.txt\nexit\n")
        tool_result = json.loads(fake.requests[1].messages[-1]["content"])
    assert done.returncode == 0, done.stderr
    assert "Which file, notes.txt or todo.txt?" in done.stdout and "Using todo.txt." in done.stdout
    assert tool_result == {"question": "Which file, notes.txt or todo.txt?", "answer": "todo.txt"}
