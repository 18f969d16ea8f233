"""Poison messages: what a tool raises or returns must never end the task, nor the process; a
message that still takes the process down is set aside instead of crash-looping.

Every test runs `hermes-kernel serve` as a real process (SQLite on disk, webhook or the fake Feishu
platform, the fake OpenAI-compatible model following the words of the message, tests/serve_process.py).
The cases come from the report on the issue "Nothing lost, nothing twice, nothing stuck".
"""

from __future__ import annotations

import re
import sqlite3
import threading
from pathlib import Path

import pytest

from hermes_core.kernel.replies import REPLIES
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer
from serve_process import Folder, follow_the_words, quietly
from waiting import wait_for

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")

RAISING_TOOLS = '''
import argparse, asyncio
from hermes_core import tool

class Custom(BaseException):
    """Not an Exception: a library's own "abort" signal."""

def misbehave(kind):
    if kind == "argparse":  # what argparse does on bad input: print usage, raise SystemExit(2)
        argparse.ArgumentParser(prog="parse").parse_args(["--no-such-flag"])
    raise {"exit": SystemExit(3), "interrupt": KeyboardInterrupt("ctrl-c"),
           "genexit": GeneratorExit("closed"), "custom": Custom("custom abort"),
           "cancelled": asyncio.CancelledError("gave up by itself")}[kind]

@tool(level=0)
def sync_raise(arg: str) -> str:
    """Raise the named exception (a sync tool, on a thread)."""
    misbehave(arg)
    return "unreachable"

@tool(level=0)
async def async_raise(arg: str) -> str:
    """Raise the named exception (an async tool, on the event loop)."""
    await asyncio.sleep(0)  # an async tool: it awaits before it raises
    misbehave(arg)
    return "unreachable"

@tool(level=0)
def circular(arg: str) -> dict:
    """Return a result that refers to itself."""
    result = {"name": arg}
    result["self"] = result
    return result

@tool(level=0)
async def slow(arg: str) -> str:
    """Take 60 s, unless told to be quick."""
    if arg != "quick":
        with open("slow-calls.txt", "a") as calls:  # in serve's folder: the test waits for it
            calls.write(arg + "\\n")
        await asyncio.sleep(60)
    return "slow finished"
'''

KINDS = {
    "argparse": "SystemExit: 2",
    "exit": "SystemExit: 3",
    "interrupt": "KeyboardInterrupt: ctrl-c",
    "genexit": "GeneratorExit: closed",
    "custom": "Custom: custom abort",
    "cancelled": "CancelledError: gave up by itself",
}


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    server = FakeOpenAIServer(handler=follow_the_words).start_in_thread()
    yield server
    server.stop()


def test_no_exception_from_a_tool_leaves_the_task(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Attack: tools raise SystemExit (argparse on bad input, and directly), KeyboardInterrupt,
    GeneratorExit, a custom BaseException subclass and — while nothing cancels them — CancelledError,
    each from a sync tool (on its thread) and from an async tool. Before: the first SystemExit
    killed `serve` (and the saved message killed it again on restart); a spontaneous CancelledError
    left the conversation without a reply. Now each is an error result the model reads, the
    process keeps serving, and the same conversation goes on."""
    server = Folder(tmp_path, RAISING_TOOLS, "", model.base_url).serve()
    try:
        for tool in ("sync_raise", "async_raise"):
            for kind, shown in KINDS.items():
                user = f"{tool}-{kind}"
                answer = server.webhook(f"call {tool} {kind}", user=user)
                assert answer["reply"].startswith("tool said: "), answer
                assert f"tool {tool} failed: {shown}" in answer["reply"], answer
                assert server.webhook("still there?", user=user)["reply"] == "ok: still there?"
        assert server.process.poll() is None
        assert server.get("/healthz")[1]["turns_done"] == 4 * len(KINDS)
    finally:
        assert server.stop() < 10
    assert server.process.returncode == 0


def test_a_circular_tool_result_is_an_error_result(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Attack: a tool returns a dict that contains itself. Before: json.dumps raised ValueError out
    of `Agent.run` and the user got the generic internal-error reply. Now the model reads an error
    result saying the result cannot be serialised, and answers."""
    server = Folder(tmp_path, RAISING_TOOLS, "", model.base_url).serve()
    try:
        reply = server.webhook("call circular loop")["reply"]
    finally:
        server.stop()
    assert reply.startswith("tool said: ")
    assert "tool circular returned a result that cannot be serialised as JSON" in reply
    assert "Circular reference" in reply


def test_a_real_cancellation_still_propagates_and_is_no_crash(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Attack (the other side of turning CancelledError into a result): SIGTERM while an async tool
    is running, twice in a row. The turn's cancellation must propagate — no "tool failed:
    CancelledError" reply, the message stays pending and runs again at the next start — and a
    graceful stop is not a crash: after two of them the message is answered, not set aside."""
    folder = Folder(tmp_path, RAISING_TOOLS, "gateway: {shutdown_grace: 0.5}\n", model.base_url)
    calls = tmp_path / "slow-calls.txt"  # one line each time the tool starts
    for run in range(2):
        server = folder.serve()
        try:
            if run == 0:  # the second start resumes the same message
                threading.Thread(target=quietly(server.webhook, "call slow hang"), daemon=True).start()
            started = lambda n=run + 1: calls.exists() and len(calls.read_text().splitlines()) == n  # noqa: E731
            wait_for(started, what="the tool to start")
        finally:
            assert server.stop() < 0.5 + 2
        with sqlite3.connect(tmp_path / ".hermes" / "gateway.db") as db:
            rows = db.execute("SELECT status, attempts FROM inbox").fetchall()
            outbox = db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]
        assert rows == [("pending", 0)] and outbox == 0  # not completed with an error, not counted
    (tmp_path / "test_tools_mod.py").write_text(
        (tmp_path / "test_tools_mod.py").read_text().replace('arg != "quick"', "False"), encoding="utf-8"
    )
    server = folder.serve()
    try:
        wait_for(lambda: server.get("/healthz")[1].get("turns_done") == 1, what="the resumed turn")
        counts = server.get("/healthz")[1]
    finally:
        server.stop()
    assert counts["set_aside"] == 0
    with sqlite3.connect(tmp_path / ".hermes" / "gateway.db") as db:
        replies = [row[0] for row in db.execute("SELECT payload FROM outbox")]
    assert len(replies) == 1 and "slow finished" in replies[0]


KILLING_TOOLS = '''
import os, signal
from hermes_core import tool

@tool(level=0)
def explode(arg: str) -> str:
    """Read something that makes the process die (a native crash, an os._exit in a library)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"
'''


@pytest.mark.parametrize("text, language", [("call explode now", "en"), ("call explode 现在", "zh")])
def test_a_message_that_kills_the_process_twice_is_set_aside(  # type: ignore[no-untyped-def]
    tmp_path: Path, model, text: str, language: str
) -> None:
    """Attack: a Feishu message whose tool kills the process outright (SIGKILL: no exception to
    catch). Before: it ran again at every start and killed every start — a crash loop, and the
    conversation never answered again. Now: serve dies, restarts, dies; at the third start the
    message is set aside (ERROR log line, /healthz `set_aside`), its sender gets the polite reply
    in their language exactly once (also after a further restart), and later messages of the
    conversation are answered."""
    feishu = FakeFeishu(time_scale=0.001).start_in_thread()
    try:
        folder = Folder(
            tmp_path, KILLING_TOOLS, "", model.base_url, FEISHU_APP_ID=feishu.app_id,
            FEISHU_APP_SECRET=feishu.app_secret, FEISHU_VERIFICATION_TOKEN=feishu.verification_token,
            FEISHU_BASE_URL=feishu.base_url,
        )  # fmt: skip
        envelope = feishu.user_message(text, chat_id="oc_poison")
        message_id = envelope["event"]["message"]["message_id"]
        first = folder.serve()
        feishu.deliver(envelope, f"{first.url}/feishu/events")
        first.process.wait(timeout=30)  # killed by its tool
        second = folder.serve()  # runs the saved message again: killed again
        second.process.wait(timeout=30)
        assert first.process.returncode == second.process.returncode == -9
        third = folder.serve()
        try:
            wait_for(lambda: any(m.reply_to == message_id for m in feishu.sent), what="the set-aside reply")
            later = feishu.user_message("hello again", chat_id="oc_poison")
            feishu.deliver(later, f"{third.url}/feishu/events")
            later_id = later["event"]["message"]["message_id"]
            wait_for(lambda: any(m.reply_to == later_id for m in feishu.sent), what="the next reply")
            counts = third.get("/healthz")[1]
        finally:
            third.stop()
        assert counts["set_aside"] == 1 and third.process.returncode == 0
        assert re.search(rf"ERROR +hermes_core.gateway: message {message_id} .* set aside", third.output())
        fourth = folder.serve()
        wait_for(fourth.idle, what="the restarted node to be idle")  # a second set-aside reply is out by then
        fourth.stop()
        replies = [m.text for m in feishu.sent if m.reply_to == message_id]
        assert replies == [REPLIES["set_aside"][language]]
        assert [m.text for m in feishu.sent if m.reply_to == later_id] == ["ok: hello again"]
    finally:
        feishu.stop()
