"""The contract of `TraceStore` (observe/traces.py), through the protocol only, for every registered
backend (tests/contracts/conftest.py).

A record is written and read back whole, replaced when its task is recorded again; summaries come
newest first, filtered by failure (a task paused for a person is no failure), conversation, tool
and time, cut where the summary says; a pasted beginning of a task id finds it, taken literally;
pruning forgets old tasks; nothing is stored unredacted; a reopen keeps it all.

How each test was seen to fail: tests/contracts/broken_backends.py has trace stores with one bug
each (a prefix matched with LIKE, paused tasks counted as failures, a record appended instead of
replaced…), and test_contracts_fail_when_broken.py checks that each test here fails against one.
"""

from __future__ import annotations

import json
from typing import Any

from contract_backends import Opener

from hermes_core.observe.traces import TraceStore

SECRET = "sk-proj1234567890abcdefghijKL"
Stores = Opener[TraceStore]
SUMMARY_KEYS = {"task_id", "conversation", "input", "started_at", "finished_at", "stop_reason", "ok", "reply",
                "model_calls", "tool_names", "tokens"}  # fmt: skip


def trace(task_id: str, started_at: float, *, conversation: str = "webhook:alice", ok: bool = True,
          stop_reason: str = "completed", tools: tuple[str, ...] = (), reply: str = "done",
          tokens: int = 30) -> dict[str, Any]:  # fmt: skip
    """A record of the shape Tracer writes (observe/traces.py's docstring)."""
    calls = [
        {"turn": 1, "id": f"c{i}", "name": name, "arguments": "{}", "result": "1", "ok": True, "error": None,
         "elapsed": 0.01, "parsed": True, "started_at": started_at}
        for i, name in enumerate(tools)
    ]  # fmt: skip
    return {
        "task_id": task_id, "conversation": conversation, "channel": "webhook", "caller": None, "model": "m",
        "input": f"input of {task_id}", "history": [], "messages": [{"role": "user", "content": "你好"}],
        "model_calls": [{"turn": 1, "response": {"content": reply}}, {"turn": 2, "response": None}],
        "tool_calls": calls, "approvals": [], "reply": reply, "stop_reason": stop_reason, "ok": ok,
        "usage": {"prompt_tokens": tokens - 10, "completion_tokens": 10, "total_tokens": tokens},
        "timings": {"total": 0.5}, "started_at": started_at, "finished_at": started_at + 0.5, "error": None,
    }  # fmt: skip


async def ids(store: TraceStore, **filters: Any) -> list[str]:
    return [summary["task_id"] for summary in await store.list(**filters)]


async def test_a_record_reads_back_whole(trace_stores: Stores) -> None:
    store = trace_stores()
    record = trace("webhook:m1~abc", 1_000.0, tools=("add",))
    await store.record(record)
    assert await store.get("webhook:m1~abc") == json.loads(json.dumps(record))
    assert await store.get("webhook:m1") is None and await store.get("missing") is None


async def test_a_task_recorded_again_is_replaced(trace_stores: Stores) -> None:
    """A task paused for a person is recorded, then recorded again when it finishes."""
    store = trace_stores()
    await store.record(trace("t1", 1_000.0, ok=False, stop_reason="awaiting_approval", tools=("send",)))
    await store.record(trace("t1", 1_000.0, reply="sent", tools=("add",)))
    found = await store.get("t1")
    assert found is not None and found["reply"] == "sent" and found["ok"] is True
    [summary] = await store.list()
    assert summary["tool_names"] == ["add"] and summary["stop_reason"] == "completed"
    assert await ids(store, tool="send") == []  # the first record's tools went with it


async def test_summaries_newest_first_with_their_fields(trace_stores: Stores) -> None:
    store = trace_stores()
    await store.record(
        trace("t2", 2_000.0, tools=("weather", "add", "weather"), reply="sunny " * 100, tokens=42)
    )
    await store.record(trace("t1", 1_000.0))
    await store.record(trace("t3", 3_000.0, conversation="feishu:oc_1"))
    summaries = await store.list()
    assert [s["task_id"] for s in summaries] == ["t3", "t2", "t1"]
    assert all(set(s) == SUMMARY_KEYS for s in summaries)
    t2 = summaries[1]
    assert (t2["conversation"], t2["input"], t2["ok"], t2["model_calls"], t2["tool_names"], t2["tokens"]) == (
        "webhook:alice", "input of t2", True, 2, ["weather", "add"], 42,
    )  # fmt: skip
    assert (t2["started_at"], t2["finished_at"], t2["stop_reason"]) == (2_000.0, 2_000.5, "completed")
    assert len(t2["reply"]) == 200 and t2["reply"].endswith("…")  # cut in the summary only
    full = await store.get("t2")
    assert full is not None and full["reply"] == "sunny " * 100
    assert await ids(store, limit=2) == ["t3", "t2"]


async def test_summaries_filter_by_failure_conversation_tool_and_time(trace_stores: Stores) -> None:
    store = trace_stores()
    await store.record(trace("ok", 1_000.0, tools=("add",)))
    await store.record(trace("failed", 2_000.0, ok=False, stop_reason="model_unavailable", conversation="b"))
    await store.record(trace("paused", 3_000.0, ok=False, stop_reason="awaiting_approval", tools=("send",)))
    await store.record(trace("asking", 4_000.0, ok=False, stop_reason="awaiting_answer", tools=("clarify",)))
    assert await ids(store, failed=True) == ["failed"]  # a task waiting for a person has not failed
    assert await ids(store, failed=False) == ["asking", "paused", "ok"]
    assert await ids(store, conversation="b") == ["failed"]
    assert await ids(store, tool="send") == ["paused"] and await ids(store, tool="sen") == []
    assert await ids(store, since=2_000.0) == ["asking", "paused", "failed"]  # since: inclusive
    assert await ids(store, until=2_000.0) == ["ok"]  # until: exclusive
    assert await ids(store, since=1_500.0, until=3_500.0, failed=False) == ["paused"]


async def test_a_pasted_beginning_of_an_id_finds_it_literally(trace_stores: Stores) -> None:
    store = trace_stores()
    for task_id in ("webhook:m1~aa", "webhook:m1~ab", "webhook:m2~aa", "feishu:om_%1", "feishu:omX1"):
        await store.record(trace(task_id, 1_000.0))
    assert await store.ids_starting("webhook:m1") == ["webhook:m1~aa", "webhook:m1~ab"]
    assert await store.ids_starting("webhook:") == ["webhook:m1~aa", "webhook:m1~ab", "webhook:m2~aa"]
    assert await store.ids_starting("webhook:", limit=1) == ["webhook:m1~aa"]
    assert await store.ids_starting("feishu:om_") == ["feishu:om_%1"]  # "_" and "%" are no wildcards
    assert await store.ids_starting("WEBHOOK:") == [] and await store.ids_starting("m1") == []


async def test_prune_forgets_the_tasks_started_before(trace_stores: Stores) -> None:
    store = trace_stores()
    await store.record(trace("old", 1_000.0, tools=("add",)))
    await store.record(trace("new", 5_000.0, tools=("add",)))
    await store.prune(1_000.0)  # started before 1000: none
    assert await ids(store) == ["new", "old"]
    await store.prune(2_000.0)
    assert await ids(store) == ["new"] and await store.get("old") is None
    assert await ids(store, tool="add") == ["new"] and await store.ids_starting("o") == []


async def test_nothing_is_stored_unredacted(trace_stores: Stores) -> None:
    store = trace_stores()
    record = trace("t1", 1_000.0, reply=f"your key is {SECRET}")
    record["messages"] = [{"role": "user", "content": f"use {SECRET}"}]
    await store.record(record)
    found = await store.get("t1")
    assert found is not None and SECRET not in json.dumps(found) and "your key is" in found["reply"]
    assert SECRET not in json.dumps(await store.list())


async def test_records_survive_a_reopen(trace_stores: Stores) -> None:
    store = trace_stores()
    await store.record(trace("t1", 1_000.0, tools=("add",)))
    store = await trace_stores.reopen(store)
    assert await ids(store, tool="add") == ["t1"] and await store.ids_starting("t") == ["t1"]
    assert (await store.get("t1") or {}).get("input") == "input of t1"
