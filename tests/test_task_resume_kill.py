"""Kill -9 at each step of a 4-tool task, restart: the write ran once, the task finished, one reply.

A write interrupted mid-call is not run again by the kernel (its outcome is unknown); the model is
told so and, like a careful model would, checks with a read-only tool before writing again.

The gateway runs as a real process (`hermes-kernel serve`) with the Feishu channel against the fake
platform and the model behind the fake OpenAI-compatible server; the test kills it by PID at each
step: while each model request is in flight, inside each tool, and just after the write took
effect but before its result was recorded.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import clean_environ, idle_at
from waiting import wait_for

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")

TOOLS_MODULE = '''
import os, time
from hermes_core import tool

def mark(text):
    with open(os.environ["RESUME_MARKS"], "a") as marks:
        marks.write(text + "\\n")

@tool(level=0)
def read_step(n: int) -> str:
    """Read the data of step n."""
    mark(f"start read_step {n}")
    time.sleep(0.4)
    return f"data {n}"

@tool(level=0)
def record_exists(text: str) -> bool:
    """Check whether a record was written."""
    path = os.environ["RESUME_EFFECTS"]
    return os.path.exists(path) and text in open(path).read().splitlines()

@tool(level=1)
def write_record(text: str) -> str:
    """Write a record (a reversible write)."""
    mark("start write_record")
    time.sleep(0.2)
    with open(os.environ["RESUME_EFFECTS"], "a") as effects:
        effects.write(text + "\\n")
    mark("effect write_record")
    time.sleep(0.4)
    return "written"
'''

PLAN = [
    ("read_step", {"n": 1}),
    ("write_record", {"text": "weekly"}),
    ("read_step", {"n": 2}),
    ("read_step", {"n": 3}),
]
KILL_POINTS = [
    *[f"model request {k}" for k in range(1, 6)],
    "start read_step 1",
    "start write_record",
    "effect write_record",  # the write took effect, its result is not journaled yet
    "start read_step 2",
    "start read_step 3",
]


def four_tool_model(request: RecordedRequest) -> FakeReply:
    """Follows PLAN; told that the write's outcome is unknown, it checks before writing again."""
    names = {c["id"]: c["function"]["name"] for m in request.messages for c in m.get("tool_calls") or []}
    results = [(names.get(m["tool_call_id"]), m["content"]) for m in request.messages if m["role"] == "tool"]
    written = any(r == ("write_record", "written") or r == ("record_exists", "true") for r in results)
    done = sum(1 for name, _ in results if name == "read_step") + written
    last = results[-1] if results else (None, "")
    if last[0] == "write_record" and "outcome of this call is unknown" in last[1]:
        return FakeReply.tool_call("record_exists", {"text": "weekly"})
    if last == ("record_exists", "false"):
        return FakeReply.tool_call("write_record", {"text": "weekly"})
    return FakeReply.tool_call(*PLAN[done]) if done < len(PLAN) else FakeReply.text("all done")


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


@pytest.fixture(scope="module")
def platform():  # type: ignore[no-untyped-def]
    model = FakeOpenAIServer(handler=four_tool_model, latency=0.4).start_in_thread()
    feishu = FakeFeishu(time_scale=0.001).start_in_thread()
    yield model, feishu
    feishu.stop()
    model.stop()


@pytest.mark.parametrize("kill_point", KILL_POINTS)
def test_kill_at_each_step_then_resume(tmp_path: Path, platform, kill_point: str) -> None:  # type: ignore[no-untyped-def]
    model, feishu = platform
    (tmp_path / "resume_tools.py").write_text(textwrap.dedent(TOOLS_MODULE), encoding="utf-8")
    (tmp_path / "hermes.yaml").write_text("tools: [resume_tools]\n", encoding="utf-8")
    marks, effects = tmp_path / "marks.txt", tmp_path / "effects.txt"
    marks.touch()
    port = free_port()
    env = clean_environ()
    env.update(
        PYTHONPATH=str(tmp_path), RESUME_MARKS=str(marks), RESUME_EFFECTS=str(effects),
        HERMES_BASE_URL=model.base_url, HERMES_MODEL="m", FEISHU_APP_ID=feishu.app_id,
        FEISHU_APP_SECRET=feishu.app_secret, FEISHU_VERIFICATION_TOKEN=feishu.verification_token,
        FEISHU_BASE_URL=feishu.base_url,
    )  # fmt: skip
    command = [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "serve", "--port", str(port)]
    model_requests_before = len(model.requests)

    def reached() -> bool:
        if kill_point.startswith("model request"):
            return len(model.requests) - model_requests_before >= int(kill_point.rsplit(" ", 1)[1])
        return kill_point in marks.read_text(encoding="utf-8").splitlines()

    envelope = feishu.user_message(f"weekly report ({kill_point})", chat_id=f"oc_{abs(hash(kill_point))}")
    message_id = envelope["event"]["message"]["message_id"]
    first = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: healthy(port))
        feishu.deliver(envelope, f"http://127.0.0.1:{port}/feishu/events")
        wait_for(reached)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
    restarted = time.monotonic()
    second = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: healthy(port))
        up = time.monotonic()
        wait_for(lambda: any(m.reply_to == message_id for m in feishu.sent), timeout=60)
        print(
            f"\nresume after kill at {kill_point!r}: serving after {up - restarted:.2f} s, "
            f"reply after {time.monotonic() - restarted:.2f} s"
        )
        # once serve is idle, a second reply would have been sent
        wait_for(lambda: idle_at(f"http://127.0.0.1:{port}"), what="serve to be idle")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=30)
    replies = [m for m in feishu.sent if m.reply_to == message_id]
    assert [m.text for m in replies] == ["all done"]
    assert effects.read_text(encoding="utf-8").splitlines() == ["weekly"]  # the write ran exactly once
