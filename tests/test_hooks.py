"""Observers are hooks the loop calls (kernel/hooks.py); the journal stays a wrapper; one place
assembles a task's stack (stack.py), and a call passes only the layers that change it."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from hermes_core import Agent, ModelUnavailable, tool
from hermes_core.cli_display import THINKING, StatusLine, TurnDisplay, show_tool_calls
from hermes_core.kernel.approvals import Pending
from hermes_core.kernel.hooks import TaskHooks
from hermes_core.kernel.loop import Limits, run_loop
from hermes_core.kernel.messages import Message, ModelResponse, ToolCall
from hermes_core.kernel.tools.registry import ToolOutcome
from hermes_core.observe.traces import SQLiteTraceStore, Tracer
from hermes_core.plans.executor import run_plan
from hermes_core.stack import layers, task_stack
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.pending import InlineInteractions
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.tools import ToolRegistry


@tool(level=0)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Told(TaskHooks):
    """Writes down what it is told, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    async def on_model_start(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> None:
        self.seen.append(("model_start", len(messages), len(tools or [])))

    async def on_model_end(self, response: ModelResponse | None, error: BaseException | None) -> None:
        self.seen.append(("model_end", response.text if response else None, type(error).__name__))

    async def on_tool_start(self, call: ToolCall) -> None:
        self.seen.append(("tool_start", call.id))

    async def on_tool_end(
        self, call: ToolCall, outcome: ToolOutcome | None, error: BaseException | None
    ) -> None:
        self.seen.append(("tool_end", call.id, outcome.content if outcome else None))


async def test_the_loop_tells_its_hooks_each_model_call_and_tool_call() -> None:
    """Two parallel calls in one turn, then the reply: each step is told, starts before ends."""
    model = ScriptedModel([call("add", {"a": 1, "b": 2}, ("add", {"a": 3, "b": 4})), reply("3 and 7")])
    told = Told()
    messages: list[Message] = [{"role": "user", "content": "1+2, 3+4"}]
    result = await run_loop(model, ToolRegistry([add]), messages, Limits(), "en", hooks=told)
    assert result.reply == "3 and 7"
    first_id, second_id = (c.id for c in result.responses[0].tool_calls)
    assert told.seen[:2] == [("model_start", 1, 1), ("model_end", "", "NoneType")]
    assert sorted(told.seen[2:6]) == sorted(
        [
            ("tool_start", first_id),
            ("tool_start", second_id),
            ("tool_end", first_id, "3"),
            ("tool_end", second_id, "7"),
        ]
    )
    assert told.seen[6:] == [("model_start", 4, 1), ("model_end", "3 and 7", "NoneType")]


async def test_a_failed_model_call_is_told_with_its_error() -> None:
    """A model that stays unavailable: the hooks hear the error, the task ends with its fixed reply."""

    class Down(ScriptedModel):
        async def complete(self, *args: Any, **kwargs: Any) -> ModelResponse:
            raise ModelUnavailable("503 after every retry")

    told = Told()
    result = await run_loop(
        Down([]), ToolRegistry([add]), [{"role": "user", "content": "hi"}], Limits(), "en", hooks=told
    )
    assert result.stop_reason == "model_unavailable"
    assert told.seen == [("model_start", 1, 1), ("model_end", None, "ModelUnavailable")]


async def test_a_traced_journaled_call_passes_only_the_layers_that_change_it(tmp_path: Path) -> None:
    """Journal and tracer on: a model call passes the journal, redaction, text-mode calls and the
    back-end (the tracer is told, not passed through); a tool call the journal and the registry."""
    database = tmp_path / "g.db"
    agent = Agent(
        model=ScriptedModel([reply("hi")]),
        tools=[add],
        journal=SQLiteTaskJournal(database),
        tracer=Tracer(SQLiteTraceStore(database)),
    )
    stack = await task_stack(agent, "t1", "hi", [{"role": "user", "content": "hi"}])
    assert layers(stack.model) == ["JournaledModel", "RedactingModelClient", "TextToolCalls", "ScriptedModel"]
    assert layers(stack.registry) == ["JournaledTools", "ToolRegistry"]
    assert stack.hooks is stack.trace
    await agent.journal.close()
    await agent.tracer.close()


async def test_a_resumed_task_traces_its_replayed_steps(tmp_path: Path) -> None:
    """The hooks see what the loop sees: a task run again from its journal is traced step by step,
    though neither the model nor the tool runs again."""
    database = tmp_path / "g.db"
    ran: list[int] = []

    @tool(level=0)
    def count(n: int) -> int:
        """Count."""
        ran.append(n)
        return n

    journal, tracer = SQLiteTaskJournal(database), Tracer(SQLiteTraceStore(database))
    agent = Agent(
        model=ScriptedModel([call("count", {"n": 1}), reply("1")]),
        tools=[count],
        journal=journal,
        tracer=tracer,
    )
    await agent.run("count", task_id="t1")
    again = Agent(model=ScriptedModel([]), tools=[count], journal=journal, tracer=tracer)
    result = await again.run("count", task_id="t1")
    record = await tracer.store.get("t1")
    await journal.close()
    await tracer.close()
    assert result.reply == "1" and ran == [1]
    assert record is not None and len(record["model_calls"]) == 2
    assert [(c["turn"], c["name"], c["result"]) for c in record["tool_calls"]] == [(1, "count", "1")]


class ToldAll(Told):
    """Also writes down a tool call cancelled under it."""

    async def on_tool_cancelled(self, call: ToolCall) -> None:
        self.seen.append(("tool_cancelled", call.id))


async def test_plan_mode_tells_the_agents_hooks_as_the_loop_does() -> None:
    """Plan mode calls the hooks itself: the plan's model call (no tools offered), each step's
    tool call, the answer's model call — the same calls, in the same shape, as the loop makes."""
    plan = json.dumps({"steps": [{"id": "sum", "tool": "add", "params": {"a": 1, "b": 2}}]})
    told = ToldAll()
    agent = Agent(model=ScriptedModel([plan, reply("it is 3")]), tools=[add], hooks=[told])
    result = await run_plan(agent, "what is 1+2?", task_id="t1")
    assert result.reply == "it is 3" and result.model_calls == 2
    assert told.seen == [
        ("model_start", 2, 0),
        ("model_end", plan, "NoneType"),
        ("tool_start", "t1:plan0:sum"),
        ("tool_end", "t1:plan0:sum", "3"),
        ("model_start", 4, 0),
        ("model_end", "it is 3", "NoneType"),
    ]


async def test_the_agents_hooks_and_its_trace_are_both_told_of_every_step(tmp_path: Path) -> None:
    """An agent's own observers and its tracer: both told of every step (one HookList)."""
    database = tmp_path / "g.db"
    told = ToldAll()
    tracer = Tracer(SQLiteTraceStore(database))
    model = ScriptedModel([call("add", {"a": 2, "b": 2}), reply("4")])
    agent = Agent(model=model, tools=[add], tracer=tracer, hooks=[told])
    await agent.run("2+2", task_id="t2")
    record = await tracer.store.get("t2")
    await tracer.close()
    assert [step[0] for step in told.seen] == [
        "model_start", "model_end", "tool_start", "tool_end", "model_start", "model_end",
    ]  # fmt: skip
    assert record is not None and [c["result"] for c in record["tool_calls"]] == ["4"]


async def test_a_tool_call_cancelled_under_the_loop_is_told_as_cancelled() -> None:
    """Ctrl-C in the terminal cancels the task while a tool runs: no outcome comes, and the hooks
    hear `on_tool_cancelled` for that call (the display takes its line down), never a tool_end."""
    started = asyncio.Event()

    @tool(level=0)
    async def wait_forever() -> str:
        """Wait."""
        started.set()
        await asyncio.Event().wait()
        return "never"

    told = ToldAll()
    model = ScriptedModel([call("wait_forever")])
    messages: list[Message] = [{"role": "user", "content": "wait"}]
    registry = ToolRegistry([wait_forever])
    task = asyncio.ensure_future(run_loop(model, registry, messages, Limits(), "en", hooks=told))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    call_id = told.seen[2][1]
    assert told.seen[2:] == [("tool_start", call_id), ("tool_cancelled", call_id)]


async def test_the_terminal_display_is_a_hook_whatever_the_order_of_setup() -> None:
    """`show_tool_calls` adds hooks and leaves the registry alone: set up before the terminal's
    approvals (the other order from chat's), a tool that needs approval is still offered,
    approved and shown. Before, the display wrapped the registry and kept the interactions it had
    when it was made (none): the tool was not offered and its call was refused."""
    status = io.StringIO()
    display = TurnDisplay(StatusLine(status, enabled=True), io.StringIO(), stream=False)

    @tool(level=1, confirm=True)
    def deploy(service: str) -> str:
        """Deploy a service."""
        return f"deployed {service}"

    async def approve(pending: Pending) -> bool:
        return True

    async def no_answer(question: str) -> str:
        return ""

    agent = Agent(model=ScriptedModel([call("deploy", {"service": "web"}), reply("done")]), tools=[deploy])
    show_tool_calls(agent, display)
    agent.use_interactions(InlineInteractions(approve, no_answer))
    display.start()
    result = await agent.run("deploy web")
    assert [o.content for o in result.tool_calls] == ["deployed web"]
    assert '→ deploy({"service": "web"})' in status.getvalue()
    assert status.getvalue().endswith(f"\x1b[2m{THINKING}\x1b[0m")  # the call is over: thinking again
    stack = await task_stack(agent, "t3", "hi", [{"role": "user", "content": "hi"}])
    assert layers(stack.registry) == ["ToolRegistry"]
