"""`agent.mode: plan | team` from the YAML configuration, end to end through the gateway.

Each test loads a YAML file with `load_settings`, builds the real gateway (`build_gateway`, the one
`hermes-kernel serve` runs) on 127.0.0.1, posts to the webhook, and scripts the fake OpenAI-compatible
server per model; the assertions read the fake's recorded requests and the tools' side effects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway_harness import gateway_for, post
from hermes_core.config import ConfigError, build_agent, load_settings
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from prompt_parts import context_of
from serve_process import clean_environ


def write_config(tmp_path: Path, fake: FakeOpenAIServer, **sections: Any) -> Path:
    workspace = tmp_path / "work"
    workspace.mkdir(exist_ok=True)
    config: dict[str, Any] = {
        "model": {"name": "main-model", "base_url": fake.base_url, "max_retries": 0},
        "gateway": {"data_dir": str(tmp_path / "data")},
    }
    for key, value in sections.items():
        config.setdefault(key, {}).update(value) if isinstance(value, dict) else config.update({key: value})
    config.setdefault("agent", {})["workspace"] = str(workspace)
    path = tmp_path / "hermes.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def plan(*steps: dict[str, Any]) -> FakeReply:
    return FakeReply.text(json.dumps({"steps": list(steps)}))


async def test_plan_mode_from_yaml_runs_the_models_json_plan_through_serve(tmp_path: Path) -> None:
    """Attack: `agent.mode: plan` in YAML must switch serve from the tool loop to plan-and-execute.
    The model's first answer is a JSON plan (calculate, then write the result to a file); the code
    runs both steps (the file appears), and a second call writes the reply from the results."""
    async with FakeOpenAIServer() as fake:
        fake.script(
            plan(
                {"id": "calc", "tool": "calculator", "params": {"expression": "6*7"}},
                {"id": "save", "tool": "write_file",
                 "params": {"path": "answer.txt", "content": "answer=$output.calc.result"}},
            ),
            FakeReply.text("Saved: the answer is 42."),
        )  # fmt: skip
        config = write_config(tmp_path, fake, agent={"mode": "plan"})
        async with gateway_for(config) as url:
            status, answer = await post(
                f"{url}/webhook", {"message": "compute 6*7 and save it", "user_id": "u1"}
            )
        requests = list(fake.requests)
    assert status == 200 and answer["reply"] == "Saved: the answer is 42."
    assert (tmp_path / "work" / "answer.txt").read_text(encoding="utf-8") == "answer=42"
    assert len(requests) == 2
    first, second = requests
    assert "Plan mode" in first.messages[0]["content"] and first.tools == []  # a plan, not tool calls
    results = second.messages[-1]["content"]
    assert results.startswith("The plan ran.") and '"step": "save"' in results and "42" in results


async def test_plan_mode_step_waits_for_approval_and_resumes_from_its_journal(tmp_path: Path) -> None:
    """Attack: in plan mode a step whose tool needs approval (`permissions.confirm`) must pause the
    task, not run; once approved over the webhook the task resumes from its journal: the plan is not
    asked for again and the calculation step does not run twice."""
    async with FakeOpenAIServer() as fake:
        fake.script(
            plan(
                {"id": "calc", "tool": "calculator", "params": {"expression": "2+3"}},
                {
                    "id": "save",
                    "tool": "write_file",
                    "params": {"path": "r.txt", "content": "r=$output.calc.result"},
                },
            ),
            FakeReply.text("Written."),
        )
        config = write_config(tmp_path, fake, agent={"mode": "plan"}, permissions={"confirm": ["write_file"]})
        async with gateway_for(config) as url:
            _, asked = await post(f"{url}/webhook", {"message": "add and save", "user_id": "u1"})
            assert "approval" in asked and not (tmp_path / "work" / "r.txt").exists()
            approval = asked["approval"]
            assert approval["tool"] == "write_file"
            status, decided = await post(
                f"{url}/webhook/approvals/{approval['id']}", {"user_id": "u1", "decision": "approve"}
            )
        requests = list(fake.requests)
    assert status == 200 and decided["reply"] == "Written."
    assert (tmp_path / "work" / "r.txt").read_text(encoding="utf-8") == "r=5"
    assert len(requests) == 2  # the plan once (replayed from the journal), then the answer


REPORT_STEPS = "STEP-REPORT-3: group the numbers by region."


@pytest.mark.parametrize("mode", ["loop", "plan"])
async def test_a_configured_skill_reaches_the_model_in_every_mode(tmp_path: Path, mode: str) -> None:
    """Attack: plan mode built its system prompt apart from the loop and left the skills out. With
    `skills.dirs` configured, the model must read the skill's listing in the system prompt and the
    steps of the skill the message triggers in the turn's context, in plan mode as in the loop."""
    skill = tmp_path / "skills" / "weekly-report" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    front = "name: weekly-report\ndescription: Write the weekly sales report.\ntriggers: [report]"
    skill.write_text(f"---\n{front}\n---\n{REPORT_STEPS}\n", encoding="utf-8")
    answer = "The report is ready."
    async with FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(json.dumps({"steps": [], "answer": answer}) if mode == "plan" else answer))
        skills = {"dirs": [str(skill.parent.parent)]}
        config = write_config(tmp_path, fake, agent={"mode": mode}, skills=skills)
        async with gateway_for(config) as url:
            status, replied = await post(f"{url}/webhook", {"message": "write the report", "user_id": "u1"})
        requests = list(fake.requests)
    assert status == 200 and replied["reply"] == answer
    messages = requests[0].messages
    assert "- weekly-report: Write the weekly sales report." in messages[0]["content"]
    assert REPORT_STEPS not in messages[0]["content"]  # the steps change per message: not in the prefix
    assert REPORT_STEPS in context_of(messages)


async def test_team_mode_from_yaml_delegates_to_the_declared_expert(tmp_path: Path) -> None:
    """Attack: `agent.mode: team` with an expert declared in YAML must run the supervisor, and the
    expert must run with its own system prompt, model and tools (seen in the fake's requests); the
    supervisor's summary comes back as the webhook reply."""
    expert = {
        "name": "research", "description": "does arithmetic", "model": "expert-model",
        "system_prompt": "You are the research expert (RESEARCH-PROMPT).", "tools": ["calculator"],
    }  # fmt: skip
    async with FakeOpenAIServer() as fake:
        fake.script_for(
            "main-model",
            FakeReply.tool_call("delegate", {"expert": "research", "task": "compute 6*7"}),
            FakeReply.text("The team says 42."),
        )
        fake.script_for(
            "expert-model",
            FakeReply.tool_call("calculator", {"expression": "6*7"}),
            FakeReply.text("It is 42."),
        )
        config = write_config(tmp_path, fake, agent={"mode": "team"}, team={"experts": [expert]})
        async with gateway_for(config) as url:
            status, answer = await post(f"{url}/webhook", {"message": "ask the team: 6*7?", "user_id": "u1"})
        requests = list(fake.requests)
    assert status == 200 and answer["reply"] == "The team says 42."
    lead = [r for r in requests if r.model == "main-model"]
    experts = [r for r in requests if r.model == "expert-model"]
    assert len(lead) == 2 and len(experts) == 2
    assert "delegate" in [t["function"]["name"] for t in lead[0].tools]
    assert "RESEARCH-PROMPT" in experts[0].messages[0]["content"]
    assert experts[0].messages[-1] == {"role": "user", "content": "compute 6*7"}  # only the task
    assert [t["function"]["name"] for t in experts[0].tools] == ["calculator"]
    assert "42" in experts[1].messages[-1]["content"]  # the calculator ran for the expert
    assert "It is 42." in lead[1].messages[-1]["content"]  # the expert's reply, as a tool result


async def test_an_experts_tool_that_needs_approval_is_refused_not_left_waiting(tmp_path: Path) -> None:
    """Attack: an expert has no one to ask, so its call to a tool that needs a person's approval
    (`permissions.confirm`) must be refused at once (the file is not written, nothing hangs) and the
    supervisor still answers; approvals stay with the supervisor, whose pauses resume."""
    expert = {
        "name": "writer",
        "system_prompt": "You write.",
        "tools": ["write_file"],
        "model": "expert-model",
    }
    async with FakeOpenAIServer() as fake:
        fake.script_for(
            "main-model",
            FakeReply.tool_call("delegate", {"expert": "writer", "task": "write x.txt"}),
            FakeReply.text("The writer could not write it."),
        )
        fake.script_for(
            "expert-model",
            FakeReply.tool_call("write_file", {"path": "x.txt", "content": "x"}),
            FakeReply.text("Refused."),
        )
        sections: dict[str, Any] = {"agent": {"mode": "team"}, "team": {"experts": [expert]}}
        config = write_config(tmp_path, fake, permissions={"confirm": ["write_file"]}, **sections)
        async with gateway_for(config) as url:
            status, answer = await post(f"{url}/webhook", {"message": "have x.txt written", "user_id": "u1"})
        requests = list(fake.requests)
    assert status == 200 and answer["reply"] == "The writer could not write it." and "approval" not in answer
    assert not (tmp_path / "work" / "x.txt").exists()
    refusal = requests[2].messages[-1]
    assert refusal["role"] == "tool" and "no one to ask" in refusal["content"]


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"agent": {"mode": "team"}}, "agent.mode is team, but team.experts declares no expert"),
        ({"agent": {"mode": "teams"}}, "agent.mode: input should be 'loop', 'plan' or 'team'"),
        ({"team": {"experts": [{"name": "a"}]}}, "team.experts.0.system_prompt: field required"),
        ({"team": {"experts": [{"name": "a", "system_prompt": "x", "model": "m", "tool": []}]}},
         "team.experts.0.tool: unknown key"),
        ({"team": {"experts": [{"name": "a b", "system_prompt": "x"}]}}, "team.experts.0.name"),
        ({"team": {"experts": [{"name": "a", "system_prompt": "x"}, {"name": "a", "system_prompt": "y"}]}},
         "team.experts: the name(s) a are used twice"),
    ],
)  # fmt: skip
def test_bad_mode_and_team_sections_are_refused_naming_the_key(
    tmp_path: Path, sections: dict[str, Any], message: str
) -> None:
    """Attack: a mistyped mode or expert declaration must stop the start with an error naming the key."""
    path = tmp_path / "hermes.yaml"
    path.write_text(yaml.safe_dump(sections), encoding="utf-8")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_settings(path, env={}, dotenv=None)


def test_an_expert_naming_a_tool_the_agent_lacks_is_refused(tmp_path: Path) -> None:
    """Attack: an expert's `tools` naming a tool that does not exist must be an error, not a silently
    tool-less expert."""
    path = tmp_path / "hermes.yaml"
    experts = [{"name": "research", "system_prompt": "x", "tools": ["calculator", "web_search"]}]
    path.write_text(
        yaml.safe_dump({"agent": {"mode": "team"}, "team": {"experts": experts}}), encoding="utf-8"
    )
    with pytest.raises(ConfigError, match=r"team\.experts\.0\.tools: no tool named web_search"):
        build_agent(load_settings(path, env={}, dotenv=None))


# -- docs/modes.md: every file and command it shows is run here ----------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "modes.md"


def doc_model(request: Any) -> FakeReply:
    """A model good enough for the doc's commands: plans in plan mode, delegates in team mode."""
    messages = request.messages
    last = messages[-1] if messages else {}
    content = str(last.get("content") or "")
    offered = [t["function"]["name"] for t in request.tools]
    if last.get("role") == "tool" or content.startswith("The plan ran."):
        return FakeReply.text("The answer is 42.")
    if "Plan mode" in str(messages[0].get("content")):
        return plan({"id": "calc", "tool": "calculator", "params": {"expression": "6*7"}})
    if "delegate" in offered:
        return FakeReply.tool_call("delegate", {"expert": "research", "task": "what is 6*7?"})
    if "calculator" in offered and "6*7" in content:
        return FakeReply.tool_call("calculator", {"expression": "6*7"})
    return FakeReply.text("Hello!")


def test_every_command_of_the_modes_doc_runs(tmp_path: Path) -> None:
    """Attack: a documented command that does not run (a stale key, a wrong flag) must fail here:
    each file of docs/modes.md is written and validated, and each command is run as shown, against
    an OpenAI-compatible endpoint given in the environment as the doc says."""
    import os
    import re
    import subprocess
    import sys

    text = DOC.read_text(encoding="utf-8")
    files = re.findall(r"<!-- file: (\S+) -->\s*```yaml\n(.*?)```", text, re.DOTALL)
    commands = [
        line for block in re.findall(r"```sh\n(.*?)```", text, re.DOTALL) for line in block.splitlines()
    ]
    assert {name for name, _ in files} == {"plan.yaml", "team.yaml", "routes.yaml"} and len(commands) >= 6
    for name, body in files:
        (tmp_path / name).write_text(body, encoding="utf-8")
        load_settings(tmp_path / name, env={}, dotenv=None)
    with FakeOpenAIServer(handler=doc_model) as fake:
        env = clean_environ()
        env.update(HERMES_BASE_URL=fake.base_url, HERMES_MODEL="main-model", HERMES_API_KEY="sk-doc")
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        for command in commands:
            done = subprocess.run(
                command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        models = {request.model for request in fake.requests}
        planned = [r for r in fake.requests if r.messages and "Plan mode" in str(r.messages[0]["content"])]
        delegated = [r for r in fake.requests if "RESEARCH" in str(r.messages[0]["content"]).upper()]
    assert {"main-model", "cheap-model"} <= models  # the routes example asked the cheaper model
    assert len(planned) == 2  # plan.yaml, and --mode plan
    assert delegated  # the team example reached the research expert
