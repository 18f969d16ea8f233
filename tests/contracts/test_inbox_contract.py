"""The contract of the inbox and its dispatch: what a channel may rely on when it hands a message to
`Inbox.accept` (channels/seam.py), whatever engine runs the turns behind it. Built by each
registered backend's `dispatcher` over its gateway store (tests/contracts/contract_backends.py; by
default the `Gateway` of gateway/dispatcher.py), with a real channel that records what it is sent.

Accepting only while running; one run per message however often it is delivered, a duplicate
told at the ack (also after a restart); one turn in
flight per conversation, in arrival order, while other conversations go on; a reply retried under
one idempotency key until delivered; replies sent in order, read back by a retry; an accepted
message answered after a restart; an approval's decision resuming its task once; a replayed
signature refused. Where an engine differs by design it declares it (`Backend.differs`, named in
contract_backends.py `DIFFERENCES`): the test of it skips there, saying why.

How each test was seen to fail: tests/contracts/broken_backends.py has dispatchers and stores with
one bug each (two turns of a conversation at once, replies sent newest first, messages lost at a
stop…), and test_contracts_fail_when_broken.py checks that each test here fails against one of
them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from contract_backends import Backend, Dispatcher

from hermes_core import Agent
from hermes_core.channels.base import Channel, DeliveryError
from hermes_core.channels.seam import InboundMessage, OutboundMessage, Reply
from hermes_core.gateway.dispatcher import Runner
from hermes_core.gateway.runner import AgentRunner
from hermes_core.kernel.approvals import ApprovalDesk, DecisionRefused
from hermes_core.kernel.tools.permissions import Caller
from hermes_core.testing import ScriptedModel
from waiting import eventually


class Recording(Channel):
    """Delivers nowhere: keeps what it was sent; fails the first `failures` sends of each reply."""

    name = "chat"

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.tries: dict[str, int] = {}
        self.sent: list[OutboundMessage] = []

    async def send(self, message: OutboundMessage) -> str | None:
        self.tries[message.uuid] = self.tries.get(message.uuid, 0) + 1
        if self.tries[message.uuid] <= self.failures:
            raise DeliveryError("platform busy", retry_after=0.01)
        self.sent.append(message)
        return f"om_{len(self.sent)}"

    def texts(self, conversation: str | None = None) -> list[str | Reply]:
        return [m.text for m in self.sent if conversation is None or m.conversation == conversation]


def message(text: str, message_id: str, user: str = "alice", event_id: str | None = None) -> InboundMessage:
    return InboundMessage("chat", f"chat:{user}", user, text, message_id, event_id=event_id)


async def echo(message: InboundMessage) -> list[str | Reply]:
    return [f"echo: {message.text}"]


@asynccontextmanager
async def running(
    backend: Backend, runner: Runner = echo, channel: Channel | None = None, desk: ApprovalDesk | None = None
) -> AsyncIterator[Dispatcher]:
    if backend.gateway_store is None:
        pytest.skip("this backend has no gateway store")
    inbox = backend.dispatcher(backend.gateway_store(), runner, desk)
    inbox.add_channel(channel or Recording())
    await inbox.start()
    try:
        yield inbox
    finally:
        await inbox.stop(grace=0.2)


async def test_it_accepts_only_while_running(backend: Backend) -> None:
    if backend.gateway_store is None:
        pytest.skip("this backend has no gateway store")
    inbox = backend.dispatcher(backend.gateway_store(), echo, None)
    channel = Recording()
    inbox.add_channel(channel)
    assert inbox.accepting is False
    with pytest.raises(RuntimeError):
        await inbox.accept(message("too early", "m0"))
    await inbox.start()
    assert inbox.accepting is True
    assert await inbox.accept(message("hi", "m1")) is not None
    await eventually(lambda: channel.texts() == ["echo: hi"])
    await inbox.stop(grace=1)
    assert inbox.accepting is False
    with pytest.raises(RuntimeError):
        await inbox.accept(message("too late", "m2"))


async def test_a_message_runs_once_however_often_it_is_delivered(backend: Backend) -> None:
    ran: list[str] = []

    async def runner(message: InboundMessage) -> list[str | Reply]:
        ran.append(message.message_id)
        return [f"echo: {message.text}"]

    channel = Recording()
    async with running(backend, runner, channel) as inbox:
        assert await inbox.accept(message("hi", "m1", event_id="ev_1")) is not None
        await asyncio.gather(*(inbox.accept(message("hi", "m1", event_id="ev_1")) for _ in range(5)))
        await inbox.accept(message("hi", "m1-resent", event_id="ev_1"))  # the same delivery
        assert await inbox.accept(message("next", "m2")) is not None
        await eventually(lambda: len(channel.sent) == 2)
    assert ran == ["m1", "m2"] and channel.texts() == ["echo: hi", "echo: next"]


async def test_a_duplicate_is_told_at_the_ack_also_after_a_restart(backend: Backend) -> None:
    """`accept` answers None for a message it has (the channel acks it without waiting)."""
    backend.skip_where_it_differs("duplicate_acknowledged")
    channel = Recording()
    async with running(backend, echo, channel) as inbox:
        assert await inbox.accept(message("hi", "m1", event_id="ev_1")) is not None
        again = await asyncio.gather(*(inbox.accept(message("hi", "m1", event_id="ev_1")) for _ in range(5)))
        other_id = await inbox.accept(message("hi", "m1-resent", event_id="ev_1"))  # the same delivery
        assert again == [None] * 5 and other_id is None
        await eventually(lambda: channel.texts() == ["echo: hi"])
    async with running(backend, echo, Recording()) as inbox:
        assert await inbox.accept(message("hi", "m1", event_id="ev_2")) is None


async def test_one_turn_per_conversation_in_arrival_order_while_others_go_on(backend: Backend) -> None:
    """Alice's first turn is held until Bob's two turns are done: Bob's conversation went on
    meanwhile, and none of Alice's later messages started before her first one ended."""
    started: list[str] = []
    running_now: dict[str, int] = {}
    overlaps: list[str] = []
    hold_alice = asyncio.Event()

    async def runner(message: InboundMessage) -> list[str | Reply]:
        started.append(message.text)
        running_now[message.conversation] = running_now.get(message.conversation, 0) + 1
        if running_now[message.conversation] > 1:
            overlaps.append(message.text)
        if message.text == "alice-0":
            await hold_alice.wait()
        await asyncio.sleep(0)
        running_now[message.conversation] -= 1
        return [message.text]

    channel = Recording()
    async with running(backend, runner, channel) as inbox:
        for i in range(3):
            await inbox.accept(message(f"alice-{i}", f"a{i}", "alice"))
        for i in range(2):
            await inbox.accept(message(f"bob-{i}", f"b{i}", "bob"))
        await eventually(lambda: channel.texts("chat:bob") == ["bob-0", "bob-1"])
        assert [text for text in started if text.startswith("alice")] == ["alice-0"]
        hold_alice.set()
        await eventually(lambda: len(channel.sent) == 5)
    assert overlaps == []
    assert channel.texts("chat:alice") == ["alice-0", "alice-1", "alice-2"]


async def test_a_reply_is_sent_again_under_its_key_until_it_is_delivered(backend: Backend) -> None:
    channel = Recording(failures=2)  # the platform refuses it twice, then takes it
    async with running(backend, echo, channel) as inbox:
        await inbox.accept(message("hi", "m1"))
        await eventually(lambda: len(channel.sent) == 1)
    [sent] = channel.sent
    assert sent.text == "echo: hi" and channel.tries == {sent.uuid: 3}  # one idempotency key


async def test_replies_go_out_in_order_and_a_retry_reads_them_back(backend: Backend) -> None:
    backend.skip_where_it_differs("one_reply_per_turn")

    async def three(message: InboundMessage) -> list[str | Reply]:
        return [f"{message.text} {i}" for i in range(3)]

    channel = Recording(failures=2)  # every reply fails twice before it is delivered
    async with running(backend, three, channel) as inbox:
        await inbox.accept(message("part", "m1"))
        await eventually(lambda: len(channel.sent) == 3)
        earlier = await inbox.store.replies_of("chat", "m1")
    assert channel.texts() == ["part 0", "part 1", "part 2"]
    assert all(tries == 3 for tries in channel.tries.values())
    assert earlier is not None and earlier.done and earlier.message.text == "part"
    assert [r.text for r in earlier.replies] == ["part 0", "part 1", "part 2"]
    assert [r.uuid for r in earlier.replies] == [m.uuid for m in channel.sent]


async def test_an_accepted_message_is_answered_after_a_restart(backend: Backend) -> None:
    """Stopped while its turn ran (a deploy): the next process runs it."""
    started = asyncio.Event()

    async def stuck(message: InboundMessage) -> list[str | Reply]:
        started.set()
        await asyncio.Event().wait()  # until the stop cancels it
        return []

    async with running(backend, stuck) as inbox:
        assert await inbox.accept(message("hi", "m1")) is not None
        await asyncio.wait_for(started.wait(), 20)
    channel = Recording()
    async with running(backend, echo, channel) as inbox:
        await eventually(lambda: channel.texts() == ["echo: hi"])


async def test_a_decision_resumes_its_task_once(backend: Backend) -> None:
    if backend.pending_store is None:
        pytest.skip("this backend has no approvals store")
    backend.skip_where_it_differs("approval_waits_in_workflow")
    store = backend.pending_store(600.0, time.time)
    agent = Agent(model=ScriptedModel([]))
    agent.use_interactions(store)
    desk = AgentRunner(agent)  # the gateway's desk: decisions by (user id, channel)
    original = message("send the invoice", "m1")
    pending = await store.approval(
        "t1", "c1", "send_invoice", "{}", Caller("alice", channel="chat"), "chat:alice"
    )
    await store.set_resume("t1", dataclasses.asdict(original))
    ran: list[InboundMessage] = []

    async def runner(message: InboundMessage) -> list[str | Reply]:
        ran.append(message)
        return ["sent"]

    channel = Recording()
    try:
        async with running(backend, runner, channel, desk) as inbox:
            with pytest.raises(DecisionRefused):
                await inbox.decide(pending.id, "mallory", "chat", True)
            decided, resumed = await inbox.decide(pending.id, "alice", "chat", True)
            assert decided.status == "approved" and resumed is not None
            with pytest.raises(DecisionRefused):
                await inbox.decide(pending.id, "alice", "chat", True)
            await eventually(lambda: channel.texts() == ["sent"])
    finally:
        await store.close()
    [again] = ran
    assert (again.kind, again.text, again.conversation, again.extra["task_id"]) == (
        "resume", "send the invoice", "chat:alice", "t1",
    )  # fmt: skip


async def test_a_replayed_signature_is_refused(backend: Backend) -> None:
    async with running(backend) as inbox:
        assert await inbox.store.claim_nonce("chat", "sha256=abc", 300) is True
        assert await inbox.store.claim_nonce("chat", "sha256=abc", 300) is False
