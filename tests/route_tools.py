"""Tools for tests/test_model_routes.py: one any model may call, one limited to the main model."""

from __future__ import annotations

from hermes_core.tools import tool

CALLED: list[str] = []


@tool(name="lookup_order", level=0)
def lookup_order(order: str) -> dict[str, str]:
    """Look up an order's status."""
    CALLED.append(f"lookup_order {order}")
    return {"order": order, "status": "shipped"}


@tool(name="salary_report", level=0, allowed_models=["main-model"])
def salary_report(team: str) -> dict[str, str]:
    """Salaries of a team (only the main model may see them)."""
    CALLED.append(f"salary_report {team}")
    return {"team": team, "total": "1,000,000"}
