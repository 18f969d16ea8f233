"""One record format for model responses and tool outcomes (kernel/records.py), read by the journal, the
trace, replay and evals; and the rows an installation of the previous version has on disk.

tests/data/records/ holds a journal and a trace record written by this project's previous version
(see its README.md): they must load unchanged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hermes_core import Agent, tool
from hermes_core.evals.traces import case_from_trace
from hermes_core.kernel.messages import ModelResponse, ToolCall, Usage
from hermes_core.kernel.records import canonical, outcome_from, outcome_record, record_of, response_from
from hermes_core.kernel.tools.registry import ToolOutcome
from hermes_core.observe.replay import replay
from hermes_core.observe.traces import SQLiteTraceStore, Tracer
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.journal import load_task
from hermes_core.testing import ScriptedModel, call, reply

DATA = Path(__file__).parent / "data" / "records"
OLD_TASK = "webhook:m1~abc123"


def old_journal() -> list[dict[str, Any]]:
    return json.loads((DATA / "journal_rows.json").read_text(encoding="utf-8"))


def old_trace() -> dict[str, Any]:
    return json.loads((DATA / "trace_record.json").read_text(encoding="utf-8"))


def adder(ran: list[str]) -> Any:
    @tool(level=0)
    def add(a: int, b: int) -> int:
        """Add two integers."""
        ran.append(f"add {a} {b}")
        return a + b

    return add


async def test_a_journal_of_the_previous_version_resumes_without_calling_anything(tmp_path: Path) -> None:
    """Old rows (list-shaped calls and usage, results under `content`) replay the finished task: its
    reply comes back, no model is called (the script is empty) and no tool runs."""
    journal, ran = SQLiteTaskJournal(tmp_path / "g.db"), []
    await load_task(journal, {"task_id": OLD_TASK, "entries": old_journal()})
    agent = Agent(model=ScriptedModel([]), tools=[adder(ran)], journal=journal)
    result = await agent.run("what is 2 + 3?", task_id=OLD_TASK)
    await journal.close()
    assert (result.reply, result.stop_reason, ran) == ("2 + 3 = 5", "completed", [])
    assert [o.content for o in result.tool_calls][0] == "5"
    assert result.tool_calls[1].error == "unknown_tool" and not result.tool_calls[1].ok
    assert result.responses[0].tool_calls == [ToolCall("call_1", "add", '{"a": 2, "b": 3}')]
    assert result.usage == Usage(30, 15, 45)


def test_old_rows_and_old_trace_entries_read_as_the_same_response_and_outcome() -> None:
    """The journal's old row and the trace's old entry of one step are one response, one outcome."""
    rows, trace = old_journal(), old_trace()
    journaled = [response_from(r["data"]) for r in rows if r["kind"] == "model_response"]
    traced = [response_from(m["response"]) for m in trace["model_calls"]]
    assert journaled == traced and len(traced) == 3
    results = [outcome_from(r["data"]) for r in rows if r["kind"] == "tool_result"]
    recorded = [outcome_from(c) for c in trace["tool_calls"]]
    assert [(o.call, o.content, o.ok, o.error) for o in results] == [
        (o.call, o.content, o.ok, o.error) for o in recorded
    ]
    assert results[0].arguments == {"a": 2, "b": 3}  # the journal kept the parsed arguments


async def test_an_old_trace_replays_and_proposes_its_case(tmp_path: Path) -> None:
    """A trace recorded by the previous version is reproduced by replay and turned into a case."""
    ran: list[str] = []
    report = await replay(old_trace(), Agent(tools=[adder(ran)]))
    assert report.reproduced, report.divergences
    assert ran == ["add 2 3"]  # level 0: it runs again
    data, notes = case_from_trace(old_trace(), "old")
    assert data["checks"]["must_call"] == ["add"] and any("missing_tool" in line for line in notes)


async def test_journal_and_trace_persist_the_same_records(tmp_path: Path) -> None:
    """One run, journaled and traced: the journal's rows and the trace's entries are the same
    records (the journal adds its turn, the trace its turn and start time)."""
    database = tmp_path / "g.db"
    journal, tracer = SQLiteTaskJournal(database), Tracer(SQLiteTraceStore(database))
    script = [call("add", {"a": 2, "b": 3}), call("missing_tool", {"x": 1}), reply("2 + 3 = 5")]
    agent = Agent(model=ScriptedModel(script), tools=[adder([])], journal=journal, tracer=tracer)
    await agent.run("what is 2 + 3?", task_id="t1")
    entries, trace = await journal.entries("t1"), await tracer.store.get("t1")
    await journal.close()
    await tracer.close()
    assert trace is not None
    responses = [e.data for e in entries if e.kind == "model_response"]
    assert responses == [m["response"] for m in trace["model_calls"]]
    results = [{k: v for k, v in e.data.items() if k != "turn"} for e in entries if e.kind == "tool_result"]
    assert results == [
        {k: v for k, v in c.items() if k not in ("turn", "started_at")} for c in trace["tool_calls"]
    ]


def test_records_round_trip() -> None:
    """What is written reads back as what was recorded, field for field."""
    response = ModelResponse(
        content="x", tool_calls=[ToolCall("c1", "add", '{"a": 1}')], usage=Usage(1, 2, 3), model="m",
        finish_reason="tool_calls", refusal=None, reasoning="r", answered_by="m-small",
    )  # fmt: skip
    assert response_from(record_of(response)) == response
    assert response_from(json.loads(json.dumps(record_of(response)))) == response
    outcome = ToolOutcome(ToolCall("c1", "add", '{"a": 1}'), "1", True, {"a": 1}, 0.5, None)
    assert outcome_from(json.loads(json.dumps(outcome_record(outcome)))) == outcome


def test_canonical_arguments_are_the_calls_key() -> None:
    """Replay compares arguments as approvals and guards do: one canonical form for text and values."""
    assert (
        canonical('{"b": 1, "a": 2}')
        == canonical({"a": 2, "b": 1})
        == ToolCall("i", "t", '{"a":2,"b":1}').key[1]
    )
    assert canonical("  not json ") == "not json"
