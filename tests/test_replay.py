"""Replay (O3): a recorded run, run again on the current code, is reproduced byte for byte; a change
in a tool's behaviour or schema shows where the run now diverges."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from hermes_core import Agent, ModelUnavailable, tool
from hermes_core.config import load_tools
from hermes_core.observe.replay import replay
from hermes_core.observe.traces import SQLiteTraceStore, Tracer
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from hermes_core.tools import clock
from hermes_core.tools.examples import current_time
from serve_process import CLEAN_ENV

WRITES: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    WRITES.clear()


@tool(level=0)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(level=0)
def lookup(city: str) -> dict:
    """Look up a city's population (millions)."""
    return {"city": city, "population": {"北京": 21.9, "上海": 24.9}.get(city)}


@tool(level=1)
def save_note(text: str) -> str:
    """Save a note (a write)."""
    WRITES.append(text)
    return f"saved: {text}"


TOOLS = [add, lookup, save_note]


def script() -> list[Any]:
    """Parallel calls, a call that fails validation and is corrected, a write, then the answer."""
    return [
        call("lookup", {"city": "北京"}, ("lookup", {"city": "上海"})),
        call("add", {"a": "21", "b": "twenty-five"}),
        call("add", '{"a": 21, "b": 25,}'),  # lenient parsing: a trailing comma
        call("save_note", {"text": "上海 is bigger"}),
        reply("上海 has more people (24.9M vs 21.9M); noted."),
    ]


async def record(tmp_path: Path, steps: list[Any], tools: list[Any] = TOOLS, **options: Any) -> dict:
    """Run the task with a tracer and return its stored record."""
    store = SQLiteTraceStore(tmp_path / "traces.db")
    agent = Agent(model=ScriptedModel(steps), tools=tools, tracer=Tracer(store), **options)
    await agent.run("which city is bigger, 北京 or 上海? note it", task_id="t-record")
    found = await store.get("t-record")
    await store.close()
    assert found is not None
    return found


def current(tools: list[Any] = TOOLS, **options: Any) -> Agent:
    """The agent as the code stands now. Its model must not be asked: replay brings its own."""
    return Agent(model=ScriptedModel([]), tools=tools, **options)


async def test_a_replay_reproduces_the_recorded_run_byte_for_byte(tmp_path: Path) -> None:
    recorded = await record(tmp_path, script())
    assert WRITES == ["上海 is bigger"] and recorded["ok"]
    WRITES.clear()
    report = await replay(recorded, current())
    assert report.reproduced, report.divergences
    replayed = [(c.turn, c.id, c.name, c.arguments, c.result, c.ok, c.error) for c in report.calls]
    assert replayed == [
        (c["turn"], c["id"], c["name"], c["arguments"], c["result"], c["ok"], c["error"])
        for c in recorded["tool_calls"]
    ]
    assert [c.error for c in report.calls] == [None, None, "bad_arguments", None, None]
    assert report.result.reply == recorded["reply"] and report.result.stop_reason == "completed"
    assert report.result.messages == recorded["messages"]  # the whole conversation, message for message
    # the write was not run again: its recorded result stood in, after the current code checked the call
    assert WRITES == [] and [c.ran for c in report.calls] == [True, True, True, True, False]
    assert "the recorded result is used" in report.calls[-1].note
    assert report.to_dict()["reproduced"] is True


async def test_run_writes_runs_level_one_tools_for_real(tmp_path: Path) -> None:
    recorded = await record(tmp_path, script())
    WRITES.clear()
    report = await replay(recorded, current(), run_writes=True)
    assert report.reproduced and WRITES == ["上海 is bigger"] and report.calls[-1].ran


async def test_a_tool_whose_behaviour_changed_shows_the_divergence(tmp_path: Path) -> None:
    recorded = await record(tmp_path, script())

    @tool(name="lookup", level=0)
    def lookup_v2(city: str) -> dict:
        """Look up a city's population (millions), now rounded."""
        return {"city": city, "population": round({"北京": 21.9, "上海": 24.9}[city])}

    report = await replay(recorded, current([add, lookup_v2, save_note]))
    assert not report.reproduced
    assert [(d.kind, d.turn, d.index) for d in report.divergences] == [("result", 1, 1), ("result", 1, 2)]
    first = report.divergences[0]
    assert first.recorded == '{"city": "北京", "population": 21.9}'
    assert first.replayed == '{"city": "北京", "population": 22}'
    assert "turn 1, call 1: lookup returns another result" == first.message


async def test_a_tool_whose_schema_changed_shows_validation_failing(tmp_path: Path) -> None:
    recorded = await record(tmp_path, script())

    @tool(name="add", level=0)
    def add_v2(x: int, y: int) -> int:
        """Add two integers (parameters renamed)."""
        return x + y

    @tool(name="save_note", level=1)
    def save_note_v2(text: str, folder: str) -> str:
        """Save a note in a folder (a write; folder now required)."""
        WRITES.append(text)
        return "saved"

    WRITES.clear()
    report = await replay(recorded, current([add_v2, lookup, save_note_v2]))
    kinds = [(d.kind, d.turn, d.index) for d in report.divergences]
    assert kinds == [("result", 2, 1), ("validation", 3, 1), ("validation", 4, 1)]
    assert "add fails (bad_arguments), recorded ok" in report.divergences[1].message
    assert "save_note fails (bad_arguments), recorded ok" in report.divergences[2].message
    assert "field 'folder' is required" in report.calls[-1].result and WRITES == []  # checked, never run


async def test_a_removed_tool_and_a_tighter_guard_show_as_divergences(tmp_path: Path) -> None:
    recorded = await record(tmp_path, script())
    report = await replay(recorded, current([add, lookup]))  # save_note is gone
    assert [(d.kind, d.turn) for d in report.divergences] == [("status", 4)]
    assert report.calls[-1].error == "unknown_tool"
    tight = await replay(recorded, current(max_tool_calls=3))
    kinds = [d.kind for d in tight.divergences]
    assert kinds == ["status", "missing_call", "model_calls", "stop_reason", "reply"]
    assert tight.calls[3].error == "budget" and tight.result.stop_reason == "max_tool_calls"


async def test_a_run_that_asks_the_model_more_than_recorded_is_reported(tmp_path: Path) -> None:
    steps = [call("add", {"a": 1, "b": 2}), call("add", {"a": 3, "b": 4})]
    recorded = await record(tmp_path, steps, max_turns=2)
    assert recorded["stop_reason"] == "max_turns"
    report = await replay(recorded, current(max_turns=3))
    assert [d.kind for d in report.divergences] == ["model_exhausted", "stop_reason", "reply"]
    assert report.result.stop_reason == "model_unavailable"


async def test_a_recorded_model_failure_replays_as_the_same_failure(tmp_path: Path) -> None:
    recorded = await record(tmp_path, [call("add", {"a": 1, "b": 2}), ModelUnavailable("overloaded")])
    assert recorded["stop_reason"] == "model_unavailable"
    report = await replay(recorded, current())
    assert report.reproduced, report.divergences


async def test_live_replay_asks_the_configured_model_and_compares(tmp_path: Path) -> None:
    recorded = await record(tmp_path, script())
    async with FakeOpenAIServer() as fake:
        fake.script(
            FakeReply.parallel_tool_calls([("lookup", {"city": "北京"}), ("lookup", {"city": "广州"})]),
            FakeReply.text("北京."),
        )
        agent = Agent(model="fake-model", base_url=fake.base_url, api_key="k", tools=TOOLS, max_retries=0)
        report = await replay(recorded, agent, live=True)
        assert len(fake.requests) == 2 and fake.requests[0].messages[-1]["content"] == recorded["input"]
    kinds = [(d.kind, d.turn, d.index) for d in report.divergences]
    assert kinds[:2] == [("arguments", 1, 2), ("missing_call", 2, 1)]
    assert report.divergences[0].recorded == '{"city": "上海"}'
    assert json.loads(report.divergences[0].replayed) == {"city": "广州"}
    assert kinds[-1][0] == "reply" and report.live


async def test_the_replay_command_reads_a_task_id_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hermes_core.cli import main

    monkeypatch.chdir(tmp_path)  # the CLI's agent: the configured tools (the examples), no model configured
    for variable in ("HERMES_BASE_URL", "HERMES_MODEL"):
        monkeypatch.delenv(variable, raising=False)
    store = SQLiteTraceStore(tmp_path / ".hermes" / "gateway.db")
    steps = [call("calculator", {"expression": "(12+34)*2"}), reply("92")]
    examples = load_tools(["hermes_core.tools.examples"])
    agent = Agent(model=ScriptedModel(steps), tools=examples, tracer=Tracer(store))
    await agent.run("计算 (12+34)*2", task_id="cli:7")
    exported = await store.get("cli:7")
    await store.close()
    assert await asyncio.to_thread(main, ["replay", "cli:7"]) == 0
    out = capsys.readouterr().out
    assert 'calculator({"expression": "(12+34)*2"}) ok → {"expression": "(12+34)*2", "result": 92}' in out
    assert out.rstrip().endswith("reproduced: the same tool calls, arguments, results and reply as recorded")
    assert exported is not None
    exported["tool_calls"][0]["result"] = (
        '{"expression": "(12+34)*2", "result": 93}'  # as if the code changed
    )
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(exported, ensure_ascii=False), encoding="utf-8")
    assert await asyncio.to_thread(main, ["replay", str(changed), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [d["kind"] for d in report["divergences"]] == ["result"] and report["reproduced"] is False


async def test_a_recorded_clock_reading_is_replayed_not_reported_as_a_divergence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 29: replaying a task that asked `current_time` reported DIVERGED and exited 1 (today's
    clock is not the recording's) as a first experience. A tool declared `varies` gets its recorded
    result back; a changed argument is still a divergence."""
    monkeypatch.setattr(clock, "_clock", lambda: datetime(2026, 12, 1, 7, 0, tzinfo=timezone.utc))
    asked = [call("current_time", {"timezone": "Asia/Shanghai"}), reply("下午 3 点。")]
    recorded = await record(tmp_path, asked, tools=[current_time])
    monkeypatch.setattr(clock, "_clock", lambda: datetime(2026, 12, 6, 9, 30, tzinfo=timezone.utc))
    report = await replay(recorded, current(tools=[current_time]))
    assert report.reproduced, report.divergences
    assert "15:00:00" in report.calls[0].result and not report.calls[0].ran
    assert "varies from run to run" in report.calls[0].note
    moved = json.loads(json.dumps(recorded))  # recorded for Tokyo: the call made now is not that one
    moved["tool_calls"][0]["arguments"] = json.dumps({"timezone": "Asia/Tokyo"})
    report = await replay(moved, current(tools=[current_time]))
    assert "arguments" in [d.kind for d in report.divergences]


def test_replay_of_what_time_is_it_from_the_command_line_is_reproduced(tmp_path: Path) -> None:
    """The README's path on a fresh folder: `run "现在几点"` (the offline demo model asks
    `current_time`), then `replay` of that task a moment later: reproduced, exit 0."""

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hermes_core", *argv], cwd=tmp_path, env=CLEAN_ENV,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    assert cli("run", "现在几点").returncode == 0
    [summary] = json.loads(cli("traces", "--json").stdout)
    replayed = cli("replay", summary["task_id"])
    assert replayed.returncode == 0 and "reproduced" in replayed.stdout, replayed.stdout + replayed.stderr
