"""A prompt prefix that provider caches can reuse, and the same notes still reaching the model.

Where the cases come from: the providers' prompt-caching rules — a cache serves only a request's
exact prefix (platform.openai.com/docs/guides/prompt-caching; api-docs.deepseek.com/guides/kv_cache)
and the tools are part of it — and the measurement of the issue this answers: a 20-turn
conversation through `serve` with memory on broke the prefix inside the system message at 17 of 19
turn starts. Every request goes to the fake OpenAI server over HTTP and is checked as it was sent.
"""

from __future__ import annotations

import itertools
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
from prompt_parts import context_of, contexts_of, without_context

GOAL = "Keep a running total of my East China orders, one order per message"
FACT = "totals are in yuan, East China only"
SUMMARY = "The user is totalling East China orders; totals so far agreed."
ANSWERS = itertools.count(1)  # every answer differs, as a model's do


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
        return FakeReply.text(f"Noted ({next(ANSWERS)}): " + str(messages[-1]["content"])[:40])
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


def check_prefix(requests: list[RecordedRequest], folded_at: Collection[int] = ()) -> list[float]:
    """The system prompt and the tools are byte-identical on every call, and every request continues
    the previous one message for message — context messages given on earlier turns stay where they
    stood — unless a fold came in between. Returns each turn's first request's prefix reuse in
    characters."""
    first = requests[0]
    reuse = []
    for index, (previous, request) in enumerate(zip(requests, requests[1:], strict=False), start=1):
        assert json.dumps(request.messages[0]) == json.dumps(first.messages[0])
        assert json.dumps(request.tools) == json.dumps(first.tools)
        if index in folded_at:
            continue
        assert request.messages[: len(previous.messages)] == previous.messages, index
        if request.messages[-1]["role"] == "user":
            before, now = serialised(previous), serialised(request)
            reuse.append(shared_prefix(before, now) / len(now))
    return reuse


def newest_notes(request: RecordedRequest) -> str:
    """The notes the model reads as current: the newest context message that gives notes."""
    given = contexts_of(request.messages)
    return next((c for c in reversed(given) if c.startswith("Conversation state")), "")


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
            assert (await say(url, GOAL)).startswith("Noted (")
            for turn in range(1, 12):
                await say(url, f"order {turn}: 1200 + 35 yuan")
        requests = agent_requests(fake)
        summaries = [
            i for i, r in enumerate(fake.requests) if r.messages[0]["content"] == SUMMARY_INSTRUCTIONS
        ]
    assert summaries, "the conversation was long enough to fold"
    folded_at = {requests.index(fake.requests[i + 1]) for i in summaries}  # the request after each fold
    reuse = check_prefix(requests, folded_at)
    assert len(reuse) >= 8 and mean(reuse) >= 0.9, reuse
    last = context_of(requests[-1].messages)  # what the model is told on the last turn
    assert FACT in newest_notes(requests[-1])  # the state snapshot
    assert f"(pinned): {GOAL}" in last and SUMMARY in last  # after a fold: the goal and the summary
    assert "Past results of this user's tasks" in last and "calculator" in last  # long-term examples
    for request in requests:  # an outcome is an example only while its reply is not in the history
        shown = [m["content"] for m in without_context(request.messages) if m["role"] == "assistant"]
        examples = [line for line in context_of(request.messages).splitlines() if "→ result: " in line]
        assert not any(line.split("→ result: ")[1] in reply for line in examples for reply in shown if reply)
    turn_starts = [r for r in requests if r.messages[-1]["role"] == "user"]
    assert turn_starts[-1].messages[-1] == {"role": "user", "content": "order 11: 1200 + 35 yuan"}


def uncached(requests: list[RecordedRequest]) -> int:
    """Characters a prefix cache cannot serve, over the conversation: each request after the part it
    shares with the one before."""
    texts = [serialised(r) for r in requests]
    return len(texts[0]) + sum(len(b) - shared_prefix(a, b) for a, b in zip(texts, texts[1:], strict=False))


async def converse(notes: Callable[[int], str]) -> list[RecordedRequest]:
    """12 turns through `Agent.run(session=Session())`, the notes of turn k being `notes(k)`: each
    call must carry its turn's notes as the newest ones, and none may enter the history."""
    async with FakeOpenAIServer(handler=model_turns) as fake:
        agent = Agent(model="m", base_url=fake.base_url, tools=[add_order], max_retries=0)
        session = Session()
        try:
            for turn in range(12):
                session.notes = notes(turn)
                assert (await agent.run(f"order {turn}: 1200 + 35 yuan", session=session)).ok
        finally:
            await agent.aclose()
    for request in fake.requests:
        assert request.messages[0] == {"role": "system", "content": agent.system_prompt}
        asked = [m for m in without_context(request.messages) if m["role"] == "user"][-1]["content"]
        assert newest_notes(request) == notes(int(asked.split()[1].rstrip(":")))
    assert all(m["role"] != "user" or m["content"].startswith("order") for m in session.messages)
    return list(fake.requests)


async def test_agent_run_with_a_session_keeps_the_prefix_and_sends_the_notes() -> None:
    """`Agent.run(session=Session())`: notes that stay the same are given once and cost almost
    nothing (≤ 1.1× the uncached characters of the same conversation without notes); notes that
    change every fourth turn reach every call as the newest, every request a pure append, and cost
    only the context messages that say them again."""
    floor = uncached(await converse(lambda turn: ""))
    stable = await converse(lambda turn: "Conversation state: orders in yuan, East China only.")
    assert mean(check_prefix(stable)) >= 0.9
    assert len(contexts_of(stable[-1].messages)) == 1
    assert uncached(stable) <= 1.1 * floor, (uncached(stable), floor)

    def changing(turn: int) -> str:
        return f"Conversation state: {turn // 4 * 4} order(s) confirmed so far."

    anchored = await converse(changing)
    assert all(r >= 0.9 for r in check_prefix(anchored))
    assert contexts_of(anchored[-1].messages) == [changing(0), changing(4), changing(8)]
    given = sum(len(changing(turn)) + len(CONTEXT_HEADING) + 40 for turn in (0, 4, 8))
    assert uncached(anchored) <= floor + given, (uncached(anchored), floor)


async def test_hints_are_given_once_and_forgotten_notes_are_taken_back() -> None:
    """Hints (long-term examples, triggered skills) are reference lines: each `- ` line under its
    heading is given once and stays; a new one comes alone under its heading. Notes that became
    empty (the state was forgotten) take back every context message, so nothing forgotten stays
    in front of the model."""
    heading = "Past results of this user's tasks:"
    hints = [[], ["- A → 1"], ["- A → 1", "- B → 2"], ["- B → 2"], ["- C → 3", "- A → 1"]]
    async with FakeOpenAIServer() as fake:
        fake.script(*[FakeReply.text(f"ok {k}") for k in range(7)])
        agent = Agent(model="m", base_url=fake.base_url, max_retries=0)
        session = Session(notes="Conversation state: budget 5000.")
        try:
            for k, lines in enumerate(hints):
                session.hints = "\n".join([heading, *lines]) if lines else ""
                assert (await agent.run(f"message {k}", session=session)).ok
            given = contexts_of(fake.requests[-1].messages)
            session.notes, session.hints = "", ""  # /forget: the state is gone
            assert (await agent.run("message 5", session=session)).ok
            session.notes = "Conversation state: budget 6000."
            assert (await agent.run("message 6", session=session)).ok
        finally:
            await agent.aclose()
    assert given == [
        "Conversation state: budget 5000.",
        f"{heading}\n- A → 1",
        f"{heading}\n- B → 2",
        f"{heading}\n- C → 3",
    ]
    assert check_prefix(fake.requests[:5]) and contexts_of(fake.requests[5].messages) == []
    assert contexts_of(fake.requests[6].messages) == ["Conversation state: budget 6000."]


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


async def test_serve_gives_the_context_once_across_a_restart_and_forget_takes_it_back(tmp_path: Path) -> None:
    """Through `serve` on SQLite: the remembered fact is given in one context message, which stays
    where it was given on later turns, also after `serve` is restarted (the state keeps where it
    stands); `/forget` takes it back, so the fact leaves the prompt at once."""
    async with FakeOpenAIServer(handler=model_turns) as fake:
        config = write_config(tmp_path, fake, long_term=False)
        async with gateway_for(config) as url:
            await say(url, GOAL)
            await say(url, "order 1: 1200 + 35 yuan")
        async with gateway_for(config) as url:  # a restart: nothing of the turn's context in memory
            await say(url, "order 2: 1200 + 35 yuan")
            assert (await say(url, "/forget")).startswith("Cleared 1 item")
            await say(url, "order 3: 1200 + 35 yuan")
        requests = agent_requests(fake)
    starts = [r for r in requests if r.messages[-1]["role"] == "user"]
    order1, order2, order3 = starts[1:]
    assert [FACT in c for c in contexts_of(order1.messages)] == [True]
    # across the restart: every request continues the one before
    check_prefix(requests[requests.index(order1) : requests.index(order3)])
    assert contexts_of(order2.messages) == contexts_of(order1.messages)
    # forgotten: gone from every context message (the chat history itself is kept, as /forget says)
    assert contexts_of(order2.messages) and not any(FACT in c for c in contexts_of(order3.messages))
