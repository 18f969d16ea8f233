"""`agent_launch`: a tool that hands a sub-task to a child agent (P3).

    research = Agent(model=..., system_prompt="You find facts. Answer with the facts only.", tools=[search])
    parent = Agent(model=..., tools=[agent_launch({"research": research})])

The child is an ordinary `Agent` with its own system prompt, tools and model. It runs in a fresh
context: none of the parent's conversation reaches it, and none of its intermediate steps reach
the parent, whose model reads a single tool result holding the child's final reply and usage.

Two bounds keep launches finite. Both come back to the model as tool errors, never as exceptions:
- depth: a context variable carries the chain of launched agents into the child's run, so the
  child's own launches are one level deeper; beyond `max_depth` a launch is refused. Agents that
  launch each other in a cycle end there too, and the error names the chain;
- budget: at most `max_children_per_task` child runs per top-level task, counted over the whole
  tree of launches below it.

The child runs for the parent's `Caller`, so its tools are offered and run exactly as that caller
is permitted: the model cannot choose whom a child acts for.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from ..kernel.messages import JSON
from ..kernel.tools import Tool, ToolContext, tool

if TYPE_CHECKING:
    from ..agent import Agent
    from ..kernel.loop import RunResult

LAUNCH_DESCRIPTION = (
    "Hand a self-contained sub-task to a helper agent. It works in a fresh context with its own tools "
    "and sees nothing of this conversation, so put everything it needs in `task`; you get back only "
    "its final answer. Several launches in one turn run in parallel."
)


@dataclass(frozen=True)
class _Chain:
    """The launches above the running code: its top-level task and the agents launched down to it."""

    root_task: str
    agents: tuple[str, ...] = ()


_chain: ContextVar[_Chain | None] = ContextVar("hermes_core_launch_chain", default=None)


def agent_launch(
    experts: Mapping[str, Agent],
    *,
    max_depth: int = 2,
    max_children_per_task: int = 4,
    timeout: float = 300.0,
    name: str = "agent_launch",
) -> Tool:
    """A tool that runs one of `experts` on a sub-task and returns its final reply and usage.

    `max_depth` is how deep launches may nest (2: children and grandchildren);
    `max_children_per_task` bounds the child runs of one top-level task; `timeout` bounds one
    child run (the agent's per-tool timeout is meant for quick tools, not whole runs).
    """
    if not experts:
        raise ValueError("agent_launch needs at least one agent to launch")
    if max_depth < 1 or max_children_per_task < 1:
        raise ValueError("max_depth and max_children_per_task must be at least 1")
    agents = dict(experts)
    budget = _ChildBudget(max_children_per_task)

    async def launch(
        agent: Annotated[str, Field(description="which agent runs the sub-task")],
        task: Annotated[str, Field(description="the sub-task, its goal and every fact the agent needs")],
        output_format: Annotated[str, Field(description="how the answer should be shaped, optional")] = "",
        *,
        context: ToolContext,
    ) -> dict[str, JSON]:
        """Run a sub-task in a child agent."""
        child = agents.get(agent)
        if child is None:
            return {"error": f"unknown agent {agent!r}; choose one of: {', '.join(agents)}"}
        chain = _chain.get() or _Chain(context.task_id)
        if len(chain.agents) >= max_depth:
            launches = " → ".join(chain.agents)
            return {
                "error": f"cannot launch {agent}: depth limit {max_depth} reached "
                f"(launch chain: {launches}). Do this part yourself or answer with what you have."
            }
        if not budget.take(chain.root_task):
            return {
                "error": f"cannot launch {agent}: this task already used its {max_children_per_task} "
                "child runs. Answer with the results you have."
            }
        message = f"{task}\n\nAnswer format: {output_format}" if output_format.strip() else task
        entered = _chain.set(_Chain(chain.root_task, (*chain.agents, agent)))
        try:
            result = await child.run(
                message, task_id=f"{context.task_id}/{context.call_id}", caller=context.caller
            )
        finally:
            _chain.reset(entered)
        if context.spent is not None:  # the parent's RunResult.usage includes the child's tokens
            context.spent.append(result.usage)
        return run_summary(agent, result)

    roster = "; ".join(f"{key}: {_role(value)}" for key, value in agents.items())
    declared = tool(name=name, timeout=timeout, description=f"{LAUNCH_DESCRIPTION} Agents: {roster}")(launch)
    declared.parameters["properties"]["agent"]["enum"] = list(agents)
    return declared


def run_summary(agent: str, result: RunResult) -> dict[str, JSON]:
    """What a parent reads of a child's run: its final reply and what it cost, nothing in between."""
    summary: dict[str, JSON] = {
        "agent": agent,
        "reply": result.reply,
        "usage": {key: value for key, value in asdict(result.usage).items() if key != "cached_tokens"},
        "model_calls": result.model_calls,  # (cached tokens are for the bill, not for the model)
    }
    if not result.ok:
        summary["error"] = f"{agent} stopped before finishing ({result.stop_reason})"
    return summary


def _role(agent: Agent, limit: int = 120) -> str:
    """The first line of an agent's system prompt, which by convention says what it is for."""
    lines = agent.system_prompt.strip().splitlines()
    first = lines[0].strip() if lines else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


class _ChildBudget:
    """Child runs used per top-level task; only the most recent tasks are remembered."""

    def __init__(self, limit: int, remembered: int = 4096) -> None:
        self.limit = limit
        self._used: OrderedDict[str, int] = OrderedDict()
        self._remembered = remembered

    def take(self, task_id: str) -> bool:
        """Count one more child run for `task_id`; False if its budget is already spent."""
        used = self._used.pop(task_id, 0)
        self._used[task_id] = min(used + 1, self.limit)
        while len(self._used) > self._remembered:
            self._used.popitem(last=False)
        return used < self.limit


__all__ = ["LAUNCH_DESCRIPTION", "agent_launch", "run_summary"]
