"""Behind a LiteLLM proxy: its recorded error bodies and headers, replayed over HTTP.

The proxy itself (`litellm[proxy]`) is well over 150 MB installed, too heavy for the test extra,
so what it sends is replayed from recordings (tests/data/provider_bodies/litellm_*.json).
"""

from __future__ import annotations

import pytest

from hermes_core.models.base import ModelUnavailable
from hermes_core.models.openai_compat import OpenAICompatClient
from hermes_core.models.settings import ModelSettings
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from provider_bodies import replay

USER = [{"role": "user", "content": "hi"}]


async def test_litellm_unknown_model_falls_back() -> None:
    """Attack: behind LiteLLM an unknown model is a 400 "Invalid model name passed in model=…"
    (recorded), not a 404, so the fallback model was never tried. It must be."""
    async with FakeOpenAIServer() as fake:
        fake.script_for("gone", replay("litellm_invalid_model"))
        fake.script_for("good", FakeReply.text("hello"))
        model = OpenAICompatClient(ModelSettings(model="gone", base_url=fake.base_url, fallback_models=("good",)))
        response = await model.complete(USER)
        await model.aclose()
    assert response.content == "hello" and response.answered_by == "good"


async def test_litellm_wait_hint_is_honoured() -> None:
    """Attack: LiteLLM's 429 carries its wait as `llm_provider-retry-after` (recorded), not
    `Retry-After`; it was ignored and the retry came at once. The retry must wait that long."""
    async with FakeOpenAIServer() as fake:
        fake.script(replay("litellm_rate_limited"), FakeReply.text("ok"))
        settings = ModelSettings(model="m", base_url=fake.base_url, retry_base_delay=0.01)
        model = OpenAICompatClient(settings)
        assert (await model.complete(USER)).content == "ok"
        await model.aclose()
    first, second = fake.requests
    assert second.received_at - first.received_at >= 0.9


@pytest.mark.parametrize(("provider", "calls"), [(None, 4), ("litellm", 1)])
async def test_retry_budget_counts_the_gateways_retries(provider: str | None, calls: int) -> None:
    """Attack: LiteLLM retries each failed upstream call twice itself, so our 3 retries cost up to
    12 upstream calls. With `retry_budget: 4` and the litellm preset we send 1 request (3 upstream
    calls); directly, the same budget keeps our 3 retries (4 calls)."""
    async with FakeOpenAIServer() as fake:
        fake.script(*[FakeReply.error(503, "overloaded")] * 4)
        settings = ModelSettings(model="m", base_url=fake.base_url, retry_base_delay=0.01, max_retries=3,
                                 retry_budget=4, provider=provider)  # fmt: skip
        model = OpenAICompatClient(settings)
        with pytest.raises(ModelUnavailable):
            await model.complete(USER)
        await model.aclose()
    assert len(fake.requests) == calls
    assert settings.effective_retries == calls - 1
