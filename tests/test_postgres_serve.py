"""Two `hermes-kernel serve` processes on one PostgreSQL database (`database.url`): two nodes.

What one node accepted and answered, the other knows: the same message sent again to the other
node is answered as a duplicate with the first reply (the inbox and outbox are shared), the other
node's console lists the task (traces are shared), and no `gateway.db` is written. The password,
given in HERMES_DATABASE_URL, appears in neither node's output.
"""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from pg_server import PASSWORD
from serve_process import clean_environ, start_serve

pytestmark = pytest.mark.slow  # real processes


def http(url: str, body: dict | None = None) -> tuple[int, str]:
    data = json.dumps(body, ensure_ascii=False).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.read().decode()


def test_two_nodes_share_the_inbox_outbox_and_traces(pg_url: str, tmp_path: Path) -> None:
    env = clean_environ(HERMES_DATABASE_URL=pg_url)
    nodes: list[subprocess.Popen[str]] = []
    addresses = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            process, found = start_serve(
                "serve", "--port", "0", cwd=tmp_path / name, env=env, stderr=subprocess.PIPE
            )  # the log apart, read at the end
            nodes.append(process)
            addresses.append(found.group(1))
        message = {"message": "计算 (12+34)*2", "user_id": "u1", "message_id": "m-1"}
        status, first = http(f"{addresses[0]}/webhook", message)
        assert status == 200 and "92" in json.loads(first)["reply"]
        status, again = http(f"{addresses[1]}/webhook", message)  # a retry that reached the other node
        assert json.loads(again) == {**json.loads(first), "duplicate": True}
        status, tasks = http(f"{addresses[1]}/console/tasks")
        assert status == 200 and "(12+34)*2" in tasks
        status, health = http(f"{addresses[1]}/healthz")
        assert json.loads(health)["inbox_pending"] == 0 and json.loads(health)["turns_done"] == 0
    finally:
        outputs = []
        for process in nodes:
            process.send_signal(signal.SIGTERM)
            out, log = process.communicate(timeout=30)
            outputs.append(out + log)
            assert process.returncode == 0, out
    assert not list(tmp_path.rglob("gateway.db"))  # the state is in PostgreSQL only
    assert all(PASSWORD not in out for out in outputs)
    assert all(
        "state: PostgreSQL at postgresql://hermes:[REDACTED:url-password]@127.0.0.1" in out for out in outputs
    )
