"""What observers are told as a task runs: `TaskHooks`, called at five points of each step.

Observers (the trace record, the log events, OpenTelemetry spans, the latency metrics: all of
observe/traces.py's `TaskTrace`; the terminal's line for each tool call, cli_display.py
`ShownTools`) only watch; they never change a request or a result. So they are told what
happened instead of wrapping the model client and the tool registry:

    on_model_start(messages, tools)      before each model call
    on_model_end(response, error)        after it: the response, or the exception it raised
    on_tool_start(call)                  before each tool call (parallel calls: concurrently)
    on_tool_end(call, outcome, error)    after it: the outcome, or the exception it raised
    on_tool_cancelled(call)              instead, when the task is cancelled during the call (Ctrl-C)

What substitutes results (the journal replaying a task, replay feeding recorded outputs) stays a
wrapper (tasks/journal.py, observe/replay.py); the hooks see what the loop sees, replayed steps
included. The shape follows openai-agents' `RunHooks` (on_llm_start/on_llm_end,
on_tool_start/on_tool_end).

Whoever runs model and tools — the loop, plan mode (plans/executor.py) — calls them through
`call_model` and `call_tool`, so every caller tells the hooks the same way. A task's observers
(the agent's `hooks` and the tracer's) are told in turn through one `HookList` (stack.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from .messages import JSON, Message, ModelResponse, ToolCall
from .model import ModelClient, TextCallback
from .tools import ToolContext, ToolRegistry
from .tools.registry import DEFAULT_TOOL_TIMEOUT, ToolOutcome
from .tools.results import DEFAULT_MAX_CHARS


class TaskHooks:
    """The five calls of a task's run; each is a no-op here, an observer overrides what it needs."""

    async def on_model_start(self, messages: list[Message], tools: list[dict[str, JSON]] | None) -> None:
        return None

    async def on_model_end(self, response: ModelResponse | None, error: BaseException | None) -> None:
        return None

    async def on_tool_start(self, call: ToolCall) -> None:
        return None

    async def on_tool_end(
        self, call: ToolCall, outcome: ToolOutcome | None, error: BaseException | None
    ) -> None:
        return None

    async def on_tool_cancelled(self, call: ToolCall) -> None:
        """The task was cancelled while `call` ran: no outcome will come (on_tool_end is not called)."""


NO_HOOKS = TaskHooks()


class HookList(TaskHooks):
    """Several observers, each told in turn, in their order."""

    def __init__(self, hooks: Sequence[TaskHooks]) -> None:
        self.hooks = tuple(hooks)

    async def on_model_start(self, messages: list[Message], tools: list[dict[str, JSON]] | None) -> None:
        for hooks in self.hooks:
            await hooks.on_model_start(messages, tools)

    async def on_model_end(self, response: ModelResponse | None, error: BaseException | None) -> None:
        for hooks in self.hooks:
            await hooks.on_model_end(response, error)

    async def on_tool_start(self, call: ToolCall) -> None:
        for hooks in self.hooks:
            await hooks.on_tool_start(call)

    async def on_tool_end(
        self, call: ToolCall, outcome: ToolOutcome | None, error: BaseException | None
    ) -> None:
        for hooks in self.hooks:
            await hooks.on_tool_end(call, outcome, error)

    async def on_tool_cancelled(self, call: ToolCall) -> None:
        for hooks in self.hooks:
            await hooks.on_tool_cancelled(call)


def all_hooks(hooks: Sequence[TaskHooks]) -> TaskHooks:
    """One `TaskHooks` telling each of `hooks`: NO_HOOKS for none, the one itself for one."""
    if not hooks:
        return NO_HOOKS
    return hooks[0] if len(hooks) == 1 else HookList(hooks)


async def call_model(
    hooks: TaskHooks,
    model: ModelClient,
    messages: list[Message],
    tools: list[dict[str, JSON]] | None,
    *,
    on_text: TextCallback | None = None,
) -> ModelResponse:
    """One model call, `hooks` told before it and after it (with the response or the error)."""
    if hooks is NO_HOOKS:  # nobody to tell: not a no-op awaited twice per call
        return await model.complete(messages, tools, on_text=on_text)
    await hooks.on_model_start(messages, tools)
    try:
        response = await model.complete(messages, tools, on_text=on_text)
    except Exception as exc:
        await hooks.on_model_end(None, exc)
        raise
    await hooks.on_model_end(response, None)
    return response


async def call_tool(
    hooks: TaskHooks,
    registry: ToolRegistry,
    call: ToolCall,
    *,
    timeout: float = DEFAULT_TOOL_TIMEOUT,
    max_chars: int = DEFAULT_MAX_CHARS,
    context: ToolContext | None = None,
) -> ToolOutcome:
    """One tool call, `hooks` told before it and after it (the outcome, the error, or its cancellation)."""
    if hooks is NO_HOOKS:
        return await registry.execute(call, timeout=timeout, max_chars=max_chars, context=context)
    await hooks.on_tool_start(call)
    try:
        outcome = await registry.execute(call, timeout=timeout, max_chars=max_chars, context=context)
    except asyncio.CancelledError:
        await hooks.on_tool_cancelled(call)
        raise
    except Exception as exc:  # the registry never raises; a journal that cannot write might
        await hooks.on_tool_end(call, None, exc)
        raise
    await hooks.on_tool_end(call, outcome, None)
    return outcome


__all__ = ["NO_HOOKS", "HookList", "TaskHooks", "all_hooks", "call_model", "call_tool"]
