"""The webhook's `"stream": true`: Server-Sent Events while the turn runs, read by a real client.

Against the gateway `serve` builds (build_gateway) and the fake OpenAI-compatible server streaming
its reply chunk by chunk; the events are read off the wire by aiohttp and parsed as the SSE format
says (event/data lines, a blank line ends an event).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from gateway_harness import serving
from hermes_core import Agent, tool
from hermes_core.config import GatewayConfig, Settings, WebhookConfig
from hermes_core.gateway.server import build_gateway
from hermes_core.kernel.replies import REPLIES
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

ANSWER = (
    "Monday and Tuesday stay dry with a light breeze from the east; on Wednesday clouds move in, "
    "and by Thursday afternoon there is steady rain that lasts into Friday. The weekend clears up."
)


@tool
async def search(query: str) -> str:
    """Search the web for a query."""
    await asyncio.sleep(0.3)  # a step that takes a while: the stream shows it running
    return f"results for {query}"


@asynccontextmanager
async def webhook_gateway(tmp_path: Path, fake: FakeOpenAIServer, **model: Any) -> AsyncIterator[str]:
    settings = Settings(gateway=GatewayConfig(data_dir=str(tmp_path)),
                        webhook=WebhookConfig(callback_hosts=["127.0.0.1"]))  # fmt: skip
    agent = Agent(model="fake-model", base_url=fake.base_url, api_key="sk-test", tools=[search], **model)
    gateway, routes = build_gateway(settings, agent)
    try:
        async with serving(gateway, routes) as url:
            yield f"{url}/webhook"
    finally:
        await gateway.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()


async def read_events(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, dict[str, Any], float]]:
    """(event name, its JSON data, when it arrived) for each Server-Sent Event of `response`."""
    name, data = "message", []
    async for raw in response.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield name, json.loads("\n".join(data)), time.monotonic()
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:") :].strip())


async def stream(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], *, stop_after: str | None = None
) -> list[tuple[str, dict[str, Any], float]]:
    """POST `body` with `"stream": true` and read its events (or stop at the first `stop_after`)."""
    events = []
    async with http.post(url, json={**body, "stream": True}) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        async for event in read_events(response):
            events.append(event)
            if event[0] == stop_after:
                break
    return events


async def test_text_deltas_and_tool_steps_arrive_as_they_happen_then_done_with_the_reply(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with FakeOpenAIServer() as fake:
        fake.script(
            FakeReply.tool_call("search", {"query": "Hangzhou weather"}),
            FakeReply.text(ANSWER, chunk_delay=0.03),  # about 30 chunks over 1 s
        )
        async with webhook_gateway(tmp_path, fake) as url:
            events = await stream(http, url, {"message": "weather?", "user_id": "u1", "message_id": "m1"})
    names = [name for name, _, _ in events]
    assert names[-1] == "done" and names.count("done") == 1
    tools = [data for name, data, _ in events if name == "tool"]
    assert [(t["name"], t["status"]) for t in tools] == [("search", "running"), ("search", "done")]
    assert names.index("tool") < names.index("text")  # the step came before the answer's text
    texts = [(data["delta"], at) for name, data, at in events if name == "text"]
    assert "".join(delta for delta, _ in texts) == ANSWER
    assert len(texts) >= 5  # in pieces, as the model wrote
    done = events[-1]
    assert done[1]["reply"] == ANSWER and done[1]["ok"] is True and done[1]["message_id"] == "m1"
    assert done[1]["task_id"].startswith("webhook:m1~")
    assert done[2] - texts[0][1] > 0.3  # the first words long before the end


async def test_a_failed_turn_ends_with_an_error_event(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    half = "Monday and Tuesday stay dry with a light breeze from the east, and then on Wednesday the"

    def broken(request: Any) -> FakeReply:
        return FakeReply.text(half, chunk_delay=0.02, stream_error={"message": "upstream reset"})

    async with FakeOpenAIServer(handler=broken) as fake:
        async with webhook_gateway(tmp_path, fake, max_retries=0) as url:
            events = await stream(http, url, {"message": "weather?", "user_id": "u1"})
    name, data, _ = events[-1]
    assert name == "error" and "done" not in [n for n, _, _ in events]
    assert data["ok"] is False and data["error"] == "model_unavailable"
    assert data["reply"] == REPLIES["model_unavailable"]["en"] and data["task_id"]


async def test_a_retry_of_the_same_message_id_follows_the_turn_and_later_gets_the_stored_reply(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(ANSWER, chunk_delay=0.03))
        async with webhook_gateway(tmp_path, fake) as url:
            body = {"message": "weather?", "user_id": "u1", "message_id": "m7"}
            cut = await stream(http, url, body, stop_after="text")  # the client drops the first request
            retried = await stream(http, url, body)  # while the turn still runs
            later = await stream(http, url, body)  # once it has finished
            plain = await http.post(url, json=body)  # and without streaming
            answer = await plain.json()
    assert len(fake.requests) == 1  # one turn, however often it was asked for
    assert cut[-1][0] == "text"
    assert retried[0][0] == "text" and ANSWER.startswith(retried[0][1]["delta"])  # the text so far
    assert "".join(d["delta"] for n, d, _ in retried if n == "text") == ANSWER
    assert retried[-1][0] == "done" and retried[-1][1]["reply"] == ANSWER
    assert [(n, d.get("delta", d.get("reply"))) for n, d, _ in later] == [("text", ANSWER), ("done", ANSWER)]
    assert later[-1][1]["task_id"] == retried[-1][1]["task_id"]
    assert answer["duplicate"] is True and answer["reply"] == ANSWER


async def test_stream_must_be_a_boolean_and_cannot_have_a_callback(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with FakeOpenAIServer() as fake, webhook_gateway(tmp_path, fake) as url:
        wrong = await http.post(url, json={"message": "hi", "user_id": "u1", "stream": "yes"})
        both = await http.post(
            url, json={"message": "hi", "user_id": "u1", "stream": True, "callback_url": "http://127.0.0.1/x"}
        )
        assert wrong.status == 400 and "'stream' must be true or false" in (await wrong.json())["error"]
        assert both.status == 400 and "cannot be combined" in (await both.json())["error"]
        assert len(fake.requests) == 0
