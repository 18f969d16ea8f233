"""The contract of the approvals desk: `PendingStore` (kernel/approvals.py), where pauses wait and are
decided, and the `ApprovalDesk` the gateway takes decisions through (gateway/runner.py's
`AgentRunner` over the store). Through the protocols only, for every registered backend
(tests/contracts/conftest.py); the clock is the test's (`Clock`), so expiry needs no waiting.

An approval is made once per (task, call); only the requester — the same id on the same channel —
or an admin decides, once, even when decisions race; an undecided one expires, and a late decision
is refused as expired; a question is answered by its asker only; open records are listed; the
message that resumes the task is kept with them; a record decided elsewhere (`PendingRecords`,
tasks/pending.py: a workflow engine) is kept, and only its outcome set again; a reopen keeps it all.

How each test was seen to fail: tests/contracts/broken_backends.py has stores with one bug each
(a decision read then written in two steps, expiry never checked, any user on any channel
allowed…), and test_contracts_fail_when_broken.py checks that each test here fails against one.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from contract_backends import Clock, Opener

from hermes_core import Agent
from hermes_core.gateway.runner import AgentRunner
from hermes_core.kernel.approvals import DecisionRefused, Pending, PendingStore
from hermes_core.kernel.tools.permissions import ADMIN, Caller, Policy
from hermes_core.tasks.pending import PendingRecords
from hermes_core.testing import ScriptedModel

TTL = 600.0  # tests/contracts/conftest.py's APPROVAL_TTL
Stores = Opener[PendingRecords]
ALICE = Caller("ou_alice", channel="feishu")


async def approval(store: PendingStore, call_id: str = "c1", task_id: str = "t1", caller: Caller = ALICE,
                   arguments: str = '{"to": "boss"}') -> Pending:  # fmt: skip
    return await store.approval(task_id, call_id, "send_invoice", arguments, caller, "feishu:oc_1")


async def refusal(store: PendingStore, pending_id: str, decider: Caller, approve: bool = True) -> str:
    with pytest.raises(DecisionRefused) as refused:
        await store.decide(pending_id, decider, approve)
    return refused.value.reason


async def test_an_approval_is_made_once_per_task_and_call(pending_stores: Stores, clock: Clock) -> None:
    store = pending_stores()
    first = await approval(store)
    assert (first.kind, first.status, first.task_id, first.call_id, first.tool) == (
        "approval", "pending", "t1", "c1", "send_invoice",
    )  # fmt: skip
    assert (first.requested_by, first.channel, first.conversation) == ("ou_alice", "feishu", "feishu:oc_1")
    assert (first.created_at, first.expires_at) == (clock.now, clock.now + TTL)
    again = await approval(store)
    assert again.id == first.id and again.status == "pending"
    others = {(await approval(store, call_id="c2")).id, (await approval(store, task_id="t2")).id}
    assert len(others | {first.id}) == 3
    assert await store.get(first.id) == first


async def test_the_requester_decides_and_the_decision_is_kept(pending_stores: Stores, clock: Clock) -> None:
    store = pending_stores()
    pending = await approval(store)
    rejected = await approval(store, call_id="c2")
    clock.now += 5
    decided = await store.decide(pending.id, ALICE, True)
    assert (decided.id, decided.status, decided.decided_by, decided.decided_at) == (
        pending.id, "approved", "ou_alice", clock.now,
    )  # fmt: skip
    assert (await store.decide(rejected.id, ALICE, False)).status == "rejected"
    found = await store.get(pending.id)
    assert found is not None and found.status == "approved" and not found.open
    assert (await approval(store)).status == "approved"  # the re-run finds its decision
    assert (await approval(store, call_id="c2")).status == "rejected"


async def test_a_decision_is_taken_once(pending_stores: Stores) -> None:
    store = pending_stores()
    pending = await approval(store)
    await store.decide(pending.id, ALICE, True)
    assert await refusal(store, pending.id, ALICE, approve=False) == "approval_already_decided"
    assert await refusal(store, pending.id, Caller("boss", ADMIN, "feishu")) == "approval_already_decided"
    found = await store.get(pending.id)
    assert found is not None and found.status == "approved"


async def test_racing_decisions_take_exactly_one(pending_stores: Stores) -> None:
    """Two people pressing a card's buttons at once (or a retried request): one decision wins."""
    store = pending_stores()
    pending = await approval(store)

    async def decide(approve: bool) -> str:
        try:
            return (await store.decide(pending.id, ALICE, approve)).status
        except DecisionRefused as refused:
            return refused.reason

    outcomes = await asyncio.gather(*(decide(i % 2 == 0) for i in range(10)))
    taken = [o for o in outcomes if o in ("approved", "rejected")]
    assert len(taken) == 1 and outcomes.count("approval_already_decided") == 9
    found = await store.get(pending.id)
    assert found is not None and found.status == taken[0]


async def test_only_the_requester_on_the_same_channel_or_an_admin_decides(pending_stores: Stores) -> None:
    store = pending_stores()
    pending = await approval(store)
    assert await refusal(store, pending.id, Caller("ou_mallory", channel="feishu")) == "approval_not_allowed"
    assert await refusal(store, pending.id, Caller("ou_alice", channel="webhook")) == "approval_not_allowed"
    assert await refusal(store, pending.id, Caller("", channel="feishu")) == "approval_not_allowed"
    assert (await store.get(pending.id) or pending).status == "pending"  # refusals changed nothing
    assert (await store.decide(pending.id, Caller("boss", ADMIN, "console"), False)).decided_by == "boss"


async def test_unknown_ids_and_questions_are_not_decided(pending_stores: Stores) -> None:
    store = pending_stores()
    question = await store.question("t1", "c9", "Which region?", ALICE, "feishu:oc_1")
    assert await refusal(store, "ap_missing", ALICE) == "approval_unknown"
    assert await refusal(store, question.id, ALICE) == "approval_unknown"
    assert await store.get("ap_missing") is None


async def test_an_undecided_approval_expires_once_its_time_is_past(
    pending_stores: Stores, clock: Clock
) -> None:
    store = pending_stores()
    due = await approval(store)
    clock.now += TTL / 2
    later = await approval(store, call_id="c2")
    decided = await approval(store, call_id="c3")
    await store.decide(decided.id, ALICE, True)
    assert await store.expire_due() == []
    clock.now += TTL / 2
    expired = await store.expire_due()
    assert [p.id for p in expired] == [due.id] and expired[0].status == "expired"
    assert await store.expire_due() == []  # each expires once
    assert [(p.id, p.status) for p in await store.expire_due(now=clock.now + TTL)] == [(later.id, "expired")]
    assert (await store.get(decided.id) or decided).status == "approved"
    assert await refusal(store, due.id, ALICE) == "approval_expired"


async def test_a_late_decision_is_refused_and_the_approval_stays_expired(
    pending_stores: Stores, clock: Clock
) -> None:
    """Past its time, before any expiry sweep: the decision is refused, the record reads expired,
    and the call's re-run reads expired too."""
    store = pending_stores()
    pending = await approval(store)
    other = await approval(store, call_id="c2")
    clock.now += TTL + 1
    assert await refusal(store, pending.id, ALICE) == "approval_expired"
    assert (await store.get(pending.id) or pending).status == "expired"
    assert (await approval(store, call_id="c2")).status == "expired"
    assert (await store.get(other.id) or other).status == "expired"
    assert await store.expire_due() == []  # both were seen expired: neither expires twice


async def test_a_question_is_answered_by_its_asker_only(pending_stores: Stores) -> None:
    store = pending_stores()
    asked = await store.question("t1", "c1", "Which region?", ALICE, "feishu:oc_1")
    assert (asked.kind, asked.status, asked.arguments) == ("question", "pending", "Which region?")
    assert (await store.question("t1", "c1", "Which region?", ALICE, "feishu:oc_1")).id == asked.id
    assert await store.answer("feishu:oc_1", "ou_mallory", "North", channel="feishu") is None
    assert await store.answer("feishu:oc_1", "ou_alice", "North", channel="webhook") is None
    assert await store.answer("feishu:oc_2", "ou_alice", "North", channel="feishu") is None
    answered = await store.answer("feishu:oc_1", "ou_alice", "East", channel="feishu")
    assert answered is not None and (answered.id, answered.status, answered.answer) == (
        asked.id,
        "answered",
        "East",
    )
    assert await store.answer("feishu:oc_1", "ou_alice", "a later message", channel="feishu") is None
    found = await store.question("t1", "c1", "Which region?", ALICE, "feishu:oc_1")
    assert (found.status, found.answer) == ("answered", "East")


async def test_open_records_are_listed(pending_stores: Stores, clock: Clock) -> None:
    store = pending_stores()
    first = await approval(store)
    clock.now += 1
    asked = await store.question("t1", "c2", "Which region?", ALICE, "feishu:oc_1")
    clock.now += 1
    decided = await approval(store, call_id="c3")
    await store.decide(decided.id, ALICE, True)
    clock.now += 1
    elsewhere = await approval(store, task_id="t2")
    assert [p.id for p in await store.open_for_task("t1")] == [first.id, asked.id]  # oldest first
    assert [p.id for p in await store.list("pending")] == [elsewhere.id, asked.id, first.id]  # newest first
    assert [p.id for p in await store.list("approved")] == [decided.id]
    assert [p.id for p in await store.list(None, limit=2)] == [elsewhere.id, decided.id]


async def test_the_message_that_resumes_the_task_is_kept_with_its_open_records(
    pending_stores: Stores,
) -> None:
    store = pending_stores()
    decided = await approval(store, call_id="c0")
    await store.decide(decided.id, ALICE, True)
    pending = await approval(store)
    resume = {"channel": "feishu", "conversation": "feishu:oc_1", "text": "发票 ≤ 5000", "extra": {"n": [1]}}
    await store.set_resume("t1", resume)
    found = await store.get(pending.id)
    assert found is not None and found.resume == resume and "resume" not in found.summary()
    assert (await store.get(decided.id) or decided).resume is None  # decided before: not touched
    assert (await store.decide(pending.id, ALICE, True)).resume == resume  # what the gateway runs again


async def test_a_record_decided_elsewhere_is_kept_and_only_its_outcome_set(
    pending_stores: Stores, clock: Clock
) -> None:
    """A workflow engine decides in the workflow and keeps the records for the approvals list."""
    store = pending_stores()
    asked = Pending("ap_wf1", "approval", "t1", "c1", "send_invoice", '{"to": "boss"}', "ou_alice", "feishu",
                    "feishu:oc_1", clock.now, clock.now + TTL)  # fmt: skip
    question = Pending("ap_wf2", "question", "t1", "c2", "clarify", "Which boss?", "ou_alice", "feishu",
                       "feishu:oc_1", clock.now + 1)  # fmt: skip
    await store.record(asked)
    await store.record(question)
    assert await store.get("ap_wf1") == asked
    assert [p.id for p in await store.open_for_task("t1")] == ["ap_wf1", "ap_wf2"]
    outcome = dataclasses.replace(asked, status="approved", decided_by="ou_alice", decided_at=clock.now + 5)
    decided = dataclasses.replace(outcome, tool="changed", arguments="{}", resume={"text": "again"})
    await store.record(decided)
    await store.record(decided)  # recorded again (a step run again): nothing more changes
    answered = dataclasses.replace(question, status="answered", decided_by="ou_alice", answer="Bob")
    await store.record(answered)
    assert await store.get("ap_wf1") == outcome  # the request as first recorded, its outcome set
    assert await store.get("ap_wf2") == answered
    assert await store.open_for_task("t1") == []
    store = await pending_stores.reopen(store)
    assert [p.id for p in await store.list(None)] == ["ap_wf2", "ap_wf1"]


async def test_records_survive_a_reopen(pending_stores: Stores) -> None:
    store = pending_stores()
    pending = await approval(store)
    decided = await approval(store, call_id="c2")
    await store.decide(decided.id, ALICE, False)
    store = await pending_stores.reopen(store)
    assert (await approval(store)).id == pending.id
    assert (await store.get(decided.id) or decided).status == "rejected"
    assert await refusal(store, decided.id, ALICE) == "approval_already_decided"


async def test_the_desk_decides_by_platform_id_and_channel(pending_stores: Stores, clock: Clock) -> None:
    """The gateway's desk (`AgentRunner`): a decision by (user id, channel), roles from the policy."""
    store = pending_stores()
    agent = Agent(model=ScriptedModel([]), permissions=Policy(admins=frozenset({"webhook:ops"})))
    agent.use_interactions(store)
    desk = AgentRunner(agent)
    first, second = await approval(store), await approval(store, call_id="c2")
    third = await approval(store, call_id="c3")
    with pytest.raises(DecisionRefused, match="approval_not_allowed"):
        await desk.decide(first.id, "ou_alice", "webhook", True)  # the same id elsewhere is someone else
    assert (await desk.decide(first.id, "ou_alice", "feishu", True)).status == "approved"
    assert (await desk.decide(second.id, "ops", "webhook", False)).status == "rejected"  # an admin
    clock.now += TTL + 1
    assert [p.id for p in await desk.expire_due()] == [third.id]
