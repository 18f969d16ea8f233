"""The official `openai` SDK as a reference client against our fake endpoint.

Our client and our fake were written together, so they agree; the SDK was not. Each test has the
SDK read what the fake sends for one endpoint quirk (docs/providers.md), proving the fake speaks
the protocol real servers do, so the quirk tests against it mean something.
"""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply  # noqa: E402
from provider_bodies import replay  # noqa: E402

USER = [{"role": "user", "content": "What is 1 + 2?"}]


def sdk(fake: FakeOpenAIServer):  # type: ignore[no-untyped-def]
    return openai.AsyncOpenAI(base_url=fake.base_url, api_key="unused", max_retries=0)


async def test_the_sdk_reads_reasoning_deltas_and_repeated_indexes() -> None:
    """Attack: the fake's reasoning and Ollama same-index knobs must be wire-valid: the SDK parses
    every chunk, sees the reasoning_content deltas and two calls both at index 0 with their ids."""
    async with FakeOpenAIServer() as fake:
        calls = [("add", {"a": 1}), ("add", {"a": 2})]
        fake.script(FakeReply(content="ok", reasoning="thinking", tool_calls=calls,
                              same_index=True))  # fmt: skip
        client = sdk(fake)
        stream = await client.chat.completions.create(model="m", messages=USER, stream=True)  # type: ignore[arg-type]
        thought, heads = "", []
        async for chunk in stream:
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            thought += (delta.model_extra or {}).get("reasoning_content") or ""
            heads += [(call.index, call.id) for call in delta.tool_calls or () if call.id]
        await client.close()
    assert thought == "thinking" and heads == [(0, "call_1"), (0, "call_2")]


async def test_the_sdk_raises_on_the_fakes_stream_error() -> None:
    """Attack: the fake's `stream_error` knob (vLLM/LiteLLM's `data: {"error": …}`) must be what the
    SDK treats as an error, not as a chunk."""
    async with FakeOpenAIServer() as fake:
        fake.script(
            FakeReply(content="partial", stream_error={"message": "Internal server error", "code": 500})
        )
        client = sdk(fake)
        stream = await client.chat.completions.create(model="m", messages=USER, stream=True)  # type: ignore[arg-type]
        with pytest.raises(openai.APIError, match="Internal server error"):
            async for _ in stream:
                pass
        await client.close()


@pytest.mark.parametrize(("body", "error"), [("vllm_no_tool_parser", "BadRequestError"),
                                             ("openrouter_no_tool_endpoints", "NotFoundError"),
                                             ("llamacpp_no_jinja", "InternalServerError")])  # fmt: skip
async def test_the_sdk_reads_the_recorded_bodies_the_fake_serves(body: str, error: str) -> None:
    """Attack: the recorded bodies served through the fake must reach a client exactly as the real
    server's did: the SDK maps each status to its own exception with the server's message."""
    async with FakeOpenAIServer() as fake:
        fake.script(replay(body))
        client = sdk(fake)
        with pytest.raises(getattr(openai, error)):
            await client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
        await client.close()


async def test_the_sdk_reads_the_fakes_reasoning_field() -> None:
    """Attack: a non-streamed reply with `reasoning_content` (DeepSeek's shape) must parse in the SDK."""
    async with FakeOpenAIServer() as fake:
        fake.script(FakeReply.text("3", reasoning="1 plus 2"))
        client = sdk(fake)
        reply = await client.chat.completions.create(model="m", messages=USER)  # type: ignore[arg-type]
        await client.close()
    message = reply.choices[0].message
    assert message.content == "3" and (message.model_extra or {})["reasoning_content"] == "1 plus 2"
