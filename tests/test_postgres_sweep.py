"""A node killed mid-turn, with no node restarting and no new message: another node's sweep takes it up.

The sweep (gateway/dispatcher.py `sweep`, postgres/gateway.py `orphaned_inbound`): every third of
the claim's lease each node looks for pending messages whose conversation has no live claim and
runs them under `turn_claim`, as a restart would. Checked with real parts: two `hermes-kernel serve`
processes on one PostgreSQL database with the fake Feishu platform and the fake model over HTTP,
one of them SIGKILLed while its turn waits for the model; and two gateways in one test process,
each its own connection pool, sweeping the same dead node's messages at the same moment.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway_harness import TurnLog, idle
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.kernel.replies import REPLIES
from hermes_core.postgres.database import PostgresDatabase
from hermes_core.postgres.gateway import NOW, PostgresGatewayStore
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import Server, clean_environ, free_port
from test_gateway import FlakyChannel, inbound
from waiting import eventually, wait_for

pytestmark = pytest.mark.slow  # real PostgreSQL, real processes

EXPIRY = 3.0  # s after the dead node is written until its claims run out (test below)
LEASE = 2.0  # database.lease_seconds of the two serve nodes: each sweeps every LEASE / 3

TOOLS = '''
import os, time
from hermes_core import tool

def mark(text):
    with open(os.environ["SWEEP_MARKS"], "a") as marks:
        marks.write(text + "\\n")

@tool(level=1)
def write_record(text: str) -> str:
    """Write a record (a reversible write)."""
    mark("start write_record")
    with open(os.environ["SWEEP_EFFECTS"], "a") as effects:
        effects.write(text + "\\n")
    return "written"
'''


def write_then_answer_slowly(request: RecordedRequest) -> FakeReply:
    """Writes once; once the write's result is in, answers after a second (the slow model call the
    node is killed in)."""
    if any(m["role"] == "tool" for m in request.messages):
        return FakeReply.text("all done", delay=1.0)
    return FakeReply.tool_call("write_record", {"text": "weekly"})


def test_a_turn_left_by_a_killed_node_is_finished_by_the_other_node_with_no_new_message(
    pg_url: str, tmp_path: Path
) -> None:
    model = FakeOpenAIServer(handler=write_then_answer_slowly).start_in_thread()
    feishu = FakeFeishu(time_scale=0.001).start_in_thread()
    marks, effects = tmp_path / "marks.txt", tmp_path / "effects.txt"
    marks.touch()
    env = clean_environ(
        PYTHONPATH=str(tmp_path), SWEEP_MARKS=str(marks), SWEEP_EFFECTS=str(effects),
        HERMES_BASE_URL=model.base_url, HERMES_MODEL="m", HERMES_DATABASE_URL=pg_url,
        FEISHU_APP_ID=feishu.app_id, FEISHU_APP_SECRET=feishu.app_secret,
        FEISHU_VERIFICATION_TOKEN=feishu.verification_token, FEISHU_BASE_URL=feishu.base_url,
    )  # fmt: skip
    (tmp_path / "sweep_tools.py").write_text(textwrap.dedent(TOOLS), encoding="utf-8")
    nodes: list[Server] = []
    try:
        for name in ("a", "b"):
            folder = tmp_path / name
            folder.mkdir()
            config = f"tools: [sweep_tools]\ndatabase:\n  lease_seconds: {LEASE}\n"
            (folder / "hermes.yaml").write_text(config, encoding="utf-8")
            port = free_port()
            log = folder / "serve.log"
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
        envelope = feishu.user_message("weekly report", chat_id="oc_sweep")
        message_id = envelope["event"]["message"]["message_id"]
        feishu.deliver(envelope, f"{first.url}/feishu/events")
        turn_calls = lambda: [r for r in model.requests if r.body.get("max_tokens") != 1]  # noqa: E731 - not the nodes' start-up checks
        wait_for(lambda: len(turn_calls()) >= 2, what="the model call after the write")  # the slow one
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(timeout=10)
        killed = time.monotonic()
        replies = lambda: [m for m in feishu.sent if m.reply_to == message_id]  # noqa: E731
        # the lease runs out, the next sweep takes it up, the model answers after 1 s; the reply is
        # written into the card the killed node had started streaming into ("running write_record")
        done = lambda: [m.text for m in replies()] == ["all done"]  # noqa: E731
        wait_for(done, timeout=LEASE + LEASE / 3 * 1.25 + 1.0 + 3.0, what="the other node's reply")
        took = time.monotonic() - killed
        print(f"\nreply {took:.2f} s after the kill (lease {LEASE} s, sweep every {LEASE / 3:.2f} s)")
        wait_for(second.idle, what="the other node to be idle")  # a second reply is out by then
        assert [m.text for m in replies()] == ["all done"]
        assert effects.read_text(encoding="utf-8").splitlines() == ["weekly"]  # the write is not run again
        assert marks.read_text(encoding="utf-8").splitlines() == ["start write_record"]
        assert second.process.poll() is None  # no restart took it up: the running node's sweep did
        status, health = second.get("/healthz")
        assert status == 200 and health["inbox_pending"] == 0
        assert "taking up 1 message(s) no node is running" in second.output()
    finally:
        for node in nodes:
            node.stop()
        feishu.stop()
        model.stop()


async def test_two_nodes_sweeping_the_same_dead_nodes_messages_at_once_run_each_turn_once(
    pg_url: str,
) -> None:
    """Both nodes see the dead node's messages (its claims expired but locked by the test, so
    neither can take one yet) and queue them — all of them on one node; on the other, which has
    just been given a new message of one of those conversations, all but that conversation's —
    then the claims are let go at once: each turn runs once, a conversation's in order (the new
    message after the dead node's), and the message that had already run twice is set aside once
    (with its one polite reply), never run a third time. The claims stay locked for seconds, past
    the lease: a claim taken after that wait starts its lease when it is taken (one taken with the
    time read before the wait was born expired, and the other node took it mid-turn)."""
    dead = PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url))
    stores = [PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url)) for _ in range(2)]
    for store in stores:
        store.lease_seconds, store.poll_seconds = 0.6, 0.02  # a sweep every 0.2 s
    runner = TurnLog(0.05)
    ran, overlaps = runner.ran, runner.overlaps

    gateways = [Gateway(store, runner) for store in stores]
    channels = [FlakyChannel(failures=0) for _ in gateways]
    for gateway, channel in zip(gateways, channels, strict=True):
        gateway.add_channel(channel)
    await asyncio.gather(*(gateway.start() for gateway in gateways))  # an empty inbox: nothing resumed
    # the dead node: three conversations with two messages each (the first one's turn was running),
    # and one message that had taken a node down twice already
    texts = {f"flaky:c{c}": [f"c{c} m{n}" for n in range(2)] for c in range(3)}
    # the dead node's claims, live while it writes (a sweep in between must not take its messages
    # early: on a slow machine writing them outlasts a sweep period), expired once it is done
    await dead._count(
        "INSERT INTO turn_claims (conversation, node, inbound_id, expires_at) "
        f"SELECT c, 'dead', 0, {NOW} + 60 FROM unnest(%s::text[]) AS c",
        ([*texts, "flaky:poison"],),
    )
    for conversation, pair in texts.items():
        ids = [await dead.accept(inbound(conversation, text, text)) for text in pair]
        assert ids[0] is not None
        await dead.begin_attempt(ids[0])
    poison = await dead.accept(inbound("flaky:poison", "kills the node", "p1"))
    assert poison is not None
    for _ in range(2):
        await dead.begin_attempt(poison)
    # the dead node's claims run out a little later (EXPIRY s); its messages are backdated, so the
    # sweep period they wait is over: every sweep after the expiry sees all of them at once
    await dead._count(
        f"UPDATE turn_claims SET inbound_id = first.id, expires_at = {NOW} + {EXPIRY} FROM (SELECT "
        "conversation, MIN(id) AS id FROM inbox GROUP BY conversation) AS first "
        "WHERE turn_claims.conversation = first.conversation"
    )
    await dead._count("UPDATE inbox SET received_at = received_at - 60")
    release = asyncio.Event()
    locked = asyncio.Event()

    async def hold(db: Any) -> None:  # the claims locked while live: no node can take one once expired
        rows = await (await db.execute(f"SELECT expires_at > {NOW} FROM turn_claims FOR UPDATE")).fetchall()
        assert all(live for (live,) in rows), "the claims ran out before the test locked them"
        locked.set()
        await release.wait()

    holder = asyncio.create_task(dead.db.transaction(hold))
    await locked.wait()
    # a new message of c0 reaches the first node while the dead node's claims still live: its lane
    # waits for c0's claim, its sweeps leave c0 alone
    assert await gateways[0].accept(inbound("flaky:c0", "c0 m2", "c0 m2")) is not None
    texts["flaky:c0"].append("c0 m2")
    assert gateways[0].swept == gateways[1].swept == 0
    # (the second node may take the new message too, once it is a sweep period old: no claim)
    await eventually(lambda: gateways[0].swept == 5 and gateways[1].swept >= 7, timeout=EXPIRY + 10)
    release.set()
    await holder
    replies = 8
    await eventually(lambda: sum(len(channel.delivered) for channel in channels) == replies, timeout=10)

    async def all_done() -> bool:
        counts = await gateways[0].store.counts()
        return all(map(idle, gateways)) and counts["inbox_pending"] == counts["outbox_pending"] == 0

    await eventually(all_done, what="both nodes idle")  # a turn run twice would have delivered by then
    for gateway in gateways:
        await gateway.stop(grace=1)
    await dead.close()
    assert overlaps == []
    assert Counter(text for _, text in ran) == Counter(t for pair in texts.values() for t in pair)
    for conversation, pair in texts.items():
        assert [text for c, text in ran if c == conversation] == pair
    delivered = [text for channel in channels for text in channel.delivered]
    assert sorted(delivered) == sorted(
        [f"echo: {t}" for pair in texts.values() for t in pair] + [REPLIES["set_aside"]["en"]]
    )
