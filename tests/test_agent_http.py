"""Whole tasks over real HTTP: Agent → OpenAICompatClient → the fake OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest

from hermes_core import Agent, tool
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from wire_schema import assert_valid_requests


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
async def lookup(city: str) -> dict[str, Any]:
    """Look up facts about a city."""
    await asyncio.sleep(0.01)  # an async tool that takes a moment
    return {"city": city, "population_m": 21.9}


def agent_for(fake: FakeOpenAIServer, **options: Any) -> Agent:
    return Agent(
        model="fake-model", base_url=fake.base_url, api_key="sk-test", tools=[add, lookup], **options
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_full_task_and_every_request_conforms(stream: bool) -> None:
    async with FakeOpenAIServer() as fake:
        fake.script(
            FakeReply.parallel_tool_calls([("add", {"a": 40, "b": 2}), ("lookup", {"city": "北京"})]),
            FakeReply.text("40+2=42；北京人口约 2190 万。"),
        )
        agent = agent_for(fake, stream=stream)
        pieces: list[str] = []
        result = await agent.run("算 40+2，再查北京人口", on_text=pieces.append if stream else None)
        await agent.aclose()
    assert result.reply == "40+2=42；北京人口约 2190 万。" and result.ok
    assert [o.content for o in result.tool_calls] == ["42", '{"city": "北京", "population_m": 21.9}']
    assert result.usage.total_tokens > 0
    if stream:
        assert "".join(pieces) == result.reply and len(pieces) > 1
    first, second = fake.requests
    assert [t["function"]["name"] for t in first.body["tools"]] == ["add", "lookup"]
    assert second.messages[-2]["role"] == "tool" and second.messages[-1]["tool_call_id"].startswith("call_")
    assert first.body["temperature"] == 0.2 and first.body.get("stream", False) is stream
    assert_valid_requests(fake.requests)


async def test_broken_arguments_and_unknown_names_from_the_server_are_survived() -> None:
    async with FakeOpenAIServer() as fake:
        fake.script(
            FakeReply.tool_call("add", '{"a": "forty", "b": 2,}'),  # broken text, wrong type
            FakeReply.tool_call("subtract", {"a": 1}),  # a tool that does not exist
            FakeReply.tool_call(
                "add", "```json\n{'a': '40', 'b': 2}\n```"
            ),  # fenced, single quotes, string int
            FakeReply.text("42"),
        )
        agent = agent_for(fake)
        result = await agent.run("40+2")
        await agent.aclose()
    errors = [json.loads(o.content).get("error", "") if not o.ok else "" for o in result.tool_calls]
    assert "field 'a'" in errors[0] and "'forty'" in errors[0]
    assert "unknown tool 'subtract'" in errors[1] and "add" in errors[1]
    assert result.tool_calls[2].content == "42" and result.reply == "42"
    assert_valid_requests(fake.requests)


async def test_unavailable_model_gives_polite_reply_and_logs_without_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with FakeOpenAIServer() as fake:
        fake.script(*[FakeReply.error(503, "overloaded")] * 4)
        agent = agent_for(fake, max_retries=3, retry_base_delay=0.01)
        result = await agent.run("what is 2+2")
        await agent.aclose()
    assert result.stop_reason == "model_unavailable"
    assert (
        result.reply == "Sorry, the model service is temporarily unavailable. Please try again in a moment."
    )
    assert len(fake.requests) == 4
    assert any(record.levelno == logging.ERROR for record in caplog.records)
    assert "sk-test" not in caplog.text


def test_run_sync_against_the_server_from_sync_code() -> None:
    with FakeOpenAIServer(default_tool_args={"a": 2, "b": 3}) as fake:
        result = agent_for(fake).run_sync("2+3")
    assert result.reply == "done: 5" and [o.call.name for o in result.tool_calls] == ["add"]
