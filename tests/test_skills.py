"""Skills (P5): SKILL.md folders, listed by name, bodies only when triggered or loaded."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hermes_core import Agent, tool
from hermes_core.config import ConfigError, build_agent, load_settings
from hermes_core.skills import SkillError, SkillSet
from hermes_core.testing import ScriptedModel, call, reply
from prompt_parts import context_of

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "skills"
DEPLOY_BODY = "STEP-DEPLOY-7: run the health check before switching traffic."
REPORT_BODY = "STEP-REPORT-3: group the numbers by region."


@tool(level=0)
def deploy_service(service: str) -> str:
    """Deploy a service."""
    return f"deployed {service}"


@tool(level=0)
def health_check(service: str) -> str:
    """Check that a service answers."""
    return "ok"


def write_skill(folder: Path, name: str, front_matter: str, body: str = "Some steps.") -> Path:
    path = folder / name / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\n{front_matter}\n---\n{body}\n", encoding="utf-8")
    return path


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "skills"
    write_skill(
        folder,
        "deploy-service",
        "name: deploy-service\ndescription: Roll a service out to staging or production.\n"
        "triggers: [deploy, rollout, 发布, 上线]\ntools: [deploy_service, health_check]\n"
        "metadata: {owner: platform}  # extra keys are allowed",
        DEPLOY_BODY,
    )
    write_skill(
        folder,
        "weekly-report",
        "name: weekly-report\ndescription: Write the weekly sales report.\ntriggers: 周报",
        REPORT_BODY,
    )
    (folder / "README.md").write_text("# Not a skill\n", encoding="utf-8")
    return folder


def agent_with(skills: SkillSet, script: list) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(script)
    return Agent(model=model, tools=[deploy_service, health_check], skills=skills), model


def system_of(model: ScriptedModel, i: int = 0) -> str:
    return model.calls[i].messages[0]["content"]


def context_at(model: ScriptedModel, i: int = 0) -> str:
    """The turn's context message of call `i` (agent.py `turn_messages`): triggered skills go there."""
    return context_of(model.calls[i].messages)


# --- progressive loading -------------------------------------------------------------------------


async def test_prompt_lists_names_and_descriptions_but_no_body_unless_triggered(
    skills_dir: Path,
) -> None:
    skills = SkillSet.load([skills_dir], ["deploy_service", "health_check"])
    agent, model = agent_with(skills, [reply("It is sunny.")])
    await agent.run("What is the weather like today?")
    system = system_of(model)
    assert system.startswith(agent.system_prompt)
    assert "- deploy-service: Roll a service out to staging or production." in system
    assert "- weekly-report: Write the weekly sales report." in system
    assert DEPLOY_BODY not in system and REPORT_BODY not in system
    assert "load_skill" in [t["function"]["name"] for t in model.calls[0].tools or []]


@pytest.mark.parametrize(
    "message",
    [
        "Please deploy the billing service",
        "Deployed yet? Start the ROLLOUT of billing",
        "帮我把计费服务发布",
    ],
)
async def test_a_trigger_in_the_message_brings_the_body_in(skills_dir: Path, message: str) -> None:
    agent, model = agent_with(SkillSet.load([skills_dir]), [reply("Done.")])
    await agent.run(message)
    assert DEPLOY_BODY in context_at(model) and DEPLOY_BODY not in system_of(model)  # the prefix stays
    assert REPORT_BODY not in context_at(model)


async def test_chinese_trigger_given_as_a_single_string(skills_dir: Path) -> None:
    agent, model = agent_with(SkillSet.load([skills_dir]), [reply("好的")])
    await agent.run("请帮我写本周的周报")
    assert REPORT_BODY in context_at(model) and DEPLOY_BODY not in context_at(model)
    assert system_of(model) == agent.skills.system_prompt(agent.system_prompt)  # the same for any message


def test_english_triggers_match_whole_words(skills_dir: Path) -> None:
    skills = SkillSet.load([skills_dir])
    assert [s.name for s in skills.triggered("two deployments went out")] == ["deploy-service"]
    assert skills.triggered("the redeployer crashed") == []
    assert skills.triggered("nothing to see") == []


async def test_load_skill_returns_the_body_and_the_prompt_stays_without_it(skills_dir: Path) -> None:
    script = [call("load_skill", {"name": "weekly-report"}), reply("Here is the report.")]
    agent, model = agent_with(SkillSet.load([skills_dir]), script)
    result = await agent.run("Summarise last week for the team")
    assert result.ok and result.tool_calls[0].ok
    assert REPORT_BODY in result.tool_calls[0].content
    assert model.calls[1].messages[-1] == {
        "role": "tool",
        "tool_call_id": result.tool_calls[0].call.id,
        "content": result.tool_calls[0].content,
    }
    assert REPORT_BODY not in system_of(model, 0) and REPORT_BODY not in system_of(model, 1)


async def test_load_skill_with_an_unknown_name_names_the_skills(skills_dir: Path) -> None:
    script = [call("load_skill", {"name": "deploy"}), reply("Sorry.")]
    agent, _ = agent_with(SkillSet.load([skills_dir]), script)
    result = await agent.run("deploy it")
    outcome = result.tool_calls[0]
    assert not outcome.ok and "no skill named 'deploy'" in outcome.content
    assert "deploy-service" in outcome.content and "weekly-report" in outcome.content


def test_load_skill_is_read_only() -> None:
    assert SkillSet().load_skill.level == 0 and SkillSet().load_skill.name == "load_skill"


# --- problems reported at load time --------------------------------------------------------------


async def test_a_missing_tool_is_reported_and_the_skill_is_unavailable(
    skills_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="hermes_core.skills"):
        skills = SkillSet.load([skills_dir], available_tools=["deploy_service"])
    warning = caplog.text
    assert "deploy-service" in warning and "health_check" in warning and "unavailable" in warning
    assert "weekly-report" not in warning
    assert [s.name for s in skills.available] == ["weekly-report"]

    script = [call("load_skill", {"name": "deploy-service"}), reply("I cannot deploy here.")]
    agent, model = agent_with(skills, script)
    result = await agent.run("deploy billing")
    assert "deploy-service" not in system_of(model) and DEPLOY_BODY not in system_of(model)
    assert DEPLOY_BODY not in context_at(model)
    assert "unavailable" in result.tool_calls[0].content and "health_check" in result.tool_calls[0].content


def test_strict_makes_a_missing_tool_an_error(skills_dir: Path) -> None:
    with pytest.raises(SkillError, match=r"deploy-service.*health_check"):
        SkillSet.load([skills_dir], available_tools=["deploy_service"], strict=True)


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("# Deploy\nJust steps, no front matter.\n", "no front matter"),
        ("---\nname: x\ndescription: never closed\n", "no front matter"),
        ("---\nname: [unclosed\ndescription: d\n---\nbody\n", "not valid YAML"),
        ("---\n- a list\n---\nbody\n", "must be a mapping"),
        ("---\ndescription: no name\n---\nbody\n", "'name'"),
        ("---\nname: has spaces\ndescription: d\n---\nbody\n", "'name'"),
        ("---\nname: nodesc\n---\nbody\n", "'description' is required"),
        ("---\nname: t\ndescription: d\ntriggers: {a: 1}\n---\nbody\n", "'triggers' must be a list"),
        ("---\nname: t\ndescription: d\ntools: [1, 2]\n---\nbody\n", "'tools' must be a list"),
    ],
)
def test_malformed_front_matter_is_an_error_naming_the_file(
    tmp_path: Path, text: str, complaint: str
) -> None:
    path = tmp_path / "broken" / "SKILL.md"
    path.parent.mkdir()
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SkillError) as raised:
        SkillSet.load([tmp_path])
    assert str(path) in str(raised.value) and complaint in str(raised.value)


def test_two_skills_with_one_name_and_a_missing_folder_are_errors(tmp_path: Path) -> None:
    first = write_skill(tmp_path / "a", "one", "name: same\ndescription: first")
    second = write_skill(tmp_path / "b", "two", "name: same\ndescription: second")
    with pytest.raises(SkillError) as raised:
        SkillSet.load([tmp_path / "a", tmp_path / "b"])
    assert str(first) in str(raised.value) and str(second) in str(raised.value)
    with pytest.raises(SkillError, match="does not exist"):
        SkillSet.load([tmp_path / "nowhere"])


# --- configuration -------------------------------------------------------------------------------


def test_configuration_names_the_skills_folder(tmp_path: Path, skills_dir: Path) -> None:
    config = tmp_path / "hermes.yaml"
    config.write_text(f"skills:\n  dirs: [{skills_dir}]\n", encoding="utf-8")
    agent = build_agent(load_settings(config, env={}, dotenv=None))
    assert agent.skills is not None and agent.registry.get("load_skill") is agent.skills.load_skill
    # the example tools have neither deploy_service nor health_check: reported, not fatal
    assert [s.name for s in agent.skills.available] == ["weekly-report"]

    config.write_text(f"skills:\n  dirs: [{skills_dir}]\n  strict: true\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^skills: .*deploy-service.*health_check"):
        build_agent(load_settings(config, env={}, dotenv=None))


def test_a_broken_skill_stops_the_configuration_with_its_file(tmp_path: Path) -> None:
    broken = write_skill(tmp_path / "skills", "broken", "name: broken")
    config = tmp_path / "hermes.yaml"
    config.write_text(f"skills: {{dirs: ['{tmp_path / 'skills'}']}}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="description") as raised:
        build_agent(load_settings(config, env={}, dotenv=None))
    assert str(broken) in str(raised.value)


def test_the_example_skills_load_with_the_example_tools() -> None:
    settings = load_settings(env={}, dotenv=None)
    settings.skills.dirs = [str(EXAMPLES)]
    agent = build_agent(settings)
    assert agent.skills is not None
    assert sorted(s.name for s in agent.skills.available) == ["bill-split", "deadline-countdown"]
    triggered = agent.skills.triggered("离 12 月 31 日截止还有几天？")
    assert [s.name for s in triggered] == ["deadline-countdown"]
