"""A tool call cut off by the output token limit is never run (kernel/guards.py `cut_off_outcomes`).

Whole tasks over real HTTP: Agent → OpenAICompatClient → the fake OpenAI-compatible server, which
sends `finish_reason: "length"` with cut argument text, streamed and not, as OpenAI, Ollama and
vLLM do when `max_tokens` ends a response inside a tool call.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hermes_core import Agent, tool
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

SF = {"city": "San Francisco"}


def weather_tool(asked: list[str]) -> Any:
    @tool(level=0)
    def get_weather(city: str) -> str:
        """Today's weather in a city."""
        asked.append(city)
        return f"sunny in {city}"

    return get_weather


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agent_for(fake: FakeOpenAIServer, asked: list[str], **options: Any) -> Agent:
    tools = [weather_tool(asked), add]
    return Agent(model="fake-model", base_url=fake.base_url, api_key="sk-test", tools=tools, **options)


def tool_messages(request: Any) -> list[str]:
    return [m["content"] for m in request.messages if m.get("role") == "tool"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_cut_mid_value_is_not_run_and_the_model_is_told(stream: bool) -> None:
    """Attack: `max_tokens` ends the response inside `get_weather({"city": "San Fr`; the old loop
    repaired the text and asked the weather of "San Fr". Now nothing runs, the model reads why,
    calls again with complete arguments, and that call runs."""
    asked: list[str] = []
    async with FakeOpenAIServer() as fake:
        fake.script(
            FakeReply.cut_off("get_weather", SF, keep=len('{"city": "San Fr')),
            FakeReply.tool_call("get_weather", SF),
            FakeReply.text("It is sunny in San Francisco."),
        )
        agent = agent_for(fake, asked, stream=stream)
        result = await agent.run("旧金山天气如何？")
        await agent.aclose()
        second = fake.requests[1]
    assert asked == ["San Francisco"] and result.ok
    assert result.tool_calls[0].error == "cut_off" and result.tool_calls[1].ok
    told = json.loads(tool_messages(second)[0])["error"]
    assert "your call to get_weather was cut off by the output token limit" in told
    assert "arguments are incomplete" in told and "shorter arguments, or ask to continue" in told
    assert second.messages[-2]["tool_calls"][0]["function"]["arguments"] == '{"city": "San Fr'


@pytest.mark.parametrize("stream", [False, True])
async def test_a_cut_response_runs_none_of_its_calls(stream: bool) -> None:
    """Attack: a parallel turn whose last call is cut (`add` complete, `get_weather` cut, then
    `finish_reason: "length"`): no call of it runs, and every call still gets its answer, so the
    history stays valid for the next request."""
    asked: list[str] = []
    cut = FakeReply(
        tool_calls=[("add", {"a": 1, "b": 2}), ("get_weather", '{"city": "San Fr')], finish_reason="length"
    )
    async with FakeOpenAIServer() as fake:
        fake.script(cut, FakeReply.text("I was cut off; let me try again later."))
        agent = agent_for(fake, asked, stream=stream)
        result = await agent.run("1+2, and the weather")
        await agent.aclose()
        answers = tool_messages(fake.requests[1])
    assert asked == [] and [o.error for o in result.tool_calls] == ["cut_off", "cut_off"]
    assert len(answers) == 2 and "call it again" in json.loads(answers[0])["error"]
    assert "cut off by the output token limit" in json.loads(answers[1])["error"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_cut_that_still_parses_is_not_run(stream: bool) -> None:
    """Attack: the limit falls where the text still parses (`{"a": 12` of `{"a": 123, …}`, which a
    repair closes into a whole, wrong object): `finish_reason: "length"` alone keeps it from
    running."""
    asked: list[str] = []
    async with FakeOpenAIServer() as fake:
        fake.script(FakeReply.cut_off("add", {"a": 123, "b": 4}, keep=len('{"a": 12')), FakeReply.text("?"))
        agent = agent_for(fake, asked, stream=stream)
        result = await agent.run("123+4")
        await agent.aclose()
    assert [o.error for o in result.tool_calls] == ["cut_off"] and result.tool_calls[0].arguments is None


@pytest.mark.parametrize("stream", [False, True])
async def test_the_fake_server_cuts_at_the_requests_max_tokens(stream: bool) -> None:
    """Attack: the agent's own `max_tokens` is too small for the call; the fake server honours it
    as a real one does (about four characters per token) and cuts the arguments. The call does
    not run; the task ends with the model's next answer."""
    asked: list[str] = []
    async with FakeOpenAIServer() as fake:
        fake.honor_max_tokens = True
        fake.script(FakeReply.tool_call("get_weather", SF), FakeReply.text("Too long for my limit."))
        agent = agent_for(fake, asked, stream=stream, max_tokens=4)
        result = await agent.run("weather in SF")
        await agent.aclose()
        first = fake.requests[0]
        sent = fake.requests[1].messages[-2]["tool_calls"][0]["function"]["arguments"]
    assert first.body is not None and first.body["max_tokens"] == 4
    assert sent == json.dumps(SF)[:16] and asked == []
    assert result.tool_calls[0].error == "cut_off" and result.reply == "Too long for my limit."


@pytest.mark.parametrize("stream", [False, True])
async def test_a_text_call_cut_by_the_limit_is_not_run(stream: bool) -> None:
    """Attack: a local model without a tool-call parser writes its call as text and the limit cuts
    it (`<tool_call>{"name": "get_weather", "arguments": {"city": "San Fr`); the text parser
    closes it, and the old loop ran get_weather("San Fr"). The cut stays a cut in text mode too."""
    asked: list[str] = []
    cut = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "San Fr'
    async with FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(cut, finish_reason="length"), FakeReply.text("Cut off, sorry."))
        agent = agent_for(fake, asked, stream=stream, tool_mode="text")
        result = await agent.run("weather in SF")
        await agent.aclose()
    assert asked == [] and [o.error for o in result.tool_calls] == ["cut_off"]
    assert result.reply == "Cut off, sorry."
