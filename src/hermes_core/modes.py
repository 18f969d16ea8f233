"""How `serve`, `run` and `chat` run a task (`agent.mode`): the tool loop, a plan, or a team.

`run_task` is the one place those commands call the agent (gateway/runner.py `AgentRunner`, which
chat uses too, and cli.py `run_once`), so each mode gets the same task id, caller, session,
journal, traces and pauses:

- `loop`: `Agent.run`, the tool loop;
- `plan`: `plans.executor.run_plan`: the model writes a JSON plan, code runs its steps, the model
  answers from the results. Its steps are journaled and a step that needs an approval or asks a
  question pauses the task exactly as the loop does; it streams no text;
- `team`: `team.Supervisor`: the agent is the supervisor and delegates to the experts of
  `team.experts`. The supervisor is built on the task's first run, after serve has given the agent
  its journal, tracer and approvals and the conversation memory its tools, so its copy has them
  too; the experts get the journal and the tracer (their runs resume and are recorded under
  `<task id>/<call id>`) but no one to ask: an expert cannot pause the task for a person.

A greeting takes the loop's fast path in every mode: no plan, no team, one model call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from .agent import Agent, Session
    from .kernel.hooks import TaskHooks
    from .kernel.loop import RunResult
    from .kernel.model import TextCallback
    from .kernel.tools.permissions import Caller
    from .team import Expert, Supervisor
    from .team.supervisor import TeamLimits

ModeName = Literal["loop", "plan", "team"]  # the one list of modes: agent.mode, --mode, TaskMode
MODES: tuple[str, ...] = get_args(ModeName)


@dataclass
class TaskMode:
    """The mode of `agent.mode` and what it needs: the replan budget, or the team. Built from the
    configuration (config.py `task_mode`), which holds the defaults: it declares none of its own."""

    name: ModeName
    max_replans: int
    experts: Sequence[Expert] = ()
    team_limits: TeamLimits | None = None  # the `team:` section (team/settings.py); None: the defaults
    _team: Supervisor | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.name not in MODES:
            raise ValueError(f"agent.mode must be one of {', '.join(MODES)}, got {self.name!r}")
        if self.name == "team" and not self.experts:
            raise ValueError("team mode needs at least one expert (team.experts)")

    def team(self, agent: Agent) -> Supervisor:
        """The supervisor over `agent` and the experts, built once, on first use."""
        if self._team is None:
            from .team import Supervisor

            for expert in self.experts:  # their runs resume and are recorded like the supervisor's
                expert.agent.journal = expert.agent.journal or agent.journal
                expert.agent.tracer = expert.agent.tracer or agent.tracer
            self._team = Supervisor(agent, self.experts, limits=self.team_limits)
        return self._team

    async def aclose(self) -> None:
        team, self._team = self._team, None
        if team is not None:
            await team.aclose()


async def run_task(
    agent: Agent,
    text: str,
    *,
    session: Session | None = None,
    on_text: TextCallback | None = None,
    task_id: str | None = None,
    caller: Caller | None = None,
    images: Sequence[str] = (),
    hooks: TaskHooks | None = None,
) -> RunResult:
    """One task in the agent's mode; the result has `Agent.run`'s shape in every mode. A message
    with pictures (`images`) runs in the loop whatever the mode: plans and teams take text. `hooks`
    (a channel streaming the reply) observe the tool loop; plan and team runs do not tell them."""
    mode = agent.mode
    if mode is None or mode.name == "loop" or agent.is_greeting(text) or images:
        return await agent.run(
            text,
            session=session,
            on_text=on_text,
            task_id=task_id,
            caller=caller,
            images=images,
            hooks=hooks,
        )
    if mode.name == "plan":
        from .plans.executor import run_plan

        return await run_plan(
            agent, text, session=session, task_id=task_id, caller=caller, max_replans=mode.max_replans
        )
    return await mode.team(agent).run(text, caller=caller, session=session, task_id=task_id)


__all__ = ["MODES", "ModeName", "TaskMode", "run_task"]
