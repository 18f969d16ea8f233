"""The PostgreSQL stores (hermes_core/postgres/) with several nodes on one database.

A "node" here is its own connection pool (`PostgresDatabase(url)`, not the shared one), or its own
process (tests/pg_node.py), on a private PostgreSQL server (tests/pg_server.py). What is checked is
what two gateways on one database must never do: accept one event twice, run one conversation's
turns at the same time or out of order, leave half a transaction behind when killed, resend one
dead letter twice, expire or decide one approval twice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway_harness import TurnLog
from hermes_core.channels.seam import InboundMessage, OutboundMessage
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.kernel.approvals import DecisionRefused
from hermes_core.kernel.tools.permissions import Caller
from hermes_core.postgres.database import PostgresDatabase, redacted_url, then_close_pools
from hermes_core.postgres.gateway import PostgresGatewayStore
from hermes_core.postgres.journal import PostgresTaskJournal
from hermes_core.postgres.migrations import expected_versions
from hermes_core.postgres.pending import PostgresInteractions
from hermes_core.postgres.sessions import PostgresSessionStore
from hermes_core.postgres.traces import PostgresTraceStore
from hermes_core.sessions.store import TurnAppend
from test_gateway import FlakyChannel, inbound
from waiting import eventually

NODE = Path(__file__).with_name("pg_node.py")


@pytest.fixture
async def nodes(pg_url: str) -> AsyncIterator[tuple[PostgresGatewayStore, PostgresGatewayStore]]:
    """Two gateway stores on one database, each with its own pool: two nodes."""
    first = PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url))
    second = PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url))
    yield first, second
    await first.close()
    await second.close()


def message(n: int, conversation: str = "webhook:u1", event: str | None = None) -> InboundMessage:
    return InboundMessage("webhook", conversation, "u1", f"message {n}", f"m{n}", event_id=event)


async def test_the_same_event_delivered_to_two_nodes_is_accepted_once(nodes) -> None:  # type: ignore[no-untyped-def]
    first, second = nodes
    outcomes = await asyncio.gather(*(
        store.accept(message(n, event=f"ev{n}")) for n in range(40) for store in (first, second)
    ))  # fmt: skip
    accepted = [outcomes[2 * n : 2 * n + 2] for n in range(40)]
    assert all(sum(i is not None for i in pair) == 1 for pair in accepted)  # exactly one node said "new"
    assert len(await first.pending_inbound()) == 40 == (await second.counts())["inbox_pending"]
    # the same message id under another event id is still the same message
    assert await second.accept(message(3, event="other")) is None


async def test_a_nul_character_is_stored_as_on_sqlite_not_refused_at_every_retry(nodes) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL's text cannot hold NUL: it is stored as U+FFFD, in keys and texts alike."""
    first, second = nodes
    inbound_id = await first.accept(InboundMessage("webhook", "webhook:u\x00", "u", "a\x00b", "m\x00"))
    assert inbound_id is not None
    assert await second.accept(InboundMessage("webhook", "webhook:u\x00", "u", "again", "m\x00")) is None
    [pending] = await second.pending_inbound()
    assert pending.text == "a\x00b"  # the payload is JSON: its \u0000 escape is kept as it was
    assert pending.conversation == "webhook:u\x00"
    earlier = await second.replies_of("webhook", "m\x00")
    assert earlier is not None and earlier.message.id == inbound_id


async def test_two_nodes_run_one_conversations_turns_one_at_a_time_in_order(nodes) -> None:  # type: ignore[no-untyped-def]
    first, second = nodes
    for store in (first, second):
        store.poll_seconds = 0.02
    ids = [await (first, second)[n % 2].accept(message(n)) for n in range(8)]
    running: list[str] = []
    ran: list[int] = []
    overlaps = 0

    async def node(store: PostgresGatewayStore, name: str) -> None:
        nonlocal overlaps
        for pending in await store.pending_inbound():  # each node sees every message, like after a restart
            while True:
                async with store.turn_claim(pending) as turn:
                    if turn is None:
                        break
                    running.append(name)
                    overlaps += len(running) > 1
                    await asyncio.sleep(0.01)  # a turn that takes a moment: another node could overlap it
                    ran.append(turn.id)  # type: ignore[arg-type]
                    await store.complete(turn.id, [])  # type: ignore[arg-type]
                    running.remove(name)
                if turn.id == pending.id:
                    break

    await asyncio.gather(node(first, "a"), node(second, "b"))
    assert overlaps == 0
    assert ran == ids  # each once, oldest first
    assert await first.pending_inbound() == []


async def test_two_gateways_started_on_one_inbox_run_each_turn_once_in_order(nodes) -> None:  # type: ignore[no-untyped-def]
    """Two gateways (gateway/dispatcher.py) start on the same pending messages, as two nodes
    restarting together do: each turn runs once, a conversation's in order, never two at once."""
    for n in range(8):
        await nodes[0].accept(inbound(f"flaky:c{n % 2}", f"m{n}", f"id{n}"))
    runner = TurnLog(0.02)
    ran, overlaps = runner.ran, runner.overlaps

    gateways = [Gateway(store, runner) for store in nodes]
    channels = [FlakyChannel(failures=0) for _ in gateways]
    for gateway, channel in zip(gateways, channels, strict=True):
        gateway.add_channel(channel)
    for store in nodes:
        store.poll_seconds = 0.02
    await asyncio.gather(*(gateway.start() for gateway in gateways))
    await eventually(lambda: sum(len(channel.delivered) for channel in channels) == 8)
    for gateway in gateways:
        await gateway.stop(grace=1)
    assert overlaps == [] and len(ran) == 8
    for conversation in ("flaky:c0", "flaky:c1"):
        assert [text for c, text in ran if c == conversation] == [
            f"m{n}" for n in range(8) if f"c{n % 2}" in conversation
        ]


def count_claim_tries(store: PostgresGatewayStore) -> list[int]:
    """Count `store`'s tries to take a turn claim, in a list of one number: a second try means the
    first found the claim held by another node (a waiting node tries again every few ms)."""
    tries = [0]
    claim = store._claim

    async def counted(db: Any, message: InboundMessage) -> Any:
        tries[0] += 1
        return await claim(db, message)

    store._claim = counted  # type: ignore[method-assign]
    return tries


async def test_another_conversation_is_not_held_up_by_a_claim(nodes) -> None:  # type: ignore[no-untyped-def]
    first, second = nodes
    await first.accept(message(1, "webhook:a"))
    await first.accept(message(2, "webhook:b"))
    one, two = await first.pending_inbound()
    async with first.turn_claim(one) as turn:
        assert turn is not None and turn.id == one.id
        async with second.turn_claim(two) as other:  # another conversation: at once
            assert other is not None and other.id == two.id
        tries = count_claim_tries(second)
        waiting = asyncio.ensure_future(second.turn_claim(one).__aenter__())
        await eventually(lambda: tries[0] >= 2 or waiting.done(), what="a second try of the claim")
        assert not waiting.done()  # the same conversation waits for the first node
    assert (await asyncio.wait_for(waiting, 5)).id == one.id  # type: ignore[union-attr]
    await second._release(one.conversation)


async def test_a_claim_whose_release_was_lost_is_taken_again_by_its_node_at_once(nodes) -> None:  # type: ignore[no-untyped-def]
    """The database went down as a turn ended, so its claim was never released: the lane trying
    the message again (the same node) takes the claim at once; it does not wait out the 30 s lease
    (seen in tests/test_postgres_restart.py: a conversation stalled for the lease). Another node
    still waits for it."""
    first, second = nodes
    await first.accept(message(1, "webhook:a"))
    (pending,) = await first.pending_inbound()
    assert first.lease_seconds >= 30
    await first.db.transaction(lambda db: first._claim(db, pending))  # the claim the lost release left
    tries = count_claim_tries(second)
    waiting = asyncio.ensure_future(second.turn_claim(pending).__aenter__())
    await eventually(lambda: tries[0] >= 2 or waiting.done(), what="a second try of the claim")
    assert not waiting.done()  # another node waits for the claim

    async def run_again() -> InboundMessage | None:
        async with first.turn_claim(pending) as turn:
            return turn

    again = await asyncio.wait_for(run_again(), 5)  # the same node: at once, not after 30 s
    assert again is not None and again.id == pending.id
    assert (await asyncio.wait_for(waiting, 5)).id == pending.id  # type: ignore[union-attr]
    await second._release(pending.conversation)


async def test_a_claim_left_on_a_finished_message_is_let_go_for_the_other_node(nodes) -> None:  # type: ignore[no-untyped-def]
    """The turn was stored, but the database went down before its claim was released: the lane's
    retry finds the message done and lets its leftover claim go, so the other node runs the
    conversation's next message at once instead of after the lease (seen in
    tests/test_postgres_restart.py: a conversation stalled 30 s on the other node)."""
    first, second = nodes
    await first.accept(message(1, "webhook:a"))
    await first.accept(message(2, "webhook:a"))
    one, two = await first.pending_inbound()
    await first.db.transaction(lambda db: first._claim(db, one))  # the claim the lost release left
    await first.complete(one.id, [])

    async def run(store: PostgresGatewayStore, pending: InboundMessage) -> InboundMessage | None:
        async with store.turn_claim(pending) as turn:
            return turn

    assert await asyncio.wait_for(run(first, one), 5) is None  # done already: nothing to run
    turn = await asyncio.wait_for(run(second, two), 5)  # the other node: at once, not after 30 s
    assert turn is not None and turn.id == two.id


async def test_the_pools_left_open_are_closed_when_serve_ends(pg_url: str) -> None:
    """`serve` runs under `then_close_pools`: a pool some store never closed is closed at the end,
    so its reconnecting tasks (which absorb cancellation) cannot hold the process open after
    SIGTERM. Seen in tests/test_postgres_restart.py: a node killed after 30 s of stopping."""
    store = PostgresSessionStore(pg_url)  # its owner never closes it

    pool = None

    async def serve() -> str:
        nonlocal pool
        await store.load("webhook:u1")  # opens the shared pool
        pool = store.db._pool
        return "served"

    assert await then_close_pools(serve()) == "served"
    assert pool is not None and pool.closed and store.db._pool is None
    fresh = PostgresDatabase.shared(pg_url)
    assert fresh is not store.db  # the next user in this process gets a pool of its own
    await fresh.close()


async def test_done_mark_history_and_replies_are_one_transaction_and_happen_once(pg_url: str) -> None:
    database = PostgresDatabase(pg_url)
    store = PostgresGatewayStore(pg_url, database=database)
    sessions = PostgresSessionStore(pg_url, database=database)
    inbound_id = await store.accept(message(1))
    assert inbound_id is not None
    turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    history = TurnAppend(sessions, "webhook:u1", "task-1", turn)
    reply = OutboundMessage(channel="webhook", conversation="webhook:u1", text="hello", uuid="u-1")
    queued = await store.complete(inbound_id, [reply], history)
    again = await store.complete(inbound_id, [reply], history)  # a racing duplicate run
    assert [r.id for r in queued] != [None] and again == []
    assert [m["content"] for m in (await sessions.load("webhook:u1")).messages] == ["hi", "hello"]
    earlier = await store.replies_of("webhook", "m1")
    assert earlier is not None and earlier.done and [r.text for r in earlier.replies] == ["hello"]
    await store.close()


def _node(url: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(NODE.parent), *sys.path])}
    command = [sys.executable, str(NODE), url, *args]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def _line(process: subprocess.Popen[str], timeout: float = 30.0) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    line = process.stdout.readline()
    assert line, f"the node exited ({process.wait(timeout=max(0.1, deadline - time.monotonic()))})"
    return line.strip()


@pytest.mark.slow
async def test_a_node_killed_mid_complete_leaves_nothing_half_written(pg_url: str) -> None:
    import psycopg

    database = PostgresDatabase(pg_url)
    store = PostgresGatewayStore(pg_url, database=database)
    sessions = PostgresSessionStore(pg_url, database=database)
    inbound_id = await store.accept(message(1))
    await sessions.load("x")  # the sessions tables exist
    with psycopg.connect(pg_url) as blocker:  # holds the conversation's session lock: complete stops there
        blocker.execute("SELECT pg_advisory_lock(hashtextextended('session:webhook:u1', 0))")
        node = _node(pg_url, "complete", str(inbound_id))

        def stopped_at_the_lock() -> bool:  # the node is inside complete's transaction, done mark written
            assert node.poll() is None, "the node exited"
            waiting = "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            return blocker.execute(waiting).fetchone() is not None

        await eventually(stopped_at_the_lock)
        node.send_signal(signal.SIGKILL)
        node.wait(10)
        blocker.execute("SELECT pg_advisory_unlock(hashtextextended('session:webhook:u1', 0))")

    async def rolled_back() -> bool:  # the killed node's transaction is gone, its session too
        return (await store.counts())["inbox_pending"] == 1 and await _backends(pg_url) <= 1

    await eventually(rolled_back)
    assert await store.pending_outbound() == [] and (await sessions.load("webhook:u1")).messages == []
    # another node completes it, whole
    history = TurnAppend(sessions, "webhook:u1", "task-1", [{"role": "user", "content": "hi"}])
    reply = OutboundMessage(channel="webhook", conversation="webhook:u1", text="done", uuid="u-1")
    assert len(await store.complete(inbound_id, [reply], history)) == 1  # type: ignore[arg-type]
    assert len((await sessions.load("webhook:u1")).messages) == 1
    await store.close()


async def _backends(url: str) -> int:
    """Client connections to this test's database other than the pool's."""
    import psycopg

    name = url.rsplit("/", 1)[1]
    async with await psycopg.AsyncConnection.connect(url) as probe:
        row = await (await probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
            "AND state <> 'idle'", (name,)
        )).fetchone()  # fmt: skip
        return int(row[0]) if row else 0


@pytest.mark.slow
async def test_two_processes_claim_one_conversation_and_only_one_runs_each_turn(pg_url: str) -> None:
    store = PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url))
    ids = [await store.accept(message(n)) for n in range(12)]
    await store._count("CREATE TABLE runs (inbound_id BIGINT, node TEXT, started FLOAT8, ended FLOAT8)")
    processes = [_node(pg_url, "run", name) for name in ("a", "b")]
    for process in processes:
        assert _line(process) == "ready"
    for process in processes:  # both start at once
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    for process in processes:
        assert process.wait(120) == 0
    rows = await store._all("SELECT id, finished_at FROM inbox ORDER BY id")
    runs = await store._all("SELECT inbound_id, node, started, ended FROM runs ORDER BY started")
    await store.close()
    assert [r[0] for r in runs] == ids  # each turn ran once, in order
    assert {r[1] for r in runs} <= {"a", "b"}
    assert all(
        earlier[3] <= later[2] for earlier, later in zip(runs, runs[1:], strict=False)
    )  # never two at once
    assert all(finished is not None for _, finished in rows)


@pytest.mark.slow
async def test_a_killed_nodes_conversation_is_taken_up_once_its_lease_expires(pg_url: str) -> None:
    store = PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url))
    store.lease_seconds, store.poll_seconds = 1.0, 0.05
    await store.accept(message(1))
    node = _node(pg_url, "hold")  # claims the conversation (1 s lease), then hangs
    assert _line(node) == "claimed"
    [pending] = await store.pending_inbound()
    node.send_signal(signal.SIGKILL)
    node.wait(10)
    started = time.monotonic()
    async with store.turn_claim(pending) as turn:
        assert turn is not None and turn.id == pending.id
    assert time.monotonic() - started < 5  # after the dead node's lease, not forever
    await store.close()


async def test_a_requested_resend_is_taken_up_by_one_node(nodes) -> None:  # type: ignore[no-untyped-def]
    first, second = nodes
    inbound_id = await first.accept(message(1))
    replies = [OutboundMessage(channel="webhook", conversation="webhook:u1", text=f"r{i}", uuid=f"u{i}")
               for i in range(10)]  # fmt: skip
    for reply in await first.complete(inbound_id, replies):
        await first.dead_letter(reply.id, "gone")  # type: ignore[arg-type]
        assert await second.request_resend(reply.id)  # type: ignore[arg-type]
    assert len(await second.dead_letters()) == 10 and len(await second.dead_letters(3)) == 3
    taken = await asyncio.gather(first.claim_resends(), second.claim_resends())
    ids = [reply.id for batch in taken for reply in batch]
    assert sorted(ids) == sorted(r.id for r in replies)  # every one, by one node
    assert await first.dead_letters() == [] and len(await second.pending_outbound()) == 10


async def test_replayed_signatures_are_refused_on_every_node(nodes) -> None:  # type: ignore[no-untyped-def]
    first, second = nodes
    claims = await asyncio.gather(*(store.claim_nonce("webhook", "sig-1", 300) for store in (first, second)))
    assert sorted(claims) == [False, True]
    assert await first.claim_nonce("webhook", "sig-2", 300)


async def test_poison_counts_and_set_aside(nodes) -> None:  # type: ignore[no-untyped-def]
    first, second = nodes
    inbound_id = await first.accept(message(1))
    assert await first.begin_attempt(inbound_id) == 1 and await second.begin_attempt(inbound_id) == 2
    [(crashed, attempts)] = await second.crashed_inbound(2)
    assert crashed.id == inbound_id and attempts == 2
    async with first.turn_claim(crashed):  # running now on a live node: no crash to set aside
        assert await second.crashed_inbound(2) == []
    reply = OutboundMessage(channel="webhook", conversation="webhook:u1", text="set aside", uuid="u")
    assert len(await second.set_aside(inbound_id, "twice", [reply])) == 1
    assert await first.set_aside(inbound_id, "twice", [reply]) == []  # once
    [aside] = await first.set_aside_messages()
    assert aside["reason"] == "twice" and (await first.counts())["set_aside"] == 1


async def test_an_approval_is_decided_and_expired_once_across_nodes(pg_url: str) -> None:
    desks = [PostgresInteractions(pg_url, database=PostgresDatabase(pg_url)) for _ in range(2)]
    asker = Caller(user_id="u1", channel="webhook")
    pending = await desks[0].approval("task-1", "call-1", "send_email", "{}", asker, "webhook:u1")
    assert (
        await desks[1].approval("task-1", "call-1", "send_email", "{}", asker, "webhook:u1")
    ).id == pending.id
    decided = await asyncio.gather(*(desk.decide(pending.id, asker, True) for desk in desks),
                                   return_exceptions=True)  # fmt: skip
    assert sum(isinstance(d, DecisionRefused) for d in decided) == 1
    assert [p.status for p in await desks[1].list(None)] == ["approved"]
    for n in range(20):
        desks[n % 2].now = lambda: time.time() - 3600  # created long ago: due
        await desks[n % 2].approval("task-2", f"call-{n}", "send_email", "{}", asker, "webhook:u1")
    for desk in desks:
        desk.now = time.time
    expired = await asyncio.gather(*(desk.expire_due() for desk in desks))
    assert sorted(p.call_id for batch in expired for p in batch) == sorted(f"call-{n}" for n in range(20))
    for desk in desks:
        await desk.close()


async def test_journal_and_traces_are_shared_by_nodes(pg_url: str) -> None:
    journals = [PostgresTaskJournal(pg_url, database=PostgresDatabase(pg_url)) for _ in range(2)]
    await asyncio.gather(*(journals[n % 2].append("t1", "model_response", {"n": n}) for n in range(30)))
    assert sorted(e.data["n"] for e in await journals[1].entries("t1")) == list(range(30))
    traces = [PostgresTraceStore(pg_url, database=PostgresDatabase(pg_url)) for _ in range(2)]
    record = {"task_id": "t1", "conversation": "webhook:u1", "input": "hi", "started_at": 1.0, "ok": True,
              "reply": "x" * 500, "tool_calls": [{"name": "clock"}, {"name": "calculator"}]}  # fmt: skip
    await traces[0].record(record)
    await traces[1].record({**record, "ok": False, "stop_reason": "model_error"})  # replaces it
    [summary] = await traces[0].list(tool="clock")
    assert summary["ok"] is False and summary["tool_names"] == ["clock", "calculator"]
    assert len(summary["reply"]) == 200 and await traces[0].list(failed=False) == []
    assert (await traces[1].get("t1"))["stop_reason"] == "model_error"  # type: ignore[index]
    assert await traces[0].ids_starting("t") == ["t1"]
    await traces[0].prune(2.0)
    assert await traces[1].list() == []
    for closable in (*journals, *traces):
        await closable.close()


async def test_nodes_starting_together_migrate_once_and_to_the_expected_versions(pg_url: str) -> None:
    stores = [PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url)) for _ in range(4)]
    for store in stores:
        PostgresSessionStore(pg_url, database=store.db)
    await asyncio.gather(*(store.counts() for store in stores))
    rows = await stores[0]._all("SELECT component, version FROM schema_versions ORDER BY component")
    assert dict(rows) == {k: v for k, v in expected_versions().items() if k in ("gateway", "sessions")}
    later = max(stores[0].db._migrations["gateway"]) + 1  # a migration of the next release
    stores[0].db.migrate(
        "gateway", {**stores[0].db._migrations["gateway"], later: "CREATE TABLE later (x INT)"}
    )
    await stores[0].counts()
    assert dict(await stores[0]._all("SELECT component, version FROM schema_versions"))["gateway"] == later
    for store in stores:
        await store.close()
    older = PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url))  # a node of the older release
    with pytest.raises(RuntimeError, match=f"gateway schema in PostgreSQL is at version {later}, newer than"):
        await older.counts()
    await older.close()


async def test_the_password_is_never_shown(postgres, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    url = postgres.url("postgres")
    password = url.split(":")[2].split("@")[0]
    assert password not in redacted_url(url) and redacted_url(url) == url.replace(
        password, "[REDACTED:url-password]"
    )
    assert redacted_url("postgresql://u:pw@h/db") == "postgresql://u:[REDACTED:url-password]@h/db"
    assert password not in repr(PostgresDatabase(url))
    wrong_port = url.replace(f":{postgres.port}/", f":{_closed_port()}/")
    store = PostgresGatewayStore(wrong_port, database=PostgresDatabase(wrong_port))
    store.db.timeout = 1.0
    with caplog.at_level(logging.DEBUG), pytest.raises(ConnectionError) as refused:
        await store.counts()
    assert "unreachable" in str(refused.value) and password not in str(refused.value)
    assert password not in caplog.text
    await store.close()


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_cli_lists_and_resends_dead_letters_and_lists_traces_from_postgres(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from hermes_core.cli import main

    async def record() -> int:
        store = PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url))
        traces = PostgresTraceStore(pg_url, database=store.db)
        inbound_id = await store.accept(message(1))
        reply = OutboundMessage(channel="webhook", conversation="webhook:u1", text="lost reply", uuid="u")
        [queued] = await store.complete(inbound_id, [reply])  # type: ignore[arg-type]
        await store.dead_letter(queued.id, "the chat is gone")  # type: ignore[arg-type]
        await traces.record({"task_id": "webhook:m1~abc", "input": "message 1", "started_at": time.time()})
        await store.close()
        return int(queued.id)  # type: ignore[arg-type]

    async def resend_requested() -> bool:
        store = PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url))
        [dead] = await store.dead_letters()
        await store.close()
        return dead["resend_requested_at"] is not None

    for name in [n for n in os.environ if n.startswith(("HERMES_", "FEISHU_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HERMES_DATABASE_URL", pg_url)
    monkeypatch.chdir(tmp_path)  # no gateway.db here: the CLI reads PostgreSQL
    outbox_id = asyncio.run(record())
    capsys.readouterr()
    assert main(["deadletters", "--json"]) == 0
    [dead] = json.loads(capsys.readouterr().out)
    assert dead["id"] == outbox_id and dead["text"] == "lost reply"
    assert main(["deadletters", "resend", str(outbox_id)]) == 0 and asyncio.run(resend_requested())
    capsys.readouterr()
    assert main(["traces", "--json"]) == 0
    assert [row["task_id"] for row in json.loads(capsys.readouterr().out)] == ["webhook:m1~abc"]
    assert not (tmp_path / ".hermes" / "gateway.db").exists()


async def test_a_nodes_unsent_replies_are_its_own_while_it_lives_and_one_other_nodes_after(  # type: ignore[no-untyped-def]
    pg_url: str,
) -> None:
    """The outbox hold (postgres/gateway.py `orphaned_outbound`), from issue 33's "a reply queued on
    a node when it dies is not sent by another node": a node's replies are not taken while it
    renews its hold (its sweeps), are taken once it stops renewing and the hold expires — in queue
    order, by one of two nodes sweeping at once — and at once when it stops gracefully."""
    stores = [PostgresGatewayStore(pg_url, database=PostgresDatabase(pg_url)) for _ in range(3)]
    first, second, third = stores
    for store in stores:
        store.lease_seconds = 0.6
    inbound_id = await first.accept(message(1))
    replies = [OutboundMessage(channel="webhook", conversation="webhook:u1", text=f"r{i}", uuid=f"u{i}")
               for i in range(3)]  # fmt: skip
    queued = await first.complete(inbound_id, replies)  # type: ignore[arg-type]
    for _ in range(3):  # 0.9 s, past the lease: the first node lives and renews
        await asyncio.sleep(0.3)  # the lease is on the database's clock: time must pass
        assert await first.orphaned_outbound(time.time()) == []
        assert await second.orphaned_outbound(time.time()) == []
    await asyncio.sleep(0.8)  # the first node stops renewing: its hold expires
    taken = await asyncio.gather(second.orphaned_outbound(time.time()), third.orphaned_outbound(time.time()))
    [batch] = [batch for batch in taken if batch]
    assert [(r.id, r.text, r.uuid) for r in batch] == [(r.id, r.text, r.uuid) for r in queued]
    holder = second if taken[0] else third
    await asyncio.sleep(0.8)  # past the lease again, on the database's clock
    assert await holder.orphaned_outbound(time.time()) == []  # renewed just now: still its own…
    await holder.close()  # …until it stops: then the other one takes them at its next sweep
    other = third if holder is second else second
    assert [r.id for r in await other.orphaned_outbound(time.time())] == [r.id for r in queued]
    for store in (first, other):
        await store.close()
