"""Agents working together: sub-agents launched as a tool (P3), and a supervisor with expert agents (P4).

- `agent_launch(experts)` (`subagents.py`): a tool that runs a child agent on a sub-task in a fresh
  context; only its final reply and usage come back. Depth limit and per-task budget.
- `Supervisor`, `Expert` (`supervisor.py`): a supervisor agent delegating to named experts over
  priority queues, with `max_depth` on every message and per-agent concurrency and rate limits.
- `TeamSettings`, `ExpertSettings` (`settings.py`): the YAML `team:` section and its experts, which
  extend the supervisor's `TeamLimits` and an expert's `MemberLimits`.
"""

from .subagents import agent_launch, run_summary
from .supervisor import BATCH, INTERACTIVE, Delegation, Expert, SpacedModel, Supervisor, priority_of

__all__ = [
    "BATCH",
    "INTERACTIVE",
    "Delegation",
    "Expert",
    "SpacedModel",
    "Supervisor",
    "agent_launch",
    "priority_of",
    "run_summary",
]
