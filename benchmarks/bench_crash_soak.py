"""Crash soak: `hermes-kernel serve` SIGKILLed at random moments while turns are in flight, then counted.

    python benchmarks/bench_crash_soak.py [--kills 40] [--seed 1]

Three processes, as in production: the gateway (`python -m hermes_core serve`, its SQLite on disk in
a temporary directory), the fake model (FakeOpenAIServer, echoing each message after a random delay
of up to 0.15 s) and the fake Feishu platform (FakeFeishu, which pushes events and pushes again the
ones the gateway did not acknowledge). Each run starts the gateway, pushes a dozen messages into
a dozen chats, waits a random moment (any moment, or the moment a turn's history is seen stored
while its message is not yet marked done) and kills it with SIGKILL; the last run lets everything
finish.

Counted afterwards, against what must hold ("nothing lost, nothing twice"):
- replies: every message answered exactly once, as the platform counts them;
- history: in each conversation's stored session history, each user turn exactly once, in the
  order the gateway accepted the messages (the inbox's order).
The figures are indicative (a shared machine): what matters is that the bad counts stay at 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest

CHATS = 12


@dataclass
class SoakResult:
    kills: int
    messages: int
    seconds: float
    user_turns_stored: int = 0
    duplicated_turns: int = 0  # user turns stored more than once (each extra copy counts)
    missing_turns: int = 0  # messages answered whose turn is not in the history
    out_of_order: list[str] = field(default_factory=list)  # conversations not in arrival order
    unanswered: int = 0
    answered_twice: int = 0

    @property
    def clean(self) -> bool:
        bad = (self.duplicated_turns, self.missing_turns, len(self.out_of_order), self.unanswered)
        return not any(bad) and not self.answered_twice

    def summary(self) -> str:
        return (
            f"{self.kills} SIGKILLs, {self.messages} messages, {self.seconds:.0f} s: "
            f"{self.user_turns_stored} user turns stored, {self.duplicated_turns} duplicated, "
            f"{self.missing_turns} missing, {len(self.out_of_order)} conversation(s) out of order; "
            f"{self.unanswered} unanswered, {self.answered_twice} answered twice"
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def wait_healthy(port: int, process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not healthy(port):
        if process.poll() is not None:
            raise AssertionError(f"gateway exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError("gateway did not become healthy")
        time.sleep(0.05)


def soak(
    workdir: Path, kills: int, *, seed: int = 1, per_run: int = 12, deadline: float = 90.0
) -> SoakResult:
    """Run the kill loop in `workdir` (the gateway's cwd; its database is `.hermes/gateway.db`)."""
    rng = random.Random(seed)
    delays = random.Random(seed + 1)

    def echo(request: RecordedRequest) -> FakeReply:
        return FakeReply.text(f"echo: {request.messages[-1]['content']}", delay=delays.uniform(0.01, 0.15))

    started = time.monotonic()
    model = FakeOpenAIServer(handler=echo).start_in_thread()
    feishu = FakeFeishu(time_scale=0.002, seed=seed).start_in_thread()
    feishu.app_qpm = 100_000
    (workdir / "hermes.yaml").write_text(  # per-sender limits off: a soak, not people
        "feishu:\n  send_rate: 200\ngateway:\n  user_messages_per_minute: null\n  conversation_queue: null\n",
        encoding="utf-8",
    )
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FEISHU_"))}
    env.update(
        HERMES_BASE_URL=model.base_url, HERMES_MODEL="m", FEISHU_APP_ID=feishu.app_id,
        FEISHU_APP_SECRET=feishu.app_secret, FEISHU_VERIFICATION_TOKEN=feishu.verification_token,
        FEISHU_BASE_URL=feishu.base_url,
    )  # fmt: skip
    command = [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "serve", "--port", str(port)]
    events = f"http://127.0.0.1:{port}/feishu/events"
    sent: list[str] = []
    try:
        for run in range(kills + 1):
            process = subprocess.Popen(
                command, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                wait_healthy(port, process)
                if run == kills:
                    _drain(feishu, sent, deadline)
                    continue
                for _ in range(per_run):
                    chat = f"oc_{rng.randrange(CHATS)}"
                    envelope = feishu.user_message(f"run {run} message {len(sent)}", chat_id=chat,
                                                   sender=f"ou_{chat}")  # fmt: skip
                    sent.append(envelope["event"]["message"]["message_id"])
                    feishu.deliver(envelope, events)
                    time.sleep(rng.uniform(0.0, 0.03))
                _kill_moment(rng, workdir / ".hermes" / "gateway.db")
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=10)
            finally:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
                    process.wait(timeout=30)
        replies = Counter(m.reply_to for m in feishu.sent)
    finally:
        feishu.stop()
        model.stop()
    result = SoakResult(kills, len(sent), time.monotonic() - started)
    result.unanswered = sum(1 for message_id in sent if message_id not in replies)
    result.answered_twice = sum(1 for count in replies.values() if count > 1)
    count_history(workdir / ".hermes" / "gateway.db", result)
    return result


def _kill_moment(rng: random.Random, database: Path) -> None:
    """Return at a random moment: any time in the next 0.4 s, or (every other run, on average) the
    moment a turn's history is seen stored while its message is not yet marked done, if that ever
    happens (it cannot once both are one transaction); else after 0.6 s."""
    if rng.random() < 0.5:
        time.sleep(rng.uniform(0.0, 0.4))
        return
    db = sqlite3.connect(database, timeout=5)
    try:
        baseline = _history_ahead(db)
        until = time.monotonic() + 0.6
        while time.monotonic() < until and _history_ahead(db) <= baseline:
            pass
    finally:
        db.close()


def _history_ahead(db: sqlite3.Connection) -> int:
    """User turns stored minus messages marked done: it grows while a turn is stored but not done."""
    stored = db.execute(
        "SELECT COUNT(*) FROM session_messages WHERE json_extract(message, '$.role') = 'user'"
    ).fetchone()[0]
    done = db.execute("SELECT COUNT(*) FROM inbox WHERE status = 'done'").fetchone()[0]
    return int(stored) - int(done)


def _drain(feishu: FakeFeishu, sent: list[str], deadline: float) -> None:
    """Let the last process answer everything (re-pushed events included), then a little longer."""
    until = time.monotonic() + deadline
    while time.monotonic() < until:
        if {m.reply_to for m in feishu.sent} >= set(sent):
            break
        time.sleep(0.1)
    time.sleep(0.5)  # anything answered twice would show up now


def count_history(database: Path, result: SoakResult) -> None:
    """Compare each conversation's stored user turns with the messages its inbox accepted, in order."""
    db = sqlite3.connect(database)
    try:
        accepted: dict[str, list[str]] = {}
        for conversation, payload in db.execute("SELECT conversation, payload FROM inbox ORDER BY id"):
            accepted.setdefault(conversation, []).append(json.loads(payload)["text"])
        stored: dict[str, list[str]] = {}
        rows = db.execute("SELECT conversation, message FROM session_messages ORDER BY conversation, seq")
        for conversation, message in rows:
            data = json.loads(message)
            if data.get("role") == "user":
                stored.setdefault(conversation, []).append(str(data.get("content")))
    finally:
        db.close()
    for conversation, texts in accepted.items():
        turns = stored.get(conversation, [])
        result.user_turns_stored += len(turns)
        counts = Counter(turns)
        result.duplicated_turns += sum(count - 1 for count in counts.values() if count > 1)
        result.missing_turns += sum(1 for text in texts if text not in counts)
        if list(dict.fromkeys(turns)) != [text for text in texts if text in counts]:
            result.out_of_order.append(conversation)


def run(kills: int = 40, seed: int = 1) -> dict:
    from _common import format_table, machine, row

    with tempfile.TemporaryDirectory(prefix="hermes-soak-") as workdir:
        result = soak(Path(workdir), kills, seed=seed)
    rows = [
        row("crash soak: duplicated user turns", str(result.duplicated_turns), "0", result.duplicated_turns,
            0, " turns"),
        row("crash soak: missing user turns", str(result.missing_turns), "0", result.missing_turns,
            0, " turns"),
        row("crash soak: conversations out of order", str(len(result.out_of_order)), "0",
            len(result.out_of_order), 0, " convs"),
        row("crash soak: messages unanswered", str(result.unanswered), "0", result.unanswered, 0, " msgs"),
        row("crash soak: messages answered twice", str(result.answered_twice), "0", result.answered_twice,
            0, " msgs"),
    ]  # fmt: skip
    print(f"{machine()}; {result.summary()}")
    print(format_table(rows))
    return {"rows": rows, "result": result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    figures = run(args.kills, args.seed)
    sys.exit(0 if figures["result"].clean else 1)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
