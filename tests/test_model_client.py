"""OpenAICompatClient against a real local HTTP server (the package's FakeOpenAIServer).

Every test drives real sockets, so retries, timeouts, streaming and concurrency are exercised the
way a production endpoint would exercise them. Delays are kept to hundredths of a second, except
the one test that proves `Retry-After: 1` is honoured.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hermes_core.kernel.messages import Usage
from hermes_core.kernel.model import ModelRequestRejected, ModelUnavailable
from hermes_core.models.openai_compat import OpenAICompatClient
from hermes_core.models.settings import ModelSettings
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

CONFORMANCE = Path(__file__).resolve().parent / "data"
SECRET = "sk-test-SECRET-4f9a1c"
USER = [{"role": "user", "content": "hi"}]
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    },
}

MakeClient = Callable[..., OpenAICompatClient]


@pytest.fixture
async def make_client(fake: FakeOpenAIServer) -> AsyncIterator[MakeClient]:
    """Clients pointed at the fake, with fast retries unless a test asks otherwise."""
    clients: list[OpenAICompatClient] = []

    def make(**overrides: Any) -> OpenAICompatClient:
        options: dict[str, Any] = {"model": "fake-model", "base_url": fake.base_url, "retry_base_delay": 0.01}
        client = OpenAICompatClient(ModelSettings(**(options | overrides)))
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


def request_validator() -> jsonschema.Draft202012Validator:
    """CreateChatCompletionRequest, with its `#/components/schemas/...` refs resolvable."""
    document = json.loads((CONFORMANCE / "openai_chat_completions_schemas.json").read_text(encoding="utf-8"))
    schema = {
        "$ref": "#/components/schemas/CreateChatCompletionRequest",
        "components": {"schemas": document["schemas"]},
    }
    return jsonschema.Draft202012Validator(schema)


def gaps(fake: FakeOpenAIServer) -> list[float]:
    times = [request.received_at for request in fake.requests]
    return [later - earlier for earlier, later in itertools.pairwise(times)]


# -- replies -------------------------------------------------------------------------------------


async def test_plain_reply_with_usage_and_model(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    usage = {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}
    fake.script(FakeReply.text("Hello there", usage=usage, model="served-model"))
    response = await make_client().complete(USER)
    assert response.content == "Hello there"
    assert response.tool_calls == []
    assert response.usage == Usage(prompt_tokens=11, completion_tokens=3, total_tokens=14)
    assert response.model == "served-model"
    assert response.finish_reason == "stop"


async def test_tool_calls_are_decoded(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.script(FakeReply.parallel_tool_calls([("add", {"a": 1, "b": 2}), ("echo", '{"text": "天气"}')]))
    response = await make_client().complete(USER, [ADD_TOOL])
    assert [(call.name, json.loads(call.arguments)) for call in response.tool_calls] == [
        ("add", {"a": 1, "b": 2}),
        ("echo", {"text": "天气"}),
    ]
    assert all(call.id for call in response.tool_calls)
    assert len({call.id for call in response.tool_calls}) == 2
    assert response.finish_reason == "tool_calls"


async def test_tolerates_object_arguments_and_skips_nameless_calls(
    fake: FakeOpenAIServer, make_client: MakeClient
) -> None:
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "city": "北京"}}},
        {"id": "c2", "type": "function", "function": {"arguments": "{}"}},
    ]
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    body = {"model": "m", "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    fake.script(FakeReply(raw_body=json.dumps(body)))
    response = await make_client().complete(USER)
    assert [(call.id, call.name) for call in response.tool_calls] == [("c1", "add")]
    assert json.loads(response.tool_calls[0].arguments) == {"a": 1, "city": "北京"}
    assert "北京" in response.tool_calls[0].arguments  # re-encoded without \u escapes


@pytest.mark.parametrize("stream", [False, True])
async def test_calls_sent_without_ids_are_named_for_their_conversation(
    fake: FakeOpenAIServer, make_client: MakeClient, stream: bool
) -> None:
    """Unique from turn to turn (an approval or a journaled result is found by its call's id), the
    same when the same conversation is sent again (a task run again names its calls alike)."""
    fake.omit_call_ids = True
    fake.script(*[FakeReply.parallel_tool_calls([("add", {"a": 1}), ("add", {"a": 2})])] * 3)
    client = make_client(stream=stream)
    first = await client.complete(USER, [ADD_TOOL])
    later = await client.complete([*USER, first.to_message()], [ADD_TOOL])
    again = await client.complete(USER, [ADD_TOOL])
    ids = [call.id for call in first.tool_calls]
    assert all(ids) and len(set(ids)) == 2
    assert not set(ids) & {call.id for call in later.tool_calls}
    assert [call.id for call in again.tool_calls] == ids


async def test_each_model_is_offered_its_own_tools_and_the_response_names_it(
    fake: FakeOpenAIServer, make_client: MakeClient
) -> None:
    from hermes_core.kernel.model import offering

    fake.unavailable = {"primary"}
    echo = {"type": "function", "function": {"name": "echo", "parameters": {"type": "object"}}}
    client = make_client(model="primary", fallback_models=("backup",), max_retries=0)
    assert client.models == ("primary", "backup")
    with offering(lambda model: {"add", "echo"} if model == "primary" else {"echo"}):
        response = await client.complete(USER, [ADD_TOOL, echo])
    sent = [[tool["function"]["name"] for tool in request.tools] for request in fake.requests]
    assert sent == [["add", "echo"], ["echo"]]
    assert response.answered_by == "backup"


# -- what is sent --------------------------------------------------------------------------------


async def test_default_body_and_authorization_header(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    await make_client(api_key=SECRET).complete([{"role": "user", "content": "你好"}])
    (request,) = fake.requests
    assert request.body == {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "你好"}],
        "temperature": 0.2,
    }
    assert request.headers["Authorization"] == f"Bearer {SECRET}"
    assert "你好".encode() in request.raw  # UTF-8, not \u escapes


async def test_optional_fields_only_when_set(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    await make_client().complete(USER, [])
    configured = make_client(
        max_tokens=50,
        top_p=0.5,
        response_format={"type": "json_object"},
        extra_body={"seed": 7},
        extra_headers={"X-Trace": "abc"},
    )
    await configured.complete(USER, [ADD_TOOL])
    bare, full = fake.requests
    assert "Authorization" not in bare.headers
    assert set(bare.body or {}) == {"model", "messages", "temperature"}  # tools=[] sends no tools key
    assert full.body is not None
    assert full.body["tools"] == [ADD_TOOL]
    assert (full.body["max_tokens"], full.body["top_p"], full.body["seed"]) == (50, 0.5, 7)
    assert full.body["response_format"] == {"type": "json_object"}
    assert "tool_choice" not in full.body and "stream" not in full.body
    assert full.headers["X-Trace"] == "abc"


async def test_every_request_body_matches_the_openai_schema(
    fake: FakeOpenAIServer, make_client: MakeClient
) -> None:
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "add 1 and 2"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
    ]
    client = make_client(api_key=SECRET, max_tokens=20, top_p=0.9, response_format={"type": "json_object"})
    await client.complete(USER)
    await client.complete(history, [ADD_TOOL])
    await client.complete(history, [ADD_TOOL], on_text=lambda piece: None)
    await make_client(stream=True, temperature=0.0).complete(USER, None)
    validator = request_validator()
    assert len(fake.requests) == 4
    for request in fake.requests:
        errors = [error.message for error in validator.iter_errors(request.body)]
        assert errors == [], request.body
    # The schema is not vacuous: it rejects what a broken client might send.
    assert not validator.is_valid({"model": "fake-model", "messages": []})
    assert not validator.is_valid({"model": "fake-model", "messages": USER, "temperature": 3})


# -- retries -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        FakeReply.error(500, "boom"),
        FakeReply.error(503),
        FakeReply.malformed(),
        FakeReply.malformed('{"id": 1}'),
    ],
    ids=["500", "503", "bad-json", "no-choices"],
)
async def test_transient_failure_is_retried(
    fake: FakeOpenAIServer, make_client: MakeClient, failure: FakeReply
) -> None:
    fake.script(failure, FakeReply.text("recovered"))
    response = await make_client().complete(USER)
    assert response.content == "recovered"
    assert len(fake.requests) == 2


async def test_backoff_grows_exponentially(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.script(*[FakeReply.error(500)] * 3, FakeReply.text("ok"))
    await make_client(retry_base_delay=0.04).complete(USER)
    first, second, third = gaps(fake)
    assert 0.04 * 0.8 <= first < 0.08
    assert 0.08 * 0.8 <= second < 0.16
    assert 0.16 * 0.8 <= third < 0.32


async def test_429_waits_for_retry_after(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.script(FakeReply.error(429, "slow down", headers={"Retry-After": "1"}), FakeReply.text("ok"))
    response = await make_client(retry_base_delay=0.01).complete(USER)
    assert response.content == "ok"
    assert gaps(fake)[0] >= 1.0


async def test_retry_after_http_date_is_capped(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    later = format_datetime(datetime.now(timezone.utc) + timedelta(seconds=30), usegmt=True)
    fake.script(FakeReply.error(503, headers={"Retry-After": later}), FakeReply.text("ok"))
    await make_client(retry_max_delay=0.3).complete(USER)
    assert 0.29 <= gaps(fake)[0] < 1.0  # the date was understood (base delay is 0.01) and capped


async def test_client_error_is_not_retried(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.script(FakeReply.error(400, "messages[0].content is invalid"))
    with pytest.raises(ModelRequestRejected) as caught:
        await make_client(fallback_models=("backup",)).complete(USER)
    assert caught.value.status == 400
    assert "messages[0].content is invalid" in str(caught.value)
    assert len(fake.requests) == 1


async def test_exhausted_retries_raise_model_unavailable(
    fake: FakeOpenAIServer, make_client: MakeClient
) -> None:
    fake.script(*[FakeReply.error(502, "bad gateway")] * 10)
    with pytest.raises(ModelUnavailable, match="fake-model") as caught:
        await make_client(max_retries=2).complete(USER)
    assert "502" in str(caught.value)
    assert len(fake.requests) == 3


async def test_timeout_is_retried(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.script(FakeReply.slow(1.0, FakeReply.text("too late")), FakeReply.text("in time"))
    started = time.monotonic()
    response = await make_client(timeout=0.2).complete(USER)
    assert response.content == "in time"
    assert len(fake.requests) == 2
    assert time.monotonic() - started < 0.9


async def test_dropped_connection_is_retried(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.script(FakeReply(disconnect=True), FakeReply.text("ok"))
    assert (await make_client().complete(USER)).content == "ok"
    assert len(fake.requests) == 2


# -- fallback models -----------------------------------------------------------------------------


async def test_fallback_model_after_primary_is_exhausted(
    fake: FakeOpenAIServer, make_client: MakeClient
) -> None:
    fake.script_for("primary", *[FakeReply.error(500)] * 3)
    fake.script_for("backup", FakeReply.text("from backup"))
    client = make_client(model="primary", fallback_models=("backup",), max_retries=2)
    response = await client.complete(USER)
    assert response.content == "from backup"
    assert [request.model for request in fake.requests] == ["primary"] * 3 + ["backup"]


async def test_unknown_model_moves_to_fallback_without_retry(
    fake: FakeOpenAIServer, make_client: MakeClient
) -> None:
    fake.models = ["backup"]
    client = make_client(model="gone", fallback_models=("backup",))
    assert (await client.complete(USER)).content == "hello"
    assert [request.model for request in fake.requests] == ["gone", "backup"]


async def test_only_unknown_models_raise_the_404(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.models = ["real"]
    with pytest.raises(ModelRequestRejected) as caught:
        await make_client(model="gone", fallback_models=("also-gone",)).complete(USER)
    assert caught.value.status == 404
    assert [request.model for request in fake.requests] == ["gone", "also-gone"]


async def test_all_models_failing_names_each(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.script(*[FakeReply.error(500, "primary down")] * 2, *[FakeReply.error(503, "backup down")] * 2)
    client = make_client(model="primary", fallback_models=("backup",), max_retries=1)
    with pytest.raises(ModelUnavailable) as caught:
        await client.complete(USER)
    assert "primary" in str(caught.value) and "backup down" in str(caught.value)
    assert len(fake.requests) == 4


# -- pacing --------------------------------------------------------------------------------------


async def test_concurrency_is_capped(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.latency = 0.05
    client = make_client(max_concurrency=3)
    replies = await asyncio.gather(*(client.complete(USER) for _ in range(10)))
    assert len(replies) == 10
    assert fake.max_in_flight == 3


async def test_requests_per_second_spaces_requests(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    client = make_client(requests_per_second=20)
    await asyncio.gather(*(client.complete(USER) for _ in range(5)))
    assert len(fake.requests) == 5
    assert min(gaps(fake)) >= 0.04  # 1/20 s apart, minus scheduling noise


# -- streaming -----------------------------------------------------------------------------------


async def test_streamed_text_reaches_on_text(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}
    text = "Streaming works, piece by piece — 逐字。"
    fake.script(FakeReply.text(text, usage=usage, chunk_delay=0.001))
    pieces: list[str] = []
    response = await make_client().complete(USER, on_text=pieces.append)
    assert len(pieces) > 1
    assert "".join(pieces) == response.content == text
    assert response.usage.total_tokens == 14 and response.usage.prompt_tokens == 5
    assert response.finish_reason == "stop"
    body = fake.requests[0].body or {}
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


async def test_async_on_text_is_awaited(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.script(FakeReply.text("one two three four"))
    pieces: list[str] = []

    async def collect(piece: str) -> None:
        await asyncio.sleep(0)  # an async callback: it awaits
        pieces.append(piece)

    response = await make_client().complete(USER, on_text=collect)
    assert "".join(pieces) == response.content == "one two three four"


async def test_streamed_tool_calls_are_assembled(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.script(
        FakeReply.parallel_tool_calls([("add", {"a": 1, "b": 2}), ("lookup", {"query": "a longer argument"})])
    )
    response = await make_client(stream=True).complete(USER, [ADD_TOOL])
    assert [(call.name, json.loads(call.arguments)) for call in response.tool_calls] == [
        ("add", {"a": 1, "b": 2}),
        ("lookup", {"query": "a longer argument"}),
    ]
    assert all(call.id.startswith("call_") for call in response.tool_calls)
    assert response.content is None and response.finish_reason == "tool_calls"
    assert response.usage.total_tokens > 0


def _sse(*chunks: dict[str, Any]) -> str:
    return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks)


def _text_chunk(text: str) -> dict[str, Any]:
    return {"model": "m", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


async def test_stream_broken_before_any_text_is_retried(
    fake: FakeOpenAIServer, make_client: MakeClient
) -> None:
    broken = _sse({"model": "m", "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    fake.script(FakeReply(raw_body=broken), FakeReply.text("whole answer"))
    pieces: list[str] = []
    response = await make_client().complete(USER, on_text=pieces.append)
    assert response.content == "whole answer" == "".join(pieces)
    assert len(fake.requests) == 2


async def test_stream_broken_after_text_is_not_retried(
    fake: FakeOpenAIServer, make_client: MakeClient
) -> None:
    fake.script(FakeReply(raw_body=_sse(_text_chunk("Half an ans"))), FakeReply.text("never shown"))
    pieces: list[str] = []
    with pytest.raises(ModelUnavailable):
        await make_client().complete(USER, on_text=pieces.append)
    assert pieces == ["Half an ans"]  # the user never sees a second beginning
    assert len(fake.requests) == 1


async def test_stream_with_garbage_event_is_retried(fake: FakeOpenAIServer, make_client: MakeClient) -> None:
    fake.script(FakeReply(raw_body="data: {not json\n\n"), FakeReply.text("fine"))
    assert (await make_client(stream=True).complete(USER)).content == "fine"
    assert len(fake.requests) == 2


# -- secrets, loops and imports ------------------------------------------------------------------


async def test_api_key_stays_out_of_logs_and_repr(
    fake: FakeOpenAIServer, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.script(FakeReply.error(500, "boom"), *[FakeReply.error(503)] * 3)
    client = make_client(api_key=SECRET, max_retries=3)
    with pytest.raises(ModelUnavailable) as caught:
        await client.complete(USER)
    fake.api_key = "a-different-key"
    with pytest.raises(ModelRequestRejected):
        await client.complete(USER)
    warnings = [r for r in caplog.records if r.name == "hermes_core.model" and r.levelno == logging.WARNING]
    errors = [r for r in caplog.records if r.name == "hermes_core.model" and r.levelno == logging.ERROR]
    assert len(warnings) == 3 and len(errors) == 2  # each retry, then each final failure
    assert SECRET not in caplog.text and "Bearer" not in caplog.text
    assert SECRET not in str(caught.value)
    assert SECRET not in repr(client.settings) and SECRET not in repr(client)


def test_a_new_event_loop_gets_a_fresh_session() -> None:
    """The same client used from two `asyncio.run` calls (e.g. a CLI invoked twice in one process)."""
    with FakeOpenAIServer() as fake:  # served from its own thread and loop
        client = OpenAICompatClient(ModelSettings(model="fake-model", base_url=fake.base_url))

        async def call_then_close() -> str | None:
            try:
                return (await client.complete(USER)).content
            finally:
                await client.aclose()

        assert asyncio.run(client.complete(USER)).content == "hello"  # its session is left behind
        assert asyncio.run(call_then_close()) == "hello"
        assert len(fake.requests) == 2


def test_importing_the_client_does_not_import_aiohttp() -> None:
    code = (
        "import sys, hermes_core.models.openai_compat, hermes_core.models.sse, hermes_core.models.settings;"
        "sys.exit('aiohttp' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
