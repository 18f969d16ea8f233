"""Durable task state (S7): journaled steps, resume after an interruption, snapshots."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from hermes_core import Agent, tool
from hermes_core.kernel.messages import ModelResponse, ToolCall
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.journal import UNKNOWN_OUTCOME, export_task, load_task, resume
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.tools import ToolRegistry


class Effects:
    """What the tools did, for the assertions, and a gate to interrupt one of them mid-run."""

    def __init__(self, block_in: str | None = None) -> None:
        self.log: list[str] = []
        self.block_in = block_in  # the tool that never returns (the test cancels the task there)
        self.entered = asyncio.Event()

    async def maybe_block(self, name: str) -> None:
        if self.block_in == name:
            self.entered.set()
            await asyncio.Event().wait()


def make_tools(effects: Effects) -> list:
    @tool(level=0)
    async def read_orders(region: str) -> dict:
        """Read the orders of a region."""
        effects.log.append(f"read {region}")
        return {"region": region, "orders": 12}

    @tool(level=1)
    async def write_report(title: str) -> str:
        """Write a report (a reversible write: not safe to repeat blindly)."""
        effects.log.append(f"write {title}")
        await effects.maybe_block("write_report")
        return "report saved"

    @tool(level=1, idempotent=True)
    async def set_status(status: str) -> str:
        """Set the task's status (idempotent)."""
        effects.log.append(f"status {status}")
        await effects.maybe_block("set_status")
        return status

    return [read_orders, write_report, set_status]


def four_step_script() -> list:
    return [
        call("read_orders", {"region": "East China"}),
        call("write_report", {"title": "weekly"}),
        call("set_status", {"status": "done"}),
        call("read_orders", {"region": "North China"}),
        reply("Report written."),
    ]


async def run_until_blocked(agent: Agent, task_id: str, effects: Effects) -> None:
    task = asyncio.ensure_future(agent.run("make the weekly report", task_id=task_id))
    await asyncio.wait_for(effects.entered.wait(), 5)
    task.cancel()  # the process "dies" while the tool runs: no result is journaled
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_every_step_is_journaled(tmp_path: Path) -> None:
    journal = SQLiteTaskJournal(tmp_path / "g.db")
    effects = Effects()
    agent = Agent(model=ScriptedModel(four_step_script()), tools=make_tools(effects), journal=journal)
    result = await agent.run("make the weekly report", task_id="t1")
    kinds = [entry.kind for entry in await journal.entries("t1")]
    await journal.close()
    assert result.reply == "Report written."
    assert kinds == ["model_response", *["tool_started", "tool_result", "model_response"] * 4, "finished"]


async def test_interrupted_write_is_not_repeated_and_the_model_is_told(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    effects = Effects(block_in="write_report")
    first = Agent(
        model=ScriptedModel(four_step_script()), tools=make_tools(effects), journal=SQLiteTaskJournal(path)
    )
    await run_until_blocked(first, "t1", effects)
    assert effects.log == ["read East China", "write weekly"]

    effects.block_in = (
        None  # the restarted process: the same task id, a fresh model with only what is left to say
    )
    later = ScriptedModel(four_step_script()[2:])
    second = Agent(model=later, tools=make_tools(effects), journal=SQLiteTaskJournal(path))
    result = await second.run("make the weekly report", task_id="t1")
    assert result.reply == "Report written."
    assert effects.log == ["read East China", "write weekly", "status done", "read North China"]
    unknown = json.loads(result.tool_calls[1].content)["error"]
    assert unknown == UNKNOWN_OUTCOME and result.tool_calls[1].error == "outcome_unknown"
    assert later.calls[0].messages[-1]["content"] == result.tool_calls[1].content  # the model saw it


async def test_interrupted_idempotent_call_runs_again(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    script = four_step_script()
    effects = Effects(block_in="set_status")
    first = Agent(model=ScriptedModel(script), tools=make_tools(effects), journal=SQLiteTaskJournal(path))
    await run_until_blocked(first, "t2", effects)
    assert effects.log == ["read East China", "write weekly", "status done"]

    effects.block_in = None
    second = Agent(
        model=ScriptedModel(script[3:]), tools=make_tools(effects), journal=SQLiteTaskJournal(path)
    )
    result = await second.run("make the weekly report", task_id="t2")
    assert effects.log == [
        "read East China",
        "write weekly",
        "status done",
        "status done",
        "read North China",
    ]
    assert result.reply == "Report written." and result.tool_calls[2].ok


async def test_finished_task_replays_without_model_or_tools(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    effects = Effects()
    first = Agent(
        model=ScriptedModel(four_step_script()), tools=make_tools(effects), journal=SQLiteTaskJournal(path)
    )
    done = await first.run("make the weekly report", task_id="t3")
    untouched = ScriptedModel([])
    again = Agent(model=untouched, tools=make_tools(effects), journal=SQLiteTaskJournal(path))
    replayed = await again.run("make the weekly report", task_id="t3")
    assert replayed.reply == done.reply and replayed.messages == done.messages
    assert untouched.calls == [] and len(effects.log) == 4


async def test_snapshot_export_and_load(tmp_path: Path) -> None:
    effects = Effects()
    source = SQLiteTaskJournal(tmp_path / "a.db")
    agent = Agent(model=ScriptedModel(four_step_script()), tools=make_tools(effects), journal=source)
    done = await agent.run("make the weekly report", task_id="t4")
    exported = await export_task(source, "t4")
    snapshot = json.loads(json.dumps(exported, ensure_ascii=False))  # through real JSON

    target = SQLiteTaskJournal(tmp_path / "b.db")
    assert await load_task(target, snapshot) == "t4"
    with pytest.raises(ValueError, match="already has a journal"):
        await load_task(target, snapshot)
    restored = Agent(model=ScriptedModel([]), tools=make_tools(effects), journal=target)
    assert (await restored.run("make the weekly report", task_id="t4")).reply == done.reply


def reused_id_turns() -> list[ModelResponse]:
    """Two turns whose calls share the id `c1`, as an endpoint that numbers calls per turn sends them."""
    east, north = (ToolCall("c1", "read_orders", json.dumps({"region": r})) for r in ("East", "North"))
    return [ModelResponse(tool_calls=[east]), ModelResponse(tool_calls=[north])]


async def replay_turns(journal: SQLiteTaskJournal, effects: Effects, task_id: str) -> list[str]:
    """Run the two turns through the journal wrappers; what each turn's call got back."""
    registry = ToolRegistry(make_tools(effects))
    model, tools = await resume(journal, task_id, ScriptedModel(reused_id_turns()), registry)
    results = []
    for _ in range(2):
        response = await model.complete([{"role": "user", "content": "orders"}])
        results.append((await tools.execute(response.tool_calls[0])).content)
    return results


async def test_two_turns_that_reuse_a_call_id_each_replay_their_own_result(tmp_path: Path) -> None:
    """Results are journaled per turn: the same id in two turns never hands one turn the other's."""
    journal, effects = SQLiteTaskJournal(tmp_path / "g.db"), Effects()
    first = await replay_turns(journal, effects, "t5")
    again = await replay_turns(journal, effects, "t5")
    await journal.close()
    assert effects.log == ["read East", "read North"]  # replayed, not run again
    assert again == first and "East" in first[0] and "North" in first[1]
