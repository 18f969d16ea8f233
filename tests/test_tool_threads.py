"""The worker threads of sync tools never make the event loop wait (kernel/tools/registry.py `ToolThreads`).

A sync tool runs on a worker thread so that the loop goes on while it runs; starting that thread
must not hold the loop either. `Thread.start()` returns only once the new thread has run, which
on a busy machine takes milliseconds, and a burst of calls starts up to `MAX_TOOL_THREADS`
workers (an abandoned worker is replaced the same way).
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from hermes_core.kernel.tools.registry import ToolThreads


async def test_the_event_loop_runs_on_while_a_worker_thread_is_being_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduled = threading.Event()  # set once the loop has shown it kept running
    real_start = threading.Thread.start

    def slow_start(self: threading.Thread) -> None:  # the OS is slow to schedule the new thread
        if self.name.startswith("hermes-tool-"):
            scheduled.wait(timeout=2)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", slow_start)
    threads = ToolThreads(idle_seconds=0.5)  # its own workers, none warm from another test
    call = asyncio.ensure_future(threads.run("add", lambda: 1 + 2))
    turns, deadline = 0, time.monotonic() + 1
    while turns < 20 and time.monotonic() < deadline:  # other tasks get their turns meanwhile
        await asyncio.sleep(0)
        turns += 1
    ran_meanwhile = turns == 20 and not scheduled.is_set()
    scheduled.set()
    assert await asyncio.wait_for(call, timeout=5) == 3
    assert ran_meanwhile, "the event loop waited for the worker thread to start"
