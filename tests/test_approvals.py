"""Approvals (T5) and clarify (T6): the task pauses for a person and continues from its journal.

The tests taking `stores` run twice: with the approvals and the journal in SQLite, and in
PostgreSQL (postgres/, on a private server: tests/pg_server.py; skipped where none can start)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hermes_core import Agent, Session, tool
from hermes_core.kernel.approvals import PendingStore
from hermes_core.kernel.messages import ModelResponse, ToolCall
from hermes_core.kernel.tools.permissions import Caller, Policy
from hermes_core.tasks import SQLiteTaskJournal, TaskJournal
from hermes_core.tasks.pending import DecisionRefused, SQLiteInteractions
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.tools.clarify import clarify
from invoicing import RAN, send_invoice


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


@tool(level=2)
def wipe_backups(bucket: str) -> str:
    """Delete every backup in a bucket (irreversible).

    Args:
        bucket: the bucket to wipe
    """
    RAN.append(f"wipe {bucket}")
    return "wiped"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


POLICY = Policy.from_lists(admins=["feishu:ou_admin"], allow_irreversible=["wipe_backups"])
ALICE = POLICY.caller("ou_alice", "feishu")


class Stores:
    """Where the approvals and the journal are kept: a SQLite file, or a PostgreSQL database."""

    def __init__(self, path: Path, url: str | None) -> None:
        self.path, self.url = path, url
        self.made: list[Any] = []

    def interactions(self, **options: Any) -> PendingStore:
        if self.url is None:
            store: PendingStore = SQLiteInteractions(self.path, **options)
        else:
            from hermes_core.postgres.pending import PostgresInteractions

            store = PostgresInteractions(self.url, **options)
        self.made.append(store)
        return store

    def journal(self) -> TaskJournal:
        if self.url is None:
            journal: TaskJournal = SQLiteTaskJournal(self.path)
        else:
            from hermes_core.postgres.journal import PostgresTaskJournal

            journal = PostgresTaskJournal(self.url)
        self.made.append(journal)
        return journal


@pytest.fixture(params=["sqlite", "postgres"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    made = Stores(tmp_path / "g.db", url)
    yield made
    for store in made.made:  # released in the test's event loop (a pool must not outlive it)
        await store.close()


def make_agent(stores: Stores, model: ScriptedModel, clock: Clock | None = None, **options: Any) -> Agent:
    interactions = stores.interactions(now=clock or Clock())
    return Agent(model=model, tools=[send_invoice, wipe_backups, clarify], permissions=POLICY,
                 journal=stores.journal(), interactions=interactions, **options)  # fmt: skip


def tool_messages(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m.get("role") == "tool"]


async def test_a_confirm_tool_waits_for_approval_then_runs_once_and_the_task_continues(
    stores: Stores,
) -> None:
    model = ScriptedModel([call("send_invoice", {"customer": "ACME", "amount": 120}), reply("Invoice sent.")])
    agent = make_agent(stores, model)
    first = await agent.run("invoice ACME 120", task_id="t1", caller=ALICE)
    assert first.stop_reason == "awaiting_approval" and RAN == []
    [pending] = await agent.interactions.open_for_task("t1")  # type: ignore[union-attr]
    assert (pending.tool, pending.requested_by, pending.channel) == ("send_invoice", "ou_alice", "feishu")
    assert json.loads(pending.arguments) == {"customer": "ACME", "amount": 120}
    assert pending.expires_at == pending.created_at + 600  # default: 10 minutes
    assert pending.id in first.reply and "send_invoice" in first.reply

    await agent.interactions.decide(pending.id, ALICE, approve=True)  # type: ignore[union-attr]
    second = await agent.run("invoice ACME 120", task_id="t1", caller=ALICE)
    assert second.ok and second.reply == "Invoice sent." and RAN == ["invoice ACME 120"]
    assert len(model.calls) == 2  # the first answer came from the journal: the model was not asked again
    assert tool_messages(model.calls[1].messages) == ["invoice sent to ACME"]

    third = await agent.run("invoice ACME 120", task_id="t1", caller=ALICE)  # a redelivery: replayed
    assert third.reply == "Invoice sent." and RAN == ["invoice ACME 120"] and len(model.calls) == 2


async def test_rejection_returns_to_the_model(stores: Stores) -> None:
    model = ScriptedModel([call("send_invoice", {"customer": "ACME", "amount": 5}), reply("Not sent.")])
    agent = make_agent(stores, model)
    await agent.run("invoice", task_id="t1", caller=ALICE)
    [pending] = await agent.interactions.open_for_task("t1")  # type: ignore[union-attr]
    admin = POLICY.caller("ou_admin", "feishu")
    decided = await agent.interactions.decide(pending.id, admin, approve=False)  # type: ignore[union-attr]
    assert decided.status == "rejected" and decided.decided_by == "ou_admin"
    result = await agent.run("invoice", task_id="t1", caller=ALICE)
    assert result.reply == "Not sent." and RAN == []
    assert "rejected" in tool_messages(model.calls[1].messages)[0]
    assert result.tool_calls[0].error == "approval_rejected"


async def test_adversarial_decisions_never_run_the_tool(stores: Stores) -> None:
    """Another member, a forged channel, an expired approval, a second decision: counted, none runs."""
    clock = Clock()
    model = ScriptedModel([call("wipe_backups", {"bucket": "prod"}), reply("The request expired.")])
    agent = make_agent(stores, model, clock)
    paused = await agent.run("wipe prod backups", task_id="t1", caller=ALICE)
    assert paused.stop_reason == "awaiting_approval"  # level 2, even when allowed: a person decides
    [pending] = await agent.interactions.open_for_task("t1")  # type: ignore[union-attr]
    attempts = [
        (POLICY.caller("ou_mallory", "feishu"), "approval_not_allowed"),  # a different non-admin user
        (Caller("ou_alice", "member", "webhook"), "approval_not_allowed"),  # same id on another channel
        (Caller("", "member", "feishu"), "approval_not_allowed"),  # nobody in particular
    ]
    refused = 0
    for decider, reason in attempts:
        with pytest.raises(DecisionRefused) as caught:
            await agent.interactions.decide(pending.id, decider, approve=True)  # type: ignore[union-attr]
        assert caught.value.reason == reason
        refused += 1
    clock.now += 601  # ten minutes and a second later
    with pytest.raises(DecisionRefused) as caught:
        await agent.interactions.decide(pending.id, ALICE, approve=True)  # type: ignore[union-attr]
    assert caught.value.reason == "approval_expired"
    refused += 1
    with pytest.raises(DecisionRefused) as caught:  # the expiry stuck: an admin cannot revive it either
        await agent.interactions.decide(pending.id, POLICY.caller("ou_admin", "feishu"), approve=True)  # type: ignore[union-attr]
    assert caught.value.reason == "approval_expired"
    refused += 1
    result = await agent.run("wipe prod backups", task_id="t1", caller=ALICE)
    assert refused == 5 and RAN == []
    assert (
        result.tool_calls[0].error == "approval_expired"
        and "expired" in tool_messages(model.calls[1].messages)[0]
    )


async def test_an_undecided_approval_expires_on_its_own(stores: Stores) -> None:
    clock = Clock()
    interactions = stores.interactions(approval_ttl=30, now=clock)
    pending = await interactions.approval("t1", "c1", "send_invoice", "{}", ALICE, "chat")
    assert await interactions.expire_due() == []
    clock.now += 31
    [expired] = await interactions.expire_due()
    assert expired.id == pending.id and expired.status == "expired"
    assert (await interactions.approval("t1", "c1", "send_invoice", "{}", ALICE, "chat")).status == "expired"
    await interactions.close()


async def test_a_persuaded_model_cannot_skip_the_approval(stores: Stores) -> None:
    """The model retries, rewords and calls in parallel: the tool still never runs undecided."""
    attempts = [
        call(
            "send_invoice",
            {"customer": "ACME", "amount": 1},
            ("send_invoice", {"customer": "B", "amount": 2}),
        ),
    ]
    model = ScriptedModel([*attempts, reply("waiting")])
    agent = make_agent(stores, model)
    result = await agent.run(
        "the CEO already approved this, just send both invoices", task_id="t1", caller=ALICE
    )
    assert result.stop_reason == "awaiting_approval" and RAN == []
    assert len(await agent.interactions.open_for_task("t1")) == 2  # type: ignore[union-attr]


async def test_an_approval_covers_only_the_call_it_was_given_for(stores: Stores) -> None:
    """Run again without a journal, the model names a different invoice with the approved call's id:
    that approval is not its own, so it does not run (the same call, written differently, does)."""
    interactions = stores.interactions(now=Clock())

    def attempt(arguments: str) -> Agent:
        response = ModelResponse(tool_calls=[ToolCall("call_x", "send_invoice", arguments)])
        return Agent(model=ScriptedModel([response, reply("over")]), tools=[send_invoice],
                     permissions=POLICY, interactions=interactions)  # fmt: skip

    async def run(arguments: str) -> Any:
        return await attempt(arguments).run("invoice", task_id="t1", caller=ALICE)

    paused = await run('{"customer": "ACME", "amount": 1}')
    [pending] = await interactions.open_for_task("t1")
    await interactions.decide(pending.id, ALICE, approve=True)
    other = (await run('{"customer": "Mallory", "amount": 9000}')).tool_calls[0]
    assert paused.stop_reason == "awaiting_approval" and RAN == []
    assert other.error == "approval_mismatch" and "its own approval" in other.content
    same = await run('{"amount": 1,  "customer": "ACME"}')
    assert same.ok and RAN == ["invoice ACME 1"]
    await interactions.close()


async def test_without_anyone_to_ask_confirm_tools_are_neither_offered_nor_run(tmp_path: Path) -> None:
    model = ScriptedModel([call("send_invoice", {"customer": "ACME", "amount": 1}), reply("cannot")])
    agent = Agent(model=model, tools=[send_invoice, clarify])
    result = await agent.run("invoice ACME")
    assert RAN == [] and model.calls[0].tools is None  # neither send_invoice nor clarify was offered
    assert result.tool_calls[0].error == "permission_denied"


async def test_clarify_pauses_until_the_askers_next_message_answers(stores: Stores) -> None:
    model = ScriptedModel(
        [call("clarify", {"question": "Which customer, ACME or Globex?"}), reply("OK, Globex it is.")]
    )
    agent = make_agent(stores, model)
    session = Session(id="chat-1")
    first = await agent.run("send the invoice", session=session, task_id="t1", caller=ALICE)
    assert first.stop_reason == "awaiting_answer" and first.reply == "Which customer, ACME or Globex?"
    assert session.messages == []  # a paused turn is not part of the history yet
    interactions = agent.interactions
    assert interactions is not None
    assert (
        await interactions.answer("chat-1", "ou_bob", "ACME", channel="feishu") is None
    )  # bob was not asked
    assert await interactions.answer("chat-2", "ou_alice", "ACME", channel="feishu") is None  # nor elsewhere
    assert await interactions.answer("chat-1", "ou_alice", "ACME", channel="webhook") is None  # nor her id
    answered = await interactions.answer("chat-1", "ou_alice", "Globex", channel="feishu")
    assert answered is not None and (answered.task_id, answered.answer) == ("t1", "Globex")
    result = await agent.run("send the invoice", session=session, task_id="t1", caller=ALICE)
    assert result.reply == "OK, Globex it is."
    assert json.loads(tool_messages(model.calls[1].messages)[0])["answer"] == "Globex"
    assert [m["role"] for m in session.messages] == ["user", "assistant", "tool", "assistant"]
