"""Plan-and-execute mode vs the tool loop on the same 3-step task: model calls, prompt bytes, wall time.

The task is a chain of three tools, each needing the previous one's result: find a file, convert
it to PDF, email the PDF (the example of the planner/executor article). Each tool takes
`--tool-seconds`. The model is the fake OpenAI-compatible server, answering after `--latency`
seconds; it is scripted to do the task right in both modes:

- tool loop (`Agent.run`): a tool call per turn, then the answer: 4 model calls, each sending the
  tool schemas and the whole conversation so far;
- plan mode (`run_plan`): the plan (the tools described once, in the system message), then the
  answer from the results: 2 model calls.

"Prompt bytes" are the request bodies the server received (JSON: model, messages, tools,
options), summed over the task's model calls. Both modes run alternately against the same server
in the same process; the wall time is the median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from _common import format_table, machine

from hermes_core import Agent, tool
from hermes_core.plans import run_plan
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest

TASK = "Find the quotation file, convert it to PDF and email the PDF to Mr Li."
PLAN = {
    "steps": [
        {"id": "find", "tool": "find_file", "params": {"keyword": "quotation"}},
        {"id": "pdf", "tool": "convert_to_pdf", "params": {"file_id": "$output.find.file_id"}},
        {"id": "mail", "tool": "send_email",
         "params": {"to": "li@example.com", "attachment": "$output.pdf.pdf_id"}},
    ]
}  # fmt: skip
ANSWER = "Done: the quotation (quotation-v3.docx) was converted to PDF and emailed to Mr Li."


def make_tools(seconds: float) -> list[Any]:
    @tool(level=0)
    async def find_file(keyword: str) -> dict:
        """Find a file in the shared drive by keyword; returns its id, name and size."""
        await asyncio.sleep(seconds)
        return {"file_id": "file-8812", "name": f"{keyword}-v3.docx", "size_kb": 84, "owner": "sales"}

    @tool(level=1)
    async def convert_to_pdf(file_id: str) -> dict:
        """Convert a document to PDF; returns the PDF's id."""
        await asyncio.sleep(seconds)
        return {"pdf_id": f"{file_id}.pdf", "pages": 3}

    @tool(level=1)
    async def send_email(to: str, attachment: str) -> dict:
        """Send an email with one attachment to one address."""
        await asyncio.sleep(seconds)
        return {"status": "sent", "to": to, "attachment": attachment, "message_id": "msg-5521"}

    return [find_file, convert_to_pdf, send_email]


def scripted_model(request: RecordedRequest) -> FakeReply:
    """The model's side of both modes: the right next move, read from the conversation."""
    messages = request.messages
    if "Plan mode:" in str(messages[0].get("content")):
        return FakeReply.text(json.dumps(PLAN))
    if str(messages[-1].get("content", "")).startswith("The plan ran."):
        return FakeReply.text(ANSWER)
    results = [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]
    if len(results) == 0:
        return FakeReply.tool_call("find_file", {"keyword": "quotation"})
    if len(results) == 1:
        return FakeReply.tool_call("convert_to_pdf", {"file_id": results[0]["file_id"]})
    if len(results) == 2:
        arguments = {"to": "li@example.com", "attachment": results[1]["pdf_id"]}
        return FakeReply.tool_call("send_email", arguments)
    return FakeReply.text(ANSWER)


async def one_task(agent: Agent, fake: FakeOpenAIServer, mode: str) -> dict[str, float]:
    before = len(fake.requests)
    started = time.perf_counter()
    result = await (run_plan(agent, TASK) if mode == "plan" else agent.run(TASK))
    wall = time.perf_counter() - started
    if not result.ok or result.reply != ANSWER or len(result.tool_calls) != 3:
        raise RuntimeError(f"{mode} mode did not do the task: {result.stop_reason} {result.reply!r}")
    sent = fake.requests[before:]
    return {
        "calls": len(sent),
        "bytes": sum(len(request.raw) for request in sent),
        "wall": wall,
    }


async def measure(latency: float, tool_seconds: float, runs: int) -> dict[str, list[dict[str, float]]]:
    fake = FakeOpenAIServer(handler=scripted_model, latency=latency)
    async with fake:
        tools = make_tools(tool_seconds)
        agent = Agent(model="fake-model", base_url=fake.base_url, api_key="unused", tools=tools)
        try:
            await one_task(agent, fake, "loop")  # warm-up: connection pool, imports
            figures: dict[str, list[dict[str, float]]] = {"loop": [], "plan": []}
            for _ in range(runs):
                for mode in ("loop", "plan"):
                    figures[mode].append(await one_task(agent, fake, mode))
        finally:
            await agent.aclose()
    return figures


def run(latency: float = 0.2, tool_seconds: float = 0.05, runs: int = 5) -> dict[str, Any]:
    figures = asyncio.run(measure(latency, tool_seconds, runs))
    summary = {
        mode: {
            "calls": rows[0]["calls"],
            "bytes": rows[0]["bytes"],
            "wall": statistics.median(row["wall"] for row in rows),
        }
        for mode, rows in figures.items()
    }
    loop, plan = summary["loop"], summary["plan"]
    table = [
        {"mode": "tool loop", **_cells(loop)},
        {"mode": "plan mode", **_cells(plan)},
        {
            "mode": "plan / loop",
            "model calls": f"{plan['calls'] / loop['calls']:.2f}",
            "prompt bytes": f"{plan['bytes'] / loop['bytes']:.2f}",
            "wall time": f"{plan['wall'] / loop['wall']:.2f}",
        },
    ]
    return {"summary": summary, "table": table}


def _cells(figures: dict[str, float]) -> dict[str, str]:
    return {
        "model calls": f"{figures['calls']:.0f}",
        "prompt bytes": f"{figures['bytes']:,.0f}",
        "wall time": f"{figures['wall'] * 1000:.0f} ms",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds the fake model takes to answer")
    parser.add_argument("--tool-seconds", type=float, default=0.05, help="seconds each tool takes")
    parser.add_argument("--runs", type=int, default=5, help="tasks per mode (the wall time is the median)")
    args = parser.parse_args()
    result = run(args.latency, args.tool_seconds, args.runs)
    print(f"3-step chained task, model latency {args.latency:g} s, tools {args.tool_seconds:g} s each, "
          f"median of {args.runs} runs per mode; {machine()}")  # fmt: skip
    print(format_table(result["table"], ("mode", "model calls", "prompt bytes", "wall time")))


if __name__ == "__main__":
    main()
