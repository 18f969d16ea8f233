"""Sync tools declared `inline` run on the event loop (kernel/tools/registry.py `_run_inline`).

The hop to a worker thread is most of what a quick sync tool costs (benchmarks/bench_overhead.py);
a tool that says it returns at once skips it, keeps the isolation a thread gave it (its context
variable changes and its crashes stay its own), and loses the privilege after one slow call.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time

import pytest

from hermes_core import Agent, Tool, tool
from hermes_core.kernel.tools.declare import ToolDefinitionError
from hermes_core.kernel.tools.registry import INLINE_SECONDS
from hermes_core.testing import ScriptedModel, call, reply

current: contextvars.ContextVar[str] = contextvars.ContextVar("current", default="none")


def thread_of_each_call(declared_inline: bool) -> tuple[list[int], list[str], Tool]:
    threads: list[int] = []
    seen: list[str] = []

    @tool(inline=declared_inline)
    def mark(label: str) -> str:
        """Record where this call runs."""
        threads.append(threading.get_ident())
        seen.append(current.get())
        current.set(label)  # must not leak into the loop's context
        return label

    return threads, seen, mark


@pytest.mark.parametrize("declared_inline", [True, False])
async def test_an_inline_tool_runs_on_the_loop_thread_and_its_context_changes_stay_its_own(
    declared_inline: bool,
) -> None:
    threads, seen, mark = thread_of_each_call(declared_inline)
    model = ScriptedModel([call("mark", {"label": "a"}), call("mark", {"label": "b"}), reply("done")])
    result = await Agent(model=model, tools=[mark]).run("mark twice")
    assert result.reply == "done" and [o.ok for o in result.tool_calls] == [True, True]
    on_loop = [ident == threading.get_ident() for ident in threads]
    assert on_loop == [declared_inline, declared_inline]
    assert seen == ["none", "none"] and current.get() == "none"  # the first call's set did not leak


async def test_an_inline_tool_that_raises_systemexit_is_a_failed_call_not_a_stopped_process() -> None:
    @tool(inline=True)
    def parse(text: str) -> str:
        """Parse like argparse does: exit on bad input."""
        raise SystemExit(2)

    model = ScriptedModel([call("parse", {"text": "--bad"}), reply("could not parse")])
    result = await Agent(model=model, tools=[parse]).run("parse it")
    assert result.reply == "could not parse"
    assert result.tool_calls[0].error == "exception" and "SystemExit" in result.tool_calls[0].content


async def test_a_slow_inline_call_is_logged_and_the_tool_s_later_calls_go_to_a_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    threads: list[int] = []

    @tool(inline=True)
    def slow(n: int) -> int:
        """Declared inline, but the first call blocks."""
        threads.append(threading.get_ident())
        if n == 0:
            time.sleep(INLINE_SECONDS * 3)
        return n

    model = ScriptedModel([call("slow", {"n": 0}), call("slow", {"n": 1}), reply("done")])
    with caplog.at_level(logging.WARNING, logger="hermes_core.tools"):
        result = await Agent(model=model, tools=[slow]).run("go")
    assert result.reply == "done"
    assert [ident == threading.get_ident() for ident in threads] == [True, False]
    assert not slow.inline
    assert any("slow is declared inline but took" in r.getMessage() for r in caplog.records)


def test_inline_is_refused_for_an_async_function() -> None:
    async def fetch(url: str) -> str:
        """An async tool runs on the loop already."""
        return url

    with pytest.raises(ToolDefinitionError, match="inline is for sync functions"):
        tool(inline=True)(fetch)


async def test_an_inline_wrapper_that_returns_a_coroutine_has_it_awaited() -> None:
    """A sync callable that hands back a coroutine (a decorator around an async function) is
    awaited, inline as on a thread, instead of rendering a coroutine object for the model."""

    async def fetch(n: int) -> int:
        return n * 2

    @tool(inline=True)
    def twice(n: int) -> object:
        """Double a number, the async way."""
        return fetch(n)

    model = ScriptedModel([call("twice", {"n": 21}), reply("done")])
    result = await Agent(model=model, tools=[twice]).run("double 21")
    assert result.tool_calls[0].ok and result.tool_calls[0].content == "42"
