"""engine: temporal without a server: its options declared once (config.py), the commands' refusals,
and the ids that route a decision or a duplicate to the right conversation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hermes_core.config import ConfigError, load_settings
from serve_process import clean_environ


def test_engine_defaults_to_embedded_and_the_temporal_section_is_checked(tmp_path: Path) -> None:
    assert load_settings(None, env={}, dotenv=None).engine == "embedded"
    config = tmp_path / "hermes.yaml"
    config.write_text("engine: temporal\ntemporal: {address: 10.0.0.5:7233, task_queue: turns}\n")
    settings = load_settings(config, env={"HERMES_TEMPORAL_NAMESPACE": "prod"}, dotenv=None)
    assert (settings.engine, settings.temporal.address, settings.temporal.namespace) == (
        "temporal", "10.0.0.5:7233", "prod",
    )  # fmt: skip
    wrongs = {"engine: sqlite\n": "engine", "temporal: {heartbeat_timeout: 0}\n": "heartbeat_timeout",
              "temporal: {adress: x}\n": "adress"}  # fmt: skip
    for wrong, key in wrongs.items():
        config.write_text(wrong)
        with pytest.raises(ConfigError, match=key):
            load_settings(config, env={}, dotenv=None)


def test_worker_refuses_the_embedded_engine_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hermes_core", "worker"], cwd=tmp_path, env=clean_environ(),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "hermes-kernel: `worker` runs turns for `engine: temporal`; this configuration's engine is embedded "
        "(serve runs its turns itself)"
    ]


def test_an_approval_id_names_its_conversation_and_only_that() -> None:
    pytest.importorskip("temporalio", reason="the temporal extra is not installed (temporalio)")
    from hermes_core.engine.temporal.activities import approval_id, conversation_of

    for conversation in ("feishu:oc_1", "webhook:a%3Ab:c", "webhook:用户", ""):
        made = approval_id(conversation, "task", "call_1")
        assert conversation_of(made) == conversation
        assert (
            made == approval_id(conversation, "task", "call_1") != approval_id(conversation, "task", "call_2")
        )
    for foreign in ("ap_0123456789abcdef", "xx_Zm9v.1234", "ap_%%%.12", "ap_gA.12"):  # embedded, other, bad
        assert conversation_of(foreign) is None, foreign


def test_the_dedup_keys_of_a_message_are_per_channel() -> None:
    pytest.importorskip("temporalio", reason="the temporal extra is not installed (temporalio)")
    from hermes_core.engine.temporal.workflow import message_keys

    assert message_keys({"channel": "feishu", "message_id": "om_1", "event_id": "ev_1"}) == [
        "m:feishu:om_1", "e:feishu:ev_1",
    ]  # fmt: skip
    assert message_keys({"channel": "webhook", "message_id": "om_1", "event_id": None}) == ["m:webhook:om_1"]


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["worker"]])
def test_no_cluster_at_the_address_is_one_line_and_exit_1(tmp_path: Path, command: list[str]) -> None:
    pytest.importorskip("temporalio", reason="the temporal extra is not installed (temporalio)")
    from serve_process import free_port

    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    (tmp_path / "hermes.yaml").write_text(f"engine: temporal\ntemporal: {{address: '{address}'}}\n")
    database = f"postgresql://hermes@127.0.0.1:{free_port()}/hermes"  # not reached: Temporal is first
    result = subprocess.run(
        [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", *command], cwd=tmp_path,
        env=clean_environ(HERMES_DATABASE_URL=database), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"hermes-kernel: cannot reach Temporal at {address} (namespace default): "), last
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # a hermes-kernel process per command
@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["worker"]])
def test_engine_temporal_without_database_url_is_refused_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    """The engine keeps its conversations, traces, approvals and dead letters in PostgreSQL: no
    `database.url`, no start (exit 2), before any connection is tried."""
    pytest.importorskip("temporalio", reason="the temporal extra is not installed (temporalio)")
    (tmp_path / "hermes.yaml").write_text("engine: temporal\ntemporal: {address: '127.0.0.1:1'}\n")
    result = subprocess.run(
        [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", *command], cwd=tmp_path,
        env=clean_environ(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("hermes-kernel: engine: temporal keeps conversations, traces, approvals"), last
    assert "set database.url (HERMES_DATABASE_URL" in last and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("recorded_file", "runner"),
    [
        ("three_turns_before_shared_state.json", "sandbox_runner"),
        ("three_turns_before_shared_state.json", "workflow_runner"),
        ("three_turns_record_activity.json", "sandbox_runner"),
        ("three_turns_record_activity.json", "workflow_runner"),
    ],
)
def test_a_run_recorded_by_an_earlier_release_replays_on_this_code(recorded_file: str, runner: str) -> None:
    """Conversations' runs recorded by earlier releases (three webhook turns: a tool call, `/new`, a
    text) replay on this workflow code without a nondeterminism error, in Temporal's sandbox and
    with the worker's own runner: the release without the command and record steps (`/new`
    answered by the model), and the one that recorded a turn with an activity task rather than a
    local step (`LOCAL_RECORD`) — each finishes as it began (`workflow.patched`)."""
    pytest.importorskip("temporalio", reason="the temporal extra is not installed (temporalio)")
    import asyncio

    from temporalio.client import WorkflowHistory
    from temporalio.worker import Replayer

    from hermes_core.engine.temporal import worker
    from hermes_core.engine.temporal.workflow import ConversationWorkflow

    recorded = Path(__file__).parent / "data" / "temporal_history" / recorded_file
    history = WorkflowHistory.from_json("webhook:u1", recorded.read_text(encoding="utf-8"))
    replayer = Replayer(  # on the queue "replay-recorded", as recorded (make_history.py)
        workflows=[ConversationWorkflow], workflow_runner=getattr(worker, runner)(), build_id="recorded"
    )
    result = asyncio.run(replayer.replay_workflow(history, raise_on_replay_failure=False))
    assert result.replay_failure is None, result.replay_failure
