"""Prompt bytes per model call over a 60-turn conversation, and session-store appends per second.

The conversation is scripted (no network): a user in Chinese and English, a sales tool called every
other turn with a ~700-byte JSON result. Three ways of sending it are compared:
- full history: every message so far (what a bare growing `Session` sends);
- window only: the last 10 turns within 2,000 tokens, older turns dropped (`memory.fold: false`);
- window + fold: the same, older turns folded into a ≤ 200-character summary (the default).
"Bytes" are `prompt_bytes` of each request: the JSON body an OpenAI-compatible client sends
(model, messages, tools). Summary calls are included in the fold variant's totals. Both memory
variants also offer the `remember` tool, whose schema costs ~590 bytes per call (turn 1).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import format_table

from hermes_core import Agent, Session, tool
from hermes_core.gateway.runner import AgentRunner
from hermes_core.kernel.messages import Message
from hermes_core.sessions import (
    SUMMARY_INSTRUCTIONS,
    ConversationMemory,
    InMemorySessionStore,
    SQLiteSessionStore,
    prompt_bytes,
)
from hermes_core.testing import ScriptedModel, call, reply

TURNS = 60
SHOWN = (1, 10, 20, 40, 60)
REGIONS = ["华东", "华北", "华南", "East China", "North China", "South China"]


@tool
def query_sales(region: str, quarter: str) -> dict:
    """Query the sales of a region in a quarter."""
    rows = [{"product": f"product-{i}", "units": 100 + i * 7, "revenue": 12_000 + i * 950} for i in range(10)]
    return {"region": region, "quarter": quarter, "currency": "CNY", "rows": rows}


def user_text(turn: int) -> str:
    region = REGIONS[turn % len(REGIONS)]
    if turn % 2:
        return f"第 {turn} 步：查一下{region}第三季度的销售，按产品列出，并和上一季度比较一下变化。"
    return f"Step {turn}: what were the Q3 sales in {region}? List them by product and compare with Q2."


def scripted_model() -> ScriptedModel:
    def answer(messages: list[Message], tools: Any) -> Any:
        if messages[0]["content"] == SUMMARY_INSTRUCTIONS:
            return "用户在逐步分析各地区第三季度销售（华东、华北、华南），已查询多次并与第二季度比较。"
        if messages[-1]["role"] == "tool":
            return "Q3 sales are listed above; revenue rose about 6% on Q2, led by product-9. 环比增长约 6%。"
        turn = int("".join(ch for ch in messages[-1]["content"].split()[1] if ch.isdigit()))
        if turn % 2:
            return call("query_sales", {"region": REGIONS[turn % len(REGIONS)], "quarter": "Q3"})
        return reply("Noted — Q3 numbers for that region are in the previous answer; anything else? " * 2)

    return ScriptedModel(answer)


def request_bytes(calls: list[Any]) -> int:
    return sum(prompt_bytes(c.messages, c.tools, model="m") for c in calls)


async def conversation_bytes(variant: str) -> tuple[dict[int, int], int, int]:
    """Per turn: the bytes of the turn's first model call; and the totals (all calls, summary calls)."""
    model = scripted_model()
    agent = Agent(model=model, tools=[query_sales])
    first_call: dict[int, int] = {}
    if variant == "full history":
        session = Session(id="c")
        for turn in range(1, TURNS + 1):
            before = len(model.calls)
            await agent.run(user_text(turn), session=session)
            first_call[turn] = request_bytes(model.calls[before : before + 1])
    else:
        memory = ConversationMemory(InMemorySessionStore(), fold=variant == "window + fold")
        runner = AgentRunner(agent, memory)
        for turn in range(1, TURNS + 1):
            before = len(model.calls)
            await runner.reply("c", user_text(turn))
            turn_calls = [c for c in model.calls[before:] if c.messages[0]["content"] != SUMMARY_INSTRUCTIONS]
            first_call[turn] = request_bytes(turn_calls[:1])
    summaries = [c for c in model.calls if c.messages[0]["content"] == SUMMARY_INSTRUCTIONS]
    return first_call, request_bytes(model.calls), request_bytes(summaries)


async def sqlite_appends_per_second(appends: int, directory: str | None) -> float:
    """Turns (user + assistant message) appended one transaction each, WAL + synchronous=FULL."""
    with tempfile.TemporaryDirectory(dir=directory) as folder:
        store = SQLiteSessionStore(Path(folder) / "gateway.db")
        turn: list[Message] = [
            {"role": "user", "content": user_text(1)},
            {"role": "assistant", "content": "Q3 sales are listed above; revenue rose about 6% on Q2."},
        ]
        try:
            started = time.perf_counter()
            for i in range(appends):
                await store.append(f"conversation-{i % 50}", turn)
            elapsed = time.perf_counter() - started
        finally:
            await store.close()
    return appends / elapsed


def run(appends: int = 500, directory: str | None = None) -> dict:
    variants = ("full history", "window only", "window + fold")
    results = {variant: asyncio.run(conversation_bytes(variant)) for variant in variants}
    rows: list[dict[str, str]] = []
    for turn in SHOWN:
        rows.append({"call": f"turn {turn}", **{v: f"{results[v][0][turn]:,}" for v in variants}})
    rows.append({"call": "total, all calls", **{v: f"{results[v][1]:,}" for v in variants}})
    rows.append({"call": "  of which summary calls", **{v: f"{results[v][2]:,}" for v in variants}})
    figures: dict[str, Any] = {f"total bytes, {v}": results[v][1] for v in variants}
    figures["sqlite appends/s"] = asyncio.run(sqlite_appends_per_second(appends, directory))
    figures["rows_table"] = rows
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=500, help="session-store appends to time")
    parser.add_argument("--dir", default=None, help="where the SQLite file goes (default: the temp dir)")
    args = parser.parse_args()
    figures = run(args.appends, args.dir)
    print(f"Prompt bytes per call, {TURNS}-turn conversation (first model call of the turn):")
    print(format_table(figures["rows_table"], ("call", "full history", "window only", "window + fold")))
    full, folded = figures["total bytes, full history"], figures["total bytes, window + fold"]
    print(f"window + fold sends {folded / full:.0%} of the full-history bytes over the conversation")
    appends = figures["sqlite appends/s"]
    print(f"SQLite session store, synchronous=FULL: {appends:,.0f} appends/s (one turn per transaction)")


if __name__ == "__main__":
    main()
