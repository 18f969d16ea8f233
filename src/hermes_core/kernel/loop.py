"""The agent loop: the model decides, code executes tools, results go back, a reply comes out.

Read `run_loop` top to bottom; everything it needs is named for what it does. The guards of a
task (turn limit, tool-call budget, repeated calls, tools that keep failing, responses cut off by
the token limit) live in `kernel/guards.py`, so the loop itself only says *when* they are checked.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field

from .guards import TaskGuards, changes_state, cut_off_outcomes
from .hooks import NO_HOOKS, TaskHooks, call_model, call_tool
from .messages import Message, ModelResponse, ToolCall, Usage
from .model import ModelClient, ModelRequestRejected, ModelUnavailable, TextCallback, offering
from .replies import Language, fixed_reply
from .tools import Tool, ToolContext, ToolRegistry
from .tools.permissions import Caller
from .tools.registry import DEFAULT_TOOL_TIMEOUT, ToolOutcome
from .tools.results import DEFAULT_MAX_CHARS

# Tool outcomes that pause the task instead of failing a call: a person must answer first (T5, T6).
# The task stops with this stop_reason and is run again under the same task id once they have.
PAUSES = ("awaiting_approval", "awaiting_answer")


@dataclass
class Limits:
    """A task's limits, declared once (`Agent(limits=…)`, its keywords, the YAML `agent:` section);
    the bounds hold where a configuration file is read."""

    max_turns: Annotated[int, Field(ge=1, le=100)] = 8  # model calls per task
    max_tool_calls: Annotated[int, Field(ge=0, le=1000)] = 8  # executed tool calls per task
    max_tool_failures: Annotated[int, Field(ge=1)] = 3  # consecutive failures before a tool is withdrawn
    tool_timeout: Annotated[float, Field(gt=0)] = DEFAULT_TOOL_TIMEOUT  # seconds; a tool may set its own
    max_result_chars: Annotated[int, Field(ge=100)] = DEFAULT_MAX_CHARS  # of one tool result the model reads


@dataclass
class RunResult:
    reply: str
    messages: list[Message]
    tool_calls: list[ToolOutcome] = field(default_factory=list)
    responses: list[ModelResponse] = field(default_factory=list)  # raw model outputs, for the trace
    usage: Usage = Usage()  # frozen: one shared zero
    stop_reason: str = "completed"  # completed | max_turns | … | awaiting_approval | awaiting_answer
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def model_calls(self) -> int:
        return len(self.responses)

    @property
    def ok(self) -> bool:
        return self.stop_reason == "completed"


async def run_loop(
    model: ModelClient,
    registry: ToolRegistry,
    messages: list[Message],
    limits: Limits,
    language: Language,
    *,
    offer_tools: bool = True,
    task_id: str = "",
    session_id: str | None = None,
    on_text: TextCallback | None = None,
    caller: Caller | None = None,
    hooks: TaskHooks = NO_HOOKS,
) -> RunResult:
    """Run one task over `messages` (which it extends in place) until the model answers;
    `hooks` (observers: the trace, logs, spans) are told of each model call and tool call."""
    run = RunResult(reply="", messages=messages)
    guards = TaskGuards(limits, lambda name: changes_state(registry.get(name)), language)
    task_context = ToolContext("", "", task_id, session_id, caller=caller, model=model.name, spent=[])
    started = time.perf_counter()
    model_seconds = 0.0
    models, offered_at = model.models, None
    for _ in range(limits.max_turns):
        state = (len(guards.withdrawn), registry.version)
        if offered_at != state:  # once, and again after a tool was withdrawn, added or removed
            offered_at = state
            # Offered: what any of the client's models may use; each request narrows it to its model's.
            tools = registry.schemas(guards.withdrawn, caller, models) if offer_tools else []
            # a one-model client is offered exactly these: not worked out again for the request
            known = {models[0]: {t["function"]["name"] for t in tools}} if len(models) == 1 else None
            offer = registry.offer(guards.withdrawn, caller, known)
        call_started = time.perf_counter()
        try:
            with offering(offer):
                response = await call_model(hooks, model, messages, tools or None, on_text=on_text)
        except (ModelUnavailable, ModelRequestRejected) as exc:
            reason = "model_unavailable" if isinstance(exc, ModelUnavailable) else "model_rejected"
            return _finish(run, fixed_reply(reason, language), reason, started)
        finally:
            model_seconds += time.perf_counter() - call_started
        run.responses.append(response)
        run.usage += response.usage
        run.timings["model"] = model_seconds
        messages.append(response.to_message())
        if not response.tool_calls:
            return _finish(run, response.text or fixed_reply("empty_reply", language), "completed", started)
        task_context.model = response.answered_by or model.name  # permissions: the model that asked
        outcomes = await run_tool_calls(response, registry, guards, limits, task_context, hooks)
        run.tool_calls.extend(outcomes)
        while task_context.spent:  # sub-agents' tokens count towards the task's usage
            run.usage += task_context.spent.pop()
        messages.extend(outcome.to_message() for outcome in outcomes)
        paused = next((outcome for outcome in outcomes if outcome.error in PAUSES), None)
        if paused is not None:  # a person must answer first; the task is run again once they have
            return _finish(run, pause_reply(paused, language), str(paused.error), started)
        if guards.budget_exhausted:
            return _finish(run, fixed_reply("max_tool_calls", language), "max_tool_calls", started)
    return _finish(run, fixed_reply("max_turns", language), "max_turns", started)


async def run_tool_calls(
    response: ModelResponse,
    registry: ToolRegistry,
    guards: TaskGuards,
    limits: Limits,
    task: ToolContext,
    hooks: TaskHooks = NO_HOOKS,
) -> list[ToolOutcome]:
    """Run the calls of one model turn concurrently; outcomes come back in call order."""
    if response.cut_off:  # the last call's arguments are incomplete: nothing of this turn runs
        return cut_off_outcomes(response)
    planned = guards.admit(response.tool_calls)

    async def execute(call: ToolCall) -> ToolOutcome:
        context = task.for_call(call.id, call.name)  # each call its own
        timeout, chars = limits.tool_timeout, limits.max_result_chars
        outcome = await call_tool(hooks, registry, call, timeout=timeout, max_chars=chars, context=context)
        guards.record(outcome)
        return outcome

    runnable = [(i, call) for i, call in enumerate(response.tool_calls) if planned[i] is None]
    if len(runnable) == 1:  # no gather; a task only where a tool may change the context (not a sync one)
        declared, work = registry.get(runnable[0][1].name), execute(runnable[0][1])
        sync = isinstance(declared, Tool) and not declared.is_async  # it runs in a copied context
        results = [await (work if sync else asyncio.get_running_loop().create_task(work))]
    else:
        results = await asyncio.gather(*(execute(call) for _, call in runnable))
    for (i, _), outcome in zip(runnable, results, strict=True):
        planned[i] = outcome
    return [outcome for outcome in planned if outcome is not None]


def pause_reply(paused: ToolOutcome, language: Language) -> str:
    """What the user reads when a task pauses: the approval request, or the model's question."""
    if paused.error != "awaiting_approval":
        return paused.content
    arguments = json.dumps(paused.arguments or {}, ensure_ascii=False)
    return fixed_reply("approval_request", language).format(
        tool=paused.call.name, arguments=arguments, id=paused.content
    )


def _finish(run: RunResult, reply: str, reason: str, started: float) -> RunResult:
    run.reply, run.stop_reason = reply, reason
    run.timings["total"] = time.perf_counter() - started
    run.timings.setdefault("model", 0.0)
    run.timings["tools"] = sum(outcome.elapsed for outcome in run.tool_calls)
    return run


__all__ = ["PAUSES", "Limits", "RunResult", "TaskGuards", "run_loop", "run_tool_calls"]
