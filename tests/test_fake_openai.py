"""Tests of the fake OpenAI server, spoken to over real HTTP with a plain aiohttp client."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest

from hermes_core.testing.fake_openai import NO_TOOLS_MESSAGE, FakeOpenAIServer, FakeReply, RecordedRequest
from waiting import eventually

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "tests" / "data" / "openai_chat_completions_schemas.json"
USER_HI = [{"role": "user", "content": "hi"}]
ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


async def chat(
    http: aiohttp.ClientSession, fake: FakeOpenAIServer, headers: dict[str, str] | None = None, **fields: Any
) -> tuple[int, Any]:
    """POST a chat request (defaults: model "m", one user message); return (status, parsed JSON)."""
    body = {"model": "m", "messages": USER_HI, **fields}
    async with http.post(f"{fake.base_url}/chat/completions", json=body, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def message_of(completion: dict[str, Any]) -> dict[str, Any]:
    return completion["choices"][0]["message"]


def parse_sse(text: str) -> list[Any]:
    """Each `data:` event of an SSE body: parsed JSON, or the literal "[DONE]"."""
    events = [event for event in text.split("\n\n") if event]
    assert all(event.startswith("data: ") for event in events), events
    return [e[6:] if e == "data: [DONE]" else json.loads(e[6:]) for e in events]


def reassemble(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Join streamed deltas the way a client must: content in order, tool calls by index."""
    content, finish = "", None
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for part in delta.get("tool_calls", []):
                call = calls.setdefault(part["index"], {"id": None, "name": "", "arguments": ""})
                call["id"] = part.get("id", call["id"])
                call["name"] += part.get("function", {}).get("name", "")
                call["arguments"] += part.get("function", {}).get("arguments", "")
            finish = choice["finish_reason"] or finish
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}


async def test_scripted_text_is_an_openai_completion_and_the_request_is_recorded(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    fake.script(FakeReply.text("first"), FakeReply.text("second", usage={"prompt_tokens": 7}))
    status, body = await chat(http, fake, headers={"X-Trace": "t1"})
    assert status == 200
    assert body["object"] == "chat.completion" and body["model"] == "m"
    assert message_of(body) == {"role": "assistant", "content": "first", "refusal": None}
    assert body["choices"][0]["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert (await chat(http, fake))[1]["usage"] == {"prompt_tokens": 7}
    assert message_of((await chat(http, fake))[1])["content"] == "hello"  # script used up: default
    record = fake.requests[0]
    assert record.path == "/v1/chat/completions"
    assert record.model == "m" and record.messages == USER_HI and record.tools == []
    assert json.loads(record.raw) == record.body
    assert record.headers["x-trace"] == "t1"
    assert fake.requests[0].received_at <= fake.requests[1].received_at
    assert fake.pending == 0


async def test_unversioned_route_models_and_health(http: aiohttp.ClientSession) -> None:
    async with FakeOpenAIServer(models=["a", "b"]) as fake:
        async with http.post(f"http://127.0.0.1:{fake.port}/chat/completions", json={"model": "a"}) as resp:
            assert resp.status == 400  # reached the chat handler: messages missing
        async with http.get(f"{fake.base_url}/models") as resp:
            assert [m["id"] for m in (await resp.json())["data"]] == ["a", "b"]
        async with http.get(f"http://127.0.0.1:{fake.port}/healthz") as resp:
            assert resp.status == 200
        assert fake.requests[0].path == "/chat/completions"


async def test_requests_need_not_be_recorded(http: aiohttp.ClientSession) -> None:
    async with FakeOpenAIServer(record_requests=False) as fake:
        assert (await chat(http, fake))[0] == 200
        assert fake.requests == [] and fake.max_in_flight == 1


async def test_tool_calls_with_dict_and_verbatim_broken_arguments(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    # FakeReply.tool_calls is the documented spelling; type checkers only know `parallel_tool_calls`.
    two_calls = [("add", {"a": 1, "b": 2}), ("echo", '{"text": "unterminated')]
    fake.script(FakeReply.tool_calls(two_calls))  # type: ignore[operator]
    fake.script(FakeReply.tool_call("add", {"a": 3}, content="thinking"))
    _, body = await chat(http, fake)
    calls = message_of(body)["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["add", "echo"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"a": 1, "b": 2}
    assert calls[1]["function"]["arguments"] == '{"text": "unterminated'
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert message_of(body)["content"] is None
    _, second = await chat(http, fake)
    assert message_of(second)["content"] == "thinking"
    ids = [c["id"] for c in calls + message_of(second)["tool_calls"]]
    assert len(set(ids)) == 3


async def test_error_reply_with_retry_after_then_the_next_scripted_reply(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    fake.script(FakeReply.error(429, "slow down", headers={"Retry-After": "2"}), FakeReply.text("ok"))
    body = {"model": "m", "messages": USER_HI}
    async with http.post(f"{fake.base_url}/chat/completions", json=body) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "2"
        assert resp.content_type == "application/json"
        error = (await resp.json())["error"]
    assert error["message"] == "slow down" and error["code"] == "rate_limit_exceeded" and "type" in error
    status, body = await chat(http, fake)
    assert status == 200 and message_of(body)["content"] == "ok"


async def test_malformed_body_is_sent_verbatim(fake: FakeOpenAIServer, http: aiohttp.ClientSession) -> None:
    fake.script(FakeReply.malformed(), FakeReply.malformed(b"not json at all"))
    for expected in ('{"choices": [', "not json at all"):
        async with http.post(
            f"{fake.base_url}/chat/completions", json={"model": "m", "messages": USER_HI}
        ) as r:
            assert r.status == 200
            assert await r.text() == expected


async def test_per_model_scripts_come_before_the_general_queue(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    fake.script(FakeReply.text("general"))
    fake.script_for("big", FakeReply.text("for big"))
    assert message_of((await chat(http, fake, model="big"))[1])["content"] == "for big"
    assert message_of((await chat(http, fake, model="small"))[1])["content"] == "general"
    assert message_of((await chat(http, fake, model="big"))[1])["content"] == "hello"


async def test_a_one_token_health_probe_takes_nothing_from_the_script(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    """`serve` probes the model once it listens (models/probe.py: at most one token), racing the
    first message: the scripted replies stay the conversation's, whichever request comes first."""
    fake.script(FakeReply.text("scripted"))
    fake.script_for("m", FakeReply.text("scripted for m"))
    assert (await chat(http, fake, max_tokens=1))[0] == 200
    assert (await chat(http, fake, max_completion_tokens=1))[0] == 200
    assert fake.pending == 2 and len(fake.requests) == 2
    assert message_of((await chat(http, fake, max_tokens=256))[1])["content"] == "scripted for m"
    assert message_of((await chat(http, fake))[1])["content"] == "scripted"


async def test_default_handler_calls_the_first_tool_then_reports_the_tool_result(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    fake.default_tool_args = {"a": 1, "b": 2}
    other_tool = {"type": "function", "function": {"name": "other"}}
    _, first = await chat(http, fake, tools=[ADD_TOOL, other_tool])
    [call] = message_of(first)["tool_calls"]
    assert call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
    history = USER_HI + [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "3" * 300},
    ]
    _, second = await chat(http, fake, messages=history, tools=[ADD_TOOL])
    assert message_of(second)["content"] == "done: " + "3" * 200
    assert message_of((await chat(http, fake))[1])["content"] == "hello"


async def test_handler_may_be_sync_or_async(fake: FakeOpenAIServer, http: aiohttp.ClientSession) -> None:
    fake.handler = lambda request: FakeReply.text(f"sync saw {len(request.messages)}")
    assert message_of((await chat(http, fake))[1])["content"] == "sync saw 1"

    async def slow_handler(request: RecordedRequest) -> FakeReply:
        await asyncio.sleep(0)  # an async handler: it awaits
        return FakeReply.text(f"async saw {request.model}")

    fake.handler = slow_handler
    assert message_of((await chat(http, fake))[1])["content"] == "async saw m"


async def test_reject_tools(http: aiohttp.ClientSession) -> None:
    async with FakeOpenAIServer(reject_tools=True) as fake:
        status, body = await chat(http, fake, tools=[ADD_TOOL])
        assert status == 400 and body["error"]["message"] == NO_TOOLS_MESSAGE
        assert (await chat(http, fake))[0] == 200


async def test_api_key_is_required_when_set(http: aiohttp.ClientSession) -> None:
    async with FakeOpenAIServer(api_key="sk-test") as fake:
        status, body = await chat(http, fake)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert (await chat(http, fake, headers={"Authorization": "Bearer wrong"}))[0] == 401
        assert (await chat(http, fake, headers={"Authorization": "Bearer sk-test"}))[0] == 200
        async with http.get(f"{fake.base_url}/models") as resp:
            assert resp.status == 401


async def test_unknown_model_is_404(http: aiohttp.ClientSession) -> None:
    async with FakeOpenAIServer(models=["known"]) as fake:
        status, body = await chat(http, fake, model="unknown")
        assert status == 404 and body["error"]["code"] == "model_not_found"
        assert (await chat(http, fake, model="known"))[0] == 200


async def test_invalid_requests_are_400_and_recorded(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    fake.script(FakeReply.text("kept for the valid request"))
    async with http.post(f"{fake.base_url}/chat/completions", data=b"{not json") as resp:
        assert resp.status == 400 and "error" in await resp.json()
    assert (await chat(http, fake, model=None))[0] == 400
    assert (await chat(http, fake, messages=[]))[0] == 400
    assert (await chat(http, fake, messages="hi"))[0] == 400
    assert len(fake.requests) == 4
    assert fake.requests[0].body is None and fake.requests[0].raw == b"{not json"
    assert message_of((await chat(http, fake))[1])["content"] == "kept for the valid request"


async def test_streaming_text_and_tool_calls_in_openai_chunk_format(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    fake.script(
        FakeReply.text(text), FakeReply.parallel_tool_calls([("add", {"a": 1, "b": 2}), ("echo", '{"x": ')])
    )
    body = {"model": "m", "messages": USER_HI, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(f"{fake.base_url}/chat/completions", json=body) as resp:
        assert resp.content_type == "text/event-stream"
        events = parse_sse(await resp.text())
    assert events[-1] == "[DONE]"
    chunks, usage_chunk = events[:-2], events[-2]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["total_tokens"] >= 0
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    pieces = [c["choices"][0]["delta"]["content"] for c in chunks[1:-1]]
    assert len(pieces) > 3 and all(1 <= len(p) <= 8 for p in pieces)
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert reassemble(chunks) == {"content": text, "tool_calls": [], "finish_reason": "stop"}

    del body["stream_options"]
    async with http.post(f"{fake.base_url}/chat/completions", json=body) as resp:
        events = parse_sse(await resp.text())
    chunks = events[:-1]
    assert all(c["choices"] for c in chunks)  # no usage chunk unless asked for
    heads = [p for c in chunks for p in c["choices"][0]["delta"].get("tool_calls", []) if "id" in p]
    assert [h["function"] for h in heads] == [
        {"name": "add", "arguments": ""},
        {"name": "echo", "arguments": ""},
    ]
    assert all(h["type"] == "function" for h in heads)
    assembled = reassemble(chunks)
    assert assembled["finish_reason"] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in assembled["tool_calls"]] == [
        ("add", json.dumps({"a": 1, "b": 2})),
        ("echo", '{"x": '),
    ]
    argument_parts = [
        p for c in chunks for p in c["choices"][0]["delta"].get("tool_calls", []) if "id" not in p
    ]
    assert len(argument_parts) > 2


async def test_streaming_request_still_gets_errors_as_plain_json(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    fake.script(FakeReply.error(503, "overloaded"))
    body = {"model": "m", "messages": USER_HI, "stream": True}
    async with http.post(f"{fake.base_url}/chat/completions", json=body) as resp:
        assert resp.status == 503 and resp.content_type == "application/json"
        assert (await resp.json())["error"]["message"] == "overloaded"


async def test_chunk_delay_spreads_the_stream_out(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    fake.script(FakeReply.text("abcdefghijkl", chunk_delay=0.02))
    body = {"model": "m", "messages": USER_HI, "stream": True}
    async with http.post(f"{fake.base_url}/chat/completions", json=body) as resp:
        started = time.monotonic()
        first = await resp.content.readline()
        assert first.startswith(b"data: ")
        rest = await resp.read()
        assert time.monotonic() - started >= 0.08  # >= 5 more events, 20 ms apart
    assert reassemble(parse_sse((first + rest).decode())[:-1])["content"] == "abcdefghijkl"


async def test_latency_and_delay(fake: FakeOpenAIServer, http: aiohttp.ClientSession) -> None:
    fake.latency = 5.0
    fake.script(FakeReply.text("instant", delay=0), FakeReply.slow(0.15), FakeReply.slow(3.0))
    started = time.monotonic()
    assert message_of((await chat(http, fake))[1])["content"] == "instant"
    assert time.monotonic() - started < 1.0
    started = time.monotonic()
    assert message_of((await chat(http, fake))[1])["content"] == "hello"
    assert time.monotonic() - started >= 0.15
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(chat(http, fake), 0.05)
    await eventually(lambda: fake.in_flight == 0)  # the client gave up: the fake stops waiting too
    assert fake.in_flight == 0


async def test_concurrent_requests_overlap_and_max_in_flight_counts_them(
    http: aiohttp.ClientSession,
) -> None:
    async with FakeOpenAIServer(latency=0.3) as fake:
        started = time.monotonic()
        requests = asyncio.gather(*(chat(http, fake) for _ in range(200)))
        results = await asyncio.wait_for(requests, timeout=5)  # serialised would take 60 s
        elapsed = time.monotonic() - started
        assert all(status == 200 for status, _ in results)
        assert elapsed < 1.5, f"200 requests at 0.3 s latency took {elapsed:.2f} s: they were serialised"
        assert fake.max_in_flight == 200 and fake.in_flight == 0
        fake.reset()
        fake.latency = 0.0
        for _ in range(3):
            await chat(http, fake)
        assert fake.max_in_flight == 1 and len(fake.requests) == 3


async def test_disconnect_drops_the_connection_without_a_response(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    fake.script(FakeReply(disconnect=True), FakeReply.text("after"))
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await chat(http, fake)
    assert message_of((await chat(http, fake))[1])["content"] == "after"
    assert fake.in_flight == 0 and len(fake.requests) == 2


def test_start_in_thread_serves_synchronous_code() -> None:
    fake = FakeOpenAIServer().start_in_thread()
    try:
        fake.script(FakeReply.text("from a thread"))
        body = json.dumps({"model": "m", "messages": USER_HI}).encode()
        request = urllib.request.Request(f"{fake.base_url}/chat/completions", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert json.load(resp)["choices"][0]["message"]["content"] == "from a thread"
        assert fake.requests[0].model == "m"
    finally:
        fake.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{fake.base_url}/models", timeout=1)
    with FakeOpenAIServer() as fake:  # `with` starts it in a thread too
        with urllib.request.urlopen(f"http://127.0.0.1:{fake.port}/healthz", timeout=5) as resp:
            assert resp.status == 200


def test_command_line_prints_ready_and_serves_until_terminated() -> None:
    python_path = [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(python_path)}
    command = [
        sys.executable,
        "-m",
        "hermes_core.testing.fake_openai",
        "--port",
        "0",
        "--tool-args",
        '{"a": 1}',
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            assert line.startswith("READY http://127.0.0.1:") and line.endswith("/v1")
            body = json.dumps({"model": "m", "messages": USER_HI, "tools": [ADD_TOOL]}).encode()
            request = urllib.request.Request(f"{line.split()[1]}/chat/completions", data=body, method="POST")
            with urllib.request.urlopen(request, timeout=5) as resp:
                [call] = json.load(resp)["choices"][0]["message"]["tool_calls"]
            assert call["function"] == {"name": "add", "arguments": '{"a": 1}'}
            process.terminate()
            assert process.wait(timeout=5) == 0  # SIGTERM is a clean shutdown
        finally:
            if process.poll() is None:
                process.kill()


def openapi_validator(root: str) -> jsonschema.Draft202012Validator:
    """A validator for one schema of OpenAI's published spec (OpenAPI 3.0 `nullable` made JSON Schema)."""

    def convert(node: Any) -> Any:
        if isinstance(node, list):
            return [convert(item) for item in node]
        if not isinstance(node, dict):
            return node
        node = {key: convert(value) for key, value in node.items()}
        if node.pop("nullable", False):
            if isinstance(node.get("type"), str):
                node["type"] = [node["type"], "null"]
            if "enum" in node:
                node["enum"] = [*node["enum"], None]
        return node

    schemas = convert(json.loads(SCHEMAS.read_text())["schemas"])
    return jsonschema.Draft202012Validator(
        {"$ref": f"#/components/schemas/{root}", "components": {"schemas": schemas}}
    )


async def test_answers_match_the_published_openai_schemas(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    completion = openapi_validator("CreateChatCompletionResponse")
    chunk = openapi_validator("CreateChatCompletionStreamResponse")
    replies = [FakeReply.text("hi there"), FakeReply.parallel_tool_calls([("add", {"a": 1}), ("b", "{")])]
    for reply in replies:
        fake.script(reply)
        completion.validate((await chat(http, fake))[1])
        fake.script(reply)
        body = {"model": "m", "messages": USER_HI, "stream": True, "stream_options": {"include_usage": True}}
        async with http.post(f"{fake.base_url}/chat/completions", json=body) as resp:
            for event in parse_sse(await resp.text())[:-1]:
                chunk.validate(event)
