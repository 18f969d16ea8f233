"""What reaches the model on each call: the window, the pinned goal, folding, the token budget.

Long scripted conversations (100+ turns, tool-heavy) run through `AgentRunner`; every request the
scripted model received is checked: system prompt first, the goal present, at most N turns of
history, every `tool_calls` message followed by all of its results, history + notes within budget.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hermes_core import Agent, tool
from hermes_core.gateway.runner import AgentRunner
from hermes_core.kernel.messages import Message
from hermes_core.sessions import (
    SUMMARY_INSTRUCTIONS,
    ConversationMemory,
    InMemorySessionStore,
    estimate_tokens,
    prompt_bytes,
    split_turns,
)
from hermes_core.sessions.context import history_tokens, message_tokens, newest_turns
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.scripted import RecordedCall
from prompt_parts import context_of, without_context

GOAL = "Build the quarterly sales report for East China, step by step"


@tool
def lookup(key: str) -> str:
    """Look a record up by key."""
    return f"record {key}: " + "quarterly figures and notes " * 8


def is_summary(messages: list[Message]) -> bool:
    return messages[0]["content"] == SUMMARY_INSTRUCTIONS


def tool_heavy(summary: Any = "Report on East China sales; figures looked up so far.") -> ScriptedModel:
    """Turn k: k % 3 == 0 → two parallel calls; 1 → two calls one after the other; 2 → plain text."""

    def answer(messages: list[Message], tools: Any) -> Any:
        if is_summary(messages):
            return summary(messages) if callable(summary) else summary
        user = max(i for i, m in enumerate(messages) if m["role"] == "user")
        k = int(messages[user]["content"].split()[-1]) if messages[user]["content"] != GOAL else 0
        done = sum(1 for m in messages[user:] if m["role"] == "tool")
        if k % 3 == 0 and done == 0:
            return call("lookup", {"key": f"{k}a"}, ("lookup", {"key": f"{k}b"}))
        if k % 3 == 1 and done < 2:
            return call("lookup", {"key": f"{k}-{done}"})
        return reply(f"answer to turn {k}")

    return ScriptedModel(answer)


async def converse(runner: AgentRunner, turns: int, conversation: str = "c1") -> list[str]:
    replies = [await runner.reply(conversation, GOAL)]
    for k in range(1, turns):
        replies.append(await runner.reply(conversation, f"next step {k}"))
    return replies


def agent_calls(model: ScriptedModel) -> list[RecordedCall]:
    return [c for c in model.calls if not is_summary(c.messages)]


def assert_tool_results_follow_calls(messages: list[Message]) -> None:
    """The rule every OpenAI-compatible API enforces: each call answered, right after its message."""
    waiting: set[str] = set()
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in waiting, f"tool result without its call: {message}"
            waiting.discard(message["tool_call_id"])
            continue
        assert not waiting, f"tool calls {waiting} not followed by their results"
        if message["role"] == "assistant" and message.get("tool_calls"):
            waiting = {c["id"] for c in message["tool_calls"]}
    assert not waiting


def history_of(messages: list[Message]) -> list[Message]:
    """The history part of a request: between the system message and the turn's context (or the
    current user message)."""
    messages = without_context(messages)
    current = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return messages[1:current]


@pytest.mark.parametrize("window_turns", [4, 10])
async def test_long_tool_heavy_conversation_keeps_goal_window_and_tool_pairs(window_turns: int) -> None:
    model = tool_heavy()
    agent = Agent(model=model, tools=[lookup])
    memory = ConversationMemory(InMemorySessionStore(), window_turns=window_turns, budget_tokens=1500)
    runner = AgentRunner(agent, memory)
    replies = await converse(runner, 120)
    assert replies[-1] == "answer to turn 119"
    calls = agent_calls(model)
    assert len(calls) == 120 + 40 * 1 + 40 * 2  # one answer per turn, plus one call per tool round
    for recorded in calls:
        messages = recorded.messages
        assert messages[0] == {"role": "system", "content": agent.system_prompt}  # the same on every call
        assert GOAL in json.dumps(messages, ensure_ascii=False)  # in the window, or pinned in the notes
        history = history_of(messages)
        assert sum(1 for m in history if m["role"] == "user") <= window_turns
        assert_tool_results_follow_calls(messages)
    state = (await memory.store.load("c1")).state
    assert state.goal == GOAL and len(state.folds) >= 10
    assert all(0 < len(fold.summary) <= 200 and fold.fallback is None for fold in state.folds)


async def test_fold_summary_is_capped_stored_and_injected() -> None:
    model = tool_heavy(summary=lambda messages: "S" * 450)  # a model that ignores the length limit
    memory = ConversationMemory(InMemorySessionStore(), window_turns=6)
    await converse(AgentRunner(Agent(model=model, tools=[lookup]), memory), 30)
    state = (await memory.store.load("c1")).state
    assert state.folds and all(len(fold.summary) <= 200 for fold in state.folds)
    assert len(state.summary) == 200 and state.summary.endswith("…")
    summary_requests = [c for c in model.calls if is_summary(c.messages)]
    assert len(summary_requests) == len(state.folds) and all(c.tools is None for c in summary_requests)
    assert "Summary so far: " + state.folds[0].summary in summary_requests[1].messages[1]["content"]
    assert state.summary in context_of(agent_calls(model)[-1].messages)


@pytest.mark.parametrize("failure", [RuntimeError("summary service down"), ""], ids=["raises", "empty"])
async def test_failing_summary_falls_back_to_truncation_and_the_turn_succeeds(failure: Any) -> None:
    model = tool_heavy(summary=failure)
    memory = ConversationMemory(InMemorySessionStore(), window_turns=4)
    replies = await converse(AgentRunner(Agent(model=model, tools=[lookup]), memory), 25)
    assert replies == ["answer to turn 0", *(f"answer to turn {k}" for k in range(1, 25))]
    state = (await memory.store.load("c1")).state
    assert state.folds and all(fold.summary == "" and fold.fallback for fold in state.folds)
    assert state.summary == "" and state.folded > 0
    for recorded in agent_calls(model):
        assert sum(1 for m in history_of(recorded.messages) if m["role"] == "user") <= 4
        assert "Summary of earlier turns" not in context_of(recorded.messages)
        assert GOAL in json.dumps(recorded.messages, ensure_ascii=False)
        assert_tool_results_follow_calls(recorded.messages)


async def test_without_folding_old_turns_are_truncated_and_no_summary_is_asked() -> None:
    model = tool_heavy()
    memory = ConversationMemory(InMemorySessionStore(), window_turns=5, fold=False)
    await converse(AgentRunner(Agent(model=model, tools=[lookup]), memory), 40)
    assert not any(is_summary(c.messages) for c in model.calls)
    state = (await memory.store.load("c1")).state
    assert state.folds == [] and state.folded > 0 and state.goal == GOAL
    last = agent_calls(model)[-1].messages
    assert sum(1 for m in history_of(last) if m["role"] == "user") == 5
    assert f"(pinned): {GOAL}" in context_of(last)


@pytest.mark.parametrize("budget", [400, 900, 2000])
async def test_history_and_state_stay_within_the_token_budget(budget: int) -> None:
    model = tool_heavy(summary="摘要：已经查询了华东地区的季度数据。" * 3)
    memory = ConversationMemory(InMemorySessionStore(), window_turns=10, budget_tokens=budget)
    runner = AgentRunner(Agent(model=model, tools=[lookup]), memory)
    await converse(runner, 60)
    for recorded in agent_calls(model):
        notes = context_of(recorded.messages)
        used = history_tokens(history_of(recorded.messages)) + estimate_tokens(notes)
        assert used <= budget, f"{used} tokens of history and state > budget {budget}"
    assert "摘要" in context_of(agent_calls(model)[-1].messages)  # the budget left room for the summary


def test_a_cut_inside_a_tool_call_group_takes_the_whole_turn_or_none() -> None:
    calls = call("lookup", {"key": "a"}, ("lookup", {"key": "b"}))
    turn = [
        {"role": "user", "content": "look up a and b"},
        calls.to_message(),
        *({"role": "tool", "tool_call_id": c.id, "content": "x" * 400} for c in calls.tool_calls),
        {"role": "assistant", "content": "done"},
    ]
    later = [{"role": "user", "content": "thanks"}, {"role": "assistant", "content": "welcome"}]
    turns = split_turns([*turn, *later])
    assert turns == [turn, later]
    tail = history_tokens(turn[-2:]) + history_tokens(later)  # a message-count cut would keep these
    assert newest_turns(turns, 10, tail) == [later]
    assert newest_turns(turns, 10, history_tokens(turn) + history_tokens(later)) == [turn, later]
    assert newest_turns(turns, 1, 10_000) == [later]


def test_token_estimate_needs_no_tokenizer() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd" * 10) == 10
    assert estimate_tokens("你好世界") == 4
    assert estimate_tokens("预算 ≤ 5000 元") == 3 + (len(" ≤ 5000 ") + 3) // 4
    assert message_tokens({"role": "user", "content": "abcd"}) == 4 + 1
    tool_call = call("lookup", {"key": "k"}).to_message()
    assert message_tokens(tool_call) == 4 + 4 + estimate_tokens('lookup{"key": "k"}')


async def test_prompt_bytes_is_the_size_of_the_request_body() -> None:
    from hermes_core.testing.fake_openai import FakeOpenAIServer

    async with FakeOpenAIServer() as fake:
        agent = Agent(model="m", base_url=fake.base_url, tools=[lookup], max_retries=0)
        try:
            await agent.run("查一下 key 华东")
        finally:
            await agent.aclose()
    for request in fake.requests:
        extra = len(request.raw) - prompt_bytes(request.messages, request.tools, model="m")
        assert 0 < extra <= len(', "temperature": 0.2')  # only the sampling options are left out


async def test_a_new_conversation_gets_no_notes() -> None:
    model = ScriptedModel([reply("hi!")])
    runner = AgentRunner(Agent(model=model), ConversationMemory(InMemorySessionStore()))
    assert await runner.reply("c", "hello") == "hi!"
    assert model.calls[0].messages == [
        {"role": "system", "content": runner.agent.system_prompt},
        {"role": "user", "content": "hello"},
    ]  # no context message
