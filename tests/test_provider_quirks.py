"""Model endpoints against what real servers send: recorded bodies, replayed over HTTP.

Each case is a body recorded from a real provider (tests/data/provider_bodies/, with its source),
served verbatim by the fake endpoint on 127.0.0.1 to the real client. docs/providers.md has the
table of these quirks; the last test checks that every row of it has its body and its test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from hermes_core import Agent, tool
from hermes_core.kernel.model import ModelRequestRejected, ModelUnavailable
from hermes_core.models.openai_compat import OpenAICompatClient
from hermes_core.models.settings import ModelSettings
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from hermes_core.textcalls.wrapper import TextToolCalls
from provider_bodies import BODIES, recorded, replay

ROOT = Path(__file__).resolve().parents[1]
USER = [{"role": "user", "content": "What is 1 + 2?"}]


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = [add.schema()]


def client(fake: FakeOpenAIServer, model: str = "m1", **kw: Any) -> OpenAICompatClient:
    kw.setdefault("retry_base_delay", 0.01)
    return OpenAICompatClient(ModelSettings(model=model, base_url=fake.base_url, **kw))


@pytest.mark.parametrize(
    "body",
    ["openai_context_length", "openai_orphan_tool_message", "openai_missing_tool_results",
     "groq_tool_use_failed",
     "deepseek_missing_reasoning"],
)  # fmt: skip
async def test_a_400_that_only_mentions_tools_keeps_native_mode(body: str) -> None:
    """Attack: a 400 that mentions "tool" or "function" but is about something else (OpenAI's
    context length, an orphan tool message, missing tool results, Groq's tool_use_failed,
    DeepSeek's missing reasoning_content; recorded bodies). It used to switch the model to text
    mode for good; it must be raised and the next request must still carry `tools`."""
    async with FakeOpenAIServer() as fake:
        fake.script(replay(body), FakeReply.text("fine"))
        model = TextToolCalls(client(fake), mode="auto")
        with pytest.raises(ModelRequestRejected):
            await model.complete(USER, TOOLS)
        assert not model.uses_text_mode() and model.decisions == {}
        await model.complete(USER, TOOLS)
        await model.aclose()
    assert "tools" in (fake.requests[-1].body or {})


async def test_a_refused_schema_names_the_tool() -> None:
    """Attack: OpenAI refuses one tool's schema (recorded "Invalid schema for function …"). The
    user is told which tool's schema was refused, never "no tool support", and native mode stays."""
    async with FakeOpenAIServer() as fake:
        fake.script(replay("openai_invalid_schema"))
        model = TextToolCalls(client(fake), mode="auto")
        with pytest.raises(
            ModelRequestRejected, match="the endpoint refused tool get_room_layout's schema: "
        ):
            await model.complete(USER, TOOLS)
        assert not model.uses_text_mode()
        await model.aclose()


@pytest.mark.parametrize("body", ["vllm_no_tool_parser", "ollama_no_tools", "llamacpp_no_jinja",
                                  "openrouter_no_tool_endpoints", "llamacpp_unsupported_tools",
                                  "gemini_gemma_no_tools"])  # fmt: skip
async def test_a_server_that_cannot_take_tools_switches_auto_mode(body: str) -> None:
    """Attack: servers that cannot take `tools` at all, each in its own words and status (vLLM 400,
    Ollama 400, llama.cpp 500 without --jinja, older llama-server's 500 "Unsupported param: tools",
    OpenRouter 404, Gemma on Gemini's endpoint 400 "Function calling is not enabled"; recorded
    bodies). The 500s used to be retried as an outage ("model unavailable") and the 404 treated as
    an unknown model; each must switch `auto` to text mode at once, with the reason kept for the
    model."""
    async with FakeOpenAIServer() as fake:
        fake.script(replay(body), FakeReply.text("The sum is 3."))
        model = TextToolCalls(client(fake), mode="auto")
        response = await model.complete(USER, TOOLS)
        await model.aclose()
    assert response.content == "The sum is 3."
    assert len(fake.requests) == 2 and "tools" not in (fake.requests[1].body or {})
    assert model.uses_text_mode() and f"HTTP {recorded(body)['status']}" in model.decisions["m1"]


async def test_a_refused_temperature_is_left_out_and_remembered() -> None:
    """Attack: o-series/gpt-5 refuse `temperature` (recorded 400). Known names get none up front;
    another model that answers the recorded 400 is asked again without it, and never sent it again."""
    async with FakeOpenAIServer() as fake:
        fake.script(
            FakeReply.text("a"), replay("openai_o3_temperature"), FakeReply.text("b"), FakeReply.text("c")
        )
        reasoner = client(fake, "o3-mini")
        await reasoner.complete(USER)
        await reasoner.aclose()
        other = client(fake, "my-reasoner")
        assert (await other.complete(USER)).content == "b"
        await other.complete(USER)
        await other.aclose()
    bodies = [r.body or {} for r in fake.requests]
    assert "temperature" not in bodies[0]
    assert "temperature" in bodies[1] and "temperature" not in bodies[2] and "temperature" not in bodies[3]


async def test_a_refused_stream_options_is_left_out() -> None:
    """Attack: Azure AI inference refuses `stream_options` (400 naming it). The stream is asked again
    without it, and later requests leave it out."""
    async with FakeOpenAIServer() as fake:
        fake.script(replay("azure_stream_options"), FakeReply.text("ok"), FakeReply.text("ok"))
        model = client(fake, stream=True)
        assert (await model.complete(USER)).content == "ok"
        await model.complete(USER)
        await model.aclose()
    bodies = [r.body or {} for r in fake.requests]
    assert "stream_options" in bodies[0] and all("stream_options" not in b for b in bodies[1:])
    assert all(b.get("stream") is True for b in bodies)


async def test_a_template_that_demands_alternating_roles_gets_one_user_turn() -> None:
    """Attack: vLLM serving Mistral refuses two user messages in a row (a turn's context and its
    message, agent.py `turn_messages`) with a 400 "… conversation roles must alternate …". The call
    is asked again with them as one user message, and later requests are sent merged at once."""
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "[Context] Orders are in yuan."},
        {"role": "user", "content": "What is 1 + 2?"},
    ]
    async with FakeOpenAIServer() as fake:
        fake.script(replay("vllm_roles_alternate"), FakeReply.text("ok"), FakeReply.text("ok"))
        model = client(fake)
        assert (await model.complete(messages)).content == "ok"
        await model.complete(messages)
        await model.aclose()
    sent = [r.messages for r in fake.requests]
    assert sent[0] == messages
    merged = {"role": "user", "content": "[Context] Orders are in yuan.\n\nWhat is 1 + 2?"}
    assert sent[1] == sent[2] == [messages[0], merged]


@pytest.mark.parametrize(
    "body", ["deepseek_reasoning_stream", "openrouter_reasoning_stream", "litellm_reasoning_stream"]
)
async def test_reasoning_deltas_are_kept_and_never_shown(body: str) -> None:
    """Attack: reasoning streamed as `reasoning_content` (DeepSeek, relayed by a real LiteLLM proxy)
    or `reasoning` (OpenRouter) deltas (recorded streams) was dropped. It must be kept on the
    response and never reach the text shown to the user."""
    shown: list[str] = []
    async with FakeOpenAIServer() as fake:
        fake.script(replay(body))
        model = client(fake, stream=True)
        response = await model.complete(USER, TOOLS, on_text=shown.append)
        await model.aclose()
    assert response.reasoning and len(response.reasoning) > 5
    assert response.reasoning not in "".join(shown) and response.reasoning[:6] not in "".join(shown)


def _thinking_model(request: RecordedRequest) -> FakeReply:
    """DeepSeek's thinking mode: a tool-call turn sent back without its reasoning is a 400."""
    turns = [m for m in request.messages if m.get("role") == "assistant" and m.get("tool_calls")]
    if any("reasoning_content" not in m for m in turns):
        return replay("deepseek_missing_reasoning")
    if not turns and (request.body or {}).get("stream"):
        return replay("deepseek_reasoning_stream")  # recorded: reasoning deltas, then a call to add
    if not turns:
        return FakeReply(tool_calls=[("add", {"a": 1, "b": 2})], reasoning="I should add 1 and 2.")
    return FakeReply.text("1 + 2 = 3.")


@pytest.mark.parametrize(("preset", "stream"), [("deepseek", False), (None, False), (None, True)])
async def test_deepseek_gets_its_reasoning_back_in_a_tool_loop(preset: str | None, stream: bool) -> None:
    """Attack: DeepSeek's thinking mode answers 400 (recorded "reasoning_content … must be passed
    back") on the second turn of a tool loop when the reasoning is not sent back. It was sent back
    only with the deepseek preset, so DeepSeek by base URL or behind a gateway (LiteLLM relays
    `reasoning_content` as it is: `litellm_reasoning_stream`) failed mid-task. With or without the
    preset the reasoning goes back and the loop finishes; it is never in the reply."""
    async with FakeOpenAIServer(handler=_thinking_model) as fake:
        agent = Agent(model="deepseek-v4-flash", base_url=fake.base_url, provider=preset, tools=[add],
                      stream=stream)  # fmt: skip
        result = await agent.run("What is 1 + 2?")
        await agent.aclose()
    thought = "The user wants 1+2; call add." if stream else "I should add 1 and 2."
    assert result.reply == "1 + 2 = 3." and thought not in result.reply
    sent = [m for m in fake.requests[1].messages if m.get("tool_calls")]
    assert sent[0]["reasoning_content"] == thought


@pytest.mark.parametrize("body", ["cerebras_reasoning_refused", "mistral_reasoning_refused"])
async def test_a_model_that_refuses_reasoning_sent_back_is_asked_again_without_it(body: str) -> None:
    """Attack: Cerebras answers 400 "property 'messages.2.assistant.reasoning_content' is
    unsupported", Mistral 422 "Extra inputs are not permitted" at `…assistant.reasoning_content`
    (recorded bodies) when reasoning goes back. The call is asked again without it, and the model is
    never sent it again; another model of the client still gets its reasoning back."""
    history = [*USER, {"role": "assistant", "content": None, "reasoning_content": "add them",
                       "tool_calls": [{"id": "c1", "type": "function",
                                       "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "3"}]  # fmt: skip
    async with FakeOpenAIServer() as fake:
        fake.script(replay(body), FakeReply.text("3"), FakeReply.text("3"))
        model = client(fake, "strict-model")
        assert (await model.complete(history, TOOLS)).content == "3"
        await model.complete(history, TOOLS)
        await model.aclose()
        other = client(fake, "deepseek-v4-flash")
        fake.script(FakeReply.text("3"))
        await other.complete(history, TOOLS)
        await other.aclose()
    carried = ["reasoning_content" in r.messages[1] for r in fake.requests]
    assert carried == [True, False, False, True]
    assert model.dropped == {"strict-model": {"reasoning_content"}}


@pytest.mark.parametrize(
    "body", ["vllm_midstream_error", "litellm_midstream_error", "openrouter_finish_error"]
)
async def test_an_error_inside_the_stream_is_an_error(body: str) -> None:
    """Attack: a 200 stream that carries an error after partial text (vLLM and LiteLLM
    `data: {"error": …}` then [DONE]; OpenRouter `finish_reason: "error"`; recorded streams). The
    partial text used to come back as a finished reply. Nothing shown yet: retried (transient),
    the next attempt's whole answer wins; text already shown: an error, never the answer."""
    async with FakeOpenAIServer() as fake:
        fake.script(replay(body), FakeReply.text("The whole answer."))
        model = client(fake, stream=True)
        assert (await model.complete(USER)).content == "The whole answer."
        fake.script(replay(body))
        with pytest.raises(ModelUnavailable):
            await model.complete(USER, on_text=lambda piece: None)
        await model.aclose()


async def test_ollama_parallel_calls_with_one_index_stay_apart() -> None:
    """Attack: Ollama streams parallel calls all with `index: 0` (recorded, ollama/ollama#15457);
    they merged into one call with broken arguments. They must stay two calls, told apart by id,
    and both run in the loop (also with the fake's `same_index` knob)."""
    async with FakeOpenAIServer() as fake:
        fake.script(replay("ollama_same_index"))
        model = client(fake, stream=True)
        response = await model.complete(USER, TOOLS)
        await model.aclose()
        fake.script(FakeReply.parallel_tool_calls([("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})],
                                                  same_index=True), FakeReply.text("3 and 7"))  # fmt: skip
        agent = Agent(model="m1", base_url=fake.base_url, tools=[add], stream=True)
        result = await agent.run("1+2 and 3+4?")
        await agent.aclose()
    assert [(c.id, json.loads(c.arguments)) for c in response.tool_calls] == [
        ("call_a1", {"a": 1, "b": 2}), ("call_b2", {"a": 3, "b": 4})]  # fmt: skip
    results = [m["content"] for m in fake.requests[-1].messages if m.get("role") == "tool"]
    assert result.reply == "3 and 7" and results == ["3", "7"]


async def test_mistral_list_content_is_the_reply() -> None:
    """Attack: Mistral's magistral answers `content` as a list of typed parts (recorded); the reply
    came back empty. The text parts are the reply, the thinking part is reasoning."""
    async with FakeOpenAIServer() as fake:
        fake.script(replay("mistral_list_content"))
        model = client(fake)
        response = await model.complete(USER)
        await model.aclose()
    assert response.content == "Bonjour !" and response.reasoning == "Simple greeting."


def quirk_rows() -> list[dict[str, str]]:
    text = (ROOT / "docs" / "providers.md").read_text(encoding="utf-8").split("\n## ")[0]  # the first table
    lines = [
        line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| provider")
    ]
    cells = [[c.strip().strip("`") for c in line.strip("|").split("|")] for line in lines]
    return [dict(zip(("provider", "sends", "we_do", "body", "test"), row, strict=True)) for row in cells]


def test_every_quirk_in_the_table_has_its_recorded_body_and_test() -> None:
    """The quirks live in one table (docs/providers.md): each row names a recorded body with its
    source and a test here or in test_litellm.py that exists; each body is in the table."""
    rows = quirk_rows()
    assert len(rows) >= 20
    sources = "".join((ROOT / "tests" / f).read_text(encoding="utf-8")
                      for f in ("test_provider_quirks.py", "test_litellm.py"))  # fmt: skip
    for row in rows:
        body = recorded(row["body"])
        assert body["source"] and isinstance(body["status"], int), row
        assert re.search(rf"def {row['test']}\(", sources), row
        assert f'"{row["body"]}"' in sources, row  # the test replays that body
    assert {p.stem for p in BODIES.glob("*.json")} == {row["body"] for row in rows}


async def test_reasoning_is_in_the_trace_not_in_the_reply(tmp_path: Path) -> None:
    """Attack: DeepSeek's streamed reasoning (recorded stream) before a tool call: the trace of the
    task shows it for that model call, the user's reply never contains it."""
    from hermes_core.observe.traces import SQLiteTraceStore, Tracer

    store = SQLiteTraceStore(tmp_path / "traces.db")
    async with FakeOpenAIServer() as fake:
        fake.script(replay("deepseek_reasoning_stream"), FakeReply.text("It is 3."))
        agent = Agent(model="deepseek-v4-flash", base_url=fake.base_url, provider="deepseek", tools=[add],
                      stream=True, tracer=Tracer(store))  # fmt: skip
        result = await agent.run("What is 1 + 2?", task_id="webhook:r1")
        await agent.aclose()
    record = await store.get("webhook:r1")
    await store.close()
    assert record is not None and result.reply == "It is 3."
    assert record["model_calls"][0]["response"]["reasoning"] == "The user wants 1+2; call add."
    assert "call add" not in result.reply
