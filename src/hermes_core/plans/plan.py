"""A plan the model writes, and the checks it must pass before anything runs.

A plan is JSON: `{"steps": [{"id", "tool", "params", "requires"}]}`. A parameter value may use an
earlier step's output: `"$output.find.file_id"` is replaced by that field of step `find`'s result
(`"$output.find"` by the whole result, `"$output.find.items.0"` by a list item); inside a longer
string the reference is replaced by its text. `parse_plan` turns the model's text into a `Plan`
or into problems; `validate_plan` checks it against the tools: every tool exists and is
permitted, every reference points to an earlier step, no cycles, required parameters present.
Problems are sentences written for the model, which gets them back to fix its plan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..kernel.messages import JSON
from ..kernel.tools import ToolRegistry
from ..kernel.tools.arguments import ArgumentError, parse_arguments
from ..kernel.tools.permissions import Caller

STEP_ID = re.compile(r"^[\w-]{1,64}$")
REFERENCE = re.compile(r"\$output\.([\w-]+)((?:\.[\w-]+)*)")


@dataclass(frozen=True)
class PlanStep:
    id: str
    tool: str
    params: dict[str, JSON] = field(default_factory=dict)
    requires: tuple[str, ...] = ()

    @property
    def references(self) -> list[str]:
        """Ids of the steps whose outputs the params use, in order of appearance."""
        return list(dict.fromkeys(step for step, _ in references_in(self.params)))

    @property
    def dependencies(self) -> tuple[str, ...]:
        """The steps that must succeed before this one runs: `requires` plus the referenced ones."""
        return tuple(dict.fromkeys([*self.requires, *self.references]))


@dataclass(frozen=True)
class Plan:
    steps: tuple[PlanStep, ...]
    answer: str | None = None  # a plan with no steps may answer directly

    def step(self, step_id: str) -> PlanStep:
        return next(step for step in self.steps if step.id == step_id)


class ReferenceProblem(ValueError):
    """A reference cannot be resolved (a missing field, a result that is not JSON…)."""


def parse_plan(text: str) -> tuple[Plan | None, list[str]]:
    """The plan in the model's reply, or the problems with its shape (never raises)."""
    try:
        data = parse_arguments(text)  # lenient: code fences, prose around the object, repairs
    except ArgumentError:
        shown = text.strip()[:200] or "(an empty reply)"
        return None, [f'your reply is not a JSON plan: {shown!r}. Reply with {{"steps": [...]}} only']
    steps = data.get("steps")
    if not isinstance(steps, list):
        return None, ['the plan must be a JSON object with a "steps" list']
    answer = data.get("answer")
    problems: list[str] = []
    parsed = [_parse_step(i, raw, problems) for i, raw in enumerate(steps, 1)]
    ids = [step.id for step in parsed if step is not None]
    for duplicate in sorted({i for i in ids if ids.count(i) > 1}):
        problems.append(f"step id {duplicate!r} is used more than once; ids must be unique")
    if not steps and not (isinstance(answer, str) and answer.strip()):
        problems.append('the plan has no steps: list the steps, or give {"steps": [], "answer": "…"}')
    if problems:
        return None, problems
    return Plan(tuple(s for s in parsed if s is not None), answer if isinstance(answer, str) else None), []


def _parse_step(number: int, raw: JSON, problems: list[str]) -> PlanStep | None:
    if not isinstance(raw, dict):
        problems.append(f"step {number} must be an object with id, tool, params and requires")
        return None
    before = len(problems)
    step_id, tool, params = raw.get("id"), raw.get("tool"), raw.get("params", {})
    requires = raw.get("requires", [])
    if not isinstance(step_id, str) or not STEP_ID.match(step_id):
        problems.append(f'step {number}: "id" must be a short name (letters, digits, _, -), got {step_id!r}')
    if not isinstance(tool, str) or not tool:
        problems.append(f'step {number}: "tool" must be a tool name, got {tool!r}')
    if params is None:
        params = {}
    if not isinstance(params, dict):
        problems.append(f'step {number}: "params" must be an object of arguments, got {params!r}')
    if isinstance(requires, str):
        requires = [requires]
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        problems.append(f'step {number}: "requires" must be a list of step ids, got {requires!r}')
    if len(problems) > before:
        return None
    # "$output.find.file_id" in requires names step "find"
    needed = [match.group(1) if (match := REFERENCE.fullmatch(r)) else r for r in requires]
    return PlanStep(str(step_id), str(tool), params, tuple(dict.fromkeys(needed)))


def validate_plan(
    plan: Plan, registry: ToolRegistry, caller: Caller | None, model: str, max_steps: int
) -> list[str]:
    """Everything that stops `plan` from running as written; empty when it may run."""
    problems: list[str] = []
    if len(plan.steps) > max_steps:
        problems.append(f"the plan has {len(plan.steps)} steps; at most {max_steps} are allowed")
    offered = {schema["function"]["name"] for schema in registry.schemas(caller=caller, model=model)}
    for step in plan.steps:
        problems += _tool_problems(step, registry, caller, model, offered)
    graph = {step.id: step.dependencies for step in plan.steps}
    cycle = find_cycle(graph)
    on_cycle = set(zip(cycle, cycle[1:], strict=False)) if cycle else set()
    if cycle:
        path = " → ".join(cycle)
        problems.append(f"the steps form a cycle ({path}): a step cannot depend on itself, even indirectly")
    position = {step.id: i for i, step in enumerate(plan.steps)}
    for step in plan.steps:
        for needed in step.dependencies:
            how = f"uses $output.{needed}" if needed in step.references else f"requires {needed!r}"
            if needed not in position:
                known = ", ".join(position)
                problems.append(f"step {step.id!r} {how}, but the plan has no such step (steps: {known})")
            elif position[needed] > position[step.id] and (step.id, needed) not in on_cycle:
                problems.append(
                    f"step {step.id!r} {how}, but step {needed!r} comes later in the plan: "
                    "a step can only use steps listed before it"
                )
    return problems


def _tool_problems(
    step: PlanStep, registry: ToolRegistry, caller: Caller | None, model: str, offered: set[str]
) -> list[str]:
    declared = registry.get(step.tool)
    if declared is None:
        close = ", ".join(registry.closest(step.tool))
        return [f"step {step.id!r}: unknown tool {step.tool!r}; available tools: {close}"]
    refusal = registry.policy.refusal(declared, caller, model)
    if refusal is not None:
        return [f"step {step.id!r}: {refusal}"]
    if step.tool not in offered:
        return [f"step {step.id!r}: tool {step.tool!r} is not available in this run"]
    required = declared.parameters.get("required", [])
    missing = [name for name in required if name not in step.params]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        return [f"step {step.id!r}: {step.tool} requires the parameter(s) {names}, missing in params"]
    return []


def find_cycle(graph: Mapping[str, Sequence[str]]) -> list[str]:
    """One cycle of the dependency graph as a path that ends where it starts, or [] if none.

    Edges to unknown nodes are ignored (they are reported separately)."""
    state: dict[str, str] = {}  # "visiting" or "done"
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "visiting"
        path.append(node)
        for needed in graph.get(node, ()):
            if needed not in graph or state.get(needed) == "done":
                continue
            if state.get(needed) == "visiting":
                return [*path[path.index(needed) :], needed]
            found = visit(needed)
            if found:
                return found
        state[node] = "done"
        path.pop()
        return []

    for node in graph:
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def references_in(value: JSON) -> list[tuple[str, list[str]]]:
    """Every `$output.step.field…` in a parameter value (nested lists and objects included)."""
    if isinstance(value, str):
        return [(m.group(1), path_fields(m.group(2))) for m in REFERENCE.finditer(value)]
    if isinstance(value, dict):
        return [ref for item in value.values() for ref in references_in(item)]
    if isinstance(value, list):
        return [ref for item in value for ref in references_in(item)]
    return []


def resolve(value: JSON, outputs: Mapping[str, JSON]) -> JSON:
    """`value` with its references replaced from `outputs` (step id → output); raises ReferenceProblem.

    A string that is exactly one reference becomes the referenced value, whatever its type."""
    if isinstance(value, str):
        whole = REFERENCE.fullmatch(value)
        if whole:
            return _output(outputs, whole.group(1), path_fields(whole.group(2)))
        return REFERENCE.sub(lambda m: as_text(_output(outputs, m.group(1), path_fields(m.group(2)))), value)
    if isinstance(value, dict):
        return {key: resolve(item, outputs) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve(item, outputs) for item in value]
    return value


def _output(outputs: Mapping[str, JSON], step_id: str, fields: Sequence[str]) -> JSON:
    if step_id not in outputs:
        raise ReferenceProblem(f"$output.{step_id}: step {step_id!r} has no output")
    return lookup(outputs[step_id], fields, f"$output.{step_id}")


def lookup(value: JSON, fields: Sequence[str], where: str) -> JSON:
    """Follow `fields` into `value` (object keys, list indexes); `where` names `value` in errors.

    Raises ReferenceProblem naming the missing field and the fields there are."""
    for name in fields:
        if isinstance(value, dict) and name in value:
            value = value[name]
        elif isinstance(value, list) and name.isdigit() and int(name) < len(value):
            value = value[int(name)]
        elif isinstance(value, dict):
            known = ", ".join(map(str, value)) or "none"
            raise ReferenceProblem(f"{where} has no field {name!r} (its fields: {known})")
        elif isinstance(value, list):
            raise ReferenceProblem(f"{where} is a list of {len(value)} items; {name!r} is not an index of it")
        else:
            kind = "text" if isinstance(value, str) else type(value).__name__
            raise ReferenceProblem(f"{where} is {kind}, not a JSON object, so it has no field {name!r}")
        where = f"{where}.{name}"
    return value


def output_value(content: str) -> JSON:
    """A tool result as data: its JSON value, or the text itself when it is not JSON."""
    try:
        return json.loads(content)
    except ValueError:
        return content


def as_text(value: JSON) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def path_fields(dotted: str) -> list[str]:
    """ ".file_id.0" → ["file_id", "0"]."""
    return [name for name in dotted.split(".") if name]


__all__ = [
    "Plan",
    "PlanStep",
    "ReferenceProblem",
    "as_text",
    "find_cycle",
    "lookup",
    "output_value",
    "parse_plan",
    "path_fields",
    "references_in",
    "resolve",
    "validate_plan",
]
