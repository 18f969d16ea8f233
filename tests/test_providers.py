"""Connecting a real model: provider presets, one clear line for a half configuration, the model in
use said at start-up, and `tools` listing what serve offers. Every test runs `hermes-kernel` as a
subprocess, against the bundled fake OpenAI-compatible server where a model is needed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import serve_process
from hermes_core.models.providers import PROVIDERS, find_provider
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

KEY_VARIABLES = tuple(p.key_env for p in PROVIDERS if p.key_env)
CLEAN_ENV = {
    k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FEISHU_")) and k not in KEY_VARIABLES
}
SECRET = "sk-provider-test-key-0123456789abcdef"


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hermes_core", *args], capture_output=True, text=True, timeout=60,
        env={**CLEAN_ENV, **(env or {})}, cwd=cwd,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        # the reported case: a model name and a key, but no endpoint, used to run the offline demo
        ((), {"HERMES_MODEL": "deepseek-chat", "HERMES_API_KEY": SECRET}, "HERMES_PROVIDER"),
        (("--model", "gpt-4.1-mini"), {}, "HERMES_BASE_URL"),
        (("--base-url", "http://127.0.0.1:9/v1"), {}, "HERMES_MODEL"),  # used to print a traceback
        ((), {"HERMES_BASE_URL": "http://user:pw-secret-123@127.0.0.1:9/v1"}, "no model name"),
        ((), {"HERMES_PROVIDER": "deepseek"}, "DEEPSEEK_API_KEY"),
        (("--provider", "qwen"), {}, "DASHSCOPE_API_KEY"),
        (("--provider", "vllm"), {}, "HERMES_MODEL"),
        (("--provider", "no-such-provider"), {}, "deepseek, qwen"),
    ],
)
def test_half_configured_model_is_one_clear_line_and_exit_2(
    args: tuple[str, ...], env: dict[str, str], expected: str, tmp_path: Path
) -> None:
    """Attack: configure half a model (a name without an endpoint, an endpoint without a name, a
    provider without its key or model, a misspelt provider). Before, everything silently ran the
    offline demo (or printed a traceback for --base-url alone); now: one line naming what to set."""
    done = cli(*args, "run", "What is 3 plus 4?", env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hermes-kernel: ") and expected in lines[0], done.stderr
    assert SECRET not in done.stderr and "pw-secret-123" not in done.stderr


@pytest.mark.slow
def test_doctor_does_not_call_a_half_configured_model_ready(tmp_path: Path) -> None:
    """Attack: HERMES_MODEL and HERMES_API_KEY without a base URL; doctor used to say "Everything
    checked is ready" (the offline demo answering). Now the configuration line fails and says why."""
    done = cli("doctor", env={"HERMES_MODEL": "deepseek-chat", "HERMES_API_KEY": SECRET}, cwd=tmp_path)
    assert done.returncode == 1, done.stdout
    assert "Everything checked is ready" not in done.stdout
    configuration = next(line for line in done.stdout.splitlines() if "configuration:" in line)
    assert configuration.startswith("FAIL") and "HERMES_PROVIDER" in configuration
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("provider", "key_env", "model"),
    [("deepseek", "DEEPSEEK_API_KEY", "deepseek-v4-flash"), ("qwen", "DASHSCOPE_API_KEY", "qwen-plus"),
     ("kimi", "MOONSHOT_API_KEY", "kimi-k2.6"), ("glm", "ZHIPUAI_API_KEY", "glm-4-flash")],
)  # fmt: skip
def test_a_preset_sends_its_default_model_and_its_own_key_variable(
    provider: str, key_env: str, model: str, tmp_path: Path
) -> None:
    """A one-word provider choice: the preset's default model goes out with the key of the preset's
    own variable (the base URL overridden to the fake server, as one would for a proxy)."""
    with FakeOpenAIServer(api_key=SECRET, models=[model]) as fake:
        fake.script(FakeReply.text("hello from the preset"))
        env = {"HERMES_PROVIDER": provider, "HERMES_BASE_URL": fake.base_url, key_env: SECRET}
        done = cli("run", "hi there, how are you doing", env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "hello from the preset" in done.stdout
        assert fake.requests[0].model == model
        assert fake.requests[0].headers.get("Authorization") == f"Bearer {SECRET}"


@pytest.mark.slow
def test_a_local_preset_needs_no_key_and_names_its_model(tmp_path: Path) -> None:
    """Local servers (Ollama, vLLM, llama.cpp, LM Studio) take no key: none is sent, none is asked for."""
    with FakeOpenAIServer(models=["my-local-model"]) as fake:
        fake.script(FakeReply.text("local answer"))
        env = {"HERMES_BASE_URL": fake.base_url}
        done = cli("--provider", "lmstudio", "--model", "my-local-model", "run", "hi there friend", env=env)
        assert done.returncode == 0, done.stderr
        assert "local answer" in done.stdout and fake.requests[0].model == "my-local-model"
        assert "Authorization" not in fake.requests[0].headers


def test_every_preset_is_complete() -> None:
    """The table: remote presets are https with a key variable ending in _API_KEY (so redaction knows
    it), local ones are loopback without one; every one cites its documentation; aliases resolve."""
    assert [p.name for p in PROVIDERS] == [
        "openai", "deepseek", "qwen", "moonshot", "zhipu", "siliconflow", "openrouter",
        "ollama", "vllm", "llamacpp", "lmstudio", "litellm", "mistral",
    ]  # fmt: skip
    for preset in PROVIDERS:
        assert preset.doc.startswith("https://")
        if preset.key_env:
            assert preset.base_url.startswith("https://") and preset.key_env.endswith("_API_KEY")
            assert preset.model
        else:
            assert preset.base_url.startswith("http://127.0.0.1:")
    assert find_provider("Kimi").name == "moonshot" and find_provider("llama.cpp").name == "llamacpp"


def test_help_doctor_and_both_readmes_list_every_preset(tmp_path: Path) -> None:
    """Issue 29: `--help` and `doctor` listed 11 providers, the README 13. All of them now come from
    the one table (models/providers.py): `--help`, `doctor`'s fix line and the READMEs' preset tables
    name each preset, and the tables hold no other."""
    names = [p.name for p in PROVIDERS]
    shown = {
        "--help": " ".join(cli("--help").stdout.split()),
        "doctor": cli("doctor", cwd=tmp_path).stdout,
    }
    root = Path(__file__).resolve().parents[1]
    for readme in ("README.md", "README.zh-CN.md"):
        text = (root / readme).read_text(encoding="utf-8")
        table = re.findall(r"^\| `([\w.-]+)` \|.*https?://", text, flags=re.M)
        assert sorted(table) == sorted(names), readme
    for where, text in shown.items():
        missing = [name for name in names if not re.search(rf"\b{re.escape(name)}\b", text)]
        assert not missing, f"{where} does not list {missing}"


@pytest.mark.slow
def test_run_says_the_offline_demo_is_answering_on_stderr(tmp_path: Path) -> None:
    """Nothing configured: the offline demo answers, and says so in one line on stderr (stdout keeps
    only the reply, so scripts can still read it)."""
    done = cli("run", "What is 3 plus 4?", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    notice = done.stderr.strip().splitlines()
    assert len(notice) == 1 and "offline demo model" in notice[0] and "HERMES_PROVIDER" in notice[0]
    assert "offline demo model" in cli("chat", cwd=tmp_path).stderr


@pytest.mark.slow
def test_run_logs_the_model_in_use_without_the_key(tmp_path: Path) -> None:
    """With --log-level INFO, run says which model and endpoint answer, never the key."""
    with FakeOpenAIServer() as fake:
        fake.script(FakeReply.text("ok"))
        env = {"HERMES_PROVIDER": "openai", "HERMES_BASE_URL": fake.base_url, "OPENAI_API_KEY": SECRET}
        done = cli("--log-level", "INFO", "run", "hi there friend", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"model: gpt-4.1-mini at {fake.base_url} (provider openai, key from OPENAI_API_KEY)" in done.stderr
    assert SECRET not in done.stderr + done.stdout


def start_serve(env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen[str], str]:
    process, found = serve_process.start_serve(
        "serve", "--port", "0", cwd=cwd, env={**CLEAN_ENV, **env}, stderr=subprocess.PIPE
    )
    return process, found.group(1)


def stop(process: subprocess.Popen[str]) -> str:
    return serve_process.stop_serve(process)


@pytest.mark.slow
def test_serve_logs_the_model_and_endpoint_never_the_key(tmp_path: Path) -> None:
    """serve's start-up log names the model, the endpoint and where the key came from; not the key."""
    with FakeOpenAIServer() as fake:
        env = {"HERMES_PROVIDER": "deepseek", "HERMES_BASE_URL": fake.base_url, "DEEPSEEK_API_KEY": SECRET}
        process, _ = start_serve(env, tmp_path)
        stderr = stop(process)
    assert re.search(rf"INFO .*model: deepseek-v4-flash at {re.escape(fake.base_url)} \(provider deepseek, "
                     r"key from DEEPSEEK_API_KEY\); tool_mode auto", stderr), stderr  # fmt: skip
    assert SECRET not in stderr


@pytest.mark.slow
def test_serve_warns_when_the_offline_demo_answers(tmp_path: Path) -> None:
    """Nothing configured: serve still starts (the demo), with a WARNING saying so and what to set."""
    process, _ = start_serve({}, tmp_path)
    stderr = stop(process)
    assert re.search(r"WARNING .*no model configured: the offline demo model answers", stderr), stderr


def parse_tools_output(text: str) -> dict[str, dict]:
    """`hermes-kernel tools` output: `name: description` then its JSON schema, per tool."""
    tools: dict[str, dict] = {}
    decoder = json.JSONDecoder()
    position = 0
    for found in re.finditer(r"^([A-Za-z0-9_]+): ", text, re.M):
        if found.start() < position:
            continue
        start = text.index("\n{", found.end()) + 1
        schema, position = decoder.raw_decode(text, start)
        tools[found.group(1)] = schema
    return tools


@pytest.mark.slow
def test_tools_and_doctor_list_exactly_what_serve_offers(tmp_path: Path) -> None:
    """Attack: compare `hermes-kernel tools` (and doctor's count) with the tools a real `serve` sends
    the model for a webhook message, captured by the fake server. They used to list 3 while serve
    offered 4 (the conversation memory's `remember` was missing). A tool only a role may use (an
    admin's `send_message`) is listed as such, and not offered to this member."""
    with FakeOpenAIServer() as fake:
        fake.script(FakeReply.text("noted"))
        env = {"HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "m"}
        process, address = start_serve(env, tmp_path)
        try:
            body = json.dumps({"message": "hello, anything new?", "user_id": "u1"}).encode()
            request = urllib.request.Request(f"{address}/webhook", data=body, method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
        finally:
            stop(process)
        [turn] = [r for r in fake.requests if r.tools]  # not serve's start-up probe of the model
        offered = {t["function"]["name"]: t["function"]["parameters"] for t in turn.tools}
        listed = cli("tools", env=env, cwd=tmp_path)
        doctor = cli("doctor", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    every = parse_tools_output(listed.stdout)
    admins_only = set(re.findall(r"^([A-Za-z0-9_]+): .*\n  \(admin only", listed.stdout, re.M))
    assert admins_only == {"send_message"}
    assert {name: schema for name, schema in every.items() if name not in admins_only} == offered
    assert {"calculator", "current_time", "date_diff", "clarify", "remember"} <= set(offered)
    assert f"{len(every)} tools" in doctor.stdout


@pytest.mark.slow
def test_commands_that_never_ask_the_model_still_run_half_configured(tmp_path: Path) -> None:
    """`traces` only reads the database: a half-configured model does not stop it (regression guard
    for the strict check above), while `tools`, which lists what serve would offer, refuses."""
    env = {"HERMES_MODEL": "deepseek-chat"}
    assert cli("traces", env=env, cwd=tmp_path).returncode == 0
    assert cli("tools", env=env, cwd=tmp_path).returncode == 2
