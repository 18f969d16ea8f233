"""`hermes-core serve` as a real process: embedded defaults, webhook, /healthz, graceful SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest

from serve_process import start_serve

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
