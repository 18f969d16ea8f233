"""Cached prompt tokens: read from each provider's usage fields, kept per call and per task, shown
in traces, the console's task page and /metrics.

Where the cases come from: the usage objects the providers document — OpenAI's prompt-caching
guide (`prompt_tokens_details.cached_tokens`), DashScope's context-cache page (its example:
3,019 prompt tokens, 2,048 cached), DeepSeek's context-caching guide (`prompt_cache_hit_tokens`,
`prompt_cache_miss_tokens`), Moonshot's context caching (a top-level `cached_tokens`) — and the
values a proxy sends instead (null, a string, more cached than prompt tokens). Each is sent by the
fake OpenAI server over HTTP, streamed and not, and read by the real client.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hermes_core import Agent, tool
from hermes_core.kernel.messages import Usage
from hermes_core.models.openai_compat import OpenAICompatClient
from hermes_core.models.settings import ModelSettings
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from test_console import console, fetch, traced

USAGES = {  # provider: (its usage object, the cached tokens read from it)
    "openai": (
        {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
         "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0}},
        1920,
    ),
    "dashscope": (
        {"prompt_tokens": 3019, "completion_tokens": 104, "total_tokens": 3123,
         "prompt_tokens_details": {"cached_tokens": 2048}},
        2048,
    ),
    "deepseek": (
        {"prompt_tokens": 1500, "completion_tokens": 20, "total_tokens": 1520,
         "prompt_cache_hit_tokens": 1408, "prompt_cache_miss_tokens": 92},
        1408,
    ),
    "moonshot": (
        {"prompt_tokens": 800, "completion_tokens": 10, "total_tokens": 810, "cached_tokens": 768},
        768,
    ),
    "no cache fields": ({"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}, 0),
    "null details": ({"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14,
                      "prompt_tokens_details": None}, 0),
    "null cached": ({"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14,
                     "prompt_tokens_details": {"cached_tokens": None}}, 0),
    "string cached": ({"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14,
                       "prompt_cache_hit_tokens": "7"}, 0),
    "more cached than prompt": ({"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14,
                                 "prompt_tokens_details": {"cached_tokens": 64}}, 11),
}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("provider", list(USAGES))
async def test_each_providers_cache_field_is_read(
    fake: FakeOpenAIServer, provider: str, stream: bool
) -> None:
    usage, cached = USAGES[provider]
    fake.script(FakeReply.text("Hello", usage=usage))
    client = OpenAICompatClient(ModelSettings(model="m", base_url=fake.base_url, max_retries=0))
    try:
        chunks: list[str] = []
        response = await client.complete(
            [{"role": "user", "content": "hi"}], on_text=chunks.append if stream else None
        )
    finally:
        await client.aclose()
    assert (fake.requests[0].body or {}).get("stream", False) is stream
    prompt, completion, total = usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]
    assert response.usage == Usage(prompt, completion, total, cached)


@tool
def add_order(amount: int) -> str:
    """Add one order's amount to the running total."""
    return f"added {amount}"


def one_call_per_turn(request: RecordedRequest) -> FakeReply:
    if request.messages[-1]["role"] == "tool":
        return FakeReply.text("Added.")
    return FakeReply.tool_call("add_order", {"amount": 1235})


def served_from_cache(requests: list[RecordedRequest]) -> list[int]:
    """What the fake's prefix cache served each request: the longest prefix (tools, then messages, as
    JSON) shared with an earlier request, at four characters per token."""
    prompts = [json.dumps([r.tools, r.messages], ensure_ascii=False) for r in requests]
    return [
        max((len(os.path.commonprefix([prompt, seen])) for seen in prompts[:i]), default=0) // 4
        for i, prompt in enumerate(prompts)
    ]


async def test_cached_tokens_reach_the_trace_the_console_and_metrics(tmp_path: Path) -> None:
    """Three turns through `serve` (the console's chat, streamed), the fake answering as DeepSeek
    does: each call's cached tokens in its trace, their sum in the task's usage, the task page
    shows them, and /metrics counts them beside the prompt tokens."""
    model = "cache-probe-model"  # its own label: /metrics is the process's
    async with FakeOpenAIServer(handler=one_call_per_turn) as fake:
        fake.prompt_cache = "deepseek"
        agent = Agent(model=model, base_url=fake.base_url, tools=[add_order], max_retries=0)
        store = traced(agent, tmp_path)
        async with console(tmp_path, agent) as url:
            for turn in range(3):
                body = {"message": f"order {turn}: 1235 yuan", "conversation": "t1"}
                status, _, _ = await fetch(f"{url}/console/api/chat", method="POST", body=body)
                assert status == 200
            traces = [await store.get(s["task_id"]) for s in await store.list()]
            records = sorted((t for t in traces if t is not None), key=lambda t: t["started_at"])
            pages = [
                (await fetch(f"{url}/console/tasks/{t['task_id'].replace(':', '%3A')}"))[1] for t in records
            ]
            _, metrics, _ = await fetch(f"{url}/metrics")
        expected = served_from_cache(list(fake.requests))
    per_call = [call["response"]["usage"]["cached_tokens"] for t in records for call in t["model_calls"]]
    assert per_call == expected and sum(expected[2:]) > 0  # later turns reuse the earlier prefix
    for record in records:
        calls = [call["response"]["usage"] for call in record["model_calls"]]
        assert record["usage"]["cached_tokens"] == sum(u["cached_tokens"] for u in calls)
    shown = records[-1]["usage"]["cached_tokens"]
    assert f", {shown} of them cached" in pages[-1]
    counters = {
        family.name: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.labels.get("model") == model and sample.name.endswith("_total")
    }
    assert counters["hermes_cached_prompt_tokens"] == sum(expected)
    assert counters["hermes_prompt_tokens"] == sum(
        call["response"]["usage"]["prompt_tokens"] for t in records for call in t["model_calls"]
    )
