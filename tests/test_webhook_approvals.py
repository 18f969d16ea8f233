"""A synchronous webhook caller learns how its approval was settled (issue 29, item 5), and the
approval it is shown is the one docs/webhook.md documents.

Before, a retry with the same `message_id` kept answering the approval request ("pending") after
the approval had been decided in the console: the decision runs the task on under another message
(channels/seam.py `resume_message`), which the retry never looked at. And the approval's `arguments`
came as JSON text and `requested_by` without its channel, unlike the page. The cases are the page's
own promises — a retry "never runs it twice: the answer is the first one's reply", the approval
example under "Approvals" — and the three ways an approval is settled (kernel/approvals.py: approve,
reject, expiry), decided from the console's API, by a decision as a Feishu card sends it
(`Gateway.decide` on the `feishu` channel), and by the gateway's expiry.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway_harness import post, serve_here, serving
from hermes_core import Agent, tool
from hermes_core.config import GatewayConfig, PermissionsConfig, Settings
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.server import build_gateway
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.testing import ScriptedModel, call, reply
from invoicing import RAN, send_invoice
from waiting import eventually

PAGE = Path(__file__).resolve().parents[1] / "docs" / "webhook.md"
ADMINS = ["webhook:boss", "feishu:ou_boss"]


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


def invoice_model(after: str = "Invoice sent.") -> ScriptedModel:
    return ScriptedModel([call("send_invoice", {"customer": "ACME", "amount": 120}), reply(after)])


@asynccontextmanager
async def gateway_serving(
    tmp_path: Path, model: ScriptedModel, ttl: float = 600, tools: list[Any] | None = None
) -> AsyncIterator[tuple[Gateway, str]]:
    """The gateway serve builds (webhook, approvals, journal), on a free port: it and its URL."""
    settings = Settings(gateway=GatewayConfig(data_dir=str(tmp_path)),
                        permissions=PermissionsConfig(admins=ADMINS, approval_ttl=ttl))  # fmt: skip
    agent = Agent(model=model, tools=tools or [send_invoice], permissions=Policy.from_lists(admins=ADMINS))
    gateway, routes = build_gateway(settings, agent)
    gateway.expiry_interval = 0.05
    async with serving(gateway, routes) as url:
        yield gateway, url
    await gateway.runner.aclose()  # type: ignore[attr-defined]


@asynccontextmanager
async def served(tmp_path: Path, model: ScriptedModel) -> AsyncIterator[str]:
    """The real `serve` (webhook and console) in this event loop: its URL."""
    settings = Settings(gateway=GatewayConfig(data_dir=str(tmp_path), shutdown_grace=1))
    async with serve_here(settings, Agent(model=model, tools=[send_invoice])) as url:
        yield url


async def ask(url: str, message_id: str, text: str = "invoice ACME 120", **extra: Any) -> dict[str, Any]:
    body = {"message": text, "user_id": "alice", "message_id": message_id, **extra}
    status, answer = await post(f"{url}/webhook", body)
    assert status == 200, answer
    return answer


async def test_a_retry_after_a_console_approval_gets_the_reply_of_the_task_run_on(tmp_path: Path) -> None:
    """Asked, retried while undecided (the approval again), approved in the console, retried: the
    reply of the task once it ran on, marked a duplicate; the tool ran once, whatever the retries."""
    async with served(tmp_path, invoice_model()) as url:
        first = await ask(url, "m-1")
        approval = first["approval"]
        undecided = await ask(url, "m-1")
        assert undecided["duplicate"] is True and undecided["approval"]["status"] == "pending"
        async with aiohttp.ClientSession() as http, http.post(
            f"{url}/console/api/approvals/{approval['id']}", json={"decision": "approve"},
            headers={"Origin": url},
        ) as decided:  # fmt: skip
            assert decided.status == 200, await decided.text()
        await eventually(lambda: RAN == ["invoice ACME 120"])
        retries = [await ask(url, "m-1") for _ in range(2)]
    for answer in retries:
        assert (answer["reply"], answer["ok"], answer["duplicate"]) == ("Invoice sent.", True, True)
        assert "approval" not in answer
    assert RAN == ["invoice ACME 120"]


@pytest.mark.parametrize("settle", ["reject", "expire"])
async def test_a_refused_or_expired_approval_answers_the_retry_with_the_outcome(
    tmp_path: Path, settle: str
) -> None:
    """Rejected (as a Feishu card decides: the gateway's `decide` on the `feishu` channel) or left to
    expire: the retry gets the task's answer once the model has heard it, not the request again."""
    model = invoice_model(after="I did not send the invoice: it was not approved.")
    async with gateway_serving(tmp_path, model, ttl=0.3 if settle == "expire" else 600) as (gateway, url):
        approval = (await ask(url, "m-2"))["approval"]
        if settle == "reject":
            await gateway.decide(approval["id"], "ou_boss", "feishu", False)
        await eventually(lambda: len(model.calls) == 2)  # the model was told, and answered
        answer = await ask(url, "m-2")
    assert answer["reply"] == "I did not send the invoice: it was not approved."
    assert answer["duplicate"] is True and "approval" not in answer and RAN == []


async def test_a_task_asking_twice_is_followed_from_one_approval_to_the_next(tmp_path: Path) -> None:
    """Two approvals in one task: after the first is approved the retry shows the second request
    (the task's run on paused again); after the second, the task's last reply."""
    model = ScriptedModel([
        call("send_invoice", {"customer": "ACME", "amount": 120}),
        call("send_invoice", {"customer": "Globex", "amount": 80}),
        reply("Both invoices sent."),
    ])  # fmt: skip
    async with gateway_serving(tmp_path, model) as (gateway, url):
        first = (await ask(url, "m-3"))["approval"]
        await gateway.decide(first["id"], "alice", "webhook", True)
        await eventually(lambda: len(model.calls) == 2)
        second = await ask(url, "m-3")
        assert second["approval"]["id"] != first["id"]
        assert second["approval"]["arguments"] == {"customer": "Globex", "amount": 80}
        await gateway.decide(second["approval"]["id"], "alice", "webhook", True)
        await eventually(lambda: len(model.calls) == 3)
        done = await ask(url, "m-3")
        streamed = await events(url, "m-3")
    assert done["reply"] == "Both invoices sent." and "approval" not in done
    assert RAN == ["invoice ACME 120", "invoice Globex 80"]
    assert streamed[-1][0] == "done" and streamed[-1][1]["reply"] == "Both invoices sent."


async def test_a_retry_while_the_approved_task_still_runs_waits_for_its_reply(tmp_path: Path) -> None:
    """Approved, but the tool is still running when the caller asks again: the retry waits for the
    task's reply (as a retry of a running message does), instead of answering the request again."""
    release = asyncio.Event()

    @tool(confirm=True)
    async def refund(order: str) -> str:
        """Refund an order (needs approval; finishes when the test lets it).

        Args:
            order: the order id
        """
        await release.wait()
        return f"refunded {order}"

    model = ScriptedModel([call("refund", {"order": "A-1"}), reply("Refunded A-1.")])
    async with gateway_serving(tmp_path, model, tools=[refund]) as (gateway, url):
        approval = (await ask(url, "m-5", "refund A-1"))["approval"]
        await gateway.decide(approval["id"], "alice", "webhook", True)
        retry = asyncio.create_task(ask(url, "m-5", "refund A-1"))
        parked = gateway.channels["webhook"]._waiting  # type: ignore[attr-defined]  # requests awaiting a reply
        await eventually(lambda: retry.done() or parked, what="the retry parked for the task's reply")
        assert not retry.done()  # waiting for the task, not answering the request again
        release.set()
        answer = await asyncio.wait_for(retry, 20)
    assert (answer["reply"], answer["duplicate"]) == ("Refunded A-1.", True)


async def events(url: str, message_id: str) -> list[tuple[str, dict[str, Any]]]:
    """A `"stream": true` retry: its events, in order."""
    body = {"message": "invoice ACME 120", "user_id": "alice", "message_id": message_id, "stream": True}
    async with aiohttp.ClientSession() as http, http.post(f"{url}/webhook", json=body) as response:
        text = await response.text()
    found = re.findall(r"event: (\w+)\ndata: (.*)\n", text)
    return [(name, json.loads(data)) for name, data in found]


def documented_approval_answer() -> dict[str, Any]:
    """The JSON example under "## Approvals" in docs/webhook.md, with its `…` placeholders."""
    section = PAGE.read_text(encoding="utf-8").split("## Approvals", 1)[1]
    block = re.search(r"```json\n(.*?)```", section, re.DOTALL)
    assert block, "docs/webhook.md: no JSON example under Approvals"
    parsed: dict[str, Any] = json.loads(block.group(1))
    return parsed


async def test_the_approval_answer_is_the_one_docs_webhook_md_shows(tmp_path: Path) -> None:
    """The page's example and a real answer have the same fields, of the same JSON types, at both
    levels: `arguments` an object (not a JSON string), `requested_by` qualified by its channel."""
    documented = documented_approval_answer()
    async with gateway_serving(tmp_path, invoice_model()) as (_, url):
        real = await ask(url, "m-4")

    def shape(answer: dict[str, Any]) -> dict[str, str]:
        return {key: type(value).__name__ for key, value in answer.items()}

    assert shape(real) == shape(documented)
    assert shape(real["approval"]) == shape(documented["approval"])
    assert real["approval"]["arguments"] == {"customer": "ACME", "amount": 120}
    assert real["approval"]["requested_by"] == "webhook:alice"
    assert documented["approval"]["requested_by"].startswith("webhook:")


async def test_the_approval_text_writes_out_bidi_and_zero_width_controls(tmp_path: Path) -> None:
    """Issue 31, attack 15, on the webhook: the reply text a caller shows its approver had the raw
    right-to-left override (U+202E, Unicode TR9; "Trojan Source", CVE-2021-42574), so it read
    `fdp.exe` reversed. Now the text names each control (`<U+202E>`); `approval.arguments` stays the
    object the tool will get, byte for byte."""
    customer = "ACME \u202eexe.fdp\u202c z\u200bero"
    model = ScriptedModel([call("send_invoice", {"customer": customer, "amount": 120}), reply("sent")])
    async with gateway_serving(tmp_path, model) as (_, url):
        real = await ask(url, "m-bidi")
    assert "ACME <U+202E>exe.fdp<U+202C> z<U+200B>ero" in real["reply"]
    assert not {"\u202e", "\u202c", "\u200b"} & set(real["reply"])
    assert real["approval"]["arguments"] == {"customer": customer, "amount": 120}
