"""The contract of `TaskJournal` (tasks/journal.py), through the protocol only, for every registered
backend (tests/contracts/conftest.py).

Entries come back per task in the order they were written, whole (any JSON, any script), none lost
to concurrent writers; a task's turn results replay by (task, turn, call id) — two turns that reuse
an id each get their own — and rows journaled before turns were recorded still replay in the order
they were written; snapshots export and load; pruning forgets whole tasks; a reopen keeps it all.

How each test was seen to fail: tests/contracts/broken_backends.py has journals with one bug each
(entries newest first, tasks mixed up, a racy sequence number…), and
test_contracts_fail_when_broken.py checks that each test here fails against one of them.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from contract_backends import Opener

from hermes_core.kernel.messages import ModelResponse, ToolCall
from hermes_core.kernel.records import record_of
from hermes_core.tasks.journal import JournalEntry, TaskJournal, export_task, load_task, replay_of, resume
from hermes_core.testing import ScriptedModel
from hermes_core.tools import ToolRegistry, tool

Journals = Opener[TaskJournal]


async def test_an_unknown_task_has_no_entries(journals: Journals) -> None:
    journal = journals()
    await journal.append("t10", "model_response", {"content": "another task's"})
    assert await journal.entries("t1") == [] and await journal.entries("never-ran") == []


async def test_entries_come_back_whole_in_the_order_written_per_task(journals: Journals) -> None:
    journal = journals()
    data: list[dict[str, Any]] = [
        {"id": "c1", "turn": 0, "name": "读取", "nested": {"list": [1, 2.5, None, True], "text": "你好 👋"}},
        {"id": "c1", "turn": 0, "content": '{"ok": true}', "ok": True},
        {"reply": "", "empty": {}, "big": "x" * 100_000},
    ]
    await journal.append("t1", "tool_started", data[0])
    await journal.append("t2", "model_response", {"content": "other task"})
    await journal.append("t1", "tool_result", data[1])
    await journal.append("t1", "finished", data[2])
    assert await journal.entries("t1") == [
        JournalEntry("tool_started", data[0]), JournalEntry("tool_result", data[1]),
        JournalEntry("finished", data[2]),
    ]  # fmt: skip
    assert await journal.entries("t2") == [JournalEntry("model_response", {"content": "other task"})]
    assert await journal.entries("t") == []  # task ids are whole, never prefixes


async def test_concurrent_appends_are_all_kept_each_once(journals: Journals) -> None:
    """Parallel tool calls of one turn journal at once: every entry is kept, none overwritten."""
    journal = journals()
    await asyncio.gather(*(journal.append("t1", "tool_started", {"id": f"c{i}"}) for i in range(30)))
    found = [entry.data["id"] for entry in await journal.entries("t1")]
    assert sorted(found) == sorted(f"c{i}" for i in range(30))


async def test_a_turns_results_replay_by_task_turn_and_call_id(journals: Journals) -> None:
    journal = journals()
    east, north = (ToolCall("c1", "read_orders", json.dumps({"region": r})) for r in ("East", "North"))
    for turn, (call, content) in enumerate([(east, "12 orders East"), (north, "3 orders North")]):
        await journal.append("t1", "model_response", record_of(ModelResponse(tool_calls=[call])))
        await journal.append("t1", "tool_started", {"id": call.id, "turn": turn, "name": call.name})
        row = {"id": call.id, "turn": turn, "name": call.name, "arguments": call.arguments,
               "content": content, "ok": True}  # fmt: skip
        await journal.append("t1", "tool_result", row)
    await journal.append("t2", "tool_started", {"id": "c1", "turn": 0, "name": "read_orders"})
    replay = replay_of(await journal.entries("t1"))
    assert replay.result(1, east) is None  # turn 1's c1 had other arguments: never turn 0's result
    first, second = replay.result(0, east), replay.result(1, north)
    assert first is not None and first.content == "12 orders East"
    assert second is not None and second.content == "3 orders North"
    assert replay.result(0, east) is not None  # a turn's own result answers every replay of it
    assert [r.tool_calls[0].arguments for r in replay.responses] == [east.arguments, north.arguments]
    assert replay.started == set()
    other = replay_of(await journal.entries("t2"))
    assert other.results == {} and other.was_started(0, east)  # started, no result: outcome unknown


@tool(level=0)
def read_orders(region: str) -> str:
    """Read a region's orders."""
    raise AssertionError("a replayed call must not run again")


async def test_rows_written_before_turns_replay_in_the_order_they_were_written(journals: Journals) -> None:
    """An old journal (rows without `turn`): each id's results answer its uses in order."""
    journal = journals()
    turns = [ModelResponse(tool_calls=[ToolCall("c1", "read_orders", json.dumps({"region": r}))])
             for r in ("East", "North")]  # fmt: skip
    for region, response in zip(("East", "North"), turns, strict=True):
        call = response.tool_calls[0]
        await journal.append("old", "model_response", record_of(response))
        await journal.append("old", "tool_started", {"id": call.id, "name": call.name})
        row = {"id": call.id, "name": call.name, "arguments": call.arguments, "content": f"orders {region}",
               "ok": True}  # fmt: skip
        await journal.append("old", "tool_result", row)
    untouched = ScriptedModel([])
    model, tools = await resume(journal, "old", untouched, ToolRegistry([read_orders]))
    replayed = []
    for _ in range(2):
        response = await model.complete([{"role": "user", "content": "orders"}])
        replayed.append((await tools.execute(response.tool_calls[0])).content)
    assert replayed == ["orders East", "orders North"] and untouched.calls == []


async def test_a_snapshot_exports_and_loads_once(journals: Journals) -> None:
    source = journals()
    await source.append("t1", "model_response", {"content": "hi"})
    await source.append("t1", "finished", {"reply": "hi"})
    snapshot = json.loads(json.dumps(await export_task(source, "t1")))  # through real JSON
    await source.prune(time.time() + 3600)
    assert await source.entries("t1") == []
    assert await load_task(source, snapshot) == "t1"
    assert [e.kind for e in await source.entries("t1")] == ["model_response", "finished"]
    with pytest.raises(ValueError, match="already has a journal"):
        await load_task(source, snapshot)


async def test_prune_forgets_whole_tasks_that_went_quiet(journals: Journals) -> None:
    journal = journals()
    await journal.append("t1", "model_response", {"content": "hi"})
    await journal.append("t2", "model_response", {"content": "hey"})
    await journal.prune(time.time() - 3600)  # nothing is that old
    assert len(await journal.entries("t1")) == 1 and len(await journal.entries("t2")) == 1
    await journal.prune(time.time() + 3600)
    assert await journal.entries("t1") == [] and await journal.entries("t2") == []
    await journal.append("t1", "model_response", {"content": "again"})  # a pruned id starts afresh
    assert [e.data for e in await journal.entries("t1")] == [{"content": "again"}]


async def test_entries_survive_a_reopen(journals: Journals) -> None:
    journal = journals()
    await journal.append("t1", "model_response", {"content": "one"})
    journal = await journals.reopen(journal)
    await journal.append("t1", "finished", {"reply": "one"})
    assert [e.kind for e in await journal.entries("t1")] == ["model_response", "finished"]
