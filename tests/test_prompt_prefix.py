"""A prompt prefix that provider caches can reuse, and the same notes still reaching the model.

Where the cases come from: the providers' prompt-caching rules — a cache serves only a request's
exact prefix (platform.openai.com/docs/guides/prompt-caching; api-docs.deepseek.com/guides/kv_cache)
and the tools are part of it — and the measurement of the issue this answers: a 20-turn
conversation through `serve` with memory on broke the prefix inside the system message at 17 of 19
turn starts. Every request goes to the fake OpenAI server over HTTP and is checked as it was sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from pathlib import Path
from statistics import mean
from typing import Any

import aiohttp
import yaml

from gateway_harness import gateway_for
from hermes_core import Agent, tool
from hermes_core.agent import CONTEXT_HEADING, Session
from hermes_core.sessions import REMEMBER, SUMMARY_INSTRUCTIONS
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from prompt_parts import context_of, without_context

GOAL = "Keep a running total of my East China orders, one order per message"
FACT = "totals are in yuan, East China only"
SUMMARY = "The user is totalling East China orders; totals so far agreed."


@tool
def add_order(amount: int) -> str:
    """Add one order's amount to the running total."""
    return f"added {amount}"


def model_turns(request: RecordedRequest) -> FakeReply:
    """One tool call per turn (the fact is remembered on the first turn, an order added on the
    others), then a text answer; the summary of a fold when asked for one."""
    messages = request.messages
    if messages[0]["content"] == SUMMARY_INSTRUCTIONS:
        return FakeReply.text(SUMMARY)
    if messages[-1]["role"] == "tool":
        return FakeReply.text("Noted: " + str(messages[-1]["content"])[:40])
    if messages[-1]["content"] == GOAL:
        return FakeReply.tool_call(REMEMBER, {"note": FACT, "kind": "fact"})
    names = [t["function"]["name"] for t in request.tools]
    name = "calculator" if "calculator" in names else names[0]
    return FakeReply.tool_call(name, {"expression": "1200 + 35"})


def serialised(request: RecordedRequest) -> str:
    """What a provider's cache matches, in the order chat templates render it: tools, then messages."""
    return json.dumps([request.tools, request.messages], ensure_ascii=False)


def shared_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def agent_requests(fake: FakeOpenAIServer) -> list[RecordedRequest]:
    return [r for r in fake.requests if r.messages[0]["content"] != SUMMARY_INSTRUCTIONS]


def check_prefix(
    requests: list[RecordedRequest], folded_at: Collection[int] = ()
) -> list[tuple[float, bool]]:
    """The system prompt and the tools are byte-identical on every call; each turn's first request
    continues the previous request — all of it when the context is unchanged, else all but the old
    context — unless a fold came in between. Returns, for each turn's first request, its prefix
    reuse in characters and whether its context was unchanged."""
    first = requests[0]
    reuse = []
    for previous, request in zip(requests, requests[1:], strict=False):
        assert json.dumps(request.messages[0]) == json.dumps(first.messages[0])
        assert json.dumps(request.tools) == json.dumps(first.tools)
        if request.messages[-1]["role"] != "user":  # within a turn: pure appends
            assert request.messages[: len(previous.messages)] == previous.messages
            continue
        if requests.index(request) in folded_at:
            continue
        unchanged = context_of(request.messages) == context_of(previous.messages)
        if unchanged:
            kept = previous.messages  # an unchanged context stays where it stood: a pure append
        else:
            kept = without_context(previous.messages)  # a changed one moves next to the new message
        assert request.messages[: len(kept)] == kept
        before, now = serialised(previous), serialised(request)
        reuse.append((shared_prefix(before, now) / len(now), unchanged))
    return reuse


async def say(url: str, text: str) -> str:
    async with aiohttp.ClientSession() as session:
        body = {"message": text, "user_id": "u1"}
        async with session.post(f"{url}/webhook", json=body) as response:
            assert response.status == 200
            return str((await response.json())["reply"])


def write_config(tmp_path: Path, fake: FakeOpenAIServer, **memory: Any) -> Path:
    config = {
        "model": {"name": "m", "base_url": fake.base_url, "max_retries": 0},
        "gateway": {"data_dir": str(tmp_path / "data")},
        "memory": {"window_turns": 6, **memory},  # state, long-term examples and folding: the defaults
    }
    path = tmp_path / "hermes.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


async def test_serve_keeps_the_prefix_stable_and_still_tells_the_model_everything(tmp_path: Path) -> None:
    """Through `serve` (webhook, SQLite sessions, state, long-term examples, folding), 12 turns."""
    async with FakeOpenAIServer(handler=model_turns) as fake:
        async with gateway_for(write_config(tmp_path, fake)) as url:
            assert (await say(url, GOAL)).startswith("Noted")
            for turn in range(1, 12):
                await say(url, f"order {turn}: 1200 + 35 yuan")
        requests = agent_requests(fake)
        summaries = [
            i for i, r in enumerate(fake.requests) if r.messages[0]["content"] == SUMMARY_INSTRUCTIONS
        ]
    assert summaries, "the conversation was long enough to fold"
    folded_at = {requests.index(fake.requests[i + 1]) for i in summaries}  # the request after each fold
    reuse = check_prefix(requests, folded_at)
    assert len(reuse) >= 8 and mean(r for r, _ in reuse) >= 0.9, reuse
    assert all(r >= 0.95 for r, unchanged in reuse if unchanged) and sum(u for _, u in reuse) >= 4, reuse
    last = context_of(requests[-1].messages)  # what the model is told on the last turn
    assert FACT in last  # the state snapshot
    assert f"(pinned): {GOAL}" in last and SUMMARY in last  # after a fold: the goal and the summary
    assert "Past results of this user's tasks" in last and "calculator" in last  # long-term examples
    turn_starts = [r for r in requests if r.messages[-1]["role"] == "user"]
    assert turn_starts[-1].messages[-1] == {"role": "user", "content": "order 11: 1200 + 35 yuan"}


def uncached(requests: list[RecordedRequest]) -> int:
    """Characters a prefix cache cannot serve, over the conversation: each request after the part it
    shares with the one before."""
    texts = [serialised(r) for r in requests]
    return len(texts[0]) + sum(len(b) - shared_prefix(a, b) for a, b in zip(texts, texts[1:], strict=False))


async def converse(notes: Callable[[int], str], *, move_context: bool = False) -> list[RecordedRequest]:
    """12 turns through `Agent.run(session=Session())`, the notes of turn k being `notes(k)`; each
    call must carry its turn's notes in its context message, and none may stay in the history.
    `move_context`: forget where the context stood, so every turn places it next to its message."""
    async with FakeOpenAIServer(handler=model_turns) as fake:
        agent = Agent(model="m", base_url=fake.base_url, tools=[add_order], max_retries=0)
        session = Session()
        try:
            for turn in range(12):
                session.notes = notes(turn)
                session.context_sent = "" if move_context else session.context_sent
                assert (await agent.run(f"order {turn}: 1200 + 35 yuan", session=session)).ok
        finally:
            await agent.aclose()
    for request in fake.requests:
        assert request.messages[0] == {"role": "system", "content": agent.system_prompt}
        asked = [m for m in without_context(request.messages) if m["role"] == "user"][-1]["content"]
        assert context_of(request.messages) == notes(int(asked.split()[1].rstrip(":")))
    assert all(m["role"] != "user" or m["content"].startswith("order") for m in session.messages)
    return list(fake.requests)


async def test_agent_run_with_a_session_keeps_the_prefix_and_sends_the_notes() -> None:
    """`Agent.run(session=Session())`: notes that stay the same cost almost nothing (≤ 1.1× the
    uncached characters of the same conversation without notes, every turn a pure append); notes
    that change every fourth turn reach every call, and cost less than a context moved to the
    newest message on every turn."""
    floor = uncached(await converse(lambda turn: ""))
    stable = await converse(lambda turn: "Conversation state: orders in yuan, East China only.")
    assert all(unchanged and r >= 0.9 for r, unchanged in check_prefix(stable))
    assert uncached(stable) <= 1.1 * floor, (uncached(stable), floor)

    def changing(turn: int) -> str:
        return f"Conversation state: {turn // 4 * 4} order(s) confirmed so far."

    anchored = await converse(changing)
    reuse = check_prefix(anchored)
    assert [unchanged for _, unchanged in reuse] == [turn % 4 != 0 for turn in range(1, 12)]
    assert all(r >= 0.9 for r, unchanged in reuse if unchanged), reuse
    assert uncached(anchored) < uncached(await converse(changing, move_context=True))


async def test_a_model_that_demands_alternating_roles_gets_the_context_merged_into_the_message() -> None:
    """Cases: the error a Hugging Face chat template raises through vLLM ("Conversation roles must
    alternate user/assistant/user/assistant/..."; the old deepseek-reasoner answered "does not
    support successive user or assistant messages"). The first refusal is answered by sending the
    context and the message as one user message, and the model is remembered: the next turn goes
    merged at once, and the model still reads the notes."""
    async with FakeOpenAIServer() as fake:
        fake.alternating_roles = True
        fake.script(FakeReply.text("First."), FakeReply.text("Second."))
        agent = Agent(model="m", base_url=fake.base_url, max_retries=0)
        session = Session(notes="Conversation state: orders in yuan, East China only.")
        try:
            assert (await agent.run("order 1", session=session)).reply == "First."
            assert (await agent.run("order 2", session=session)).reply == "Second."
        finally:
            await agent.aclose()
    refused, first, second = fake.requests
    assert [m["role"] for m in refused.messages] == ["system", "user", "user"]
    for request in (first, second):
        roles = [m["role"] for m in request.messages]
        assert all(not (a == b == "user") for a, b in zip(roles, roles[1:], strict=False))
        merged = request.messages[1]["content"]  # the unchanged context stays where it stood
        assert merged.startswith(CONTEXT_HEADING) and "East China only." in merged
        assert merged.endswith("order 1")
    assert second.messages[-1] == {"role": "user", "content": "order 2"}
    assert session.messages[-2:] == [
        {"role": "user", "content": "order 2"},
        {"role": "assistant", "content": "Second."},
    ]  # the history keeps the message alone
