"""`hermes-kernel doctor` with `engine: temporal`: the frontend at `temporal.address` answers, the
namespace exists, the server's version is named — against a Temporal dev server (tests/temporal_dev.py),
a closed port, an unknown namespace, and an environment without the SDK.

Two faults of issue 33 ("the runbook"), run as an operator runs them: the command against an
unknown namespace printed its FAIL and then died with signal 6 now and then (the SDK's native
threads during the interpreter's exit, temporalio/sdk-python issue 300): run 20 times, it must end
with exit code 1 every time; and after the engine's `serve` and `worker` nodes have started on a
database, the `database` line must not ask for a migration no node of this engine applies (the
embedded engine's journal)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hermes_core.cli import main
from waiting import wait_for


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("HERMES_", "FEISHU_", "TEMPORAL_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def doctor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], address: str, namespace: str = "default"
) -> tuple[int, str, str]:
    """Exit code, the `temporal` line, everything printed (the database: HERMES_DATABASE_URL)."""
    config = tmp_path / "hermes.yaml"
    config.write_text(
        f"engine: temporal\ntemporal:\n  address: '{address}'\n  namespace: {namespace}\n"
        f"gateway:\n  data_dir: {tmp_path / 'data'}\n",
        encoding="utf-8",
    )
    code = main(["--config", str(config), "doctor"])
    out = capsys.readouterr()
    found = [line for line in out.out.splitlines() if line.partition("  ")[2].strip().startswith("temporal:")]
    return code, (found[0] if found else ""), out.out + out.err


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.slow  # a Temporal dev server process
def test_a_reachable_server_its_version_and_namespace(
    temporal_dev: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("HERMES_DATABASE_URL", pg_url)  # the engine's state (database.url is required)
    code, line, output = doctor(tmp_path, capsys, temporal_dev)
    assert code == 0 and line.startswith("OK "), output
    assert "Temporal 1." in line and f"at {temporal_dev}: reachable; namespace 'default' registered" in line


@pytest.mark.slow
def test_an_unknown_namespace_is_a_fail_naming_it(
    temporal_dev: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, line, output = doctor(tmp_path, capsys, temporal_dev, namespace="no-such-ns")
    assert code == 1 and line.startswith("FAIL") and "has no namespace 'no-such-ns'" in line, output
    assert "temporal operator namespace create --namespace no-such-ns" in line


def test_a_closed_port_is_a_fail_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("temporalio", reason="the temporal extra is not installed (temporalio)")
    address = f"127.0.0.1:{closed_port()}"
    started = time.monotonic()
    code, line, output = doctor(tmp_path, capsys, address)
    assert code == 1 and line.startswith(f"FAIL  temporal: cannot reach {address}"), output
    assert "Connection refused" in line and "correct temporal.address (HERMES_TEMPORAL_ADDRESS)" in line
    assert time.monotonic() - started < 5


def test_without_the_sdk_a_fail_names_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in [name for name in sys.modules if name == "temporalio" or name.startswith("temporalio.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "temporalio", None)  # `import temporalio` raises ImportError
    code, line, output = doctor(tmp_path, capsys, f"127.0.0.1:{closed_port()}")
    assert code == 1 and line.startswith("FAIL  temporal: engine: temporal, but the Temporal SDK"), output
    assert line.endswith('— pip install "hermes-kernel[temporal]"')


def test_engine_temporal_without_a_database_url_is_a_fail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """serve and worker refuse to start without it: doctor says so, not that SQLite is fine."""
    code, _, output = doctor(tmp_path, capsys, f"127.0.0.1:{closed_port()}")
    [line] = [line for line in output.splitlines() if line.partition("  ")[2].startswith("database:")]
    assert code == 1 and line.startswith("FAIL  database: engine: temporal keeps its state in PostgreSQL"), (
        line
    )
    assert "set database.url (HERMES_DATABASE_URL" in line


@pytest.mark.slow
def test_an_unknown_namespace_ends_the_command_with_its_fail_never_a_signal(
    temporal_dev: str, tmp_path: Path
) -> None:
    from serve_process import clean_environ

    (tmp_path / "hermes.yaml").write_text(
        f"engine: temporal\ntemporal:\n  address: '{temporal_dev}'\n  namespace: no-such-ns\n",
        encoding="utf-8",
    )
    command = [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "doctor"]
    for run in range(20):  # the abort came in about one run in six
        done = subprocess.run(
            command, cwd=tmp_path, env=clean_environ(), capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1, (run, done.returncode, done.stderr[-2000:])
        assert "FAIL  temporal: " in done.stdout and "has no namespace 'no-such-ns'" in done.stdout, (
            done.stdout
        )


@pytest.mark.slow
def test_after_the_nodes_start_no_migration_is_left_that_they_never_apply(
    temporal_dev: str, tmp_path: Path, pg_url: str
) -> None:
    import asyncio

    from hermes_core.testing.fake_feishu import FakeFeishu
    from hermes_core.testing.fake_openai import FakeOpenAIServer
    from test_temporal_engine import Cluster, steps

    model = FakeOpenAIServer(handler=steps, latency=0.01).start_in_thread()
    feishu = FakeFeishu(time_scale=0.01, seed=17).start_in_thread()
    cluster = Cluster(tmp_path, temporal_dev, model, feishu, database=pg_url, workers=1)
    try:
        asyncio.run(
            feishu.push(feishu.user_message("hello", chat_id="oc_m", sender="ou_m"), cluster.events(0))
        )
        wait_for(lambda: len(feishu.messages_in("oc_m")) >= 1, 60, "the reply")  # every store is in use
        command = [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "doctor"]
        done = subprocess.run(
            command, cwd=tmp_path, env=cluster.env, capture_output=True, text=True, timeout=60
        )
    finally:
        cluster.stop()
        feishu.stop()
        model.stop()
    [line] = [line for line in done.stdout.splitlines() if line[6:].startswith("database:")]
    assert line.startswith("OK    database: PostgreSQL") and "schema at the latest migration" in line, line
