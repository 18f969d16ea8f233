"""`/metrics` stays bounded whatever tool names the model invents: an attack end to end against the
real `serve` in this event loop and the fake OpenAI-compatible server, /metrics parsed with
prometheus_client's parser (the reference implementation of the text format).

Where the case comes from: issue 31 (a prompt-injected model calling 1,000 invented tool names made
1,000 label values); Prometheus' naming and instrumentation guides ("do not use labels to store
dimensions with high cardinality … such as user IDs"; label values must come from a bounded set).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway_harness import serve_here
from hermes_core.config import load_settings
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest

INVENTED, PER_ANSWER = 1000, 100


async def test_a_thousand_invented_tool_names_make_one_label_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"invented_{uuid.uuid4().hex[:8]}_"
    answers = iter(range(INVENTED // PER_ANSWER))

    def model(request: RecordedRequest) -> FakeReply:
        if (request.body or {}).get("max_tokens") == 1:  # serve's start-up check of the key
            return FakeReply.text("ok")
        batch = next(answers, None)
        if batch is None:
            return FakeReply.text("done")
        names = range(batch * PER_ANSWER, (batch + 1) * PER_ANSWER)
        return FakeReply(tool_calls=[(f"{prefix}{n}", {}) for n in names])

    monkeypatch.setenv("HERMES_API_KEY", "sk-test-0000000000000000")
    async with FakeOpenAIServer() as fake:
        fake.handler = model
        config = tmp_path / "hermes.yaml"
        config.write_text(f"model: {{name: m, base_url: '{fake.base_url}'}}\n"
                          f"agent: {{max_turns: 20, max_tool_calls: 1000, max_tool_failures: 1000}}\n"
                          f"gateway: {{data_dir: '{tmp_path / 'data'}', shutdown_grace: 1}}\n")  # fmt: skip
        async with serve_here(load_settings(config, dotenv=None)) as url, aiohttp.ClientSession() as http:
            async with http.post(f"{url}/webhook", json={"message": "go", "user_id": "u1"}) as response:
                assert response.status == 200
            async with http.get(f"{url}/metrics") as response:
                exposition = await response.text()
    labels = [
        sample.labels.get("tool", "")
        for family in text_string_to_metric_families(exposition)
        if family.name == "hermes_tool_call_seconds"
        for sample in family.samples
        if sample.name == "hermes_tool_call_seconds_count"
    ]
    assert not [label for label in labels if label.startswith(prefix)]
    counts = {
        sample.labels["tool"]: sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name == "hermes_tool_call_seconds_count"
    }
    assert counts.get("other", 0) >= INVENTED
