"""K2's guards for one task: which calls of a model turn may run, and why the others may not.

A repeated call is a loop only when it can learn or do nothing new, so repeats are judged by what
could have changed since, not by the arguments alone:

- The calls of one turn are distinct requests ("give me four random numbers" is four identical
  calls): each runs. A repeated call *id* is refused even within a turn, since an id names one
  call (its approval and its journaled result).
- A call identical (same tool, same arguments in canonical form) to one of an earlier turn is
  refused only when no state-changing call ran successfully from the start of that earlier call
  on. The earlier call counts itself (a toggle run twice turns a thing on and off again; a read
  after a write reads a moved state) unless it answered as the time before with nothing changed
  between: a lookup declared without a level that answers the same twice is not asked again.
- State-changing: a tool of level ≥ 1, or an MCP tool whose server does not mark it
  `readOnlyHint: true` (the hint never lowers a level, it only keeps a level-0 MCP tool counted
  as a write when the server does not vouch for it).
- A response cut off by the output token limit (`finish_reason: "length"`) runs none of its
  calls: the arguments of the last one are incomplete, and a repaired cut value ("San Fr") would
  run with a meaning the model never wrote. The model is told and may call again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from .messages import ModelResponse, ToolCall
from .replies import Language, fixed_reply
from .tools.declare import Tool
from .tools.registry import ToolOutcome
from .tools.results import error_result

if TYPE_CHECKING:
    from .loop import Limits


def changes_state(declared: Tool | None) -> bool:
    """Whether a successful call of this tool may have changed what later calls see."""
    if declared is None:  # an unknown tool never runs
        return False
    return declared.level >= 1 or declared.read_only_hint is False


class TaskGuards:
    """The guards of one task. `admit` decides, before execution, which calls of a turn may run."""

    def __init__(self, limits: Limits, changes: Callable[[str], bool], language: Language) -> None:
        self.limits, self.language = limits, language
        self.executed = 0
        self.budget_exhausted = False
        self.withdrawn: set[str] = set()
        self._changes_state = changes  # tool name → may a successful call change state?
        self._changes = 0  # state-changing calls that succeeded so far
        self._started: dict[tuple[str, str], int] = {}  # call key → `_changes` when it last started
        self._answers: dict[tuple[str, str], tuple[str, int]] = {}  # call key → (result, `_changes` after)
        self._ids: set[str] = set()  # an id names one call: its approval and its journaled result
        self._failures: Counter[str] = Counter()

    def admit(self, calls: list[ToolCall]) -> list[ToolOutcome | None]:
        """One turn's calls: for each, the outcome explaining its refusal, or None to run it."""
        earlier = dict(self._started)  # repeats are judged against earlier turns only
        return [self.refuse(call, earlier) for call in calls]

    def refuse(self, call: ToolCall, earlier: dict[tuple[str, str], int] | None = None) -> ToolOutcome | None:
        """An outcome explaining why `call` is not executed, or None to execute it."""
        earlier = self._started if earlier is None else earlier
        if call.id in self._ids:
            message = f"call id {call.id!r} was already used in this task; this call was not run. "
            return refused(call, message + "Give every call its own id.", "repeated_call_id")
        self._ids.add(call.id)
        if call.name in self.withdrawn:
            message = f"tool {call.name} failed {self.limits.max_tool_failures} times in a row and is no "
            return refused(call, message + "longer available in this task; use another approach", "withdrawn")
        key = call.key  # canonical arguments: parsed and encoded again, so computed once
        if earlier.get(key) == self._changes:
            message = fixed_reply("repeated_call", self.language).format(tool=call.name)
            return refused(call, message, "repeated_call")
        if self.executed >= self.limits.max_tool_calls:
            self.budget_exhausted = True
            return refused(call, f"tool call limit of {self.limits.max_tool_calls} reached", "budget")
        self._started[key] = self._changes
        self.executed += 1
        return None

    def record(self, outcome: ToolOutcome) -> None:
        name, key = outcome.call.name, outcome.call.key
        if outcome.error == "outcome_unknown":  # interrupted by a restart: trying it again is not a loop
            self._started.pop(key, None)
        if outcome.ok:
            self._failures[name] = 0
            same = self._answers.get(key) == (outcome.content, self._changes)  # and nothing changed between
            self._changes += self._changes_state(name)
            self._answers[key] = (outcome.content, self._changes)
            if same:  # its own run changed nothing it reads: asked again, it would answer the same
                self._started[key] = self._changes
        elif outcome.error != "unknown_tool":
            self._failures[name] += 1
            if self._failures[name] >= self.limits.max_tool_failures:
                self.withdrawn.add(name)


def cut_off_outcomes(response: ModelResponse) -> list[ToolOutcome]:
    """The answers to the calls of a response cut off by the output token limit: none ran."""
    *complete, last = response.tool_calls
    cut = (
        f"your call to {last.name} was cut off by the output token limit; its arguments are incomplete "
        "and it was not run. Call it again with shorter arguments, or ask to continue."
    )
    held = "not run: the response with this call was cut off by the output token limit; call it again."
    return [*(refused(call, held, "cut_off") for call in complete), refused(last, cut, "cut_off")]


def refused(call: ToolCall, message: str, reason: str) -> ToolOutcome:
    return ToolOutcome(call, error_result(message), ok=False, error=reason)


__all__ = ["TaskGuards", "changes_state", "cut_off_outcomes", "refused"]
