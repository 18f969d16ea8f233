"""Each option is declared once: `ModelSettings` (the model), `Limits` (a task), `TeamLimits` and
`MemberLimits` (a team), each both the YAML section and what the client, the loop and the team read,
with the agent's and the supervisor's keywords a thin layer over them; the other `agent:` options and
the permission lists default as the code that reads them does; the approval TTL is one constant.

These tests check the seam against the real parts: a YAML file read by `load_settings`, an agent
built by `build_agent`, requests arriving at the fake OpenAI-compatible server on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from hermes_core import Agent, tool
from hermes_core.config import ConfigError, Settings, build_agent, load_settings
from hermes_core.kernel.loop import Limits
from hermes_core.kernel.tools.registry import ToolRegistry
from hermes_core.kernel.tools.results import DEFAULT_MAX_CHARS
from hermes_core.models.settings import ModelSettings
from hermes_core.testing import ScriptedModel
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

ENDPOINT_OWN = {"model", "base_url", "api_key"}  # where the model is: the agent, a preset or the environment


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hermes.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_every_model_option_is_a_yaml_key_an_agent_keyword_and_an_attribute(tmp_path: Path) -> None:
    """Attack: an option declared in one place but missing from another (the YAML section, the agent's
    keywords, what the client reads): every field of `ModelSettings` must be all three, with one default."""
    defaults = ModelSettings()
    for declared in dataclasses.fields(ModelSettings):
        if declared.name in ENDPOINT_OWN:
            continue
        value = getattr(defaults, declared.name)
        section = {declared.name: list(value) if isinstance(value, tuple) else value}
        settings = load_settings(write(tmp_path, yaml.safe_dump({"model": section})), env={}, dotenv=None)
        assert getattr(settings.model, declared.name) == value, declared.name
        agent = Agent(**{declared.name: value})
        assert getattr(agent, declared.name) == getattr(agent.settings, declared.name) == value, declared.name


def test_every_limit_is_a_yaml_key_an_agent_keyword_and_an_attribute(tmp_path: Path) -> None:
    """Attack: a limit whose YAML key, keyword and loop value drift apart: each field of `Limits` set
    in `agent:` must reach the agent's `limits` unchanged, and each keyword its attribute."""
    changed = {"max_turns": 5, "max_tool_calls": 6, "max_tool_failures": 2, "tool_timeout": 7.5,
               "max_result_chars": 1234}  # fmt: skip
    assert set(changed) == {declared.name for declared in dataclasses.fields(Limits)}
    path = write(tmp_path, yaml.safe_dump({"agent": changed}))
    agent = build_agent(load_settings(path, env={}, dotenv=None))
    assert agent.limits == Limits(**changed) == Agent(limits=Limits(**changed)).limits
    for name, value in changed.items():
        assert getattr(Agent(**{name: value}), name) == value == getattr(agent, name)


def test_the_defaults_are_named_once() -> None:
    """Attack: a default written twice drifts (3000 characters here, 30 s there): the limits, the
    configuration and every tool registry must read the same named constants."""
    from hermes_core.kernel.tools.registry import DEFAULT_TOOL_TIMEOUT

    assert Limits().max_result_chars == Settings().agent.max_result_chars == DEFAULT_MAX_CHARS
    assert Limits().tool_timeout == Settings().agent.tool_timeout == DEFAULT_TOOL_TIMEOUT
    assert Settings().model == ModelSettings() == Agent().settings
    import hermes_core.observe.replay  # noqa: F401  (every wrapper of the registry, loaded)
    import hermes_core.tasks.journal  # noqa: F401

    registries = subclasses(ToolRegistry)  # observers are hooks now (kernel/hooks.py): only substitutes wrap
    names = {registry.__name__ for registry in registries}
    assert {"ToolRegistry", "RegistryWrapper", "ReplayTools", "JournaledTools"} <= names
    for registry in registries:
        parameters = inspect.signature(registry.execute).parameters
        assert parameters["timeout"].default is DEFAULT_TOOL_TIMEOUT, registry
        assert parameters["max_chars"].default is DEFAULT_MAX_CHARS, registry


def subclasses(cls: type) -> list[type]:
    return [cls, *(sub for child in cls.__subclasses__() for sub in subclasses(child))]


async def test_an_option_only_the_settings_declare_reaches_the_request_from_yaml_and_keywords(
    tmp_path: Path,
) -> None:
    """Attack: an option of the client that the YAML file or the agent's keywords cannot set (before,
    `extra_body` and `retry_max_delay` were code-only): from a file and from a keyword, it must
    reach the request the endpoint receives."""
    async with FakeOpenAIServer() as fake:
        path = write(tmp_path, f"""
            model:
              name: m
              base_url: {fake.base_url}
              temperature: 0.3
              extra_body: {{seed: 7}}
              retry_max_delay: 0.5
            tools: []
        """)  # fmt: skip
        configured = build_agent(load_settings(path, env={}, dotenv=None))
        keyword = Agent(model="m", base_url=fake.base_url, temperature=0.3, extra_body={"seed": 7})
        for agent in (configured, keyword):
            fake.script(FakeReply.text("fine"))
            assert (await agent.run("what is new?")).reply == "fine"
            await agent.aclose()
    assert [(r.body or {}).get("seed") for r in fake.requests] == [7, 7]
    assert [(r.body or {}).get("temperature") for r in fake.requests] == [0.3, 0.3]
    assert configured.settings.retry_max_delay == 0.5


async def test_settings_limits_and_keywords_make_one_agent() -> None:
    """Attack: the two ways to configure an agent disagreeing: `settings=`/`limits=` and the keywords
    must give the same agent, a keyword winning over the same option of `settings=`, and a copy of an
    agent (`dataclasses.replace`, as a team makes one) keeping both."""

    @tool
    def dump() -> str:
        """A long text."""
        return "x" * 5000

    async with FakeOpenAIServer() as fake:
        settings = ModelSettings(model="m", base_url=fake.base_url, temperature=0.9)
        agent = Agent(settings=settings, limits=Limits(max_result_chars=1200), temperature=0.1, tools=[dump])
        copy = dataclasses.replace(agent, max_turns=3)
        assert copy.limits == Limits(max_turns=3, max_result_chars=1200) and copy.temperature == 0.1
        assert settings.temperature == 0.9  # the caller's settings are not changed
        fake.script(FakeReply.tool_call("dump"), FakeReply.text("done"))
        result = await copy.run("dump it")
        await copy.aclose()
    assert result.reply == "done" and (fake.requests[0].body or {}).get("temperature") == 0.1
    assert "[truncated: shown 1200 of 5000 chars]" in fake.requests[1].messages[-1]["content"]
    with pytest.raises(TypeError, match="max_turnz"):
        Agent(max_turnz=3)


@pytest.mark.parametrize("header", ["Authorization", "x-api-key"])
def test_a_credential_in_the_extra_headers_of_the_file_is_refused(tmp_path: Path, header: str) -> None:
    """Attack: the key smuggled into the configuration file as a request header, now that every model
    option is a YAML key: it must be refused like `api_key`, without echoing it."""
    data: dict[str, Any] = {"model": {"extra_headers": {header: "Bearer sk-live-999", "X-Trace": "on"}}}
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, yaml.safe_dump(data)), env={}, dotenv=None)
    assert f"model.extra_headers.{header}" in str(caught.value) and "sk-live-999" not in str(caught.value)
    data["model"]["extra_headers"] = {"X-Trace": "on"}
    assert load_settings(write(tmp_path, yaml.safe_dump(data)), env={}, dotenv=None).model.extra_headers == {
        "X-Trace": "on"
    }


def test_the_model_section_survives_a_round_trip(tmp_path: Path) -> None:
    """Attack: the section read back from its own dump (as `--mode` does) losing a renamed key: the
    YAML names (`name`, `fallback`) and the field names (`model`, `fallback_models`) are one option."""
    path = write(tmp_path, "model:\n  name: big\n  fallback: [small]\n  base_url: http://127.0.0.1:9/v1\n")
    settings = load_settings(path, env={}, dotenv=None)
    again = Settings.model_validate(settings.model_dump())
    assert again.model == settings.model and again.model.name == "big" and again.model.fallback == ["small"]


def test_the_approval_ttl_is_declared_once() -> None:
    """Attack: the time an approval waits written again beside its one declaration (`APPROVAL_TTL`):
    the YAML default must be that constant itself, the stores (which a library may build without a
    configuration) default to it, and a Temporal worker's steps, only ever built from a
    configuration, have no default of their own: they receive the configured value."""
    pytest.importorskip("temporalio")
    from hermes_core.config import PermissionsConfig
    from hermes_core.engine.temporal.activities import StepInteractions, TurnActivities
    from hermes_core.kernel.approvals import APPROVAL_TTL
    from hermes_core.postgres.pending import PostgresInteractions
    from hermes_core.tasks.pending import InlineInteractions, SQLiteInteractions

    assert PermissionsConfig.model_fields["approval_ttl"].default is APPROVAL_TTL
    for store in (SQLiteInteractions, PostgresInteractions):
        assert inspect.signature(store).parameters["approval_ttl"].default is APPROVAL_TTL, store
    assert inspect.signature(InlineInteractions).parameters["timeout"].default is APPROVAL_TTL
    for step, name in ((StepInteractions, "ttl"), (TurnActivities, "approval_ttl")):
        assert inspect.signature(step).parameters[name].default is inspect.Parameter.empty, step


def test_every_team_option_is_declared_once_and_reaches_the_supervisor(tmp_path: Path) -> None:
    """Attack: a team option written again (in the task mode, the supervisor's keywords, the expert)
    whose default drifts from the YAML's: the `team:` section extends the `TeamLimits` the supervisor
    reads, each `team.experts` entry the `MemberLimits` an `Expert` holds, no other code declares
    them, and a value set in the file reaches the running team unchanged."""
    from hermes_core.modes import TaskMode
    from hermes_core.team import Expert, Supervisor
    from hermes_core.team.settings import ExpertSettings, TeamSettings
    from hermes_core.team.supervisor import MemberLimits, TeamLimits

    assert issubclass(TeamSettings, TeamLimits) and issubclass(ExpertSettings, MemberLimits)
    assert issubclass(Expert, MemberLimits) and Settings().team == TeamSettings()
    team = {"max_depth": 2, "concurrency": 3, "requests_per_second": 7.0, "delegate_timeout": 9.0}
    member = {"concurrency": 2, "requests_per_second": 5.0, "can_delegate": True}
    assert set(team) == {f.name for f in dataclasses.fields(TeamLimits)}
    assert set(member) == {f.name for f in dataclasses.fields(MemberLimits)}
    for code in (Supervisor, TaskMode):  # they take the section whole: no option of their own
        assert not (set(team) | set(member)) & set(inspect.signature(code).parameters), code
    expert = {"name": "research", "system_prompt": "You find facts.", **member}
    data = {"agent": {"mode": "team"}, "team": {**team, "experts": [expert]}, "tools": []}
    settings = load_settings(write(tmp_path, yaml.safe_dump(data)), env={}, dotenv=None)
    agent = build_agent(settings, model=ScriptedModel([]))
    assert agent.mode is not None
    supervisor = agent.mode.team(agent)
    assert {name: getattr(supervisor.limits, name) for name in team} == team
    [built] = agent.mode.experts
    assert {name: getattr(built, name) for name in member} == member
    assert Supervisor(agent, [], max_depth=4).limits == TeamLimits(max_depth=4)  # a keyword: a copy
    with pytest.raises(TypeError, match="max_depht"):
        Supervisor(agent, [], max_depht=4)


def test_every_agent_option_the_code_also_defaults_has_one_default() -> None:
    """Attack: an `agent:` option whose default is written again where the code uses it (the plan
    runner's replans, the shell's sandbox, the workspace's quotas, the modes `--mode` offers, the
    agent's prompt and greetings restated by `build_agent`) drifting from the YAML's: the section's
    default must be the code's own, and the mode that runs a task declares no default at all."""
    from hermes_core.cli import build_parser
    from hermes_core.config import AgentConfig
    from hermes_core.modes import MODES, ModeName, TaskMode
    from hermes_core.plans import run_plan
    from hermes_core.plans.executor import DEFAULT_MAX_REPLANS
    from hermes_core.tools.builtin import builtin_tools
    from hermes_core.tools.files import MIB, Workspace
    from hermes_core.tools.sandbox import DEFAULT_SANDBOX, SandboxMode
    from hermes_core.tools.shell import run_command_tool

    def default(code: Any, name: str) -> Any:
        return inspect.signature(code).parameters[name].default

    section = AgentConfig()
    assert section.max_replans is DEFAULT_MAX_REPLANS is default(run_plan, "max_replans")
    assert section.shell_sandbox is DEFAULT_SANDBOX is default(builtin_tools, "shell_sandbox")
    assert default(run_command_tool, "sandbox") is DEFAULT_SANDBOX
    assert section.workspace_quota_mb == default(Workspace, "quota_bytes") / MIB
    assert section.workspace_conversation_quota_mb == default(Workspace, "conversation_quota_bytes") / MIB
    fields = AgentConfig.__pydantic_fields__
    assert fields["mode"].annotation == ModeName and fields["shell_sandbox"].annotation == SandboxMode
    mode_flag = next(action for action in build_parser()._actions if action.dest == "mode")
    assert tuple(mode_flag.choices or ()) == MODES
    parameters = inspect.signature(TaskMode).parameters
    assert all(parameters[name].default is inspect.Parameter.empty for name in ("name", "max_replans"))
    built, plain = build_agent(Settings(), model_required=False), Agent()  # nothing set: the agent's own
    assert (built.system_prompt, built.greeting_patterns) == (plain.system_prompt, plain.greeting_patterns)


def test_the_permission_lists_are_the_policys_and_reach_it(tmp_path: Path) -> None:
    """Attack: a `permissions:` option the kernel's `Policy` lacks, or holds with another default (the
    file's `batch_max_level` was a second 1): every key but the two the composition reads itself
    (`confirm`, `approval_ttl`) is a field of `Policy`, defaulting as it does, and a value set in the
    file reaches the built agent's policy unchanged."""
    from hermes_core.config import PermissionsConfig
    from hermes_core.kernel.tools.permissions import Policy

    lists = set(PermissionsConfig.model_fields) - {"confirm", "approval_ttl"}
    assert lists <= {declared.name for declared in dataclasses.fields(Policy)}
    plain, section = Policy(), PermissionsConfig()
    for name in lists:  # the same default, in the policy's own container (a frozenset of a list)
        assert type(getattr(plain, name))(getattr(section, name)) == getattr(plain, name), name
    written = {"admins": ["feishu:ou_a"], "roles": {"webhook:u1": "hr"}, "allow_irreversible": ["wipe"],
               "batch_max_level": 0}  # fmt: skip
    assert set(written) == lists
    path = write(tmp_path, yaml.safe_dump({"permissions": written, "tools": []}))
    agent = build_agent(load_settings(path, env={}, dotenv=None), model_required=False)
    assert agent.permissions == Policy.from_lists(**written)
