"""PostgreSQL down for longer than a turn's preparation used to be retried, on `engine: temporal`:
the messages that arrive meanwhile wait for the database and are answered once it is back —
never with the apology.

The case is issue 33's: with PostgreSQL down for 75 s, 10 of 30 messages were answered with
"something went wrong", because the step that prepares a turn (it reads the stored conversation)
was tried 5 times — each try waits up to the pool's 10 s for a connection, about 50 s in all —
and then the turn failed. Here a private PostgreSQL server (tests/pg_server.py) is stopped with
`pg_ctl stop -m fast`, as tests/test_postgres_restart.py does, while two `serve` nodes and a
worker run (tests/test_temporal_engine.py's `Cluster`); three messages are pushed to the nodes
(their acks need no database), the server stays down for 60 s, longer than those 5 tries, and is
started again: every message gets its own answer, once, and no apology is sent.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_core.kernel.replies import REPLIES
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer
from pg_server import PostgresServer
from test_temporal_engine import Cluster, replies_by_message, steps
from waiting import eventually

pytestmark = pytest.mark.slow  # real processes, PostgreSQL stopped for a minute

DOWN_SECONDS = 60.0  # today's cap was 5 tries of up to ~10 s each


@pytest.fixture
def cluster(
    tmp_path: Path, temporal_dev: str, private_postgres: PostgresServer
) -> Iterator[tuple[Cluster, FakeFeishu]]:
    model = FakeOpenAIServer(handler=steps, latency=0.02).start_in_thread()
    feishu = FakeFeishu(time_scale=0.01, seed=9).start_in_thread()
    database = private_postgres.fresh_database()
    nodes = Cluster(tmp_path, temporal_dev, model, feishu, database=database, workers=1)
    try:
        yield nodes, feishu
    finally:
        nodes.stop()
        feishu.stop()
        model.stop()


async def test_a_database_outage_is_waited_out_not_apologised_for(
    cluster: tuple[Cluster, FakeFeishu], private_postgres: PostgresServer
) -> None:
    nodes, feishu = cluster
    chats = [f"oc_{uuid.uuid4().hex[:6]}_{n}" for n in range(3)]
    first = feishu.user_message("hello before", chat_id=chats[0], sender=f"ou_{chats[0]}")
    await feishu.push(first, nodes.events(0))
    await eventually(lambda: len(feishu.sent) >= 1, 60, "the first reply")

    private_postgres.shut_down("fast")
    down_at = time.monotonic()
    sent = []
    for n, chat in enumerate(chats):
        envelope = feishu.user_message(f"call record outage{n}", chat_id=chat, sender=f"ou_{chat}")
        result = await feishu.push(envelope, nodes.events(n % 2))
        assert result.ok, result  # acknowledged: signal-with-start needs no database
        sent.append(envelope["event"]["message"]["message_id"])
    await asyncio.sleep(DOWN_SECONDS - (time.monotonic() - down_at))  # the outage lasts: time must pass
    assert not any(m.reply_to in sent for m in feishu.sent), "answered while the database was down"
    private_postgres.start_again()
    back_at = time.monotonic()
    try:
        await eventually(lambda: set(replies_by_message(feishu)) >= set(sent), 60, "every message answered")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the worker's log: {nodes.output('worker-0')[-3000:]}") from None
    print(f"answered {time.monotonic() - back_at:.1f} s after the database was back")
    apologies = {REPLIES["internal_error"]["en"], REPLIES["internal_error"]["zh"]}
    answers = {m.reply_to: m.text for m in feishu.sent if m.reply_to in sent}
    assert answers == {mid: f"done: recorded outage{n}" for n, mid in enumerate(sent)}, answers
    assert not apologies & {m.text for m in feishu.sent}
    assert all(count == 1 for count in replies_by_message(feishu).values())
    assert all(process.poll() is None for process in nodes.processes)
