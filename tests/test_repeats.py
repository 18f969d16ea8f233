"""Which repeated calls are loops (kernel/guards.py `TaskGuards`): judged across turns, by what could have
changed since. Scripted models drive a real agent over real tools: the workspace file tools, and
the demo MCP server (tests/mcp_demo_server.py) as a stdio subprocess."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes_core import Agent, tool
from hermes_core.kernel.messages import ModelResponse, ToolCall
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from hermes_core.tools.files import Workspace, file_tools
from hermes_core.tools.mcp import MCPConnection

DEMO_SERVER = Path(__file__).with_name("mcp_demo_server.py")


def refusals(result: Any) -> list[tuple[str, str | None]]:
    return [(o.call.name, o.error) for o in result.tool_calls if not o.ok]


def contents(result: Any) -> list[str]:
    return [o.content for o in result.tool_calls]


async def test_four_identical_calls_in_one_turn_all_run() -> None:
    """Attack: "give me four random numbers" — one turn, four identical calls with their own ids.
    The old guard ran one and refused three as repeats."""
    draws: list[int] = []

    @tool
    def random_number() -> int:
        """A random number."""
        draws.append(len(draws))
        return len(draws)

    four = call("random_number", {}, *[("random_number", {})] * 3)
    result = await Agent(model=ScriptedModel([four, reply("1 2 3 4")]), tools=[random_number]).run(
        "4 个随机数"
    )
    assert len(draws) == 4 and refusals(result) == []
    assert sorted(contents(result)) == ["1", "2", "3", "4"]


async def test_a_repeated_call_id_in_one_turn_is_still_refused() -> None:
    """Attack: two calls of one turn share an id (an id names one approval and one journaled
    result): the second is refused even though repeats within a turn are allowed."""
    runs: list[int] = []

    @tool(level=0)
    def ping() -> str:
        """Ping."""
        runs.append(1)
        return "pong"

    twins = ModelResponse(tool_calls=[ToolCall("same", "ping"), ToolCall("same", "ping")])
    result = await Agent(model=ScriptedModel([twins, reply("ok")]), tools=[ping]).run("ping twice")
    assert runs == [1] and refusals(result) == [("ping", "repeated_call_id")]


async def test_write_read_write_read_all_run(tmp_path: Path) -> None:
    """Attack: a read after a write (the reference filesystem server's pattern): write_file →
    read_file → write_file → read_file. The old guard refused the second, identical read."""
    workspace = Workspace(tmp_path)
    read = {"path": "notes.txt"}
    script = [
        call("write_file", {"path": "notes.txt", "content": "draft 1"}),
        call("read_file", read),
        call("write_file", {"path": "notes.txt", "content": "draft 2"}),
        call("read_file", read),
        reply("done"),
    ]
    result = await Agent(model=ScriptedModel(script), tools=file_tools(workspace)).run("write, check, fix")
    assert refusals(result) == []
    reads = [json.loads(o.content) for o in result.tool_calls if o.call.name == "read_file"]
    assert [r["content"] for r in reads] == ["draft 1", "draft 2"]


async def test_the_same_read_twice_with_nothing_between_is_refused(tmp_path: Path) -> None:
    """Attack: a loop — the same read in two turns with no write in between (a regression guard:
    this is the loop the guard exists for, refused before and after)."""
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    read = {"path": "notes.txt"}
    script = [call("read_file", read), call("read_file", read), reply("hello")]
    result = await Agent(model=ScriptedModel(script), tools=file_tools(Workspace(tmp_path))).run("read")
    assert refusals(result) == [("read_file", "repeated_call")]
    assert "nothing has changed since" in json.loads(result.tool_calls[1].content)["error"]


async def test_a_failed_write_changes_nothing_so_the_read_is_still_a_repeat(tmp_path: Path) -> None:
    """Attack: a write that fails between two identical reads does not make the second read new:
    only a state-changing call that succeeded counts."""
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    read = {"path": "notes.txt"}
    script = [
        call("read_file", read),
        call("write_file", {"path": "../outside.txt", "content": "x"}),  # leaves the workspace: refused
        call("read_file", read),
        reply("hello"),
    ]
    result = await Agent(model=ScriptedModel(script), tools=file_tools(Workspace(tmp_path))).run("read")
    assert [name for name, _ in refusals(result)] == ["write_file", "read_file"]
    assert refusals(result)[1] == ("read_file", "repeated_call")


async def test_toggle_on_off_on_all_run() -> None:
    """Attack: toggling on, off and on again: the third call is identical to the first, but the
    second changed the state in between. The old guard refused it."""
    switched: list[str] = []

    @tool
    def set_light(state: str) -> str:
        """Switch the light on or off."""
        switched.append(state)
        return f"light {state}"

    script = [call("set_light", {"state": s}) for s in ("on", "off", "on")] + [reply("on again")]
    result = await Agent(model=ScriptedModel(script), tools=[set_light]).run("blink")
    assert switched == ["on", "off", "on"] and refusals(result) == []


def demo_server(log: Path) -> MCPConnection:
    """The demo MCP server, every tool configured level 0: only the server's own readOnlyHint
    keeps a tool counted as read-only."""
    env = {"DEMO_CALL_LOG": str(log)}
    return MCPConnection("demo", command=sys.executable, args=[str(DEMO_SERVER)], env=env, level=0)


def served(log: Path) -> list[str]:
    return [json.loads(line)["tool"] for line in log.read_text(encoding="utf-8").splitlines()]


async def test_mcp_toggle_without_arguments_flips_twice_and_a_status_check_follows(tmp_path: Path) -> None:
    """Attack (the reference "everything" MCP server's `toggle-logging`, which takes no arguments):
    toggle on, toggle off, check the status, toggle on, check again. Every toggle is identical to
    the one before and every status check to the one before; each reads or flips a state that a
    successful state-changing call moved (a level-0 MCP tool without `readOnlyHint: true` counts as
    one). The old guard refused the second toggle and the second status check."""
    log = tmp_path / "calls.jsonl"
    script = [
        call("toggle_logging"),
        call("toggle_logging"),
        call("logging_status"),
        call("toggle_logging"),
        call("logging_status"),
        call("logging_status"),  # nothing changed since the last check: this one is a loop
        reply("logging is on"),
    ]
    async with demo_server(log) as server:
        result = await Agent(model=ScriptedModel(script), tools=server.tools).run("flip the logging")
    assert contents(result)[:5] == ["logging on", "logging off", "off", "logging on", "on"]
    assert refusals(result) == [("logging_status", "repeated_call")]
    assert served(log) == ["toggle_logging"] * 2 + ["logging_status", "toggle_logging", "logging_status"]


@tool
def get_weather(city: str) -> dict:
    """Get today's weather for a city (the README's tool: declared without a level)."""
    WEATHER_RUNS.append(city)
    return {"city": city, "condition": "sunny", "temp_c": 21}


WEATHER_RUNS: list[str] = []


@pytest.mark.parametrize(
    ("question", "told"),
    [
        ("What's the weather in Paris?", "answer from what you have"),
        ("巴黎今天天气怎么样？", "直接用已有结果回答"),
    ],
)
async def test_a_model_repeating_an_undeclared_lookup_is_told_to_answer(question: str, told: str) -> None:
    """Attack (MISSION K2): a model that repeats the same lookup until it is told to stop, over HTTP
    (the fake endpoint). The README's `get_weather` has no level, so it counted as a write and the
    identical call was never refused: it ran 8 times and the user got the "needed more steps"
    apology. The same answer twice with nothing else changing is enough: the third call is refused
    with the fixed text (replies.py, in the user's language) and the model answers from it."""

    def repeating_model(request: RecordedRequest) -> FakeReply:
        last = request.messages[-1]
        if last.get("role") == "tool" and told in str(last.get("content")):
            return FakeReply.text("Paris: sunny, 21 °C.")
        return FakeReply.tool_call("get_weather", {"city": "Paris"})

    WEATHER_RUNS.clear()
    async with FakeOpenAIServer(handler=repeating_model) as fake:
        agent = Agent(model="m", base_url=fake.base_url, tools=[get_weather])
        result = await agent.run(question)
        await agent.aclose()
    assert result.stop_reason == "completed" and result.reply == "Paris: sunny, 21 °C."
    assert WEATHER_RUNS == ["Paris", "Paris"] and refusals(result) == [("get_weather", "repeated_call")]


async def test_a_same_answer_after_a_write_is_not_yet_a_repeat() -> None:
    """The rule's bound: the same answer counts only with no state-changing call in between. A
    lookup, a write, the lookup (same answer, but the write came between), the lookup (same answer,
    nothing between: from now on a loop), the lookup again: refused. And a lookup whose answers
    differ (a counter) keeps running."""
    counted: list[int] = []

    @tool
    def set_unit(unit: str) -> str:
        """Set the temperature unit."""
        return f"unit {unit}"

    @tool
    def next_ticket() -> int:
        """The next ticket number (a lookup without a level whose answer changes)."""
        counted.append(1)
        return len(counted)

    paris = ("get_weather", {"city": "Paris"})
    script = [call(*paris), call("set_unit", {"unit": "C"}), call(*paris), call(*paris), call(*paris)]
    script += [call("next_ticket") for _ in range(3)] + [reply("done")]
    WEATHER_RUNS.clear()
    agent = Agent(model=ScriptedModel(script), tools=[get_weather, set_unit, next_ticket], max_turns=10)
    result = await agent.run("weather")
    assert WEATHER_RUNS == ["Paris"] * 3 and counted == [1, 1, 1], refusals(result)
    assert refusals(result) == [("get_weather", "repeated_call")]
