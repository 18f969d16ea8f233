"""Plan-and-execute mode: the model writes a whole plan, code checks and runs it, the model answers.

`run_plan(agent, message)` is the alternative to the tool loop for tasks whose steps are known
up front. It costs two model calls when all goes well, however many steps the plan has:

1. plan: the tools are described in the system message (none are offered as callable); the
   reply is parsed and validated (`plans/plan.py`). An invalid plan goes back with its problems.
2. execute: steps run in dependency order, steps that are ready together run concurrently, and
   references are resolved from earlier results. Every step is a `ToolCall` through
   `registry.execute`, so permissions, approvals, timeouts and the journal apply as in the loop;
   the task's hooks (the trace, the terminal's display) are told of each model call and step
   exactly as the loop tells them (kernel/hooks.py `call_model`, `call_tool`).
3. a failed step: the model gets the error and the results so far (its plan is above in the
   conversation) and writes a revised plan. A revised step with the same tool and arguments as
   one that already succeeded reuses that result instead of running again.
4. answer: one model call with the results.

At most `1 + max_replans` plans are written, invalid ones included. A step that pauses the task
for a person (`loop.PAUSES`: an approval, a question) stops it at once with the loop's reply for
it: no further step starts, and the task is run again under the same task id once they have
answered. Step call ids are `<task id>:plan<attempt>:<step id>`, the same on every run of the
task, which is what lets the journal replay them and an approval find its call.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..kernel.hooks import NO_HOOKS, TaskHooks, call_model, call_tool
from ..kernel.loop import PAUSES, RunResult, pause_reply
from ..kernel.messages import Message, ModelResponse, ToolCall
from ..kernel.model import ModelClient, ModelRequestRejected, ModelUnavailable
from ..kernel.replies import Language, detect_language, fixed_reply
from ..kernel.tools import ToolContext, ToolRegistry
from ..kernel.tools.permissions import Caller
from ..kernel.tools.registry import ToolOutcome
from ..kernel.tools.results import error_result
from .plan import Plan, ReferenceProblem, output_value, parse_plan, resolve, validate_plan

if TYPE_CHECKING:
    from ..agent import Agent, Session

DEFAULT_MAX_REPLANS = 2  # revised plans after a failed step or an invalid plan (agent.max_replans)

PLAN_INSTRUCTIONS = """\
Plan mode: do not call tools yourself. Reply with one JSON object, the plan, and nothing else:
{{"steps": [{{"id": "find", "tool": "<tool name>", "params": {{...}}, "requires": []}}]}}
- id: a short unique name (letters, digits, _ or -).
- params: the tool's arguments. A value may use an earlier step's result: "$output.find" is the \
whole result, "$output.find.file_id" a field of it, "$output.find.items.0" a list item; inside a \
longer string the reference is replaced by its text.
- requires: ids of steps that must finish first (steps used in params are required anyway).
- A step may only use steps listed before it. Steps that do not depend on each other run at once.
- If no tool is needed, reply {{"steps": [], "answer": "<your reply>"}}.
The code runs the plan and then gives you the results to write the answer.

Tools (name, description, JSON Schema of params):
{tools}"""

PROBLEMS = "Your plan cannot run:\n{problems}\nWrite a corrected plan, as JSON only."
STEP_FAILED = (
    "Step {step!r} ({tool}) failed: {error}\nResults so far:\n{results}\n"
    "Write a revised plan for the rest of the task, as JSON only, in the same format. A step with "
    "the same tool and params as one that succeeded reuses its result instead of running again."
)
RESULTS = (
    "The plan ran. Results:\n{results}\n"
    "Now answer the user's request from these results: the answer itself, not JSON."
)


async def run_plan(
    agent: Agent,
    message: str,
    *,
    session: Session | None = None,
    task_id: str | None = None,
    caller: Caller | None = None,
    max_replans: int = DEFAULT_MAX_REPLANS,
) -> RunResult:
    """Run one task in plan-and-execute mode; the result has the same shape as `Agent.run`'s.

    With `agent.journal`, a task run again under the same `task_id` (after a crash or a pause)
    replays its journal: recorded plans and step results are reused, nothing runs twice.
    """
    from ..agent import turn_messages

    task_id = task_id or uuid.uuid4().hex
    system, steps = agent.turn_prompt(message)  # the loop's prompt, skills too; the answer's (no catalogue)
    told = (session.notes, session.hints) if session is not None else ()
    notes = "\n\n".join(part for part in (*told, steps) if part)
    history = session.messages if session is not None else []
    if agent.mcp is not None:  # the catalogue names every tool the plan may use
        await agent.mcp.attach(agent.registry)
    catalogue = tool_catalogue(agent.registry, caller, agent.client.name)
    planning = f"{system}\n\n{PLAN_INSTRUCTIONS.format(tools=catalogue)}"
    # the notes and the triggered skills' steps go after the history, as in the loop (`turn_messages`)
    messages = turn_messages(planning, history, notes, {"role": "user", "content": message})
    # the same model, tools and hooks as the loop's: journal replayed, every step traced
    stack = await agent.task_tools(task_id, message, messages, session, caller)
    model = stack.model
    context = ToolContext("", "", task_id, session.id if session else None, caller=caller, model=model.name)
    language = agent.language or detect_language(message)
    runner = PlanRunner(agent, model, stack.registry, context, language, messages, hooks=stack.hooks)
    result = await runner.run(max_replans, answer_system=system)
    if not await agent.task_finished(task_id, result, stack.trace):  # paused: run again once answered
        return result
    if session is not None:  # the plan's JSON exchanges stay in the result, not in the history
        session.messages.append({"role": "user", "content": message})
        session.messages.append({"role": "assistant", "content": result.reply})
    return result


@dataclass
class PlanRunner:
    """One task in plan mode: the conversation, the steps run so far, the model, the tools and
    the hooks told of each call."""

    agent: Agent
    model: ModelClient
    registry: ToolRegistry
    context: ToolContext
    language: Language
    messages: list[Message]
    succeeded: dict[tuple[str, str], ToolOutcome] = field(default_factory=dict)  # reused by re-plans
    hooks: TaskHooks = NO_HOOKS

    def __post_init__(self) -> None:
        self.result = RunResult(reply="", messages=self.messages)
        self.started = time.perf_counter()

    async def run(self, max_replans: int, answer_system: str) -> RunResult:
        try:
            return await self._plan_execute_answer(max_replans, answer_system)
        except ModelUnavailable:
            return self._finish(fixed_reply("model_unavailable", self.language), "model_unavailable")
        except ModelRequestRejected:
            return self._finish(fixed_reply("model_rejected", self.language), "model_rejected")

    async def _plan_execute_answer(self, max_replans: int, answer_system: str) -> RunResult:
        stop_reason = "plan_invalid"
        for attempt in range(max(0, max_replans) + 1):
            plan, problems = self._check(await self._ask(self.messages))
            if plan is None:
                stop_reason, feedback = "plan_invalid", PROBLEMS.format(problems=_bullets(problems))
            elif not plan.steps:
                return self._finish(plan.answer or "", "completed")
            else:
                outcomes = await self._execute(plan, attempt)
                paused = next((o for o in outcomes.values() if o.error in PAUSES), None)
                if paused is not None:  # a person must answer first: stop here, as the loop does
                    return self._finish(pause_reply(paused, self.language), str(paused.error))
                failed = next((s for s in plan.steps if s.id in outcomes and not outcomes[s.id].ok), None)
                if failed is None:
                    return await self._answer(plan, outcomes, answer_system)
                stop_reason = "plan_failed"
                feedback = STEP_FAILED.format(
                    step=failed.id,
                    tool=failed.tool,
                    error=_error_text(outcomes[failed.id]),
                    results=_report(plan, outcomes),
                )
            if attempt < max_replans:
                self.messages.append({"role": "user", "content": feedback})
        return self._finish(fixed_reply(stop_reason, self.language), stop_reason)

    def _check(self, response: ModelResponse) -> tuple[Plan | None, list[str]]:
        if response.tool_calls:
            names = ", ".join(call.name for call in response.tool_calls)
            return None, [f'you called tools ({names}) instead of writing a plan: reply {{"steps": [...]}}']
        plan, problems = parse_plan(response.text)
        if plan is None:
            return None, problems
        limit = self.agent.max_tool_calls
        self.context.model = response.answered_by or self.model.name  # permissions: who wrote the plan
        problems = validate_plan(plan, self.registry, self.context.caller, self.context.model, limit)
        return (None, problems) if problems else (plan, [])

    async def _execute(self, plan: Plan, attempt: int) -> dict[str, ToolOutcome]:
        """Run the plan's steps; their outcomes by step id (steps that never started are absent)."""
        outcomes: dict[str, ToolOutcome] = {}
        outputs: dict[str, Any] = {}
        fresh: set[str] = set()

        async def run_step(step_id: str) -> bool:
            step = plan.step(step_id)
            call_id = f"{self.context.task_id}:plan{attempt}:{step.id}"
            try:
                arguments = resolve(step.params, outputs)
            except ReferenceProblem as problem:
                call = ToolCall(call_id, step.tool, json.dumps(step.params, ensure_ascii=False))
                outcomes[step_id] = ToolOutcome(
                    call, error_result(str(problem)), ok=False, error="bad_reference"
                )
                return False
            call = ToolCall(call_id, step.tool, json.dumps(arguments, ensure_ascii=False))
            key = (step.tool, json.dumps(arguments, sort_keys=True, ensure_ascii=False))
            outcome = self.succeeded.get(key)
            if outcome is None:
                outcome = await self._run_call(call)
                fresh.add(step_id)
            outcomes[step_id] = outcome
            if outcome.ok:
                outputs[step_id], self.succeeded[key] = output_value(outcome.content), outcome
            return outcome.ok

        await run_in_dependency_order({step.id: step.dependencies for step in plan.steps}, run_step)
        self.result.tool_calls += [outcomes[s.id] for s in plan.steps if s.id in fresh]
        return outcomes

    async def _run_call(self, call: ToolCall) -> ToolOutcome:
        context = replace(self.context, call_id=call.id, tool_name=call.name, scratch={})
        limits = self.agent.limits
        return await call_tool(
            self.hooks, self.registry, call,
            timeout=limits.tool_timeout, max_chars=limits.max_result_chars, context=context,
        )  # fmt: skip

    async def _answer(self, plan: Plan, outcomes: dict[str, ToolOutcome], system: str) -> RunResult:
        self.messages.append({"role": "user", "content": RESULTS.format(results=_report(plan, outcomes))})
        # the tool catalogue is not needed to write the answer: the plain system prompt will do
        response = await self._ask([{"role": "system", "content": system}, *self.messages[1:]])
        return self._finish(response.text or fixed_reply("empty_reply", self.language), "completed")

    async def _ask(self, messages: list[Message]) -> ModelResponse:
        started = time.perf_counter()
        try:
            response = await call_model(self.hooks, self.model, messages, None)
        finally:
            timings = self.result.timings
            timings["model"] = timings.get("model", 0.0) + time.perf_counter() - started
        self.result.responses.append(response)
        self.result.usage += response.usage
        self.messages.append(response.to_message())
        return response

    def _finish(self, reply: str, stop_reason: str) -> RunResult:
        run = self.result
        run.reply, run.stop_reason = reply, stop_reason
        run.timings["total"] = time.perf_counter() - self.started
        run.timings.setdefault("model", 0.0)
        run.timings["tools"] = sum(outcome.elapsed for outcome in run.tool_calls)
        return run


def tool_catalogue(registry: ToolRegistry, caller: Caller | None, model: str) -> str:
    """The tools this caller may use with this model, one JSON object per line."""
    schemas = registry.schemas(caller=caller, model=model)
    return "\n".join(json.dumps(schema["function"], ensure_ascii=False) for schema in schemas)


async def run_in_dependency_order(
    dependencies: Mapping[str, Sequence[str]], run_step: Callable[[str], Awaitable[bool]]
) -> None:
    """Run each step once all its dependencies have succeeded; steps ready together run concurrently.

    `run_step(step_id)` returns True when the step succeeded. After the first False (a failure or
    a pause) no further step starts, but the steps already running finish: cancelling a tool
    midway would leave its effect unknown. Steps with a dependency that did not succeed never
    start. `dependencies` must be acyclic and name only its own keys (plans and workflows are
    validated before they get here).
    """
    succeeded: set[str] = set()
    started: set[str] = set()
    running: dict[asyncio.Future[bool], str] = {}
    stopping = False
    try:
        while True:
            ready = [s for s, needs in dependencies.items() if s not in started and succeeded >= set(needs)]
            for step_id in [] if stopping else ready:
                started.add(step_id)
                running[asyncio.ensure_future(run_step(step_id))] = step_id
            if not running:
                return
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                step_id = running.pop(task)
                if task.result():
                    succeeded.add(step_id)
                else:
                    stopping = True
    finally:  # an exception or a cancellation: nothing is left running behind the caller's back
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


def _report(plan: Plan, outcomes: Mapping[str, ToolOutcome]) -> str:
    """The steps' results as the model reads them: one JSON object per step and line, in plan order."""
    entries: list[dict[str, Any]] = []
    for step in plan.steps:
        outcome = outcomes.get(step.id)
        if outcome is None:
            entries.append({"step": step.id, "tool": step.tool, "status": "not run"})
        else:
            status = "ok" if outcome.ok else "failed"
            result = output_value(outcome.content)
            entries.append({"step": step.id, "tool": step.tool, "status": status, "result": result})
    return "\n".join(json.dumps(entry, ensure_ascii=False) for entry in entries)


def _error_text(outcome: ToolOutcome) -> str:
    value = output_value(outcome.content)
    return str(value["error"]) if isinstance(value, dict) and "error" in value else outcome.content


def _bullets(problems: list[str]) -> str:
    return "\n".join(f"- {problem}" for problem in problems)


__all__ = [
    "DEFAULT_MAX_REPLANS", "PLAN_INSTRUCTIONS", "PlanRunner", "run_in_dependency_order", "run_plan",
    "tool_catalogue",
]  # fmt: skip
