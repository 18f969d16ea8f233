"""One scripted scenario per behaviour of the agent loop (K1–K7)."""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time

import pytest

from hermes_core import Agent, ModelUnavailable, Session, ToolContext, ToolError, tool
from hermes_core.kernel.replies import fixed_reply
from hermes_core.models import ModelRequestRejected
from hermes_core.testing import ScriptedModel, call, reply
from virtual_clock import VirtualClock


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def tool_messages(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["role"] == "tool"]


async def test_tool_result_goes_back_with_matching_id() -> None:
    model = ScriptedModel([call("add", {"a": 2, "b": 3}), reply("5")])
    result = await Agent(model=model, tools=[add]).run("2+3?")
    assert result.reply == "5" and result.ok
    assistant = result.messages[2]
    tool_msg = result.messages[3]
    assert tool_msg == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": "5"}
    # the second model call saw the tool result
    assert model.calls[1].messages[-1]["content"] == "5"
    assert model.calls[0].tools and model.calls[0].tools[0]["function"]["name"] == "add"
    assert result.usage.total_tokens == 30 and result.model_calls == 2


async def test_parallel_calls_run_concurrently_and_merge_in_call_order() -> None:
    """The two calls' waits overlap: on a virtual clock (tests/virtual_clock.py), so that the
    0.45 s window is measured in the tools' own seconds, not in a loaded machine's."""
    finished: list[str] = []
    clock = VirtualClock()

    @tool
    async def slow(label: str, seconds: float) -> str:
        """Wait, then echo the label."""
        await clock.sleep(seconds)
        finished.append(label)
        return label

    model = ScriptedModel(
        [
            call("slow", {"label": "first", "seconds": 0.4}, ("slow", {"label": "second", "seconds": 0.1})),
            reply("ok"),
        ]
    )
    started = clock()
    [result] = await clock.run(Agent(model=model, tools=[slow]).run("go"))
    elapsed = clock() - started
    assert elapsed < 0.45, elapsed  # sequential would take 0.5 s
    assert finished == ["second", "first"]  # really ran at the same time
    assert [m["content"] for m in tool_messages(result.messages)] == ["first", "second"]


async def test_parallel_sync_tools_do_not_share_state() -> None:
    current: contextvars.ContextVar[str] = contextvars.ContextVar("current", default="none")
    seen: dict[str, tuple[str, list[str], str]] = {}

    @tool
    def mark(label: str, items: list[str], context: ToolContext) -> str:
        """Record what this call sees."""
        current.set(label)
        context.scratch["label"] = label
        items.append(label)  # mutating its own arguments must not leak into another call
        time.sleep(0.05)  # long enough for the two calls to overlap
        seen[label] = (context.scratch["label"], list(items), current.get())
        return label

    model = ScriptedModel(
        [call("mark", {"label": "a", "items": []}, ("mark", {"label": "b", "items": []})), reply("done")]
    )
    await Agent(model=model, tools=[mark]).run("mark")
    assert seen == {"a": ("a", ["a"], "a"), "b": ("b", ["b"], "b")}
    assert current.get() == "none"


async def test_max_turns_gives_a_closing_message() -> None:
    counter = iter(range(100))
    model = ScriptedModel(lambda messages, tools: call("add", {"a": next(counter), "b": 1}))
    result = await Agent(model=model, tools=[add], max_turns=3, max_tool_calls=50).run("loop forever")
    assert result.stop_reason == "max_turns"
    assert result.reply == fixed_reply("max_turns", "en")
    assert len(model.calls) == 3


async def test_tool_call_budget_stops_the_task() -> None:
    runs: list[int] = []

    @tool
    def count(n: int) -> int:
        """Count a call."""
        runs.append(n)
        return n

    ten = call("count", {"n": 0}, *[("count", {"n": i}) for i in range(1, 10)])
    model = ScriptedModel([ten, reply("never reached")])
    result = await Agent(model=model, tools=[count]).run("数一数")
    assert sorted(runs) == list(range(8))  # default cap: 8 per task
    assert result.stop_reason == "max_tool_calls"
    assert result.reply == fixed_reply("max_tool_calls", "zh")
    assert len(tool_messages(result.messages)) == 10  # every call still answered (wire stays valid)


async def test_identical_repeated_call_is_not_executed() -> None:
    """A read repeated with nothing changed since is a loop (a write would have moved the state)."""
    runs: list[int] = []

    @tool(level=0)
    def lookup(key: str) -> str:
        """Look a key up."""
        runs.append(1)
        return "value"

    model = ScriptedModel(
        [call("lookup", {"key": "x"}), call("lookup", '{ "key" : "x" }'), reply("the value is value")]
    )
    result = await Agent(model=model, tools=[lookup]).run("look up x")
    assert len(runs) == 1
    refused = json.loads(tool_messages(result.messages)[1]["content"])
    assert "change your strategy" in refused["error"]
    assert result.reply == "the value is value"


async def test_tool_failing_three_times_is_withdrawn() -> None:
    runs: list[int] = []

    @tool
    def flaky(n: int) -> int:
        """Always fails."""
        runs.append(n)
        raise RuntimeError("backend down")

    model = ScriptedModel([call("flaky", {"n": i}) for i in range(4)] + [reply("gave up")])
    result = await Agent(model=model, tools=[flaky, add]).run("try")
    assert runs == [0, 1, 2]  # the fourth call was not executed
    assert "no longer available" in json.loads(tool_messages(result.messages)[3]["content"])["error"]
    offered = [[t["function"]["name"] for t in c.tools or []] for c in model.calls]
    assert offered[:3] == [["flaky", "add"]] * 3 and offered[3] == ["add"]
    assert result.reply == "gave up"


async def test_a_tool_added_or_removed_during_a_task_changes_the_next_offer() -> None:
    """The loop works out the tools it offers once per task, and again only when one changed: a
    tool registered by a call (a plugin loaded on demand) is offered at the next model call, and
    a removed one no longer."""
    agent: Agent

    @tool
    def load_plugin() -> str:
        """Load the multiply tool."""
        agent.register_tool(multiply)
        agent.registry.remove("add")
        return "loaded"

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    model = ScriptedModel([call("load_plugin", {}), call("multiply", {"a": 2, "b": 3}), reply("6")])
    agent = Agent(model=model, tools=[load_plugin, add])
    result = await agent.run("2*3?")
    offered = [[t["function"]["name"] for t in c.tools or []] for c in model.calls]
    assert offered == [["load_plugin", "add"], ["load_plugin", "multiply"], ["load_plugin", "multiply"]]
    assert tool_messages(result.messages)[1]["content"] == "6" and result.reply == "6"


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_tool_timeout_becomes_a_result(kind: str) -> None:
    if kind == "async":

        async def hang() -> str:
            """Never returns in time."""
            await asyncio.sleep(5)
            return "late"
    else:

        def hang() -> str:
            """Never returns in time."""
            time.sleep(1.5)
            return "late"

    model = ScriptedModel([call("hang"), reply("it timed out")])
    started = time.perf_counter()
    result = await Agent(model=model, tools=[tool(hang)], tool_timeout=0.2).run("wait")
    assert time.perf_counter() - started < 1.0
    content = json.loads(tool_messages(result.messages)[0]["content"])
    assert "timed out after 0.2 s" in content["error"]
    assert result.tool_calls[0].error == "timeout" and result.reply == "it timed out"


def test_timeout_works_from_a_worker_thread() -> None:
    @tool(timeout=0.2)
    def hang() -> str:
        """Sleeps too long."""
        time.sleep(1.0)
        return "late"

    results = []

    def worker() -> None:
        model = ScriptedModel([call("hang"), reply("done")])
        results.append(Agent(model=model, tools=[hang]).run_sync("go"))

    thread = threading.Thread(target=worker)
    started = time.perf_counter()
    thread.start()
    thread.join(5)
    assert results and results[0].tool_calls[0].error == "timeout"
    assert time.perf_counter() - started < 1.0


async def test_model_corrects_its_call_after_a_validation_error() -> None:
    model = ScriptedModel([call("add", {"a": "five", "b": 2}), call("add", {"a": "5", "b": 2}), reply("7")])
    result = await Agent(model=model, tools=[add]).run("add five and two")
    first = json.loads(tool_messages(result.messages)[0]["content"])["error"]
    assert "field 'a'" in first and "integer" in first and "'five'" in first
    assert tool_messages(result.messages)[1]["content"] == "7"  # "5" coerced to 5
    assert result.reply == "7"


async def test_unknown_tool_lists_closest_names() -> None:
    model = ScriptedModel([call("ad", {"a": 1, "b": 2}), reply("sorry")])
    result = await Agent(model=model, tools=[add]).run("add")
    error = json.loads(tool_messages(result.messages)[0]["content"])["error"]
    assert "unknown tool 'ad'" in error and "add" in error


async def test_long_results_are_truncated_with_a_marker() -> None:
    @tool
    def dump() -> str:
        """Return a lot of text."""
        return "x" * 10_000

    model = ScriptedModel([call("dump"), reply("ok")])
    result = await Agent(model=model, tools=[dump], max_result_chars=1200).run("dump")
    content = tool_messages(result.messages)[0]["content"]
    assert content.startswith("x" * 1200) and content.endswith("[truncated: shown 1200 of 10000 chars]")
    assert len(content) < 1300


async def test_extractor_compresses_and_results_are_json() -> None:
    @tool(extractor=lambda rows: {"count": len(rows), "first": rows[0]})
    def search(query: str) -> list[dict]:
        """Search records."""
        return [{"id": i, "name": f"记录{i}"} for i in range(500)]

    model = ScriptedModel([call("search", {"query": "all"}), reply("500 records")])
    result = await Agent(model=model, tools=[search]).run("search")
    assert json.loads(tool_messages(result.messages)[0]["content"]) == {
        "count": 500,
        "first": {"id": 0, "name": "记录0"},
    }


async def test_exceptions_and_business_errors_become_tool_results() -> None:
    @tool
    def explode() -> str:
        """Crash."""
        raise ValueError("bad state")

    @tool
    def refuse() -> str:
        """Business error."""
        raise ToolError("account is locked")

    @tool
    def report() -> dict:
        """Error as a value."""
        return {"error": "quota exceeded"}

    model = ScriptedModel(
        [call("explode", "{}", ("refuse", "{}"), ("report", "{}")), reply("problems reported")]
    )
    result = await Agent(model=model, tools=[explode, refuse, report]).run("go")
    errors = [json.loads(m["content"])["error"] for m in tool_messages(result.messages)]
    assert errors == ["tool explode failed: ValueError: bad state", "account is locked", "quota exceeded"]
    assert [o.ok for o in result.tool_calls] == [False, False, False]
    assert result.reply == "problems reported"


@pytest.mark.parametrize("greeting", ["你好", "hello!", "Thanks.", "在吗？"])
async def test_greeting_skips_tool_schemas(greeting: str) -> None:
    model = ScriptedModel([reply("hi there")])
    result = await Agent(model=model, tools=[add]).run(greeting)
    assert model.calls[0].tools is None and result.reply == "hi there"


async def test_non_greeting_gets_tools_and_fast_path_can_be_disabled() -> None:
    model = ScriptedModel([reply("a"), reply("b")])
    await Agent(model=model, tools=[add]).run("hello, what is 2+2?")
    await Agent(model=model, tools=[add], greeting_patterns=()).run("hello")
    assert model.calls[0].tools is not None and model.calls[1].tools is not None


@pytest.mark.parametrize(
    ("error", "key"),
    [(ModelUnavailable("down"), "model_unavailable"), (ModelRequestRejected("bad"), "model_rejected")],
)
async def test_model_failure_gives_a_polite_reply(error: Exception, key: str) -> None:
    result = await Agent(model=ScriptedModel([error]), tools=[add]).run("你能做什么")
    assert result.reply == fixed_reply(key, "zh") and result.stop_reason == key


async def test_session_keeps_history_between_runs() -> None:
    model = ScriptedModel([call("add", {"a": 1, "b": 1}), reply("2"), reply("you asked 1+1")])
    agent = Agent(model=model, tools=[add])
    session = Session()
    await agent.run("1+1?", session=session)
    await agent.run("what did I ask?", session=session)
    roles = [m["role"] for m in model.calls[2].messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert len(session.messages) == 6


async def test_dict_style_entry_and_register_tool() -> None:
    def weather(city: str) -> dict:
        return {"city": city, "temp": 21}

    agent = Agent(model=ScriptedModel([call("get_weather", {"city": "北京"}), reply("21°C")]))
    entry = {
        "description": "Get the weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "handler": weather,
    }
    agent.register_tool(entry, name="get_weather")
    result = await agent.run("北京天气")
    assert json.loads(tool_messages(result.messages)[0]["content"]) == {"city": "北京", "temp": 21}


async def test_empty_model_answer_gets_a_fixed_reply() -> None:
    from hermes_core.kernel.messages import ModelResponse

    result = await Agent(model=ScriptedModel([ModelResponse(content="")])).run("hi there friend")
    assert result.reply == fixed_reply("empty_reply", "en")
