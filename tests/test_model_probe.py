"""`serve` notices a model that refuses its key (issue 29, item 4): before, it started, /healthz said ok
with nothing degraded, and every user was told to rephrase; only `doctor` named the bad key.

The refusals are the OpenAI API's documented errors, as the fake OpenAI-compatible server answers
them (testing/fake_openai.py): 401 `invalid_api_key` ("Incorrect API key provided.") for a key it
does not take (`api_key`), 404 `model_not_found` for a model it does not serve (`models`). `serve`
runs in this event loop with all its parts (webhook, console, /metrics); /metrics is parsed with
prometheus_client's parser, the reference implementation of the exposition format.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway_harness import serve_here
from hermes_core.config import load_settings
from hermes_core.gateway.model_health import MISCONFIGURED, ModelHealth
from hermes_core.models.providers import Endpoint
from hermes_core.testing.fake_openai import FakeOpenAIServer
from serve_process import clean_environ, start_serve, stop_serve
from waiting import eventually, wait_for

RIGHT_KEY = "sk-right-5f1c0e9a7b3d44e1"
WRONG_KEY = "sk-wrong-83d2aa61c4f07b95"


@asynccontextmanager
async def served(tmp_path: Path, fake: FakeOpenAIServer, model: str = "m") -> AsyncIterator[str]:
    """`serve` on a free port, its model the fake (the key: HERMES_API_KEY, set by the test); its URL."""
    config = tmp_path / "hermes.yaml"
    config.write_text(f"model: {{name: {model}, base_url: '{fake.base_url}'}}\n"
                      f"gateway: {{data_dir: '{tmp_path / 'data'}', shutdown_grace: 1}}\n")  # fmt: skip
    async with serve_here(load_settings(config, dotenv=None)) as url:
        yield url


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def ask(url: str, message: str) -> dict[str, Any]:
    body = {"message": message, "user_id": "u1"}
    async with aiohttp.ClientSession() as session, session.post(f"{url}/webhook", json=body) as response:
        assert response.status == 200
        answer: dict[str, Any] = await response.json()
        return answer


async def model_parts(url: str) -> list[dict[str, Any]]:
    status, text = await get(f"{url}/healthz")
    assert status == 200, text  # degraded, not down: a healthcheck must not restart a working process
    return [part for part in json.loads(text)["degraded"] if part["component"] == "model"]


async def degraded_gauge(url: str) -> float | None:
    _, text = await get(f"{url}/metrics")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hermes_degraded" and sample.labels == {"component": "model"}:
                return sample.value
    return None


async def test_a_refused_key_is_degraded_everywhere_and_users_get_a_polite_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrong key: /healthz lists `model` naming HERMES_API_KEY, /metrics says 1, the console's
    status has it, and the users read, in their language, that the bot is misconfigured. The key
    itself appears nowhere."""
    monkeypatch.setenv("HERMES_API_KEY", WRONG_KEY)
    async with FakeOpenAIServer(api_key=RIGHT_KEY) as fake, served(tmp_path, fake) as url:
        await eventually(lambda: model_parts(url))
        [part] = await model_parts(url)
        assert "HERMES_API_KEY was refused" in part["detail"] and "HTTP 401" in part["detail"]
        assert "set HERMES_API_KEY" in part["fix"]
        assert await degraded_gauge(url) == 1.0
        _, console = await get(f"{url}/console/api/status")
        assert [p["component"] for p in json.loads(console)["gateway"]["degraded"]] == ["model"]
        english, chinese = await ask(url, "what is 2+2?"), await ask(url, "你好，帮我算一下")
        shown = [await get(f"{url}/healthz"), await get(f"{url}/metrics"), console, english, chinese]
    assert english["reply"] == MISCONFIGURED["en"] and chinese["reply"] == MISCONFIGURED["zh"]
    assert (english["ok"], english["error"]) == (False, "model_rejected")
    assert "rephrase" not in english["reply"] and WRONG_KEY not in json.dumps(shown, ensure_ascii=False)
    assert fake.requests[0].headers["Authorization"] == f"Bearer {WRONG_KEY}"  # the probe, unasked


async def test_the_right_key_is_not_degraded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same set-up with the key the endpoint takes: probed, and nothing degraded."""
    monkeypatch.setenv("HERMES_API_KEY", RIGHT_KEY)
    async with FakeOpenAIServer(api_key=RIGHT_KEY) as fake, served(tmp_path, fake) as url:
        await eventually(lambda: len(fake.requests) == 1)
        # the probe's answer is read: its verdict shows nowhere while it is fine (no marker to wait for)
        await asyncio.sleep(0.2)
        assert await model_parts(url) == [] and await degraded_gauge(url) == 0.0
        assert (await ask(url, "hello"))["ok"] is True


async def test_an_unknown_model_is_degraded_with_the_closest_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model the endpoint does not serve (404 model_not_found): degraded, the fix naming the model
    it lists; the users get the same polite reply."""
    monkeypatch.setenv("HERMES_API_KEY", RIGHT_KEY)
    async with (
        FakeOpenAIServer(api_key=RIGHT_KEY, models=["qwen2.5-7b-instruct", "llama3"]) as fake,
        served(tmp_path, fake, model="qwen2.5-7b") as url,
    ):
        await eventually(lambda: model_parts(url))
        [part] = await model_parts(url)
        assert "does not know the model 'qwen2.5-7b'" in part["detail"]
        assert "closest it lists: qwen2.5-7b-instruct" in part["fix"]
        assert (await ask(url, "hello"))["reply"] == MISCONFIGURED["en"]


async def test_a_model_call_that_succeeds_clears_the_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key is fixed at the endpoint (it takes the one serve has): the next message is answered by
    the model, and the model is no longer degraded."""
    monkeypatch.setenv("HERMES_API_KEY", WRONG_KEY)
    async with FakeOpenAIServer(api_key=RIGHT_KEY) as fake, served(tmp_path, fake) as url:
        await eventually(lambda: model_parts(url))
        fake.api_key = WRONG_KEY  # the endpoint now takes this key
        answer = await ask(url, "hello")
        assert answer["ok"] is True and answer["reply"] != MISCONFIGURED["en"]
        assert await model_parts(url) == [] and await degraded_gauge(url) == 0.0


async def test_the_probe_does_not_delay_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An endpoint that takes 30 s to answer: serve listens and answers /healthz at once while the
    probe still waits."""
    monkeypatch.setenv("HERMES_API_KEY", RIGHT_KEY)
    async with FakeOpenAIServer(api_key=RIGHT_KEY, latency=30) as fake:
        started = time.monotonic()
        async with served(tmp_path, fake) as url:
            status, _ = await get(f"{url}/healthz")
            answered = time.monotonic() - started
            await eventually(lambda: len(fake.requests) == 1)  # the probe is out, unanswered
            assert status == 200 and await model_parts(url) == []
    assert answered < 5, answered


async def test_a_probe_that_hangs_is_cut_and_a_degraded_model_is_probed_again() -> None:
    """`ModelHealth` alone, against the fake: a probe of an endpoint that does not answer is cut by
    its timeout (and says so); while degraded, the probe runs again every `interval` and clears the
    state once the endpoint takes the key, without any user writing."""
    async with FakeOpenAIServer(api_key=RIGHT_KEY, latency=30) as fake:
        hanging = ModelHealth(Endpoint("m", fake.base_url, api_key=RIGHT_KEY), timeout=0.3)
        started = time.monotonic()
        found = await hanging.probe()
        assert time.monotonic() - started < 3 and found.verdict == "unreachable" and hanging.degraded() == []
    async with FakeOpenAIServer(api_key=RIGHT_KEY) as fake:
        health = ModelHealth(Endpoint("m", fake.base_url, key_env="DEEPSEEK_API_KEY", api_key=WRONG_KEY),
                             interval=0.1)  # fmt: skip
        health.start()
        try:
            await eventually(lambda: bool(health.degraded()))
            assert "DEEPSEEK_API_KEY was refused" in str(health.degraded()[0]["detail"])  # the provider's
            fake.api_key = WRONG_KEY
            await eventually(lambda: health.degraded() == [])
        finally:
            await health.stop()
    assert health.probes >= 2


@pytest.mark.slow
def test_the_command_serve_says_it_in_one_error_line_naming_the_variable(tmp_path: Path) -> None:
    """`hermes-kernel serve` as an operator starts it, a provider preset with the wrong key in the
    provider's variable: /healthz names DEEPSEEK_API_KEY, and the log has one ERROR line saying
    what to set, without the key."""
    with FakeOpenAIServer(api_key=RIGHT_KEY) as fake:
        (tmp_path / "hermes.yaml").write_text(f"model: {{provider: deepseek, base_url: '{fake.base_url}'}}\n")
        env = clean_environ(DEEPSEEK_API_KEY=WRONG_KEY)
        process, found = start_serve("--config", "hermes.yaml", "serve", "--port", "0", cwd=tmp_path, env=env,
                                     stderr=subprocess.PIPE)  # fmt: skip

        def degraded_model() -> list[dict[str, Any]]:
            with urllib.request.urlopen(f"{found.group(1)}/healthz", timeout=5) as response:
                return [p for p in json.loads(response.read())["degraded"] if p["component"] == "model"]

        try:
            parts = wait_for(degraded_model, 20, "the model among /healthz's degraded parts")
        finally:
            log = stop_serve(process)
    assert parts and "DEEPSEEK_API_KEY was refused" in parts[0]["detail"]
    [line] = [line for line in log.splitlines() if "model degraded" in line]
    assert "ERROR" in line and "set DEEPSEEK_API_KEY to a key this endpoint accepts" in line
    assert WRONG_KEY not in log
