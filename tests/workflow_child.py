"""Child process of tests/test_workflows.py: runs one workflow under a SQLite journal.

Every execution of a step appends its name to the file in WORKFLOW_COUNTS; the step named in
WORKFLOW_BLOCK (if any) then hangs, so that the test can kill -9 the process inside it. The
finished run prints its outputs as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from hermes_core import Agent, tool
from hermes_core.plans import Workflow, run_workflow
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.testing import ScriptedModel

WORKFLOW = """
name: weekly-report
steps:
  - id: fetch
    type: tool
    tool: fetch_sales
    params: {region: "{inputs.region}"}
  - id: total
    type: tool
    tool: add_up
    params: {values: "{steps.fetch.output.rows}"}
    depends_on: [fetch]
  - id: summary
    type: model
    prompt: "Summarise the sales of {inputs.region}: {steps.fetch.output.rows}"
    depends_on: [fetch]
  - id: publish
    type: tool
    tool: publish
    params: {text: "{steps.summary.output} (total {steps.total.output})"}
    depends_on: [total, summary]
  - id: report
    type: agent
    agent: writer
    prompt: "Write the report from: {steps.publish.output.published}"
    depends_on: [publish]
"""


def executed(name: str) -> bool:
    """Count one execution of `name`; True if the process is to hang in it (and be killed)."""
    with open(os.environ["WORKFLOW_COUNTS"], "a", encoding="utf-8") as counts:
        counts.write(name + "\n")
    return os.environ.get("WORKFLOW_BLOCK") == name


def tool_ran(name: str) -> None:
    if executed(name):
        time.sleep(60)  # tools run in worker threads: the event loop goes on


async def model_answered(name: str) -> None:
    if executed(name):
        await asyncio.sleep(60)  # blocked here until the test kills this process


@tool(level=0)
def fetch_sales(region: str) -> dict:
    """Fetch a region's sales."""
    tool_ran("fetch")
    return {"region": region, "rows": [3, 4, 5]}


@tool(level=0)
def add_up(values: list[int]) -> int:
    """Add numbers up."""
    tool_ran("total")
    return sum(values)


@tool(level=1, idempotent=True)
def publish(text: str) -> dict:
    """Publish a text (publishing the same text twice leaves one copy)."""
    tool_ran("publish")
    return {"published": text}


async def model_step(messages: list[dict[str, Any]], tools: Any) -> str:
    await model_answered("summary")
    return "sales rose"


async def writer_step(messages: list[dict[str, Any]], tools: Any) -> str:
    await model_answered("report")
    return "REPORT: " + messages[-1]["content"].split(": ", 1)[1]


async def main() -> None:
    journal = SQLiteTaskJournal(sys.argv[1])
    agent = Agent(model=ScriptedModel(model_step), tools=[fetch_sales, add_up, publish], journal=journal)
    writer = Agent(model=ScriptedModel(writer_step))
    workflow = Workflow.from_yaml(WORKFLOW)
    result = await run_workflow(
        workflow, agent, inputs={"region": "华东"}, agents={"writer": writer}, run_id="weekly-1"
    )
    resumed = sorted(step_id for step_id, step in result.steps.items() if step.resumed)
    print(json.dumps({"stop_reason": result.stop_reason, "outputs": result.outputs, "resumed": resumed}))
    await journal.close()


if __name__ == "__main__":
    asyncio.run(main())
