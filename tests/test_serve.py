"""`hermes-kernel serve` as a real process: embedded defaults, webhook, /healthz, graceful SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from serve_process import CLEAN_ENV, start_serve

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")


def start_server(cwd: Path) -> tuple[subprocess.Popen[str], str]:
    process, found = start_serve("serve", "--port", "0", cwd=cwd)
    return process, found.group(1)


def http(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body, ensure_ascii=False).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read())


def test_serve_on_embedded_defaults_then_stop_gracefully(tmp_path: Path) -> None:
    process, address = start_server(tmp_path)
    try:
        assert address.startswith("http://127.0.0.1:")  # localhost by default
        status, health = http(f"{address}/healthz")
        assert status == 200 and health["ok"] is True
        status, answer = http(f"{address}/webhook", {"message": "计算 (12+34)*2", "user_id": "u1"})
        assert status == 200 and "92" in answer["reply"]
        _, health = http(f"{address}/healthz")
        assert health["turns_done"] == 1 and health["replies_sent"] == 1
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    assert (tmp_path / ".hermes" / "gateway.db").is_file()


def test_a_busy_port_is_one_line_naming_the_fix_and_exit_2(tmp_path: Path) -> None:
    """A second `serve` on a port another process holds: like every other start-up error (config
    errors, the console's refusal), one line on stderr that names the fix, and exit 2 — no traceback.
    The case comes from the first-hour report (issue 29: "a busy port prints a raw traceback")."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "hermes_core", "serve", "--port", str(port)],
            cwd=tmp_path, env=CLEAN_ENV, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    log_line = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ (INFO|DEBUG) ")  # serve's own INFO log
    lines = [line for line in done.stderr.strip().splitlines() if not log_line.match(line)]
    assert len(lines) == 1 and lines[0].startswith("hermes-kernel: "), done.stderr
    assert f"port {port}" in lines[0] and "--port" in lines[0] and "gateway.port" in lines[0]
