"""A node that lost its claim on a conversation does not act on it: the claim's epoch fences each step.

The fault (issue 33, item 4): a `serve` node paused (SIGSTOP) inside a turn's model call lost its
lease; the other node took the turn over and answered; the paused node, resumed, ran the tool a
second time. The cases follow the fencing-token scheme of lease-based systems (Kleppmann, "How to
do distributed locking", 2016; Chubby's sequencers, Burrows 2006): every take of the claim gets a
larger token, and a write carrying an older token is refused by the storage itself.

- store level, two nodes (two connection pools) on one database: a journal write and `complete`
  under a claim another node has since taken are refused (`ClaimLost`) and write nothing; the
  holder's writes pass; an old epoch of the same node is refused too (an epoch is never reused,
  even after the claim row was deleted);
- real processes: two `hermes-kernel serve` nodes on one PostgreSQL (a 2 s lease), the fake Feishu
  platform and the fake model over HTTP, whose first answer is a side-effecting tool call: node A
  is stopped (SIGSTOP) while its model call is in flight, node B's sweep takes the turn up and
  answers, node A is continued (SIGCONT): the tool ran once, one reply, A's turn ended quietly.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import hermes_core
from hermes_core.channels.seam import InboundMessage, OutboundMessage
from hermes_core.postgres.database import PostgresDatabase
from hermes_core.postgres.gateway import NOW, PostgresGatewayStore
from hermes_core.postgres.journal import PostgresTaskJournal
from hermes_core.tasks.fence import CURRENT_FENCE, ClaimLost, Fence, fenced
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import Server, clean_environ, free_port
from waiting import wait_for

TASK = "task-1"
SOURCE = str(Path(hermes_core.__file__).parents[1])  # the nodes run the code under test


@pytest.fixture
async def nodes(pg_url: str) -> AsyncIterator[tuple[PostgresGatewayStore, PostgresGatewayStore]]:
    """Two gateway stores on one database, each with its own pool: two nodes."""
    first = PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url))
    second = PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url))
    yield first, second
    await first.close()
    await second.close()


async def _expire(store: PostgresGatewayStore, conversation: str) -> None:
    """The claim's lease runs out (its node stopped renewing: paused)."""
    await store._count(f"UPDATE turn_claims SET expires_at = {NOW} - 1 WHERE conversation = %s",
                       (conversation,))  # fmt: skip


async def test_a_write_under_a_claim_another_node_took_is_refused_and_writes_nothing(nodes) -> None:  # type: ignore[no-untyped-def]
    first, second = nodes
    journal_a = PostgresTaskJournal(first.db.url, database=first.db)
    journal_b = PostgresTaskJournal(second.db.url, database=second.db)
    await first.accept(InboundMessage("webhook", "webhook:u1", "u1", "hi", "m1"))
    (pending,) = await first.pending_inbound()
    assert pending.id is not None
    taken, done = asyncio.Event(), asyncio.Event()

    async def node_b() -> Fence | None:
        async with second.turn_claim(pending) as turn:
            assert turn is not None
            await journal_b.append(TASK, "model_response", {"by": "b"})  # the holder writes
            taken.set()
            await done.wait()
            return CURRENT_FENCE.get()

    async with first.turn_claim(pending) as turn:
        assert turn is not None
        old = CURRENT_FENCE.get()
        assert old is not None and old.node == first.node
        await journal_a.append(TASK, "model_response", {"by": "a"})  # still ours: written
        await _expire(first, pending.conversation)
        other = asyncio.create_task(node_b())  # its own context: its own fence
        await asyncio.wait_for(taken.wait(), 5)
        with pytest.raises(ClaimLost, match="epoch"):
            await journal_a.append(TASK, "tool_started", {"id": "c1", "turn": 0, "name": "write"})
        reply = OutboundMessage(channel="webhook", conversation="webhook:u1", text="late", uuid="u-a")
        with pytest.raises(ClaimLost):
            await first.complete(pending.id, [reply])
        done.set()
        new = await other
    assert new is not None and new.node == second.node and new.epoch > old.epoch
    assert [e.data for e in await journal_a.entries(TASK)] == [{"by": "a"}, {"by": "b"}]
    assert (await first.counts())["inbox_pending"] == 1  # not marked done by the node that lost it
    assert (await first.counts())["outbox_pending"] == 0  # and nothing queued


async def test_an_old_epoch_of_the_same_node_is_refused_after_the_claim_was_taken_again(nodes) -> None:  # type: ignore[no-untyped-def]
    """The claim row is deleted at release and inserted at the next take: the epoch comes from a
    sequence, so the new row never repeats an old number, and the node alone is not enough."""
    first, _ = nodes
    journal = PostgresTaskJournal(first.db.url, database=first.db)
    await first.accept(InboundMessage("webhook", "webhook:u1", "u1", "hi", "m1"))
    (pending,) = await first.pending_inbound()
    async with first.turn_claim(pending):
        old = CURRENT_FENCE.get()
    async with first.turn_claim(pending):
        new = CURRENT_FENCE.get()
        await journal.append(TASK, "model_response", {"epoch": "new"})
    assert old is not None and new is not None and new.epoch > old.epoch
    async with first.turn_claim(pending):
        with fenced(old), pytest.raises(ClaimLost):
            await journal.append(TASK, "model_response", {"epoch": "old"})
    assert [e.data for e in await journal.entries(TASK)] == [{"epoch": "new"}]
    assert CURRENT_FENCE.get() is None  # no claim held: no fence, writes go as before
    await journal.append(TASK, "finished", {"reply": "ok"})


LEASE = 2.0  # database.lease_seconds of the two serve nodes: each sweeps every LEASE / 3

TOOLS = '''
import os
from hermes_core import tool

@tool(level=1)
def write_record(text: str) -> str:
    """Write a record (a side effect: each execution counted)."""
    with open(os.environ["FENCE_EFFECTS"], "a") as effects:
        effects.write(text + "\\n")
    return "written"
'''


class FirstCallSlow:
    """The model: its first turn call (node A's, the one A is stopped in) answers after a second;
    every call without a tool result asks for the write, one with it answers "all done"."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: RecordedRequest) -> FakeReply:
        if request.body.get("max_tokens") == 1:  # a node's start-up check
            return FakeReply.text("ok")
        self.calls += 1
        if any(m["role"] == "tool" for m in request.messages):
            return FakeReply.text("all done")
        return FakeReply.tool_call("write_record", {"text": "weekly"}, delay=1.0 if self.calls == 1 else 0)


@pytest.mark.slow  # real PostgreSQL, real processes
def test_a_node_paused_past_its_lease_does_not_run_the_tool_again_when_it_wakes(
    pg_url: str, tmp_path: Path
) -> None:
    handler = FirstCallSlow()
    model = FakeOpenAIServer(handler=handler).start_in_thread()
    feishu = FakeFeishu(time_scale=0.001).start_in_thread()
    effects = tmp_path / "effects.txt"
    effects.touch()
    env = clean_environ(
        PYTHONPATH=os.pathsep.join([str(tmp_path), SOURCE]), FENCE_EFFECTS=str(effects),
        HERMES_BASE_URL=model.base_url, HERMES_MODEL="m", HERMES_DATABASE_URL=pg_url,
        FEISHU_APP_ID=feishu.app_id, FEISHU_APP_SECRET=feishu.app_secret,
        FEISHU_VERIFICATION_TOKEN=feishu.verification_token, FEISHU_BASE_URL=feishu.base_url,
    )  # fmt: skip
    (tmp_path / "fence_tools.py").write_text(textwrap.dedent(TOOLS), encoding="utf-8")
    nodes: list[Server] = []
    try:
        for name in ("a", "b"):
            folder = tmp_path / name
            folder.mkdir()
            # no streamed card: a node frozen inside its send's quota transaction (postgres/quota.py)
            # would hold the quota row, and the other node's reply, until it wakes
            config = f"tools: [fence_tools]\nfeishu:\n  stream: false\ndatabase:\n  lease_seconds: {LEASE}\n"
            (folder / "hermes.yaml").write_text(config, encoding="utf-8")
            port, log = free_port(), folder / "serve.log"
            command = [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "serve", "--port",
                       str(port)]  # fmt: skip
            process = subprocess.Popen(command, cwd=folder, env=env, stdout=log.open("w"),
                                       stderr=subprocess.STDOUT)  # fmt: skip
            nodes.append(Server(process, f"http://127.0.0.1:{port}", log))
        for node in nodes:
            up = lambda node=node: node.healthy() or node.process.poll() is not None  # type: ignore[misc]  # noqa: E731
            wait_for(up, what="serve to start")
            assert node.process.poll() is None, node.output()
        first, second = nodes
        envelope = feishu.user_message("weekly report", chat_id="oc_fence")
        message_id = envelope["event"]["message"]["message_id"]
        feishu.deliver(envelope, f"{first.url}/feishu/events")
        wait_for(lambda: handler.calls >= 1, what="node A's model call")
        os.kill(first.process.pid, signal.SIGSTOP)  # frozen while the model's answer is on its way
        try:
            replies = lambda: [m.text for m in feishu.sent if m.reply_to == message_id]  # noqa: E731
            wait_for(lambda: replies() == ["all done"], timeout=LEASE * 4 + 5, what="node B's reply")
            assert effects.read_text(encoding="utf-8").splitlines() == ["weekly"]  # B's write
        finally:
            os.kill(first.process.pid, signal.SIGCONT)
        woke = time.monotonic()
        lines = lambda: effects.read_text(encoding="utf-8").splitlines()  # noqa: E731
        wait_for(lambda: "not answered here" in first.output() or len(lines()) > 1, timeout=15,
             what="node A to wake and end its turn")  # fmt: skip
        print(f"\nnode A ended its turn {time.monotonic() - woke:.2f} s after waking")
        # once both nodes are idle, a second run of the tool or a second reply would be over
        wait_for(lambda: first.idle() and second.idle(), what="both nodes idle")
        assert lines() == ["weekly"]  # the tool ran once: B's
        assert replies() == ["all done"]  # one reply, no apology from A
        assert handler.calls == 3  # A's first call, B's two; A asked nothing more
        assert "not answered here" in first.output()  # logged
        assert "Traceback" not in first.output() and "X-ray" not in first.output()  # not a failed task
        assert " ERROR " not in first.output()
        assert first.process.poll() is None and second.process.poll() is None
    finally:
        for node in nodes:
            node.stop()
        feishu.stop()
        model.stop()
