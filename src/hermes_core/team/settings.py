"""Every option of a team, declared once: the YAML `team:` section is `TeamSettings`, which extends
the `TeamLimits` a `Supervisor` reads, and each `team.experts` entry is an `ExpertSettings`, which
extends an `Expert`'s `MemberLimits` (supervisor.py) with what config.py builds the expert's agent
from. A default or a bound is written once, beside its field, in supervisor.py or here.

Pydantic dataclasses: a configuration file validates straight into them (a bad value names its key
and what is allowed). No agent is imported here: config.py turns each entry into an `Expert`.
"""

from __future__ import annotations

from dataclasses import field, fields
from typing import TYPE_CHECKING, Annotated

from pydantic import ConfigDict, Field, model_validator
from pydantic.dataclasses import dataclass

from .supervisor import Expert, MemberLimits, TeamLimits

if TYPE_CHECKING:
    from ..agent import Agent


@dataclass(config=ConfigDict(extra="forbid"), kw_only=True)
class ExpertSettings(MemberLimits):
    """One expert of `team.experts`: the fields of `team.Expert` (name, description, concurrency,
    requests_per_second, can_delegate) and of its agent: its own `system_prompt`, the `tools` it may
    use (names of the main agent's tools; none listed: no tools) and its `model` (a model of the same
    endpoint; none: the main model)."""

    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]+$")]
    description: str = ""
    system_prompt: Annotated[str, Field(min_length=1)]
    tools: list[str] = field(default_factory=list)
    model: Annotated[str | None, Field(min_length=1)] = None

    def expert(self, agent: Agent) -> Expert:
        """The team member this entry declares, working as `agent` (config.py builds it from
        `system_prompt`, `tools` and `model`)."""
        limits = {declared.name: getattr(self, declared.name) for declared in fields(MemberLimits)}
        return Expert(self.name, agent, self.description, **limits)


@dataclass(config=ConfigDict(extra="forbid"))
class TeamSettings(TeamLimits):
    """`agent.mode: team` (team/supervisor.py): the main agent is the supervisor and hands work to
    these experts with its `delegate` tool. `max_depth`: hops a piece of work may take;
    `concurrency`/`requests_per_second`: the supervisor's own limits; `delegate_timeout`: seconds one
    delegation may take. Experts cannot pause for a person: their tools that need an approval, and
    `clarify`, are refused (give such tools to the supervisor)."""

    experts: list[ExpertSettings] = field(default_factory=list)

    @model_validator(mode="after")
    def _unique_names(self) -> TeamSettings:
        names = [expert.name for expert in self.experts]
        taken = sorted({name for name in names if names.count(name) > 1} | ({"supervisor"} & set(names)))
        if taken:
            raise ValueError(f"experts: the name(s) {', '.join(taken)} are used twice (or by the supervisor)")
        return self


__all__ = ["ExpertSettings", "TeamSettings"]
