"""Crash safety: the gateway process is SIGKILLed at random points and restarted, 20 times.

The fake Feishu platform keeps pushing (and re-pushing unacknowledged events on its retry
schedule); at the end every message must have been answered exactly once, as the platform counts.
"""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import clean_environ, health_at, idle_at
from waiting import wait_for

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")

RUNS = 20
MESSAGES_PER_RUN = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def echo(request: RecordedRequest) -> FakeReply:
    return FakeReply.text(f"echo: {request.messages[-1]['content']}")


def wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    wait_for(lambda: process.poll() is not None or health_at(url) is not None, 20, "the gateway to start")
    assert process.poll() is None, f"gateway exited with {process.returncode}"


def diagnose(unanswered: set[str | None], feishu: FakeFeishu, tmp_path: Path) -> str:
    """What happened to the unanswered messages: their pushes, and their rows in the gateway's database."""
    import sqlite3

    lines = [f"unanswered: {sorted(map(str, unanswered))}"]
    for attempt in feishu.push_log:
        if attempt.message_id in unanswered:
            lines.append(f"push {attempt}")
    db = sqlite3.connect(tmp_path / ".hermes" / "gateway.db")
    for message_id in unanswered:
        rows = db.execute("SELECT id, status FROM inbox WHERE message_id = ?", (message_id,)).fetchall()
        lines.append(f"inbox {message_id}: {rows}")
    unsent = db.execute(
        "SELECT id, status, attempts, last_error FROM outbox WHERE status != 'sent'"
    ).fetchall()
    lines.append(f"outbox not sent: {unsent}")
    return "\n".join(lines)


def test_sigkill_at_random_points_loses_nothing_and_answers_nothing_twice(tmp_path: Path) -> None:
    rng = random.Random(20261129)
    port = free_port()
    model = FakeOpenAIServer(handler=echo, latency=0.05).start_in_thread()
    feishu = FakeFeishu(time_scale=0.002, seed=7).start_in_thread()
    env = clean_environ()
    env.update(
        HERMES_BASE_URL=model.base_url, HERMES_MODEL="m", FEISHU_APP_ID=feishu.app_id,
        FEISHU_APP_SECRET=feishu.app_secret, FEISHU_VERIFICATION_TOKEN=feishu.verification_token,
        FEISHU_BASE_URL=feishu.base_url,
    )  # fmt: skip
    command = [sys.executable, "-m", "hermes_core", "serve", "--port", str(port)]
    events_url = f"http://127.0.0.1:{port}/feishu/events"
    sent_ids: list[str] = []
    try:
        for run in range(RUNS + 1):
            process = subprocess.Popen(
                command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                wait_healthy(f"http://127.0.0.1:{port}", process)
                for i in range(MESSAGES_PER_RUN if run < RUNS else 0):
                    chat = f"oc_{rng.randrange(4)}"
                    envelope = feishu.user_message(
                        f"run {run} message {i}", chat_id=chat, sender=f"ou_{chat}"
                    )
                    sent_ids.append(envelope["event"]["message"]["message_id"])
                    feishu.deliver(envelope, events_url)  # thread-safe: runs on the fake's loop
                if run < RUNS:
                    time.sleep(rng.uniform(0.0, 0.4))  # a random point: receiving, mid-turn, mid-send
                    process.send_signal(signal.SIGKILL)
                    process.wait(timeout=10)
                else:
                    answered = lambda: {m.reply_to for m in feishu.sent} >= set(sent_ids)  # noqa: E731
                    with contextlib.suppress(AssertionError):  # else the checks below say what is missing
                        wait_for(answered, 90, "a reply to every message")
                    if answered():  # and once idle, anything answered twice has been sent too
                        wait_for(lambda: idle_at(f"http://127.0.0.1:{port}"), what="the gateway to be idle")
            finally:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=30)
        replies = Counter(m.reply_to for m in feishu.sent)
        assert set(replies) == set(sent_ids), diagnose(set(sent_ids) - set(replies), feishu, tmp_path)
        twice = [(m.reply_to, m.uuid, m.text) for m in feishu.sent if replies[m.reply_to] > 1]
        assert not twice, twice
        assert len(sent_ids) == RUNS * MESSAGES_PER_RUN
    finally:
        feishu.stop()
        model.stop()
