"""Configuration (O1) and the command line (C1) with the offline demo model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hermes_core.config import ConfigError, build_agent, load_settings

CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}


def write(tmp_path: Path, text: str, name: str = "hermes.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_yaml_then_environment(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        model:
          name: from-file
          base_url: http://127.0.0.1:9/v1
          temperature: 0.5
        agent:
          max_turns: 4
    """,
    )
    settings = load_settings(path, env={"HERMES_MODEL": "from-env"}, dotenv=None)
    assert settings.model.name == "from-env" and settings.model.temperature == 0.5
    assert settings.agent.max_turns == 4
    agent = build_agent(settings)
    assert (
        agent.max_turns == 4
        and agent.model == "from-env"
        and agent.registry.names == ["calculator", "current_time", "date_diff", "clarify"]
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("model:\n  temperature: hot\n", "model.temperature: input should be a valid number"),
        ("model:\n  temperature: 7\n", "model.temperature: input should be less than or equal to 2"),
        ("agent:\n  max_turnz: 3\n", "agent.max_turnz: unknown key"),
        ("agent:\n  language: fr\n", "agent.language: input should be 'zh' or 'en'"),
        ("- just a list\n", "the top level must be a mapping"),
        ("model: [unclosed\n", "is not valid YAML"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        load_settings(write(tmp_path, text), env={}, dotenv=None)


def test_secrets_in_the_file_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "model:\n  name: m\n  api_key: sk-live-123\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={}, dotenv=None)
    assert "model.api_key" in str(info.value) and "sk-live-123" not in str(info.value)


def test_dotenv_fills_the_environment_without_overriding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_MODEL", "already-set")
    monkeypatch.setenv("HERMES_BASE_URL", "")  # recorded, so what the .env sets is undone after the test
    monkeypatch.delenv("HERMES_BASE_URL")
    dotenv = write(
        tmp_path, 'HERMES_MODEL=from-dotenv\nexport HERMES_BASE_URL="http://127.0.0.1:9/v1"\n# x\n', ".env"
    )
    settings = load_settings(None, dotenv=dotenv)
    assert settings.model.name == "already-set" and settings.model.base_url == "http://127.0.0.1:9/v1"


def test_user_tools_load_from_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_team_tools.py").write_text(
        textwrap.dedent('''
        from hermes_core import tool

        @tool
        def shout(text: str) -> str:
            """Upper-case a text."""
            return text.upper()
        '''),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = load_settings(write(tmp_path, "tools: [my_team_tools]\n"), env={}, dotenv=None)
    assert build_agent(settings).registry.names == ["shout", "clarify"]
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        build_agent(load_settings(write(tmp_path, "tools: [no_such_module]\n"), env={}, dotenv=None))


def cli(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hermes_core", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={**CLEAN_ENV, **(env or {})},
    )


@pytest.mark.slow
@pytest.mark.parametrize("message", ["计算 (12+34)*2", "what is (12+34)*2"])
def test_run_answers_arithmetic_through_the_calculator(message: str) -> None:
    done = cli("run", "--json", message)
    assert done.returncode == 0, done.stderr
    import json

    result = json.loads(done.stdout)
    assert result["tool_calls"][0]["name"] == "calculator"
    assert result["tool_calls"][0]["arguments"] == {"expression": "(12+34)*2"}
    assert "92" in result["reply"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("message", "marker"), [("现在几点", "【离线演示模型】"), ("what time is it", "[offline demo model]")]
)
def test_run_answers_time_questions_through_the_time_tool(message: str, marker: str) -> None:
    done = cli("run", message)
    assert done.returncode == 0, done.stderr
    assert marker in done.stdout and "current_time" in done.stdout and "UTC" in done.stdout
    assert re.search(r"\d\d:\d\d:\d\d", done.stdout)  # the time, as a sentence (was the raw result)


@pytest.mark.slow
def test_run_without_a_model_explains_how_to_configure_one() -> None:
    done = cli("run", "tell me a joke")
    assert "HERMES_BASE_URL" in done.stdout and "offline demo model" in done.stdout


@pytest.mark.slow
def test_chat_repl_keeps_going_until_exit() -> None:
    done = cli("chat", stdin="计算 2^10\nwhat is 7*6\nquit\nnever read\n")
    assert done.returncode == 0, done.stderr
    assert "1024" in done.stdout and "42" in done.stdout


@pytest.mark.slow
def test_chat_ends_on_eof_and_tools_lists_schemas() -> None:
    assert cli("chat", stdin="").returncode == 0
    listed = cli("tools")
    assert listed.returncode == 0 and '"expression"' in listed.stdout and "current_time" in listed.stdout


@pytest.mark.slow
def test_bad_config_is_a_clear_error(tmp_path: Path) -> None:
    done = cli("--config", str(write(tmp_path, "model:\n  timeout: -1\n")), "run", "hi")
    assert done.returncode == 2 and "model.timeout" in done.stderr


@pytest.mark.slow
def test_unreachable_model_fails_politely_with_nonzero_exit() -> None:
    done = cli(
        "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "run", "计算 1+1",
        env={"HERMES_API_KEY": "sk-test-secret"},
    )  # fmt: skip
    assert done.returncode == 1
    assert "模型服务暂时不可用" in done.stdout
    assert "sk-test-secret" not in done.stdout + done.stderr
