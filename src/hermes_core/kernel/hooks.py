"""What observers are told as a task runs: the loop calls its `TaskHooks` at four points.

Observers (the trace record, the log events, OpenTelemetry spans, the latency metrics: all of
observe/traces.py's `TaskTrace`) only watch; they never change a request or a result. So they are
told what happened instead of wrapping the model client and the tool registry:

    on_model_start(messages, tools)      before each model call
    on_model_end(response, error)        after it: the response, or the exception it raised
    on_tool_start(call)                  before each tool call (parallel calls: concurrently)
    on_tool_end(call, outcome, error)    after it: the outcome, or the exception it raised

What substitutes results (the journal replaying a task, replay feeding recorded outputs) stays a
wrapper (tasks/journal.py, observe/replay.py); the hooks see what the loop sees, replayed steps
included. The shape follows openai-agents' `RunHooks` (on_llm_start/on_llm_end,
on_tool_start/on_tool_end).

A caller that runs model and tools without the loop (plan mode) gets them through `hooked`: thin
wrappers that make the same four calls.
"""

from __future__ import annotations

from typing import Any

from .messages import Message, ModelResponse, ToolCall
from .model import ModelWrapper, TextCallback
from .tools import ToolContext, ToolRegistry
from .tools.registry import DEFAULT_TOOL_TIMEOUT, RegistryWrapper, ToolOutcome
from .tools.results import DEFAULT_MAX_CHARS


class TaskHooks:
    """The four calls of a task's run; each is a no-op here, an observer overrides what it needs."""

    async def on_model_start(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> None:
        return None

    async def on_model_end(self, response: ModelResponse | None, error: BaseException | None) -> None:
        return None

    async def on_tool_start(self, call: ToolCall) -> None:
        return None

    async def on_tool_end(
        self, call: ToolCall, outcome: ToolOutcome | None, error: BaseException | None
    ) -> None:
        return None


NO_HOOKS = TaskHooks()


class AllHooks(TaskHooks):
    """Several observers told of the same task, in order (the trace, a channel streaming the reply)."""

    def __init__(self, *observers: TaskHooks) -> None:
        self.observers = [hooks for hooks in observers if hooks is not NO_HOOKS]

    async def on_model_start(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> None:
        for hooks in self.observers:
            await hooks.on_model_start(messages, tools)

    async def on_model_end(self, response: ModelResponse | None, error: BaseException | None) -> None:
        for hooks in self.observers:
            await hooks.on_model_end(response, error)

    async def on_tool_start(self, call: ToolCall) -> None:
        for hooks in self.observers:
            await hooks.on_tool_start(call)

    async def on_tool_end(
        self, call: ToolCall, outcome: ToolOutcome | None, error: BaseException | None
    ) -> None:
        for hooks in self.observers:
            await hooks.on_tool_end(call, outcome, error)


def hooked(model: Any, registry: ToolRegistry, hooks: TaskHooks) -> tuple[Any, ToolRegistry]:
    """The model and tools for a caller that is not the loop: each call reported to `hooks`."""
    return HookedModel(model, hooks), HookedTools(registry, hooks)


class HookedModel(ModelWrapper):
    def __init__(self, inner: Any, hooks: TaskHooks) -> None:
        super().__init__(inner)
        self.hooks = hooks

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        await self.hooks.on_model_start(messages, tools)
        try:
            response = await self.inner.complete(messages, tools, on_text=on_text)
        except Exception as exc:
            await self.hooks.on_model_end(None, exc)
            raise
        await self.hooks.on_model_end(response, None)
        return response


class HookedTools(RegistryWrapper):
    def __init__(self, registry: ToolRegistry, hooks: TaskHooks) -> None:
        super().__init__(registry)
        self.hooks = hooks

    async def execute(
        self,
        call: ToolCall,
        *,
        timeout: float = DEFAULT_TOOL_TIMEOUT,
        max_chars: int = DEFAULT_MAX_CHARS,
        context: ToolContext | None = None,
    ) -> ToolOutcome:
        await self.hooks.on_tool_start(call)
        try:
            outcome = await self.inner.execute(call, timeout=timeout, max_chars=max_chars, context=context)
        except Exception as exc:  # the registry never raises; a journal that cannot write might
            await self.hooks.on_tool_end(call, None, exc)
            raise
        await self.hooks.on_tool_end(call, outcome, None)
        return outcome


__all__ = ["NO_HOOKS", "AllHooks", "HookedModel", "HookedTools", "TaskHooks", "hooked"]
