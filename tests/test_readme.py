"""The README's examples are run here, so they cannot rot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hermes_core.testing.fake_openai import FakeOpenAIServer

README = Path(__file__).resolve().parents[1] / "README.md"


def example(name: str) -> str:
    text = README.read_text(encoding="utf-8")
    found = re.search(rf"<!-- readme-example: {name} -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert found, f"README example {name!r} is missing"
    return found.group(1)


def test_tool_agent_example_runs_against_an_openai_compatible_endpoint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeOpenAIServer(default_tool_args={"city": "Beijing"}, api_key="sk-readme") as fake:
        monkeypatch.setenv("HERMES_BASE_URL", fake.base_url)
        monkeypatch.setenv("HERMES_MODEL", "any-model")
        monkeypatch.setenv("HERMES_API_KEY", "sk-readme")
        exec(compile(example("tool-agent"), "README.md", "exec"), {})
        first, second = fake.requests
    out = capsys.readouterr().out.splitlines()
    assert out[0] == 'done: {"city": "Beijing", "condition": "sunny", "temp_c": 21}'
    assert out[1].startswith("['get_weather'] ")
    assert first.body["tools"][0]["function"]["name"] == "get_weather"
    assert second.messages[-1]["role"] == "tool"


def test_scripted_example_runs() -> None:
    exec(compile(example("scripted"), "README.md", "exec"), {})


def test_approvals_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(example("approvals"), "README.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["awaiting_approval", "Refunded A-1."]


def test_readme_commands_match_ci() -> None:
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip install ".[test]" && python -m pytest' in README.read_text(encoding="utf-8")
    assert 'pip install ".[test]" && python -m pytest' in ci


def test_readme_configuration_example_is_valid(tmp_path: Path) -> None:
    from hermes_core.config import load_settings

    text = README.read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(.*?)```", text, re.DOTALL)
    assert block
    path = tmp_path / "hermes.yaml"
    path.write_text(block.group(1).replace("mypkg.tools", "hermes_core.tools.examples"), encoding="utf-8")
    settings = load_settings(path, env={}, dotenv=None)
    assert settings.model.tool_mode == "auto" and settings.model.fallback == ["qwen2.5-7b-instruct"]


def test_the_test_command_says_what_skips_and_that_ci_installs_it() -> None:
    """Every Debian package `.ci/run` installs for the tests, and the Temporal server's pin file,
    is named beside the README's test command, so a reader knows why tests skip on a bare machine."""
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    packages = re.search(r"apt-get install -y -qq --no-install-recommends ([^>]*)>", ci)
    assert packages, "the apt-get line of .ci/run"
    names = packages.group(1).replace("\\", " ").split()
    assert "postgresql" in names and "chromium" in names
    text = README.read_text(encoding="utf-8")
    start = text.index('pip install ".[test]" && python -m pytest')
    section = text[start : text.index("\n## ", start)]
    for name in [*names, ".ci/temporal-server.txt", "-rs"]:
        assert name in section, f"the README's test command does not mention {name}"
