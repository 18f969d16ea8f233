"""Plan-and-execute mode and declarative workflows: steps known up front, run by code.

- `run_plan(agent, message)`: the model writes a JSON plan of tool steps; code validates it,
  runs it (independent steps concurrently) and asks the model for the answer (plans/executor.py).
- `Workflow` + `run_workflow`: steps written in YAML or Python (tool, model, sub-agent), run in
  dependency order and journaled so that a crashed run resumes where it stopped (plans/workflow.py).
"""

from .executor import run_plan
from .plan import Plan, PlanStep, parse_plan, validate_plan
from .workflow import StepResult, Workflow, WorkflowError, WorkflowResult, WorkflowStep, run_workflow

__all__ = [
    "Plan",
    "PlanStep",
    "StepResult",
    "Workflow",
    "WorkflowError",
    "WorkflowResult",
    "WorkflowStep",
    "parse_plan",
    "run_plan",
    "run_workflow",
    "validate_plan",
]
