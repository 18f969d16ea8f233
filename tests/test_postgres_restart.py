"""PostgreSQL restarted while two `serve` nodes on one `database.url` take webhook messages.

A private server (tests/pg_server.py) is stopped with `pg_ctl stop -m fast` (every connection cut)
while messages flow and turns run, then started again on the same port and data folder. Meanwhile
a request gets 503 with Retry-After (never 500) within Feishu's 3 s and is sent again, as a client
does; afterwards
every message is answered, none answered twice (one inbox row, done, with one reply), each user's
messages in the order sent, and both nodes still run and stop cleanly. The model is asked again
only for a turn the stop cut short (it could not store what it did: it runs again, as after a crash).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from pg_server import PostgresServer
from serve_process import SERVING, clean_environ, free_port
from waiting import wait_for

pytestmark = pytest.mark.slow  # real processes, a server stopped and started


def echo(request: RecordedRequest) -> FakeReply:
    user = next(m for m in reversed(request.messages) if m["role"] == "user")
    return FakeReply.text(f"ok: {user['content']}")


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read() or b"{}")


def start_node(folder: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str, Path]:
    folder.mkdir()
    log = folder / "serve.log"
    command = [sys.executable, "-m", "hermes_core", "serve", "--port", str(free_port())]
    process = subprocess.Popen(command, cwd=folder, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    wait_for(lambda: process.poll() is not None or SERVING.search(log.read_text()), 60, "serve")
    found = SERVING.search(log.read_text())
    assert process.poll() is None and found, log.read_text()
    return process, found.group(1), log


def turns(model: FakeOpenAIServer) -> list[RecordedRequest]:
    """The model's requests for turns: serve's one-token start-up check of the key is none."""
    return [r for r in model.requests if r.body.get("max_tokens") != 1]


def test_postgres_restarted_mid_run_nothing_lost_or_answered_twice(
    private_postgres: PostgresServer, tmp_path: Path
) -> None:
    model = FakeOpenAIServer(handler=echo, latency=0.05).start_in_thread()
    env = clean_environ(
        HERMES_DATABASE_URL=private_postgres.fresh_database(),
        HERMES_BASE_URL=model.base_url,
        HERMES_MODEL="m",
    )
    nodes = [start_node(tmp_path / name, env) for name in ("a", "b")]
    users, per_user = [f"u{n}" for n in range(4)], 6
    answers: dict[str, list[str]] = {user: [] for user in users}
    statuses: list[tuple[float, int, dict[str, str]]] = []  # (when it was answered, status, headers)
    refusal_seconds: list[float] = []
    down, stopped_at, errors, in_flight = threading.Event(), [0.0], [], set()

    def talk(number: int, user: str, count: int = per_user, after: threading.Event | None = None) -> None:
        """Each message after the last one's answer; a 503 is sent again (to the other node)."""
        try:
            if after is not None:
                after.wait(timeout=120)
            for i in range(count):
                body = {"message": f"{user}-{i}", "user_id": user, "message_id": f"{user}-{i}"}
                node = (number + i) % 2
                while True:
                    sent_at = time.monotonic()
                    status, headers, answer = post(f"{nodes[node][1]}/webhook", body)
                    statuses.append((time.monotonic(), status, headers))
                    if status == 503:
                        refusal_seconds.append(time.monotonic() - sent_at)
                    if status == 200 and "reply" in answer:
                        answers[user].append(answer["reply"])
                        break
                    assert status in (200, 202, 503), (status, answer)
                    node = 1 - node
                    time.sleep(0.1)  # a client pausing before its retry, as real ones do: not a wait
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    def refused_meanwhile() -> int:
        return sum(1 for at, status, _ in statuses if status == 503 and at >= stopped_at[0])

    clients = [threading.Thread(target=talk, args=(n, user)) for n, user in enumerate(users)]
    late = [f"late{n}" for n in range(3)]  # their first message arrives while the server is down
    answers.update({user: [] for user in late})
    clients += [threading.Thread(target=talk, args=(n, user, 2, down)) for n, user in enumerate(late)]
    try:
        for client in clients:
            client.start()
        wait_for(lambda: sum(map(len, answers.values())) >= 5, 60, "the first answers")
        stopped_at[0] = time.monotonic()
        answered_before = {a.removeprefix("ok: ") for done in answers.values() for a in done}
        private_postgres.shut_down("fast")
        down.set()
        wait_for(lambda: refused_meanwhile() >= 3 or errors, 60, "requests refused while it is down")
        asked_meanwhile = {
            str([m for m in r.messages if m["role"] == "user"][-1]["content"]) for r in turns(model)
        }
        in_flight.update(asked_meanwhile - answered_before)  # turns the stop may have cut short
        private_postgres.start_again()
        for client in clients:
            client.join(timeout=120)
        assert not errors, errors
        assert not any(client.is_alive() for client in clients), "a client still waits"
        for user in users + late:
            count = per_user if user in users else 2
            assert answers[user] == [f"ok: {user}-{i}" for i in range(count)], (user, answers[user])
        asked = Counter(
            str([m for m in r.messages if m["role"] == "user"][-1]["content"]) for r in turns(model)
        )
        texts = {f"{user}-{i}" for user in users for i in range(per_user)} | {
            f"{u}-{i}" for u in late for i in (0, 1)
        }
        assert set(asked) == texts
        again = {text for text, n in asked.items() if n > 1}
        assert again <= in_flight and max(asked.values()) <= 2, (asked, in_flight)  # only turns cut short
        with psycopg.connect(env["HERMES_DATABASE_URL"], autocommit=True) as db:
            # a retry on the other node is answered from the stored reply, maybe before its node
            # has sent it (the send waits out the database too): every reply is sent in the end
            unsent = "SELECT count(*) FROM outbox WHERE status = 'pending'"
            wait_for(lambda: db.execute(unsent).fetchone() == (0,), 30, "every reply sent")
            rows = db.execute(
                "SELECT i.message_id, i.status, count(o.id), min(o.status) FROM inbox i "
                "LEFT JOIN outbox o ON o.inbound_id = i.id GROUP BY i.id"
            ).fetchall()
        assert sorted(row[0] for row in rows) == sorted(texts), "a message stored twice or not at all"
        assert {(status, replies, sent) for _, status, replies, sent in rows} == {("done", 1, "sent")}, rows
        refused = [(status, headers) for at, status, headers in statuses if status != 200]
        assert refused and all(s == 503 and h.get("Retry-After") for s, h in refused), refused
        assert max(refusal_seconds) < 3.0, refusal_seconds  # within Feishu's ack deadline
        logs = [log.read_text()[-3000:] for *_, log in nodes]
        assert all(process.poll() is None for process, _, _ in nodes), logs
    finally:
        codes = []
        for process, _, _ in nodes:
            process.send_signal(signal.SIGTERM)
            try:
                codes.append(process.wait(timeout=30))
            except subprocess.TimeoutExpired:
                process.kill()
                codes.append(process.wait())
        model.stop()
    assert codes == [0, 0], codes
