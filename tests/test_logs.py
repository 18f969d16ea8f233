"""Structured logs (O2): one line per event, the documented schema, levels, daily rotation, redaction."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hermes_core import Agent, ModelUnavailable, tool
from hermes_core.kernel.redaction import default_redactor
from hermes_core.kernel.tools.permissions import Caller, Policy
from hermes_core.observe.log_redaction import uninstall_log_redaction
from hermes_core.observe.logs import EVENTS, LOG_FILE, setup_logging
from hermes_core.observe.traces import Tracer
from hermes_core.testing import ScriptedModel, call, reply

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs" / "log-schema.json").read_text("utf-8"))
SECRET = "sk-logtest-7Hq2Lm9Nx4Pw6Rz8Tb1Vc3"


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """setup_logging changes the root logger: put it back as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)
    uninstall_log_redaction()


@tool(level=0)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(level=0, required_role="admin")
def broadcast(text: str) -> str:
    """Send a message to everyone (admins only)."""
    return "sent"


def busy_agent() -> Agent:
    """A task that uses every kind of event: calls, a failing call, a refused call, a reply."""
    script = [
        call("add", {"a": 40, "b": 2}, ("add", {"a": "forty"})),
        call("broadcast", {"text": "hi\nall"}),
        reply("The answer is 42.\nDone."),
    ]
    return Agent(model=ScriptedModel(script), tools=[add, broadcast], tracer=Tracer(), permissions=Policy())


def lines_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


async def test_every_line_is_one_json_event_that_validates_against_the_schema(tmp_path: Path) -> None:
    stream = io.StringIO()
    setup_logging("DEBUG", log_format="json", log_dir=tmp_path, stream=stream)
    await busy_agent().run("what is 40 + 2?", task_id="t-schema", caller=Caller("u1", channel="webhook"))
    failing = Agent(model=ScriptedModel([ModelUnavailable("down")]), tracer=Tracer())
    await failing.run("hello there, what is the time", task_id="t-down")

    file_lines = lines_of((tmp_path / LOG_FILE).read_text("utf-8"))
    assert file_lines == lines_of(stream.getvalue())  # the file holds the same JSON lines
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for line in file_lines:
        validator.validate(line)
    assert {line["event"] for line in file_lines} == {*EVENTS, "log"}  # each type at least once
    ours = [line for line in file_lines if line["task_id"] == "t-schema"]
    assert [line["event"] for line in ours if line["event"] in ("message_in", "reply_out")] == [
        "message_in",
        "reply_out",
    ]
    first = next(line for line in ours if line["event"] == "model_response")
    assert first["turn"] == 1 and [c["name"] for c in first["tool_calls"]] == ["add", "add"]
    assert json.loads(first["tool_calls"][0]["arguments"]) == {"a": 40, "b": 2}  # the raw model output
    results = sorted((line for line in ours if line["event"] == "tool_result"), key=lambda r: r["call_id"])
    assert [(r["tool"], r["ok"], r["error"], r["turn"], r["level"]) for r in results] == [
        ("add", True, None, 1, "INFO"),  # parallel calls log their results as they finish
        ("add", False, "bad_arguments", 1, "WARNING"),
        ("broadcast", False, "permission_denied", 2, "WARNING"),
    ]
    assert results[0]["result"] == "42" and results[0]["arguments"] == '{"a": 40, "b": 2}'
    # a plain log record written inside the task (the registry's refusal) carries the task too
    refusal = next(line for line in ours if line["event"] == "log")
    assert refusal["logger"] == "hermes_core.tools" and refusal["turn"] == 2
    assert refusal["message"].startswith("refused broadcast")
    end = next(line for line in ours if line["event"] == "reply_out")
    assert end["reply"] == "The answer is 42.\nDone." and end["usage"]["total_tokens"] == 45
    assert end["model_calls"] == 3 and end["tool_calls"] == 3 and end["conversation"] is None
    down = next(line for line in file_lines if line["task_id"] == "t-down" and line["event"] == "error")
    assert down["level"] == "ERROR" and down["stage"] == "model" and "down" in down["error"]


async def test_console_format_is_one_readable_line_per_record() -> None:
    stream = io.StringIO()
    setup_logging("INFO", log_format="console", stream=stream)
    await busy_agent().run("what is\n40 + 2?", task_id="t-console")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 12  # in; 3 responses; 4 calls and 4 results; the registry's refusal; out
    assert lines[0].endswith("INFO    [task t-console] message in: what is\\n40 + 2?")
    messages = [line.split(" ", 2)[2] for line in lines]  # after the date and the time
    assert any(m.startswith("INFO    [task t-console turn 1] tool result: add ok in ") for m in messages)
    assert any(
        m.startswith("WARNING [task t-console turn 2] hermes_core.tools: refused broadcast") for m in messages
    )
    assert messages[-1].startswith("INFO    [task t-console turn 3] reply out (completed, 3 model calls")
    assert all(line[:4].isdigit() for line in lines)  # every line starts with its time: nothing wrapped


async def test_info_is_the_default_and_leaves_the_prompt_to_debug() -> None:
    stream = io.StringIO()
    setup_logging(log_format="json", stream=stream)
    await busy_agent().run("what is 40 + 2?", task_id="t-info")
    events = {line["event"] for line in lines_of(stream.getvalue())}
    assert "model_request" not in events and {"model_response", "tool_result", "reply_out"} <= events
    assert logging.getLogger().level == logging.INFO


async def test_no_secret_reaches_a_log_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_API_KEY", SECRET)
    default_redactor().add_environment()
    stream = io.StringIO()
    setup_logging("DEBUG", log_format="console", log_dir=tmp_path, stream=stream)

    @tool(level=0)
    def read_config(name: str) -> str:
        """Read a configuration value."""
        logging.getLogger("mytools").info("read %s = %s", name, SECRET)
        return f"api_key={SECRET}"

    model = ScriptedModel([call("read_config", {"name": SECRET}), reply(f"the key is {SECRET}")])
    await Agent(model=model, tools=[read_config], tracer=Tracer()).run(f"show {SECRET}", task_id="t-secret")
    written = (tmp_path / LOG_FILE).read_text("utf-8") + stream.getvalue()
    assert "[REDACTED]" in written and SECRET not in written
    assert "read_config" in written and "mytools" in written


def test_files_rotate_daily_and_keep_retention_days(tmp_path: Path) -> None:
    now = [time.mktime((2025, 3, 1, 10, 0, 0, 0, 0, -1))]  # 10:00 local time
    setup_logging(
        "INFO",
        log_format="json",
        log_dir=tmp_path,
        retention_days=7,
        stream=io.StringIO(),
        clock=lambda: now[0],
    )
    log = logging.getLogger("hermes_core.test")
    log.info("first day")
    now[0] += 13 * 3600  # 23:00, same day: no rotation yet
    log.info("late on the first day")
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOG_FILE]
    now[0] += 2 * 3600  # 01:00 the next day
    log.info("second day")
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOG_FILE, f"{LOG_FILE}.2025-03-01"]
    first = lines_of((tmp_path / f"{LOG_FILE}.2025-03-01").read_text("utf-8"))
    assert [line["message"] for line in first] == ["first day", "late on the first day"]
    assert [line["message"] for line in lines_of((tmp_path / LOG_FILE).read_text("utf-8"))] == ["second day"]
    for day in range(10):  # ten more days, a line each
        now[0] += 86400
        log.info("day %d", day + 3)
    kept = sorted(p.name for p in tmp_path.iterdir() if p.name != LOG_FILE)
    assert kept == [f"{LOG_FILE}.2025-03-{d:02d}" for d in range(5, 12)]  # the last 7 days before today
    assert [line["message"] for line in lines_of((tmp_path / LOG_FILE).read_text("utf-8"))] == ["day 12"]


def test_setting_up_again_replaces_only_its_own_handlers() -> None:
    other = logging.NullHandler()
    logging.getLogger().addHandler(other)
    try:
        first = setup_logging("INFO", stream=io.StringIO())
        second = setup_logging("WARNING", log_format="json", stream=io.StringIO())
        root = logging.getLogger().handlers
        assert other in root and second[0] in root and first[0] not in root
        with pytest.raises(ValueError, match="console or json"):
            setup_logging("INFO", log_format="xml")
    finally:
        logging.getLogger().removeHandler(other)
