"""Declarative workflows: tool, model and agent steps with depends_on, parallel branches, resume."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_core import Agent, ToolError, tool
from hermes_core.kernel.tools.permissions import Caller
from hermes_core.plans import Workflow, WorkflowError, WorkflowStep, run_workflow
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.journal import UNKNOWN_OUTCOME
from hermes_core.tasks.pending import SQLiteInteractions
from hermes_core.testing import ScriptedModel
from waiting import wait_for

CHILD = Path(__file__).with_name("workflow_child.py")

REPORT = """
name: weekly-report
steps:
  - id: fetch
    type: tool
    tool: fetch_sales
    params: {region: "{inputs.region}"}
  - id: total
    type: tool
    tool: add_up
    params: {values: "{steps.fetch.output.rows}"}   # the list itself
    depends_on: [fetch]
  - id: summary
    type: model
    prompt: "Summarise the sales of {inputs.region}: {steps.fetch.output.rows}"
    depends_on: fetch
  - id: report
    type: agent
    agent: writer
    prompt: "Report: {steps.summary.output}; total {steps.total.output}"
    depends_on: [total, summary]
"""


class Sales:
    """Tools for the report workflow, recording every execution."""

    def __init__(self, failures: int = 0, confirm_adding: bool = False) -> None:
        self.ran: list[str] = []
        self.failures = failures
        self.confirm_adding = confirm_adding  # add_up waits for a person's approval

    def tools(self) -> list[Any]:
        @tool(level=0)
        def fetch_sales(region: str) -> dict:
            """Fetch a region's sales."""
            self.ran.append(f"fetch {region}")
            return {"region": region, "rows": [3, 4, 5]}

        @tool(level=0, confirm=self.confirm_adding)
        def add_up(values: list[int]) -> int:
            """Add numbers up."""
            self.ran.append(f"add {values}")
            if self.failures:
                self.failures -= 1
                raise ToolError("the adder is offline")
            return sum(values)

        return [fetch_sales, add_up]


def writer() -> Agent:
    return Agent(model=ScriptedModel(lambda messages, tools: "WROTE " + messages[-1]["content"]))


async def test_a_yaml_workflow_runs_tool_model_and_agent_steps() -> None:
    sales = Sales()
    model = ScriptedModel(["sales rose"])
    agent = Agent(model=model, tools=sales.tools())
    result = await run_workflow(
        Workflow.from_yaml(REPORT), agent, inputs={"region": "华东"}, agents={"writer": writer()}
    )
    assert result.ok and result.stop_reason == "completed"
    assert result.outputs == {
        "fetch": {"region": "华东", "rows": [3, 4, 5]},
        "total": 12,
        "summary": "sales rose",
        "report": "WROTE Report: sales rose; total 12",
    }
    assert sales.ran == ["fetch 华东", "add [3, 4, 5]"]  # the params got the list, not its text
    assert model.calls[0].messages == [{"role": "user", "content": "Summarise the sales of 华东: [3, 4, 5]"}]
    assert all(step.elapsed > 0 and not step.resumed for step in result.steps.values())
    assert [o.call.name for o in result.tool_calls] == ["fetch_sales", "add_up"]


async def test_a_python_workflow_is_the_same_thing() -> None:
    workflow = Workflow(
        [
            WorkflowStep("fetch", "tool", tool="fetch_sales", params={"region": "North"}),
            WorkflowStep("total", "tool", tool="add_up", params={"values": "{steps.fetch.output.rows}"},
                         depends_on=["fetch"]),
        ]
    )  # fmt: skip
    result = await run_workflow(workflow, Agent(model=ScriptedModel([]), tools=Sales().tools()))
    assert result.ok and result.outputs["total"] == 12
    as_data = [
        {"id": s.id, "type": s.type, "tool": s.tool, "params": s.params, "depends_on": list(s.depends_on)}
        for s in workflow.steps
    ]
    assert Workflow.from_dict({"steps": as_data}) == workflow


async def test_independent_steps_run_in_parallel() -> None:
    @tool(level=0)
    def slow_count(n: int) -> int:
        """Count slowly."""
        time.sleep(0.5)
        return n

    async def slow_model(messages: list[dict[str, Any]], tools: Any) -> str:
        if messages[0]["content"] == "think":
            await asyncio.sleep(0.5)
            return "slow answer"
        return "quick answer"

    workflow = Workflow.from_dict(
        {
            "steps": [
                {"id": "a", "type": "tool", "tool": "slow_count", "params": {"n": 1}},
                {"id": "b", "type": "tool", "tool": "slow_count", "params": {"n": 2}},
                {"id": "c", "type": "model", "prompt": "think"},
                {"id": "d", "type": "model", "prompt": "{steps.a.output} {steps.b.output} {steps.c.output}",
                 "depends_on": ["a", "b", "c"]},
            ]
        }
    )  # fmt: skip
    model = ScriptedModel(slow_model)
    started = time.perf_counter()
    result = await run_workflow(workflow, Agent(model=model, tools=[slow_count]))
    elapsed = time.perf_counter() - started
    assert result.ok and model.calls[-1].messages[0]["content"] == "1 2 slow answer"
    # three 0.5 s steps, then a quick one: about 0.5 s if they overlapped, 1.5 s if not
    assert elapsed < 0.9, f"the independent steps took {elapsed:.2f} s: they did not overlap"
    assert result.steps["a"].elapsed >= 0.5 and result.steps["c"].elapsed >= 0.5


BAD_DEFINITIONS = {
    "cycle": ({"steps": [{"id": "a", "type": "model", "prompt": "x", "depends_on": ["b"]},
                         {"id": "b", "type": "model", "prompt": "y", "depends_on": ["a"]}]},
              "the steps form a cycle: a → b → a"),
    "unknown dependency": ({"steps": [{"id": "a", "type": "model", "prompt": "x", "depends_on": ["z"]}]},
                           "step 'a' depends on 'z', which is not a step of the workflow"),
    "template without the dependency": (
        {"steps": [{"id": "a", "type": "model", "prompt": "x"},
                   {"id": "b", "type": "model", "prompt": "{steps.a.output}"}]},
        "step 'b' uses {steps.a.output} but does not depend on 'a'"),
    "template of no step": ({"steps": [{"id": "a", "type": "model", "prompt": "{steps.q.output}"}]},
                            "step 'a' uses {steps.q.output}, but there is no step 'q'"),
    "unknown type": ({"steps": [{"id": "a", "type": "shell", "prompt": "ls"}]},
                     "step 'a': type must be one of tool, model, agent, got 'shell'"),
    "tool step without a tool": ({"steps": [{"id": "a", "type": "tool"}]},
                                 "step 'a': tool steps need 'tool'"),
    "agent step without a prompt": ({"steps": [{"id": "a", "type": "agent", "agent": "w"}]},
                                    "step 'a': agent steps need 'prompt'"),
    "misspelt key": ({"steps": [{"id": "a", "type": "model", "prompt": "x", "depends-on": ["b"]}]},
                     "step 1: unknown key(s) depends-on"),
    "duplicate ids": ({"steps": [{"id": "a", "type": "model", "prompt": "x"}] * 2},
                      "step 'a': the id is used more than once"),
    "no steps": ({"steps": []}, "a workflow needs at least one step"),
    "not a mapping": (["a", "b"], 'a workflow is a mapping with a "steps" list'),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_DEFINITIONS)
def test_a_bad_definition_is_a_clear_error(case: str) -> None:
    data, problem = BAD_DEFINITIONS[case]
    with pytest.raises(WorkflowError) as raised:
        Workflow.from_dict(data)
    assert problem in str(raised.value)


def test_yaml_that_is_not_yaml_is_a_clear_error() -> None:
    with pytest.raises(WorkflowError, match="not valid YAML"):
        Workflow.from_yaml("steps: [ {id: a")


async def test_what_the_run_lacks_is_reported_before_any_step_runs() -> None:
    sales = Sales()
    workflow = Workflow.from_dict(
        {
            "steps": [
                {"id": "fetch", "type": "tool", "tool": "fetch_sales", "params": {"region": "{inputs.area}"}},
                {"id": "mail", "type": "tool", "tool": "send_mail", "params": {}},
                {"id": "write", "type": "agent", "agent": "editor", "prompt": "write"},
            ]
        }
    )
    with pytest.raises(WorkflowError) as raised:
        await run_workflow(workflow, Agent(model=ScriptedModel([]), tools=sales.tools()), agents={})
    message = str(raised.value)
    assert "step 'mail': unknown tool 'send_mail'" in message
    assert "step 'write': no agent named 'editor' was given" in message
    assert "step 'fetch' uses {inputs.area}, which was not given" in message
    assert sales.ran == []


async def test_a_failed_step_stops_the_run_and_running_it_again_retries_only_that(tmp_path: Path) -> None:
    sales = Sales(failures=1)
    journal = SQLiteTaskJournal(tmp_path / "j.db")
    agent = Agent(model=ScriptedModel(["sales rose"]), tools=sales.tools(), journal=journal)
    run = {"inputs": {"region": "East"}, "agents": {"writer": writer()}, "run_id": "r1"}
    first = await run_workflow(Workflow.from_yaml(REPORT), agent, **run)  # type: ignore[arg-type]
    assert first.stop_reason == "failed" and "report" not in first.steps
    assert first.error == "step 'total' failed: add_up: the adder is offline"

    second = await run_workflow(Workflow.from_yaml(REPORT), agent, **run)  # type: ignore[arg-type]
    await journal.close()
    assert second.ok and second.outputs["report"] == "WROTE Report: sales rose; total 12"
    assert sales.ran == ["fetch East", "add [3, 4, 5]", "add [3, 4, 5]"]  # fetch ran once
    assert {s for s, r in second.steps.items() if r.resumed} == {"fetch", "summary"}


async def test_a_missing_field_is_a_clear_step_error() -> None:
    workflow = Workflow.from_dict(
        {
            "steps": [
                {"id": "fetch", "type": "tool", "tool": "fetch_sales", "params": {"region": "x"}},
                {
                    "id": "say",
                    "type": "model",
                    "prompt": "{steps.fetch.output.totals}",
                    "depends_on": "fetch",
                },
            ]
        }
    )
    result = await run_workflow(workflow, Agent(model=ScriptedModel([]), tools=Sales().tools()))
    assert result.stop_reason == "failed"
    problem = "steps.fetch.output has no field 'totals' (its fields: region, rows)"
    assert result.error == f"step 'say' failed: {problem}"


async def test_a_model_step_times_out() -> None:
    async def stuck(messages: list[dict[str, Any]], tools: Any) -> str:
        await asyncio.sleep(5)
        return "late"

    step = {"id": "think", "type": "model", "prompt": "x", "timeout": 0.2}
    workflow = Workflow.from_dict({"steps": [step]})
    result = await run_workflow(workflow, Agent(model=ScriptedModel(stuck)))
    assert result.error == "step 'think' failed: timed out after 0.2 s"


async def test_an_interrupted_write_is_not_repeated_blindly(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    entered, writes = asyncio.Event(), []

    @tool(level=1)
    async def write_record(text: str) -> str:
        """Write a record (not safe to repeat)."""
        writes.append(text)
        entered.set()
        await asyncio.sleep(60 if len(writes) == 1 else 0)
        return "written"

    workflow = Workflow.from_dict({"steps": [{"id": "w", "type": "tool", "tool": "write_record",
                                              "params": {"text": "weekly"}}]})  # fmt: skip
    first = Agent(model=ScriptedModel([]), tools=[write_record], journal=SQLiteTaskJournal(path))
    task = asyncio.ensure_future(run_workflow(workflow, first, run_id="w1"))
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()  # the process dies inside the write
    with pytest.raises(asyncio.CancelledError):
        await task

    second = Agent(model=ScriptedModel([]), tools=[write_record], journal=SQLiteTaskJournal(path))
    result = await run_workflow(workflow, second, run_id="w1")
    assert writes == ["weekly"] and result.stop_reason == "failed"
    assert result.error == f"step 'w' failed: write_record: {UNKNOWN_OUTCOME}"


async def test_a_pause_for_approval_stops_the_workflow_and_it_continues_once_approved(tmp_path: Path) -> None:
    sales = Sales(confirm_adding=True)
    database = tmp_path / "g.db"
    journal, interactions = SQLiteTaskJournal(database), SQLiteInteractions(database)
    agent = Agent(model=ScriptedModel(["sales rose"]), tools=sales.tools(), journal=journal,
                  interactions=interactions)  # fmt: skip
    bob = Caller("ou_bob", channel="webhook")
    run = {"inputs": {"region": "x"}, "agents": {"writer": writer()}, "run_id": "r1", "caller": bob}
    first = await run_workflow(Workflow.from_yaml(REPORT), agent, **run)  # type: ignore[arg-type]
    [pending] = await interactions.open_for_task("r1")
    assert first.stop_reason == "awaiting_approval" and first.error == pending.id
    assert "report" not in first.steps and sales.ran == ["fetch x"]

    await interactions.decide(pending.id, bob, approve=True)
    second = await run_workflow(Workflow.from_yaml(REPORT), agent, **run)  # type: ignore[arg-type]
    assert second.ok and second.outputs["report"] == "WROTE Report: sales rose; total 12"
    assert sales.ran == ["fetch x", "add [3, 4, 5]"]


# -- kill -9 in the middle of a step, then run again ------------------------------------------------

KILL_POINTS = {  # the step the process dies in → the steps finished (journaled) by then
    "summary": {"fetch", "total"},
    "publish": {"fetch", "total", "summary"},
    "report": {"fetch", "total", "summary", "publish"},
}
STEPS = ["fetch", "total", "summary", "publish", "report"]


def journaled_steps(database: Path) -> set[str]:
    try:
        with sqlite3.connect(database, timeout=5) as db:
            rows = db.execute("SELECT data FROM task_journal WHERE kind = 'workflow_step'").fetchall()
    except sqlite3.OperationalError:  # not created yet
        return set()
    return {json.loads(data)["id"] for (data,) in rows}


@pytest.mark.slow
@pytest.mark.parametrize("kill_point", KILL_POINTS)
def test_a_killed_workflow_resumes_without_rerunning_finished_steps(tmp_path: Path, kill_point: str) -> None:
    database, counts = tmp_path / "journal.db", tmp_path / "counts.txt"
    counts.touch()
    env = {**os.environ, "WORKFLOW_COUNTS": str(counts), "WORKFLOW_BLOCK": kill_point}
    command = [sys.executable, str(CHILD), str(database)]
    first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        in_step = lambda: kill_point in counts.read_text().split()  # noqa: E731
        wait_for(lambda: in_step() and journaled_steps(database) >= KILL_POINTS[kill_point])
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    finally:
        if first.poll() is None:
            first.kill()
        first.wait()
        if first.stderr:
            first.stderr.close()
    assert journaled_steps(database) == KILL_POINTS[kill_point]

    env.pop("WORKFLOW_BLOCK")
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    report = json.loads(second.stdout.strip().splitlines()[-1])
    assert report["stop_reason"] == "completed"
    assert report["outputs"]["report"] == "REPORT: sales rose (total 12)"
    assert set(report["resumed"]) == KILL_POINTS[kill_point]
    executions = counts.read_text().split()
    # every finished step ran once; the one killed midway ran again (it is read-only or idempotent)
    assert {step: executions.count(step) for step in STEPS} == {
        step: 2 if step == kill_point else 1 for step in STEPS
    }
