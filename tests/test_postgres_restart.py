"""PostgreSQL restarted while two `serve` nodes on one `database.url` take webhook messages.

A private server (tests/pg_server.py) is stopped with `pg_ctl stop -m fast` (every connection cut)
while messages flow and turns run, then started again on the same port and data folder. Meanwhile
a request gets 503 with Retry-After (never 500) and is sent again, as a client does; afterwards
every message is answered, none answered twice (the model asked once per message), each user's
messages in the order sent, and both nodes still run and stop cleanly.
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from pg_server import PostgresServer
from pg_server import missing as postgres_missing
from serve_process import SERVING, clean_environ, free_port

pytestmark = pytest.mark.slow  # real processes, a server stopped and started


@pytest.fixture
def server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test alone: it is stopped and started in the middle."""
    reason = postgres_missing()
    if reason is not None:
        pytest.skip(reason)
    started = PostgresServer().start()
    try:
        yield started
    finally:
        started.stop()


def echo(request: RecordedRequest) -> FakeReply:
    user = next(m for m in reversed(request.messages) if m["role"] == "user")
    return FakeReply.text(f"ok: {user['content']}")


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


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
    wait_until(lambda: process.poll() is not None or SERVING.search(log.read_text()), 60, "serve")
    found = SERVING.search(log.read_text())
    assert process.poll() is None and found, log.read_text()
    return process, found.group(1), log


def test_postgres_restarted_mid_run_nothing_lost_or_answered_twice(
    server: PostgresServer, tmp_path: Path
) -> None:
    model = FakeOpenAIServer(handler=echo, latency=0.05).start_in_thread()
    env = clean_environ(
        HERMES_DATABASE_URL=server.fresh_database(), HERMES_BASE_URL=model.base_url, HERMES_MODEL="m"
    )
    nodes = [start_node(tmp_path / name, env) for name in ("a", "b")]
    users, per_user = [f"u{n}" for n in range(4)], 6
    answers: dict[str, list[str]] = {user: [] for user in users}
    statuses: list[tuple[float, int, dict[str, str]]] = []
    down, stopped_at, errors = threading.Event(), [0.0], []

    def talk(number: int, user: str, count: int = per_user, after: threading.Event | None = None) -> None:
        """Each message after the last one's answer; a 503 is sent again (to the other node)."""
        try:
            if after is not None:
                after.wait(timeout=120)
            for i in range(count):
                body = {"message": f"{user}-{i}", "user_id": user, "message_id": f"{user}-{i}"}
                node = (number + i) % 2
                while True:
                    status, headers, answer = post(f"{nodes[node][1]}/webhook", body)
                    statuses.append((time.monotonic(), status, headers))
                    if status == 200 and "reply" in answer:
                        answers[user].append(answer["reply"])
                        break
                    assert status in (200, 202, 503), (status, answer)
                    node = 1 - node
                    time.sleep(0.1)
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
        wait_until(lambda: sum(map(len, answers.values())) >= 5, 60, "the first answers")
        stopped_at[0] = time.monotonic()
        server.shut_down("fast")
        down.set()
        wait_until(lambda: refused_meanwhile() >= 3 or errors, 60, "requests refused while it is down")
        server.start_again()
        for client in clients:
            client.join(timeout=120)
        assert not errors, errors
        assert not any(client.is_alive() for client in clients), "a client still waits"
        for user in users + late:
            count = per_user if user in users else 2
            assert answers[user] == [f"ok: {user}-{i}" for i in range(count)], (user, answers[user])
        asked = Counter(
            str([m for m in r.messages if m["role"] == "user"][-1]["content"]) for r in model.requests
        )
        assert {text: n for text, n in asked.items() if n != 1} == {}, "a message ran more than once"
        assert len(asked) == len(users) * per_user + len(late) * 2
        refused = [(status, headers) for at, status, headers in statuses if status != 200]
        assert refused and all(s == 503 and h.get("Retry-After") for s, h in refused), refused
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
