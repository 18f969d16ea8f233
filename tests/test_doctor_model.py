"""`hermes-kernel doctor` talks to the configured model endpoint (a real subprocess against the bundled
fake OpenAI-compatible server): the key, the model name, and how the model calls tools."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_core.models.providers import PROVIDERS
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")

KEY_VARIABLES = tuple(p.key_env for p in PROVIDERS if p.key_env)
CLEAN_ENV = {
    k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FEISHU_")) and k not in KEY_VARIABLES
}
KEY = "sk-doctor-right-key-0123456789abcdef"
WRONG = "sk-doctor-wrong-key-0123456789abcdef"
MODELS = ["qwen2.5-7b-instruct", "qwen2.5-14b-instruct", "llama-3.1-8b-instruct"]


def doctor(env: dict[str, str], tmp_path: Path, config: str = "") -> tuple[int, dict[str, str], str]:
    """Run doctor; the exit code, each check's line by name, all output."""
    args = [sys.executable, "-m", "hermes_core", "doctor"]
    if config:
        path = tmp_path / "hermes.yaml"
        path.write_text(config, encoding="utf-8")
        args[3:3] = ["--config", str(path)]
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=90, cwd=tmp_path, env={**CLEAN_ENV, **env}
    )
    lines = {}
    for line in done.stdout.splitlines():
        status, _, rest = line.partition("  ")
        if status.strip() in ("OK", "FAIL", "SKIP"):
            lines[rest.strip().partition(":")[0]] = line
    return done.returncode, lines, done.stdout + done.stderr


def test_a_refused_key_names_the_providers_key_variable(tmp_path: Path) -> None:
    """Attack: a wrong DEEPSEEK_API_KEY (the endpoint answers 401). The FAIL names the variable to fix,
    never the key."""
    with FakeOpenAIServer(api_key=KEY) as fake:
        env = {"HERMES_PROVIDER": "deepseek", "HERMES_BASE_URL": fake.base_url, "DEEPSEEK_API_KEY": WRONG}
        code, lines, output = doctor(env, tmp_path)
    assert code == 1
    line = lines["model endpoint"]
    assert line.startswith("FAIL") and "DEEPSEEK_API_KEY" in line and "401" in line, output
    assert lines["model tools"].startswith("SKIP")
    assert WRONG not in output and KEY not in output


def test_an_unknown_model_names_it_and_the_closest_listed_ones(tmp_path: Path) -> None:
    """Attack: a model name the endpoint does not serve (404 model_not_found); doctor asks GET /models
    and names the closest models it lists."""
    with FakeOpenAIServer(api_key=KEY, models=MODELS) as fake:
        env = {"HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "qwen2.5-7b", "HERMES_API_KEY": KEY}
        code, lines, output = doctor(env, tmp_path)
    assert code == 1
    line = lines["model endpoint"]
    assert line.startswith("FAIL") and "'qwen2.5-7b'" in line and "HERMES_MODEL" in line, output
    assert "closest it lists: qwen2.5-7b-instruct" in line


def test_model_not_found_said_in_a_400_is_recognised(tmp_path: Path) -> None:
    """Some endpoints answer a wrong model with 400 "Model Not Exist" instead of 404."""

    def reply(request: RecordedRequest) -> FakeReply:
        return FakeReply.error(400, "Model Not Exist")

    with FakeOpenAIServer(handler=reply, models=MODELS) as fake:
        code, lines, output = doctor({"HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "llama3"}, tmp_path)
    assert code == 1
    assert "does not know the model 'llama3'" in lines["model endpoint"], output
    assert "llama-3.1-8b-instruct" in lines["model endpoint"]


def test_native_tool_calls_say_native_works(tmp_path: Path) -> None:
    """The fake answers the one-tool probe with a native call: OK, tool_mode native/auto."""
    with FakeOpenAIServer(models=["m1"], default_tool_args={"expression": "6*7"}) as fake:
        code, lines, output = doctor({"HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "m1"}, tmp_path)
        probe = fake.requests[-1]
    assert code == 0, output
    assert lines["model tools"].startswith("OK") and "native tool calls (calculator)" in lines["model tools"]
    assert [t["function"]["name"] for t in probe.tools] == ["calculator"]
    assert "Everything checked is ready." in output


@pytest.mark.parametrize(("mode", "status"), [("auto", "OK"), ("native", "FAIL")])
def test_an_endpoint_that_refuses_tools_is_told_to_use_text_mode(
    mode: str, status: str, tmp_path: Path
) -> None:
    """Attack: an endpoint that answers 400 to any `tools` parameter (a server without tool support).
    doctor says to use tool_mode text; with tool_mode native every tool request would fail: FAIL."""
    with FakeOpenAIServer(models=["m1"], reject_tools=True) as fake:
        config = f"model:\n  name: m1\n  base_url: {fake.base_url}\n  tool_mode: {mode}\n"
        code, lines, output = doctor({}, tmp_path, config)
    line = lines["model tools"]
    assert (
        line.startswith(status) and "refuses the `tools` parameter" in line and "tool_mode: text" in line
    ), output
    assert lines["model endpoint"].startswith("OK")
    assert code == (1 if status == "FAIL" else 0)


def test_tool_calls_written_as_text_are_recognised(tmp_path: Path) -> None:
    """A local model served without a tool parser writes `<tool_call>{…}</tool_call>` in its content;
    doctor reads it with the text-call parsers and says to set tool_mode: text."""
    with FakeOpenAIServer(models=["m1"], default_tool_args={"expression": "6*7"}) as fake:
        fake.text_tool_calls = True
        code, lines, output = doctor({"HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "m1"}, tmp_path)
    line = lines["model tools"]
    assert line.startswith("OK") and "writes tool calls as text, Hermes <tool_call> JSON" in line, output
    assert "(`hermes`)" in line and "reads only this family" in line
    assert "set model.tool_mode: text and model.tool_format: hermes" in line
    assert code == 0


def test_text_mode_configured_and_the_model_follows_it(tmp_path: Path) -> None:
    """With tool_mode text the probe describes the tool in the prompt (no `tools` parameter) and
    reads the call back from the text."""
    with FakeOpenAIServer(models=["m1"], default_tool_args={"expression": "6*7"}) as fake:
        fake.text_tool_calls = True
        config = f"model:\n  name: m1\n  base_url: {fake.base_url}\n  tool_mode: text\n"
        code, lines, output = doctor({}, tmp_path, config)
        probe = fake.requests[-1]
    assert code == 0, output
    assert lines["model tools"].startswith("OK") and "text mode" in lines["model tools"]
    assert "(`hermes`)" in lines["model tools"]  # the family it was read in
    assert probe.tools == [] and "<tools>" in probe.messages[0]["content"]


def qwen3_coder_call(request: RecordedRequest) -> FakeReply:
    """A Qwen3-Coder served without its tool parser: the call in the model's own XML, as text."""
    return FakeReply.text(
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n6*7\n</parameter>\n</function>\n</tool_call>"
    )


@pytest.mark.parametrize("pinned", [None, "qwen3_coder", "glm"])
def test_doctor_names_the_family_and_a_wrong_pinned_one_fails(tmp_path: Path, pinned: str | None) -> None:
    """doctor names the family the model writes (Qwen3-Coder XML) and says to pin it; a
    `model.tool_format` that names another family would show the calls as text: FAIL."""
    with FakeOpenAIServer(handler=qwen3_coder_call) as fake:
        config = f"model:\n  name: Qwen3-Coder-30B-A3B\n  base_url: {fake.base_url}\n"
        code, lines, output = doctor({}, tmp_path, config + (f"  tool_format: {pinned}\n" if pinned else ""))
    line = lines["model tools"]
    assert "writes tool calls as text, Qwen3-Coder XML (`qwen3_coder`)" in line, output
    if pinned == "glm":
        assert line.startswith("FAIL") and "model.tool_format says glm" in line, output
        assert "set model.tool_format: qwen3_coder" in line and code == 1
    else:
        assert line.startswith("OK") and "model.tool_format: qwen3_coder" in line and code == 0, output


def test_an_unknown_pinned_family_is_a_configuration_error(tmp_path: Path) -> None:
    with FakeOpenAIServer() as fake:
        config = f"model:\n  name: m1\n  base_url: {fake.base_url}\n  tool_format: qwen4\n"
        code, lines, output = doctor({}, tmp_path, config)
    assert code == 1 and "unknown tool-call family 'qwen4'" in output and "qwen3_coder" in output, output


def test_a_model_that_ignores_the_tool_fails_the_check(tmp_path: Path) -> None:
    """Attack: a model that answers "42" instead of calling the offered tool: doctor does not call
    it ready."""

    def reply(request: RecordedRequest) -> FakeReply:
        return FakeReply.text("42")

    with FakeOpenAIServer(handler=reply) as fake:
        code, lines, output = doctor({"HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "m1"}, tmp_path)
    assert code == 1
    assert lines["model tools"].startswith("FAIL") and "without calling" in lines["model tools"], output
    assert "Everything checked is ready" not in output
