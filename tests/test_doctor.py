"""`hermes-kernel doctor` against real local servers: the fake OpenAI endpoint and the fake Feishu."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_core.cli import main
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import clean_environ

MODEL_KEY = "sk-doctor-model-key-0123456789abcdef"
APP_SECRET = "feishu-app-secret-0123456789"
VERIFICATION_TOKEN = "feishu-vt-0123456789"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No HERMES_*/FEISHU_* from the machine, and no `.env` of the repository (cwd is a temp dir)."""
    for name in list(os.environ):
        if name.startswith(("HERMES_", "FEISHU_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def model() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(api_key=MODEL_KEY, models=["m1"]) as fake:
        yield fake


@pytest.fixture
def feishu() -> Iterator[FakeFeishu]:
    with FakeFeishu(app_secret=APP_SECRET, verification_token=VERIFICATION_TOKEN) as fake:
        yield fake


def write_config(
    tmp_path: Path, *, base_url: str | None, feishu: FakeFeishu | None = None, data_dir: Path | None = None
) -> Path:
    lines = [f"gateway:\n  data_dir: {data_dir or tmp_path / 'data'}"]
    if base_url is not None:
        lines.append(f"model:\n  name: m1\n  base_url: {base_url}")
    if feishu is not None:
        lines.append(f"feishu:\n  app_id: {feishu.app_id}\n  base_url: {feishu.base_url}")
    path = tmp_path / "hermes.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def doctor(config: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, str], str]:
    """Run `hermes-kernel --config … doctor`; the exit code, each check's line by name, all output."""
    code = main(["--config", str(config), "doctor"])
    captured = capsys.readouterr()
    lines: dict[str, str] = {}
    for line in captured.out.splitlines():
        status, _, rest = line.partition("  ")
        if status.strip() in ("OK", "FAIL", "SKIP"):
            lines[rest.strip().partition(":")[0]] = line
    return code, lines, captured.out + captured.err


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_everything_ok(
    tmp_path: Path,
    model: FakeOpenAIServer,
    feishu: FakeFeishu,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HERMES_API_KEY", MODEL_KEY)
    monkeypatch.setenv("FEISHU_APP_SECRET", APP_SECRET)
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", VERIFICATION_TOKEN)
    code, lines, output = doctor(write_config(tmp_path, base_url=model.base_url, feishu=feishu), capsys)
    assert code == 0, output
    names = ["configuration", "model endpoint", "model tools", "feishu credentials", "feishu events"]
    names += ["webhook", "database"]
    assert list(lines) == names
    assert all(line.startswith("OK ") for line in lines.values()), output
    assert "m1 at " + model.base_url in lines["model endpoint"]
    assert "bot hermes-bot (ou_bot)" in lines["feishu credentials"]
    assert str(tmp_path / "data" / "gateway.db") in lines["database"]
    probe = model.requests[0]
    assert probe.body is not None and probe.body["max_tokens"] == 1 and probe.model == "m1"
    assert feishu.tokens_issued  # the credentials were really exchanged for a token
    assert MODEL_KEY not in output and APP_SECRET not in output and VERIFICATION_TOKEN not in output


def test_unreachable_model_is_a_fail_line_and_missing_feishu_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base_url = f"http://127.0.0.1:{closed_port()}/v1"
    code, lines, output = doctor(write_config(tmp_path, base_url=base_url), capsys)
    assert code == 1
    assert lines["model endpoint"].startswith("FAIL")
    assert f"cannot get an answer from {base_url}" in lines["model endpoint"]
    assert "check HERMES_BASE_URL" in lines["model endpoint"]
    assert lines["feishu credentials"].startswith("SKIP") and "not configured" in lines["feishu credentials"]
    assert lines["feishu events"].startswith("SKIP")
    assert lines["configuration"].startswith("OK") and lines["database"].startswith("OK")
    assert "1 check(s) failed: model endpoint." in output


@pytest.mark.parametrize(
    ("key", "model_name", "expected"),
    [("sk-wrong-key-0123456789abcdef", "m1", "HERMES_API_KEY"), (MODEL_KEY, "m2", "HERMES_MODEL")],
)
def test_model_rejections_say_what_to_change(
    tmp_path: Path,
    model: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    key: str,
    model_name: str,
    expected: str,
) -> None:
    monkeypatch.setenv("HERMES_API_KEY", key)
    monkeypatch.setenv("HERMES_MODEL", model_name)
    code, lines, output = doctor(write_config(tmp_path, base_url=model.base_url), capsys)
    assert code == 1
    assert lines["model endpoint"].startswith("FAIL") and expected in lines["model endpoint"]
    assert key not in output


def test_wrong_feishu_secret(
    tmp_path: Path, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wrong = "not-the-app-secret-987654"
    monkeypatch.setenv("FEISHU_APP_SECRET", wrong)
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", VERIFICATION_TOKEN)
    code, lines, output = doctor(write_config(tmp_path, base_url=None, feishu=feishu), capsys)
    assert code == 1
    line = lines["feishu credentials"]
    assert line.startswith("FAIL") and "refused the credentials" in line and "FEISHU_APP_SECRET" in line
    assert not feishu.tokens_issued
    assert lines["model endpoint"].startswith("SKIP")  # no endpoint: the offline demo model
    assert wrong not in output and APP_SECRET not in output


def test_feishu_webhook_without_verification_token(
    tmp_path: Path, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FEISHU_APP_SECRET", APP_SECRET)
    code, lines, _ = doctor(write_config(tmp_path, base_url=None, feishu=feishu), capsys)
    assert code == 1
    assert lines["feishu credentials"].startswith("OK")
    assert lines["feishu events"].startswith("FAIL") and "FEISHU_VERIFICATION_TOKEN" in lines["feishu events"]


def test_data_dir_that_cannot_be_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, lines, _ = doctor(write_config(tmp_path, base_url=None, data_dir=blocker / "data"), capsys)
    assert code == 1
    line = lines["database"]
    assert line.startswith("FAIL") and "is not writable (Not a directory)" in line
    assert "gateway.data_dir" in line


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes to read-only folders")
def test_read_only_data_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o500)
    try:
        code, lines, _ = doctor(write_config(tmp_path, base_url=None, data_dir=data), capsys)
    finally:
        data.chmod(0o700)
    assert code == 1 and lines["database"].startswith("FAIL")
    assert "Permission denied" in lines["database"]


def test_bad_configuration_skips_the_rest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "hermes.yaml"
    config.write_text(f"model:\n  api_key: {MODEL_KEY}\n  temperature: hot\n", encoding="utf-8")
    code, lines, output = doctor(config, capsys)
    assert code == 1
    assert lines["configuration"].startswith("FAIL") and "model.api_key" in lines["configuration"]
    assert [line.split()[0] for line in lines.values()] == [
        "FAIL",
        "SKIP",
        "SKIP",
        "SKIP",
        "SKIP",
        "SKIP",
        "SKIP",
    ]
    assert MODEL_KEY not in output


@pytest.mark.slow
def test_secrets_never_printed_even_when_an_endpoint_echoes_them(tmp_path: Path, feishu: FakeFeishu) -> None:
    """A real `hermes-kernel doctor` process; the model endpoint echoes the Authorization header back."""

    def echo_credentials(request: RecordedRequest) -> FakeReply:
        return FakeReply.error(400, "bad request from " + str(request.headers.get("Authorization")))

    wrong_secret = "wrong-app-secret-0123456789"
    with FakeOpenAIServer(handler=echo_credentials) as model:
        config = write_config(tmp_path, base_url=model.base_url, feishu=feishu)
        env = clean_environ()
        env.update(
            HERMES_API_KEY=MODEL_KEY,
            FEISHU_APP_SECRET=wrong_secret,
            FEISHU_VERIFICATION_TOKEN=VERIFICATION_TOKEN,
            FEISHU_ENCRYPT_KEY="feishu-encrypt-key-0123456789",
        )
        process = subprocess.run(
            [sys.executable, "-m", "hermes_core", "--config", str(config), "doctor"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    output = process.stdout + process.stderr
    assert process.returncode == 1, output
    assert "bad request from Bearer [REDACTED]" in output  # the echo happened, and was redacted
    for secret in (MODEL_KEY, wrong_secret, VERIFICATION_TOKEN, "feishu-encrypt-key-0123456789"):
        assert secret not in output
