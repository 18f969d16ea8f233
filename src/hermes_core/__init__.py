"""hermes_core: a small, readable Hermes-style agent kernel.

    from hermes_core import Agent, tool

Names are imported on first use, so `import hermes_core` stays cheap and pulls in no HTTP client.
"""

from __future__ import annotations

# not `from typing import TYPE_CHECKING`: importing typing (re, contextlib, collections) was
# nearly all of `import hermes_core`'s time; type checkers take any constant of this name as True
TYPE_CHECKING = False

__version__ = "0.1.0"

_EXPORTS = {
    "Agent": "agent",
    "Session": "agent",
    "RunResult": "kernel.loop",
    "Limits": "kernel.loop",
    "tool": "tools",
    "Tool": "tools",
    "ToolContext": "tools",
    "ToolError": "tools",
    "ToolRegistry": "tools",
    "ModelClient": "models",
    "ModelError": "models",
    "ModelUnavailable": "models",
    "ModelRequestRejected": "models",
    "ModelResponse": "kernel.messages",
    "ToolCall": "kernel.messages",
    "Usage": "kernel.messages",
    "agent_launch": "team",
    "Expert": "team",
    "Supervisor": "team",
    "run_plan": "plans",
    "Workflow": "plans",
    "run_workflow": "plans",
    "SkillSet": "skills",
}

if TYPE_CHECKING:
    from typing import Any

    from .agent import Agent, Session
    from .kernel.loop import Limits, RunResult
    from .kernel.messages import ModelResponse, ToolCall, Usage
    from .kernel.tools import Tool, ToolContext, ToolError, ToolRegistry, tool
    from .models import ModelClient, ModelError, ModelRequestRejected, ModelUnavailable
    from .plans import Workflow, run_plan, run_workflow
    from .skills import SkillSet
    from .team import Expert, Supervisor, agent_launch


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hermes_core' has no attribute {name!r}")
    import importlib  # here, not at the top: `import hermes_core` itself imports nothing

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__all__ = [
    "Agent",
    "Expert",
    "Limits",
    "ModelClient",
    "ModelError",
    "ModelRequestRejected",
    "ModelResponse",
    "ModelUnavailable",
    "RunResult",
    "Session",
    "SkillSet",
    "Supervisor",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "Usage",
    "Workflow",
    "agent_launch",
    "run_plan",
    "run_workflow",
    "tool",
]
