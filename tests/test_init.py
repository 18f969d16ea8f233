"""`hermes-kernel init`: every provider and channel choice writes a configuration that loads and means
what was asked, a `.env.example` naming exactly the secrets it needs, and nothing is overwritten.

Cases come from the issue's list of choices (the provider presets of models/providers.py; the
channels terminal, webhook, Feishu webhook, Feishu long connection; time zone; data folder) and
from config.py's own rules (secrets only from the environment, a half-configured model refused).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_core.cli import main
from hermes_core.config import ConfigError, load_settings, model_endpoint
from hermes_core.models.providers import GENERIC_KEY, PROVIDERS
from serve_process import clean_environ

KEY_VARIABLES = {p.key_env for p in PROVIDERS if p.key_env} | {GENERIC_KEY}
CHANNEL_SETS = [
    "terminal",
    "webhook",
    "feishu-webhook",
    "feishu-longconn",
    "terminal,webhook,feishu-longconn",
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No model key, HERMES_* or FEISHU_* of the machine (no real endpoint is ever asked); cwd a temp dir."""
    for name in list(os.environ):
        if name.startswith(("HERMES_", "FEISHU_")) or name in KEY_VARIABLES:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def env_example_names(folder: Path) -> set[str]:
    lines = (folder / ".env.example").read_text(encoding="utf-8").splitlines()
    assigned = [line.partition("=") for line in lines if line and not line.startswith("#")]
    assert all(value == "" for _, _, value in assigned), "a value in .env.example"
    return {name for name, _, _ in assigned}


def init_flags(provider: str, channels: str, *extra: str) -> list[str]:
    model = ["--model", "served-model"] if provider in ("vllm", "lmstudio", "litellm") else []
    return ["init", "--provider", provider, *model, "--channel", channels, "--timezone", "Asia/Shanghai",
            "--data-dir", "state", "--yes", *extra]  # fmt: skip


@pytest.mark.parametrize("channels", CHANNEL_SETS)
@pytest.mark.parametrize("provider", [p.name for p in PROVIDERS])
def test_every_choice_loads_and_means_what_was_asked(
    provider: str, channels: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each preset × each channel choice: init exits 0 (a missing key is expected, not a failure),
    the written file loads with `load_settings` and its settings are the answers."""
    assert main(init_flags(provider, channels)) == 0, capsys.readouterr()
    names = env_example_names(tmp_path)
    filled = {name: "filled-in" for name in names}
    settings = load_settings(tmp_path / "hermes.yaml", env=filled, dotenv=None)
    preset = next(p for p in PROVIDERS if p.name == provider)
    endpoint = model_endpoint(settings, filled)
    assert endpoint is not None and endpoint.provider == provider
    assert endpoint.model == (preset.model or "served-model") and endpoint.api_key == (
        "filled-in" if preset.key_env else None
    )
    chosen = channels.split(",")
    assert settings.webhook.enabled == ("webhook" in chosen)
    feishu = [c.removeprefix("feishu-") for c in chosen if c.startswith("feishu-")]
    assert settings.feishu.mode == (feishu[0] if feishu else "webhook")
    assert (settings.schedule.timezone, settings.gateway.data_dir) == ("Asia/Shanghai", "state")
    assert "doctor" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("provider", "channels", "expected"),
    [
        ("deepseek", "terminal", {"DEEPSEEK_API_KEY"}),
        ("ollama", "webhook", set()),
        ("qwen", "feishu-longconn", {"DASHSCOPE_API_KEY", "FEISHU_APP_ID", "FEISHU_APP_SECRET"}),
        ("openai", "feishu-webhook",
         {"OPENAI_API_KEY", "FEISHU_APP_ID", "FEISHU_APP_SECRET", "FEISHU_VERIFICATION_TOKEN"}),
    ],
)  # fmt: skip
def test_env_example_names_exactly_the_secrets_needed(
    provider: str, channels: str, expected: set[str], tmp_path: Path
) -> None:
    """Each name is needed (without the model key the model is refused; without the Feishu app the
    bot is off) and none is missing (with them the model resolves and the bot has its app id)."""
    assert main(init_flags(provider, channels)) == 0
    assert env_example_names(tmp_path) == expected
    filled = {name: "x" for name in expected}
    settings = load_settings(tmp_path / "hermes.yaml", env=filled, dotenv=None)
    assert model_endpoint(settings, filled) is not None
    if "FEISHU_APP_ID" in expected:
        assert settings.feishu.app_id == "x"
    key = next(iter(expected - {"FEISHU_APP_ID", "FEISHU_APP_SECRET", "FEISHU_VERIFICATION_TOKEN"}), None)
    if key:
        with pytest.raises(ConfigError, match=key):
            model_endpoint(settings, {})
    assert "secret" not in (tmp_path / "hermes.yaml").read_text(encoding="utf-8").split("#")[0].lower()


def run_cli(*args: str, cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in clean_environ().items() if k not in KEY_VARIABLES}
    return subprocess.run(
        [sys.executable, "-m", "hermes_core", *args], cwd=cwd, env=env, input=stdin,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_documented_flags_in_a_fresh_folder(tmp_path: Path) -> None:
    """The issue's own command line, as a new user runs it: files written, doctor's lines shown,
    the next step named, exit 0 although the key is not filled in yet."""
    result = run_cli("init", "--provider", "deepseek", "--channel", "feishu-longconn", "--timezone",
                     "Asia/Shanghai", "--data-dir", ".hermes", "--yes", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "wrote hermes.yaml" in result.stdout and "DEEPSEEK_API_KEY" in result.stdout
    assert "configuration:" in result.stdout and "Traceback" not in result.stderr
    text = (tmp_path / "hermes.yaml").read_text(encoding="utf-8")
    assert "mode: longconn" in text and text.count("#") >= 5  # commented


def test_existing_files_are_kept_unless_force(tmp_path: Path) -> None:
    """A second init must not destroy an edited configuration: one line, exit 2, file unchanged."""
    (tmp_path / "hermes.yaml").write_text("agent:\n  max_turns: 3\n", encoding="utf-8")
    kept = run_cli("init", "--provider", "ollama", "--yes", cwd=tmp_path)
    assert kept.returncode == 2 and "--force" in kept.stderr and len(kept.stderr.splitlines()) == 1
    assert (tmp_path / "hermes.yaml").read_text(encoding="utf-8") == "agent:\n  max_turns: 3\n"
    assert not (tmp_path / ".env.example").exists()
    forced = run_cli("init", "--provider", "ollama", "--yes", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "provider: ollama" in (tmp_path / "hermes.yaml").read_text(encoding="utf-8")


def test_interactive_answers_from_stdin(tmp_path: Path) -> None:
    """Piped answers, one per question (provider, model, channels, time zone, data folder); an
    empty answer takes the default shown in brackets."""
    result = run_cli(
        "init", "--dir", "bot", cwd=tmp_path, stdin="vllm\nqwen3-8b\nwebhook,terminal\nEurope/Paris\n\n"
    )
    assert result.returncode == 0, result.stderr
    assert "Model provider" in result.stdout and "[.hermes]" in result.stdout
    settings = load_settings(tmp_path / "bot" / "hermes.yaml", env={}, dotenv=None)
    assert (settings.model.provider, settings.model.name) == ("vllm", "qwen3-8b")
    assert settings.webhook.enabled and settings.schedule.timezone == "Europe/Paris"
    assert settings.gateway.data_dir == ".hermes" and (tmp_path / "bot" / ".hermes").is_dir()
    assert env_example_names(tmp_path / "bot") == set()


@pytest.mark.parametrize(
    ("args", "stdin", "says"),
    [
        (["--provider", "nosuch", "--yes"], "", "no provider is named 'nosuch'"),
        (["--provider", "vllm", "--yes"], "", "give its name with --model"),
        (["--channel", "fax", "--yes"], "", "no channel is named fax"),
        (["--channel", "feishu-webhook,feishu-longconn", "--yes"], "", "not both"),
        (["--timezone", "Mars/Olympus", "--yes"], "", "unknown time zone 'Mars/Olympus'"),
        ([], "deepseek\n", "no answer on standard input"),
    ],
)
def test_an_unusable_answer_is_one_line_and_writes_nothing(
    args: list[str], stdin: str, says: str, tmp_path: Path
) -> None:
    """Bad input of each kind the questions take, and input that ends early: exit 2, one line."""
    result = run_cli("init", *args, cwd=tmp_path, stdin=stdin)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "hermes.yaml").exists()


def test_odd_values_are_quoted_so_they_load_as_given(tmp_path: Path) -> None:
    """A data folder YAML would read as something else (a number, a comment, a boolean)."""
    for data_dir in ("1.5", "data # here", "yes", "数据"):
        assert main(["init", "--provider", "ollama", "--data-dir", data_dir, "--yes", "--force"]) == 0
        settings = load_settings(tmp_path / "hermes.yaml", env={}, dotenv=None)
        assert settings.gateway.data_dir == data_dir


def test_the_global_config_flag_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--config FILE init` writes FILE (what the later commands will be given), and doctor reads it."""
    assert main(["--config", "team.yaml", "init", "--provider", "ollama", "--yes"]) == 0
    assert not (tmp_path / "hermes.yaml").exists()
    assert load_settings(tmp_path / "team.yaml", env={}, dotenv=None).model.provider == "ollama"
    assert "configuration: team.yaml" in capsys.readouterr().out


def test_the_folder_init_wrote_is_read_without_config(tmp_path: Path) -> None:
    """Attack (found by the first-hour test): `init`, then `serve` in that folder as the README says,
    ignored the hermes.yaml just written — a vllm bot with HERMES_BASE_URL set was refused for "no
    model name" although the file names one. A command without --config reads ./hermes.yaml."""
    from hermes_core.testing.fake_openai import FakeOpenAIServer

    assert main(init_flags("vllm", "terminal")) == 0
    with FakeOpenAIServer(default_tool_args={"expression": "2+3"}) as fake:
        env = clean_environ(HERMES_BASE_URL=fake.base_url)
        done = subprocess.run(
            [sys.executable, "-m", "hermes_core", "run", "what is 2+3?"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert fake.requests and fake.requests[0].model == "served-model"
    assert "done:" in done.stdout
