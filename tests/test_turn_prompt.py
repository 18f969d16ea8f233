"""A turn's prompt is assembled in one place (agent.py `Agent.turn_prompt`): the loop, plan mode and
the Temporal engine's `prepare_task` send the model the same system prompt, skills included, and the
same context for the same agent and message."""

from __future__ import annotations

import json
from pathlib import Path

from hermes_core import Agent
from hermes_core.agent import turn_messages
from hermes_core.engine.temporal.activities import TurnActivities
from hermes_core.kernel.messages import user_message
from hermes_core.plans.executor import run_plan
from hermes_core.skills import SkillSet
from hermes_core.testing import ScriptedModel, reply

STEPS = "STEP-REPORT-3: group the numbers by region."
TEXT = "write the report"


def skills_in(tmp_path: Path) -> SkillSet:
    skill = tmp_path / "skills" / "weekly-report" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    front = "name: weekly-report\ndescription: Write the weekly sales report.\ntriggers: [report]"
    skill.write_text(f"---\n{front}\n---\n{STEPS}\n", encoding="utf-8")
    return SkillSet.load([skill.parent.parent])


async def test_the_loop_plan_mode_and_temporal_give_a_turn_the_same_prompt(tmp_path: Path) -> None:
    """Attack: each path built the prompt itself, and plan mode's copy left the skills out. For one
    agent and one message, the Temporal prepare step's system prompt and context, laid out as its
    workflow lays them out, must be the request the embedded loop sends; plan mode's must be the
    same with its plan instructions after the system prompt."""
    skills = skills_in(tmp_path)
    loop_model = ScriptedModel([reply("Done.")])
    await Agent(model=loop_model, skills=skills).run(TEXT)
    embedded = loop_model.calls[0].messages
    assert STEPS in json.dumps(embedded[1:]) and "- weekly-report:" in embedded[0]["content"]

    steps = TurnActivities(Agent(model=ScriptedModel([]), skills=skills), {}, approval_ttl=60.0)
    prepared = await steps._prepare({"text": TEXT, "sender": "u1", "channel": "webhook"})
    assert turn_messages(prepared["system"], [], prepared["notes"], user_message(TEXT)) == embedded

    plan_model = ScriptedModel([reply(json.dumps({"steps": [], "answer": "Done."}))])
    await run_plan(Agent(model=plan_model, skills=skills), TEXT)
    planned = plan_model.calls[0].messages
    assert planned[0]["content"].startswith(f"{embedded[0]['content']}\n\nPlan mode")
    assert planned[1:] == embedded[1:]
