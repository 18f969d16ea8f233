"""Sessions that persist (S1, S5), the state snapshot (S4), /memory and /forget, the long-term hook."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes_core import Agent, tool
from hermes_core.gateway.runner import AgentRunner
from hermes_core.kernel.messages import Message
from hermes_core.sessions import (
    REMEMBER,
    SUMMARY_INSTRUCTIONS,
    ConversationMemory,
    ConversationState,
    InMemorySessionStore,
    SessionStore,
    SQLiteSessionStore,
)
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from prompt_parts import context_of, without_context
from serve_process import clean_environ
from test_gateway import post, running_gateway
from wire_schema import assert_valid_requests


@tool
def query_sales(region: str) -> dict:
    """Query this quarter's sales of a region."""
    return {"region": region, "sales": 1234}


def sqlite_memory(path: Path, **options: Any) -> ConversationMemory:
    return ConversationMemory(SQLiteSessionStore(path / "gateway.db"), **options)


async def test_history_survives_a_restart(tmp_path: Path) -> None:
    first = ScriptedModel([call("query_sales", {"region": "华东"}), reply("华东 1234"), reply("好的")])
    runner = AgentRunner(Agent(model=first, tools=[query_sales]), sqlite_memory(tmp_path))
    assert await runner.reply("feishu:ou_1", "查华东销售") == "华东 1234"
    assert await runner.reply("feishu:ou_1", "记住这个数") == "好的"
    await runner.aclose()

    second = ScriptedModel([reply("上次是 1234"), reply("你好")])  # a new process: new agent and store
    runner = AgentRunner(Agent(model=second, tools=[query_sales]), sqlite_memory(tmp_path))
    try:
        assert await runner.reply("feishu:ou_1", "上次的数是多少？") == "上次是 1234"
        assert await runner.reply("feishu:ou_2", "你好呀") == "你好"
    finally:
        await runner.aclose()
    sent = second.calls[0].messages
    roles = ["system", "user", "assistant", "tool", "assistant", "user", "assistant", "user"]
    assert [m["role"] for m in sent] == roles
    assert sent[3]["tool_call_id"] == sent[2]["tool_calls"][0]["id"] and "1234" in sent[3]["content"]
    assert len(second.calls[1].messages) == 2  # another conversation: nothing of ou_1's history
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        version = db.execute("SELECT version FROM schema_versions WHERE component = 'sessions'").fetchone()
        assert version == (3,)  # 2: session_turns, each turn stored once; 3: messages indexed by time
        assert db.execute("SELECT COUNT(*) FROM session_messages").fetchone()[0] == 4 + 2 + 2 + 2


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_store_round_trip_and_atomic_state_updates(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """On both stores: SQLite, and PostgreSQL on a private server (tests/pg_server.py)."""
    if kind == "sqlite":
        store: SessionStore = SQLiteSessionStore(tmp_path / "gateway.db")
    else:
        from hermes_core.postgres.sessions import PostgresSessionStore

        store = PostgresSessionStore(request.getfixturevalue("pg_url"))
    try:
        empty = await store.load("c")
        assert empty.messages == [] and empty.state == ConversationState()
        turn: list[Message] = [
            {"role": "user", "content": "预算 ≤ 5000"},
            {"role": "assistant", "content": ""},
        ]
        await store.append("c", turn)
        await store.append("c", [{"role": "user", "content": "next"}])
        state = await store.update_state("c", lambda s: s.facts.append("budget ≤ 5000"))
        state = await store.update_state("c", lambda s: setattr(s, "folded", 2))
        assert state.facts == ["budget ≤ 5000"] and state.folded == 2
        loaded = await store.load("c")
        assert loaded.messages == [{"role": "user", "content": "next"}] and loaded.state == state

        def clear_then_fail(state: ConversationState) -> None:
            state.facts.clear()
            raise ZeroDivisionError

        with pytest.raises(ZeroDivisionError):  # a failing change writes nothing
            await store.update_state("c", clear_then_fail)
        assert (await store.load("c")).state.facts == ["budget ≤ 5000"]
    finally:
        await store.close()


def remember_then_chat(request: RecordedRequest) -> FakeReply:
    """The fake model: records the constraint of turn 1 through `remember`, then chats."""
    messages = request.messages
    if messages[0]["content"] == SUMMARY_INSTRUCTIONS:
        return FakeReply.text("用户在做华东销售分析，已讨论多轮。")
    if messages[-1]["role"] == "tool":
        return FakeReply.text("好的，已记下。")
    if "只要华东" in messages[-1]["content"]:
        return FakeReply.tool_call(REMEMBER, {"note": "只用华东地区的数据", "kind": "fact"})
    return FakeReply.text("第 " + messages[-1]["content"].split()[-1] + " 轮的回答")


async def test_a_constraint_from_turn_1_is_still_in_the_prompt_at_turn_60(tmp_path: Path) -> None:
    async with FakeOpenAIServer(handler=remember_then_chat) as fake:
        agent = Agent(model="m", base_url=fake.base_url, max_retries=0)
        runner = AgentRunner(agent, sqlite_memory(tmp_path, window_turns=6))
        try:
            assert await runner.reply("u1", "分析销售数据，只要华东地区的") == "好的，已记下。"
            for turn in range(2, 61):
                await runner.reply("u1", f"继续 {turn}")
            state = (await runner.memory.store.load("u1")).state
        finally:
            await runner.aclose()
            await agent.aclose()
    turn_60 = [r for r in fake.requests if r.messages[0]["content"] != SUMMARY_INSTRUCTIONS][-1]
    assert turn_60.messages[-1]["content"] == "继续 60"
    context = context_of(turn_60.messages)
    # the fact and the pinned goal
    assert "只用华东地区的数据" in context and "分析销售数据，只要华东地区的" in context
    assert "用户在做华东销售分析" in context  # the fold's summary
    assert turn_60.messages[0] == {"role": "system", "content": agent.system_prompt}
    assert all(m["content"] != "分析销售数据，只要华东地区的" for m in turn_60.messages[1:])  # turn 1 folded
    assert state.facts == ["只用华东地区的数据"] and len(state.folds) >= 5
    assert turn_60.tools and turn_60.tools[0]["function"]["name"] == REMEMBER
    assert_valid_requests(fake.requests)


async def test_memory_and_forget_in_chinese_and_english_through_the_webhook(tmp_path: Path) -> None:
    def model_answer(messages: list[Message], tools: Any) -> Any:
        text = [m["content"] for m in messages if m["role"] == "user"][-1]
        if messages[-1]["role"] == "tool":
            return "好的" if "预算" in text else "Noted."
        if "预算" in text:
            return call(REMEMBER, {"note": "预算不超过 5000 元"}, (REMEMBER, {"note": "只看华东数据"}))
        if "East China" in text:
            return call(REMEMBER, {"note": "only East China data"})
        return "…"

    model = ScriptedModel(model_answer)
    runner = AgentRunner(Agent(model=model), sqlite_memory(tmp_path))
    try:
        async with running_gateway(tmp_path, runner) as (_, url):

            async def say(user: str, text: str) -> str:
                status, body = await post(f"{url}/webhook", {"message": text, "user_id": user})
                assert status == 200, body
                return str(body["reply"])

            assert await say("zh", "/memory") == "I have not noted anything for this conversation yet."
            assert await say("zh", "帮我做报表：预算不超过5000元，只看华东数据") == "好的"
            listing = await say("zh", "/memory")
            assert "事实与约束" in listing and "1. 预算不超过 5000 元\n2. 只看华东数据" in listing
            assert await say("zh", "/forget 1") == "已删除第 1 条：预算不超过 5000 元"
            assert "1. 只看华东数据" in await say("zh", "/记忆")
            assert "没有第 7 条" in await say("zh", "/忘记 7")
            assert "已清除" in await say("zh", "/forget")
            assert await say("zh", "/memory") == "这次对话我还没有记下任何要点。"

            assert await say("en", "Only East China data, please") == "Noted."
            listing = await say("en", "/memory")
            assert listing.startswith("What I remember") and "1. only East China data" in listing
            assert await say("en", "/forget 2") == "There is no item 2. Send /memory to see the list."
            assert await say("en", "/forget 1") == "Removed item 1: only East China data"
            assert await say("en", "/memory") == "I have not noted anything for this conversation yet."
            assert "/forget N" in await say("en", "/forget everything")
    finally:
        await runner.aclose()
    seen = json.dumps([c.messages for c in model.calls], ensure_ascii=False)
    assert "/memory" not in seen and "/forget" not in seen and "/记忆" not in seen  # never reached the model


async def test_remember_keeps_steps_dedups_and_refuses_when_full() -> None:
    memory = ConversationMemory(InMemorySessionStore(), budget_tokens=200)
    assert await memory.remember("c", "fetch the data", "pending") == "noted (pending): fetch the data"
    await memory.remember("c", "make the chart", "pending")
    await memory.remember("c", "Fetch the data", "done")
    await memory.remember("c", "budget ≤ 5000")
    await memory.remember("c", "budget   ≤ 5000")  # the same fact again: kept once
    state = (await memory.store.load("c")).state
    assert state.facts == ["budget ≤ 5000"]
    assert (state.pending, state.done) == (["make the chart"], ["Fetch the data"])
    from hermes_core.tools import ToolError

    with pytest.raises(ToolError, match="memory is full"):
        for n in range(20):
            await memory.remember("c", f"constraint number {n} that takes a little room")
    with pytest.raises(ToolError, match="inside a conversation"):
        await memory.remember(None, "x")
    with pytest.raises(ToolError, match="1 to 200 characters"):
        await memory.remember("c", "x" * 201)
    assert "budget ≤ 5000" in (await memory.store.load("c")).state.facts


class FakeLongTerm:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.recorded: list[tuple[str, str, Any, str]] = []
        self.queries: list[tuple[str, str, int]] = []

    async def relevant(self, owner: str, query: str, k: int) -> list[Any]:
        self.queries.append((owner, query, k))
        if self.fail:
            raise RuntimeError("index broken")
        return ["x"]

    def format_examples(self, outcomes: list[Any], language: str = "en") -> str:
        return "Past results:\n- 2026-11-01 query_sales(华东) → 1234"

    async def record(self, owner: str, task_type: str, params: Any, result: str) -> None:
        if self.fail:
            raise RuntimeError("disk full")
        self.recorded.append((owner, task_type, params, result))


@pytest.mark.parametrize("fail", [False, True], ids=["working", "failing"])
async def test_long_term_hook_gets_finished_tasks_and_adds_examples(fail: bool) -> None:
    @tool
    def make_report(title: str) -> str:
        """Make a report."""
        return "report.pdf"

    long_term = FakeLongTerm(fail=fail)
    model = ScriptedModel(
        [
            call(
                "query_sales", {"region": "华东"}, ("make_report", {"title": "Q3"}), (REMEMBER, {"note": "Q"})
            ),
            reply("done " + "x" * 600),
            reply("hello"),
        ]
    )
    memory = ConversationMemory(InMemorySessionStore(), long_term=long_term, examples=2)
    runner = AgentRunner(Agent(model=model, tools=[query_sales, make_report]), memory)
    assert (await runner.reply("feishu:ou_9", "华东 Q3 报表")).startswith("done")
    assert await runner.reply("feishu:ou_9", "thanks a lot") == "hello"
    assert long_term.queries[0] == ("feishu:ou_9", "华东 Q3 报表", 2)
    if fail:
        assert long_term.recorded == [] and "Past results" not in context_of(model.calls[0].messages)
        return
    assert "2026-11-01 query_sales(华东)" in context_of(model.calls[0].messages)
    [(owner, task_type, params, result)] = long_term.recorded  # the greeting used no tool: not recorded
    assert (owner, task_type) == ("feishu:ou_9", "make_report+query_sales")
    assert params == [{"region": "华东"}, {"title": "Q3"}] and len(result) == 500


async def test_serve_wires_sqlite_sessions_and_long_term_memory(tmp_path: Path) -> None:
    from hermes_core.config import Settings
    from hermes_core.gateway.server import build_memory

    settings = Settings.model_validate(
        {"gateway": {"data_dir": str(tmp_path)}, "memory": {"window_turns": 1, "fold": False}}
    )
    memory = build_memory(settings)
    model = ScriptedModel(
        [call("query_sales", {"region": "East China"}), reply("1234"), reply("again"), reply("once more")]
    )
    runner = AgentRunner(Agent(model=model, tools=[query_sales]), memory)
    try:
        await runner.reply("u", "East China sales")
        await runner.reply("u", "East China sales again")
        await runner.reply("u", "East China sales, once more")
    finally:
        await runner.aclose()
    assert isinstance(memory.store, SQLiteSessionStore) and memory.window_turns == 1
    # while the window shows the first turn's reply, its outcome is no example: the model sees it there
    assert "query_sales" not in context_of(model.calls[-2].messages)
    assert "1234" in json.dumps(model.calls[-2].messages)
    # once the turn has left the window, the outcome comes back as a dated example
    assert "1234" not in json.dumps(without_context(model.calls[-1].messages))
    given = context_of(model.calls[-1].messages)
    assert "query_sales" in given and "1234" in given


def test_memory_settings_are_validated(tmp_path: Path) -> None:
    from hermes_core.config import ConfigError, load_settings

    path = tmp_path / "hermes.yaml"
    path.write_text("memory:\n  window_turns: 6\n  fold: false\n", encoding="utf-8")
    settings = load_settings(path, env={}, dotenv=None)
    memory = settings.memory
    assert (memory.window_turns, memory.fold, memory.budget_tokens) == (6, False, 8000)
    path.write_text("memory:\n  window_turns: 0\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="memory.window_turns"):
        load_settings(path, env={}, dotenv=None)


@pytest.mark.slow
def test_chat_repl_answers_memory_commands_without_the_model() -> None:
    env = clean_environ()
    done = subprocess.run(
        [sys.executable, "-m", "hermes_core", "chat"],
        input="/memory\n/记忆\nquit\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "I have not noted anything" in done.stdout and "还没有记下" in done.stdout
