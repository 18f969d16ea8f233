"""Stuck sync tools: a sync tool that never returns must not hold the process, nor starve others.

Python cannot kill a thread; kernel/tools/registry.py runs sync tools on daemon threads of its own,
abandons (and replaces) a worker whose call timed out, and refuses further calls of a tool with
too many stuck threads. Each test performs a case of the report on the issue "Nothing lost,
nothing twice, nothing stuck" against real processes: a script using `Agent.run_sync`,
`hermes-kernel run`, and `hermes-kernel serve` (SQLite on disk, webhook, the fake model).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from hermes_core.testing.fake_openai import FakeOpenAIServer
from serve_process import Folder, follow_the_words, quietly
from waiting import wait_for

STUCK_TOOLS = '''
import time
from hermes_core import tool

def stuck(arg: str) -> str:
    """Never return (in practice: a network call without a timeout, a lock never released)."""
    with open("stuck-calls.txt", "a") as calls:  # in serve's folder: the tests wait for it
        calls.write(arg + "\\n")
    time.sleep(45)
    return "too late"

@tool(level=0, timeout=1)
def instant(arg: str) -> str:
    """Answer at once."""
    return f"instant {arg}"

TOOLS = [instant, *(tool(name=f"stuck_{i}", level=0, timeout=1)(stuck) for i in range(8))]
'''


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    server = FakeOpenAIServer(handler=follow_the_words).start_in_thread()
    yield server
    server.stop()


def test_run_sync_exits_with_its_reply_not_when_the_tool_returns(tmp_path: Path) -> None:
    """Attack (from the report): `Agent.run_sync` with a sync tool that hangs. Before: run_sync
    returned after the 1 s timeout, but the process exited only when the tool did (the thread
    pool's workers are joined at interpreter exit: 61 s). Now the process exits with its reply."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent('''
        import time
        from hermes_core import Agent, tool
        from hermes_core.testing import ScriptedModel, call, reply

        @tool(level=0, timeout=1)
        def hang(arg: str) -> str:
            """Hang."""
            time.sleep(45)
            return "too late"

        model = ScriptedModel([call("hang", {"arg": "x"}), reply("gave up waiting")])
        agent = Agent(model=model, tools=[hang])
        print(agent.run_sync("go").reply, flush=True)
    '''), encoding="utf-8")  # fmt: skip
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gave up waiting"
    assert elapsed < 8, f"the process lingered: {elapsed:.1f} s"


@pytest.mark.slow
def test_hermes_core_run_exits_promptly_after_its_reply(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Attack (from the report): `hermes-kernel run` whose model calls a hanging sync tool. Before:
    the reply was printed after the tool's timeout, then the process lingered until the tool
    returned. Now it exits within a second or two of printing its reply."""
    folder = Folder(tmp_path, STUCK_TOOLS, "", model.base_url)
    process = subprocess.Popen(
        folder.command("run", "call stuck_0 x"), cwd=tmp_path, env=folder.env,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        printed = time.monotonic()
        process.wait(timeout=60)
        lingered = time.monotonic() - printed
    finally:
        if process.poll() is None:
            process.kill()
    assert line.startswith("tool said: ") and "timed out after 1 s" in line
    assert lingered < 2, f"exited {lingered:.1f} s after its reply"


@pytest.mark.slow
def test_serve_stops_within_its_grace_with_a_stuck_tool(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Attack (from the report): SIGTERM to `serve` while a sync tool hangs (a long timeout, so the
    call is still running). Before: 29 s to stop — the grace, then the wait for the thread at
    exit. Now it stops within its grace period (1 s) plus 2 s."""
    tools = STUCK_TOOLS.replace("timeout=1)(stuck)", "timeout=40)(stuck)")
    folder = Folder(tmp_path, tools, "gateway: {shutdown_grace: 1}\n", model.base_url)
    server = folder.serve()
    try:
        sender = threading.Thread(target=quietly(server.webhook, "call stuck_0 x"), daemon=True)
        sender.start()
        wait_for(lambda: (tmp_path / "stuck-calls.txt").exists(), what="the tool to start")
    finally:
        took = server.stop(timeout=60)
    assert took < 1 + 2, f"SIGTERM → exit took {took:.1f} s"
    assert server.process.returncode == 0


@pytest.mark.slow
def test_stuck_tools_cannot_starve_the_others(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Attack (from the report): 32 calls of sync tools that hang (8 tools × 4 parallel calls, each
    timing out after 1 s) fill what used to be the shared 32-thread pool. Before: every later
    sync call, even an instant one, "timed out". Now the abandoned workers are replaced, so an
    instant tool answers at once; and a further call of a tool with 4 stuck threads is refused at
    once with a clear error instead of starting a fifth."""
    server = Folder(tmp_path, STUCK_TOOLS, "", model.base_url).serve()
    try:
        senders = [
            threading.Thread(target=quietly(server.webhook, f"parallel stuck_{i} 4", f"user{i}"))
            for i in range(8)
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(timeout=30)
        assert server.get("/healthz")[1]["turns_done"] == 8
        started = time.monotonic()
        answer = server.webhook("call instant now", user="other")["reply"]
        instant_took = time.monotonic() - started
        started = time.monotonic()
        refused = server.webhook("call stuck_3 again", user="other2")["reply"]
        refusal_took = time.monotonic() - started
    finally:
        server.stop()
    assert answer == "tool said: instant now", answer
    assert instant_took < 1.0
    assert "tool stuck_3 is not run: 4 earlier calls of it timed out and are still running" in refused
    assert refusal_took < 1.0  # refused, not started and timed out
    assert "abandoned after" in server.output()


@pytest.mark.slow
def test_a_refused_tool_is_available_again_once_its_threads_return(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Attack: a tool that hangs for a while (3 s, its timeout 0.5 s) is called until 4 of its
    threads are stuck, then again. The refusal must not be forever: once the stuck threads
    return (their late results are discarded), the tool runs again."""
    tools = STUCK_TOOLS.replace("time.sleep(45)", "time.sleep(3)").replace(
        "timeout=1)(stuck)", "timeout=0.5)(stuck)"
    )
    server = Folder(tmp_path, tools, "", model.base_url).serve()
    try:
        stuck = server.webhook("parallel stuck_0 4")["reply"]
        refused = server.webhook("call stuck_0 again", user="u2")["reply"]
        returned = "tool stuck_0 returned"  # logged once an abandoned thread is let go
        wait_for(lambda: server.output().count(returned) == 4, what="the four threads to return")
        again = server.webhook("call stuck_0 later", user="u3")["reply"]
    finally:
        server.stop()
    assert stuck.count("timed out after 0.5 s") == 4
    assert "still running; it is unavailable until they return" in refused
    assert "timed out after 0.5 s" in again  # run (and abandoned) again, not refused
    assert "after it was abandoned; result discarded" in server.output()
