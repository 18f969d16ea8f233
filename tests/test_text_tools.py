"""Whole tasks with models that write tool calls as text, over HTTP, in native, text and auto modes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from hermes_core import Agent, tool
from hermes_core.kernel.replies import fixed_reply
from hermes_core.testing import ScriptedModel
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from hermes_core.textcalls.wrapper import render_text_mode
from wire_schema import assert_valid_requests

# One call of add(a=2, b=3), as each format writes it (from the formats' published descriptions).
FORMATS = {
    "hermes": '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
    "hermes_string_args": '<tool_call>{"name": "add", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}</tool_call>',
    "function_equals": '<function=add>{"a": 2, "b": 3}</function>',
    "function_name_attr": '<function name="add">{"a": 2, "b": 3}</function>',
    "tool_tag": '<tool>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool>',
    "function_call_tag": '<function_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</function_call>',
    "fenced_json": '```json\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n```',
    "bare_json": '{"name": "add", "arguments": {"a": 2, "b": 3}}',
    "llama3_json": '{"name": "add", "parameters": {"a": 2, "b": 3}}',
    "mistral": '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}]',
    "pythonic": "[add(a=2, b=3)]",
    "qwen3_coder_xml": (
        "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n"
        "</function>\n</tool_call>"
    ),
}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def last_result(request: RecordedRequest) -> str | None:
    """The tool result the model is shown last, natively or as <tool_response> text."""
    last = request.messages[-1]
    if last["role"] == "tool":
        return str(last["content"])
    found = re.search(r"<tool_response>\n(.*?)\n</tool_response>", str(last.get("content")), re.DOTALL)
    return found.group(1) if found else None


def text_only_model(call_text: str) -> Any:
    """A fake model that never uses native tool_calls: it writes `call_text`, then reports the result."""

    def handler(request: RecordedRequest) -> FakeReply:
        result = last_result(request)
        if result is not None:
            return FakeReply.text(f"<think>the tool said {result}</think>The sum is {result}.")
        return FakeReply.text(f"Let me add them.\n{call_text}" if call_text.startswith("<") else call_text)

    return handler


@pytest.mark.parametrize("mode", ["native", "auto"])
@pytest.mark.parametrize("name", sorted(FORMATS))
async def test_text_only_model_completes_the_task(name: str, mode: str) -> None:
    ran: list[tuple[int, int]] = []

    @tool
    def add_numbers(a: int, b: int) -> int:
        """Add two integers."""
        ran.append((a, b))
        return a + b

    async with FakeOpenAIServer(handler=text_only_model(FORMATS[name])) as fake:
        agent = Agent(model="local", base_url=fake.base_url, tools=[tool(name="add")(add_numbers.handler)])
        agent.tool_mode = mode  # type: ignore[assignment]
        result = await agent.run("2+3?")
        await agent.aclose()
    assert ran == [(2, 3)] and result.reply == "The sum is 5." and result.ok
    assert result.responses[-1].reasoning == "the tool said 5"
    first, second = fake.requests
    assert "tools" in first.body
    if mode == "native":
        assert "tools" in second.body and second.messages[-1]["role"] == "tool"
    else:  # auto saw a text call and switched this model to text mode
        assert "tools" not in second.body and "<tools>" in second.messages[0]["content"]
        assert second.messages[-1]["content"].startswith("<tool_response>")
    assert_valid_requests(fake.requests)


async def test_auto_mode_switches_when_the_endpoint_refuses_tools_and_remembers() -> None:
    async with FakeOpenAIServer(handler=text_only_model(FORMATS["hermes"]), reject_tools=True) as fake:
        agent = Agent(model="local", base_url=fake.base_url, tools=[add])
        first = await agent.run("2+3?")
        second = await agent.run("2+3 again?")
        await agent.aclose()
    assert first.reply == second.reply == "The sum is 5."
    with_tools = [r for r in fake.requests if r.body and "tools" in r.body]
    assert len(with_tools) == 1  # refused once, then never sent again
    assert "<tools>" in fake.requests[1].messages[0]["content"]
    assert '"name": "add"' in fake.requests[1].messages[0]["content"]


async def test_native_mode_never_switches() -> None:
    async with FakeOpenAIServer(handler=text_only_model(FORMATS["hermes"]), reject_tools=True) as fake:
        agent = Agent(model="local", base_url=fake.base_url, tools=[add], tool_mode="native")
        result = await agent.run("2+3?")
        await agent.aclose()
    assert result.stop_reason == "model_rejected" and result.reply == fixed_reply("model_rejected", "en")
    assert len(fake.requests) == 1


async def test_text_mode_sends_calls_and_results_as_text() -> None:
    async with FakeOpenAIServer(handler=text_only_model(FORMATS["hermes"])) as fake:
        agent = Agent(model="local", base_url=fake.base_url, tools=[add], tool_mode="text")
        result = await agent.run("2+3?")
        await agent.aclose()
    assert result.reply == "The sum is 5."
    assert all("tools" not in r.body for r in fake.requests)
    second = fake.requests[1].messages
    assert second[-2]["role"] == "assistant" and "<tool_call>" in second[-2]["content"]
    assert "tool_calls" not in second[-2]
    assert second[-1] == {"role": "user", "content": "<tool_response>\n5\n</tool_response>"}


def test_render_text_mode_merges_a_batch_of_results_into_one_user_turn() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "sums"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "tool", "tool_call_id": "c2", "content": "7"},
    ]
    rendered = render_text_mode(messages, [add.schema()])
    assert (
        rendered[0]["content"].startswith("Be brief.\n\n# Tools")
        and json.dumps(add.schema()) in rendered[0]["content"]
    )
    assert rendered[2]["content"].count("<tool_call>") == 2
    assert rendered[3:] == [
        {
            "role": "user",
            "content": "<tool_response>\n3\n</tool_response>\n<tool_response>\n7\n</tool_response>",
        }
    ]


async def test_unknown_name_in_text_is_not_run_and_the_model_is_told() -> None:
    model = ScriptedModel(['<tool_call>{"name": "multiply", "arguments": {"a": 2}}</tool_call>', "sorry"])
    result = await Agent(model=model, tools=[add]).run("2*3?")
    error = json.loads(result.tool_calls[0].content)["error"]
    assert "unknown tool 'multiply'" in error and "add" in error
    assert result.reply == "sorry"


async def test_streamed_text_never_shows_tags_or_reasoning() -> None:
    async with FakeOpenAIServer(handler=text_only_model(FORMATS["hermes"])) as fake:
        agent = Agent(model="local", base_url=fake.base_url, tools=[add], stream=True)
        pieces: list[str] = []
        result = await agent.run("2+3?", on_text=pieces.append)
        await agent.aclose()
    shown = "".join(pieces)
    assert result.reply == "The sum is 5."
    assert "<" not in shown and "think" not in shown and "tool_call" not in shown
    assert (
        shown == "Let me add them.The sum is 5." or shown.replace("\n", "") == "Let me add them.The sum is 5."
    )


async def test_think_is_kept_out_of_the_reply_even_without_calls() -> None:
    model = ScriptedModel(["<think>user wants a greeting, 2+3 is 5</think>Five."])
    result = await Agent(model=model, tools=[add]).run("2+3? just say it")
    assert result.reply == "Five." and result.responses[0].reasoning == "user wants a greeting, 2+3 is 5"
    assert result.messages[-1]["content"] == "Five."


async def test_think_open_template_hides_reasoning_while_streaming() -> None:
    model = ScriptedModel(["the user wants five</think>Five."])
    pieces: list[str] = []
    agent = Agent(model=model, tools=[add], think_open=True)
    result = await agent.run("2+3? just say it", on_text=pieces.append)
    assert result.reply == "Five." and "".join(pieces) == "Five."
    assert result.responses[0].reasoning == "the user wants five"


async def test_text_call_ids_are_unique_across_turns() -> None:
    call_text = '<tool_call>{"name": "add", "arguments": {"a": %d, "b": 1}}</tool_call>'
    model = ScriptedModel([call_text % 1, call_text % 2, "done"])
    result = await Agent(model=model, tools=[add]).run("add twice")
    ids = [o.call.id for o in result.tool_calls]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert [m["tool_call_id"] for m in result.messages if m["role"] == "tool"] == ids


async def test_text_call_ids_are_the_same_when_the_same_conversation_is_sent_again() -> None:
    """A task run again names its text calls as it did the first time (the ids come from the request)."""
    call_text = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>'
    runs = [await Agent(model=ScriptedModel([call_text, "done"]), tools=[add]).run("add") for _ in range(2)]
    first, again = ([o.call.id for o in run.tool_calls] for run in runs)
    assert first == again and first[0].startswith("textcall_")


async def test_text_mode_writes_only_the_tools_every_model_may_use_into_the_prompt() -> None:
    """Text mode puts the tools in the prompt, which the primary or a fallback may answer: a tool
    allowed only for the primary is not written there when there is a fallback."""

    @tool(allowed_models=("big",))
    def audit(query: str) -> str:
        """Search the audit log."""
        return "found"

    async with FakeOpenAIServer() as fake:
        fake.script(FakeReply.text("no tools needed"))
        agent = Agent(model="big", base_url=fake.base_url, fallback_models=["small"], tools=[add, audit])
        agent.tool_mode = "text"
        await agent.run("hello there, add something")
        await agent.aclose()
    prompt = fake.requests[0].messages[0]["content"]
    assert '"add"' in prompt and '"audit"' not in prompt
