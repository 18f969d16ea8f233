"""Declarative workflows: steps that call a tool, the model or a sub-agent, run as their dependencies allow.

A workflow is data, written in YAML or Python (a dict, or `Workflow`/`WorkflowStep` objects)::

    name: weekly-report
    steps:
      - id: fetch
        type: tool
        tool: fetch_sales
        params: {region: "{inputs.region}"}
      - id: total
        type: tool
        tool: add_up
        params: {values: "{steps.fetch.output.rows}"}   # the list itself, not its text
        depends_on: [fetch]
      - id: summary
        type: model
        prompt: "Summarise these sales: {steps.fetch.output}"
        depends_on: [fetch]
      - id: report
        type: agent
        agent: writer
        prompt: "Write the weekly report. Total: {steps.total.output}. Summary: {steps.summary.output}"
        depends_on: [total, summary]

- `tool` steps run through `registry.execute` (permissions, approvals, timeouts) with the
  rendered `params`; `model` steps make one model call with the rendered `prompt`; `agent`
  steps run a named `Agent` on the rendered `prompt` and take its reply. `timeout` (seconds) is
  optional on every step.
- Templates know two things: `{steps.<id>.output}` (then `.field` or `.0` into it) and
  `{inputs.<name>}`. Nothing else in braces is touched and nothing is evaluated. A tool
  parameter that is exactly one template gets the value itself (a list stays a list).
- Steps whose dependencies are done run concurrently. The first failure (or pause for a person)
  stops new steps from starting; running ones finish.
- With a journal (`TaskJournal`, under the run id) each finished step is recorded with its
  output and time. Running the same run id again skips finished steps, uses their outputs, and
  runs the rest; a failed step is tried again. A tool call cut off by a crash is treated as in
  the tool loop (tasks/journal.py): run again only if it is read-only or idempotent.

Mistakes in a workflow raise `WorkflowError` listing every problem, before any step runs.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..kernel.loop import PAUSES
from ..kernel.messages import JSON, ToolCall
from ..kernel.model import ModelError
from ..kernel.tools import ToolContext, ToolRegistry
from ..kernel.tools.permissions import Caller
from ..kernel.tools.registry import ToolOutcome
from .executor import run_in_dependency_order
from .plan import STEP_ID, ReferenceProblem, as_text, find_cycle, lookup, output_value, path_fields

if TYPE_CHECKING:
    from ..agent import Agent
    from ..tasks.journal import TaskJournal

STEP_TYPES = ("tool", "model", "agent")
TEMPLATE = re.compile(r"\{(?:steps\.([\w-]+)\.output|inputs\.([\w-]+))((?:\.[\w-]+)*)\}")
_KEYS = {"id", "type", "tool", "params", "prompt", "agent", "depends_on", "timeout"}


class WorkflowError(ValueError):
    """A workflow that cannot run as written; `problems` lists every reason."""

    def __init__(self, name: str, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(f"workflow {name!r} cannot run:\n" + "\n".join(f"- {p}" for p in self.problems))


@dataclass
class WorkflowStep:
    id: str
    type: str  # tool | model | agent
    tool: str | None = None  # tool steps: the tool's name
    params: dict[str, JSON] = field(default_factory=dict)  # tool steps: arguments (templates allowed)
    prompt: str | None = None  # model and agent steps: the template of what is sent
    agent: str | None = None  # agent steps: a name in the `agents` given to run_workflow
    depends_on: Sequence[str] = ()  # ids of the steps that must be done first (one id may be a str)
    timeout: float | None = None

    def __post_init__(self) -> None:
        depends_on = self.depends_on
        self.depends_on = (depends_on,) if isinstance(depends_on, str) else tuple(depends_on)

    def templates(self) -> list[tuple[str | None, str | None]]:
        """(step id, input name) of every template in the prompt and params."""
        texts = [self.prompt or "", *_strings(self.params)]
        return [(m.group(1), m.group(2)) for text in texts for m in TEMPLATE.finditer(text)]


@dataclass
class Workflow:
    steps: Sequence[WorkflowStep]
    name: str = "workflow"

    def __post_init__(self) -> None:
        self.steps = tuple(self.steps)
        problems = _definition_problems(self.steps)
        if problems:
            raise WorkflowError(self.name, problems)

    @classmethod
    def from_dict(cls, data: JSON) -> Workflow:
        """A workflow from plain data: `{"name": …, "steps": [{"id", "type", …}, …]}`."""
        name = str(data.get("name", "workflow")) if isinstance(data, Mapping) else "workflow"
        raw_steps = data.get("steps") if isinstance(data, Mapping) else None
        if not isinstance(raw_steps, list):
            raise WorkflowError(name, ['a workflow is a mapping with a "steps" list'])
        problems: list[str] = []
        steps = [_step_from_dict(i, raw, problems) for i, raw in enumerate(raw_steps, 1)]
        if problems:
            raise WorkflowError(name, problems)
        return cls([step for step in steps if step is not None], name)

    @classmethod
    def from_yaml(cls, text: str) -> Workflow:
        import yaml  # only workflows written in YAML need it

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise WorkflowError("workflow", [f"not valid YAML: {exc}"]) from None
        return cls.from_dict(data)

    @classmethod
    def load(cls, path: str | Path) -> Workflow:
        """Read a workflow from a YAML (or JSON) file."""
        return cls.from_yaml(Path(path).read_text(encoding="utf-8"))

    def step(self, step_id: str) -> WorkflowStep:
        return next(step for step in self.steps if step.id == step_id)


@dataclass
class StepResult:
    id: str
    status: str  # done | failed | paused
    output: JSON = None  # done: the step's output; paused: what the person is shown
    error: str | None = None  # failed: why; paused: the reason (awaiting_approval, awaiting_answer)
    elapsed: float = 0.0
    resumed: bool = False  # taken from the journal of an earlier run, not run this time


@dataclass
class WorkflowResult:
    run_id: str
    steps: dict[str, StepResult]  # the steps that ran or were resumed; absent ones never started
    stop_reason: str = "completed"  # completed | failed | awaiting_approval | awaiting_answer
    error: str | None = None  # failed: which step and why; paused: the question or the approval id
    tool_calls: list[ToolOutcome] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return self.stop_reason == "completed"

    @property
    def outputs(self) -> dict[str, JSON]:
        return {step_id: r.output for step_id, r in self.steps.items() if r.status == "done"}


async def run_workflow(
    workflow: Workflow,
    agent: Agent,
    *,
    inputs: Mapping[str, JSON] | None = None,
    agents: Mapping[str, Agent] | None = None,
    run_id: str | None = None,
    caller: Caller | None = None,
    journal: TaskJournal | None = None,
) -> WorkflowResult:
    """Run `workflow` with `agent`'s model, tools and limits; `agents` are the sub-agents by name.

    `journal` (default: `agent.journal`) makes the run resumable: call again with the same
    `run_id` after a crash, a failure or a pause, and only the steps not finished run.
    """
    journal = journal if journal is not None else agent.journal
    run = _WorkflowRun(workflow, agent, dict(inputs or {}), dict(agents or {}), caller, journal)
    run.check()
    await run.load_journal(run_id or uuid.uuid4().hex)
    return await run.execute()


@dataclass
class _WorkflowRun:
    workflow: Workflow
    agent: Agent
    inputs: dict[str, JSON]
    agents: dict[str, Agent]
    caller: Caller | None
    journal: TaskJournal | None

    def __post_init__(self) -> None:
        self.run_id = ""
        self.registry: ToolRegistry = self.agent.registry
        self.results: dict[str, StepResult] = {}
        self.attempts: Counter[str] = Counter()  # failed attempts per step, from the journal
        self.tool_calls: list[ToolOutcome] = []

    def check(self) -> None:
        """What the definition alone cannot tell: tools, agents and inputs of this run."""
        problems: list[str] = []
        model = self.agent.client.name
        offered = {s["function"]["name"] for s in self.registry.schemas(caller=self.caller, model=model)}
        for step in self.workflow.steps:
            declared = self.registry.get(step.tool or "") if step.type == "tool" else None
            if step.type == "tool" and declared is None:
                problems.append(f"step {step.id!r}: unknown tool {step.tool!r}")
            elif declared is not None:
                refusal = self.registry.policy.refusal(declared, self.caller, model)
                if refusal or declared.name not in offered:
                    problems.append(
                        f"step {step.id!r}: {refusal or f'{declared.name} is not available here'}"
                    )
            if step.type == "agent" and step.agent not in self.agents:
                problems.append(f"step {step.id!r}: no agent named {step.agent!r} was given")
            for _, name in step.templates():
                if name is not None and name not in self.inputs:
                    problems.append(f"step {step.id!r} uses {{inputs.{name}}}, which was not given")
        if problems:
            raise WorkflowError(self.workflow.name, problems)

    async def load_journal(self, run_id: str) -> None:
        """What earlier runs under this id finished, and tools that replay their recorded calls."""
        self.run_id = run_id
        if self.journal is None:
            return
        from ..tasks.journal import JournaledTools, replay_of

        entries = await self.journal.entries(run_id)
        self.registry = JournaledTools(self.agent.registry, self.journal, run_id, replay_of(entries))
        ids = {step.id for step in self.workflow.steps}
        for entry in entries:
            if entry.data.get("id") not in ids:
                continue
            if entry.kind == "workflow_step":
                step_id, data = entry.data["id"], entry.data
                self.results[step_id] = StepResult(
                    step_id, "done", data["output"], None, data["elapsed"], True
                )
            elif entry.kind == "workflow_step_failed":
                self.attempts[entry.data["id"]] += 1

    async def execute(self) -> WorkflowResult:
        started = time.perf_counter()
        done = set(self.results)
        dependencies = {
            step.id: [d for d in step.depends_on if d not in done]
            for step in self.workflow.steps
            if step.id not in done
        }
        await run_in_dependency_order(dependencies, self.run_step)
        result = WorkflowResult(self.run_id, self.results, tool_calls=self.tool_calls)
        result.elapsed = time.perf_counter() - started
        stopped = [r for r in self.results.values() if r.status != "done"]
        paused = next((r for r in stopped if r.status == "paused"), None)
        if paused is not None:
            result.stop_reason, result.error = str(paused.error), as_text(paused.output)
        elif stopped:
            result.stop_reason, result.error = "failed", f"step {stopped[0].id!r} failed: {stopped[0].error}"
        return result

    async def run_step(self, step_id: str) -> bool:
        step = self.workflow.step(step_id)
        started = time.perf_counter()
        # a tool step's timeout is the registry's (kernel/tools/registry.py): cancelling it here would
        # leave a started call without a result in the journal
        timeout = step.timeout if step.type != "tool" else None
        try:
            result = await asyncio.wait_for(self._run(step), timeout=timeout)
        except asyncio.TimeoutError:
            result = StepResult(step.id, "failed", error=f"timed out after {step.timeout:g} s")
        except ReferenceProblem as problem:
            result = StepResult(step.id, "failed", error=str(problem))
        result.elapsed = time.perf_counter() - started
        self.results[step.id] = result
        if self.journal is not None and result.status == "done":
            data = {"id": step.id, "output": result.output, "elapsed": result.elapsed}
            await self.journal.append(self.run_id, "workflow_step", data)
        elif self.journal is not None and result.status == "failed":
            data = {"id": step.id, "error": result.error, "elapsed": result.elapsed}
            await self.journal.append(self.run_id, "workflow_step_failed", data)
        return result.status == "done"

    async def _run(self, step: WorkflowStep) -> StepResult:
        attempt_id = f"{self.run_id}:{step.id}:{self.attempts[step.id]}"
        if step.type == "tool":
            return await self._run_tool(step, attempt_id)
        prompt = as_text(self.render(step.prompt or ""))
        if step.type == "model":
            try:
                response = await self.agent.client.complete([{"role": "user", "content": prompt}], None)
            except ModelError as exc:
                return StepResult(step.id, "failed", error=f"the model call failed: {exc}")
            return StepResult(step.id, "done", response.text)
        reply = await self.agents[step.agent or ""].run(prompt, task_id=attempt_id, caller=self.caller)
        if reply.ok:
            return StepResult(step.id, "done", reply.reply)
        if reply.stop_reason in PAUSES:
            return StepResult(step.id, "paused", reply.reply, reply.stop_reason)
        why = f"agent {step.agent!r} stopped ({reply.stop_reason}): {reply.reply}"
        return StepResult(step.id, "failed", error=why)

    async def _run_tool(self, step: WorkflowStep, call_id: str) -> StepResult:
        call = ToolCall(call_id, step.tool or "", json.dumps(self.render(step.params), ensure_ascii=False))
        context = ToolContext(
            call.id, call.name, self.run_id, caller=self.caller, model=self.agent.client.name
        )
        limits = self.agent.limits
        timeout = step.timeout if step.timeout is not None else limits.tool_timeout
        outcome = await self.registry.execute(
            call, timeout=timeout, max_chars=limits.max_result_chars, context=context
        )
        self.tool_calls.append(outcome)
        if outcome.ok:
            return StepResult(step.id, "done", output_value(outcome.content))
        if outcome.error in PAUSES:
            return StepResult(step.id, "paused", outcome.content, outcome.error)
        value = output_value(outcome.content)
        error = value["error"] if isinstance(value, dict) and "error" in value else outcome.content
        return StepResult(step.id, "failed", error=f"{step.tool}: {error}")

    def render(self, value: JSON) -> JSON:
        """`value` with its templates filled in; a string that is one whole template keeps its type."""
        if isinstance(value, str):
            whole = TEMPLATE.fullmatch(value)
            if whole:
                return self._value_of(whole)
            return TEMPLATE.sub(lambda match: as_text(self._value_of(match)), value)
        if isinstance(value, dict):
            return {key: self.render(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.render(item) for item in value]
        return value

    def _value_of(self, match: re.Match[str]) -> JSON:
        step_id, name, dotted = match.groups()
        if step_id is not None:
            return lookup(self.results[step_id].output, path_fields(dotted), f"steps.{step_id}.output")
        return lookup(self.inputs, [name, *path_fields(dotted)], "inputs")


def _step_from_dict(number: int, raw: JSON, problems: list[str]) -> WorkflowStep | None:
    if not isinstance(raw, Mapping):
        problems.append(f"step {number} must be a mapping (id, type, …), got {raw!r}")
        return None
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        problems.append(
            f"step {number}: unknown key(s) {', '.join(map(str, unknown))}; known: {sorted(_KEYS)}"
        )
        return None
    depends_on = raw.get("depends_on") or []
    depends_on = [depends_on] if isinstance(depends_on, str) else depends_on
    timeout = raw.get("timeout")
    if not isinstance(depends_on, list) or not isinstance(raw.get("params") or {}, Mapping):
        problems.append(f"step {number}: depends_on must be a list of step ids and params a mapping")
        return None
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)):
        problems.append(f"step {number}: timeout must be a number of seconds, got {timeout!r}")
        return None
    step_id: JSON = raw.get("id")  # id and type are checked with the rest of the definition
    step_type: JSON = raw.get("type")
    return WorkflowStep(
        id=step_id,
        type=step_type,
        tool=raw.get("tool"),
        params=dict(raw.get("params") or {}),
        prompt=raw.get("prompt"),
        agent=raw.get("agent"),
        depends_on=[str(d) for d in depends_on],
        timeout=timeout,
    )


def _definition_problems(steps: Sequence[WorkflowStep]) -> list[str]:
    """Everything wrong with the steps as written (ids, types, fields, dependencies, templates)."""
    if not steps:
        return ["a workflow needs at least one step"]
    problems: list[str] = []
    ids = [step.id for step in steps]
    for step in steps:
        problems += _step_problems(step, ids)
    cycle = find_cycle({step.id: list(step.depends_on) for step in steps})
    if cycle:
        problems.append(f"the steps form a cycle: {' → '.join(cycle)}")
        return problems
    before = _ancestors(steps)
    for step in steps:
        for used, _ in step.templates():
            if used is not None and used in ids and used not in before.get(step.id, set()):
                problems.append(
                    f"step {step.id!r} uses {{steps.{used}.output}} but does not depend on {used!r}: "
                    "add it to depends_on"
                )
    return problems


def _step_problems(step: WorkflowStep, ids: list[str]) -> list[str]:
    where = f"step {step.id!r}"
    problems = []
    if not isinstance(step.id, str) or not STEP_ID.match(step.id):
        problems.append(f"{where}: id must be a short name (letters, digits, _, -)")
    elif ids.count(step.id) > 1:
        problems.append(f"{where}: the id is used more than once")
    if step.type not in STEP_TYPES:
        problems.append(f"{where}: type must be one of {', '.join(STEP_TYPES)}, got {step.type!r}")
    needed = {"tool": ["tool"], "model": ["prompt"], "agent": ["agent", "prompt"]}.get(str(step.type), [])
    for key in needed:
        if not isinstance(getattr(step, key), str) or not getattr(step, key):
            problems.append(f"{where}: {step.type} steps need {key!r}")
    for dependency in step.depends_on:
        if dependency not in ids:
            problems.append(f"{where} depends on {dependency!r}, which is not a step of the workflow")
    for used, _ in step.templates():
        if used is not None and used not in ids:
            problems.append(f"{where} uses {{steps.{used}.output}}, but there is no step {used!r}")
    if step.timeout is not None and step.timeout <= 0:
        problems.append(f"{where}: timeout must be positive")
    return problems


def _ancestors(steps: Sequence[WorkflowStep]) -> dict[str, set[str]]:
    """Every step's direct and indirect dependencies (the graph is known to be acyclic)."""
    direct = {step.id: [d for d in step.depends_on if d != step.id] for step in steps}
    found: dict[str, set[str]] = {}

    def of(step_id: str) -> set[str]:
        if step_id not in found:
            found[step_id] = set()
            for dependency in direct.get(step_id, []):
                found[step_id] |= {dependency, *of(dependency)}
        return found[step_id]

    for step in steps:
        of(step.id)
    return found


def _strings(value: JSON) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


__all__ = ["Workflow", "WorkflowError", "WorkflowResult", "WorkflowStep", "StepResult", "run_workflow"]
