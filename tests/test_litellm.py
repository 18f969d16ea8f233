"""Behind a LiteLLM proxy: what the real proxy sent, replayed over HTTP.

The proxy (`litellm[proxy]` 1.108.7) installs to about 750 MB, too heavy for the test extra, so
its answers were recorded from a real proxy process on 127.0.0.1 whose upstream was the fake
endpoint (tests/data/provider_bodies/litellm_*.json), and are replayed here.
"""

from __future__ import annotations

import pytest

from hermes_core.kernel.model import ModelUnavailable
from hermes_core.models.openai_compat import OpenAICompatClient
from hermes_core.models.settings import ModelSettings
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from provider_bodies import recorded, replay

USER = [{"role": "user", "content": "hi"}]


async def test_litellm_unknown_model_falls_back() -> None:
    """Attack: behind LiteLLM an unknown model is a 400 "Invalid model name passed in model=…"
    (recorded), not a 404, so the fallback model was never tried. It must be."""
    async with FakeOpenAIServer() as fake:
        fake.script_for("gone", replay("litellm_invalid_model"))
        fake.script_for("good", FakeReply.text("hello"))
        model = OpenAICompatClient(
            ModelSettings(model="gone", base_url=fake.base_url, fallback_models=("good",))
        )
        response = await model.complete(USER)
        await model.aclose()
    assert response.content == "hello" and response.answered_by == "good"


async def test_litellm_wait_hint_is_honoured() -> None:
    """Attack: LiteLLM's 429 carries its wait as `llm_provider-retry-after` (recorded), not
    `Retry-After`; it was ignored and the retry came at once. The retry must wait for it (7 s,
    capped here by `retry_max_delay` to 1 s; without the hint the wait would be 0.01 s)."""
    async with FakeOpenAIServer() as fake:
        fake.script(replay("litellm_rate_limited"), FakeReply.text("ok"))
        settings = ModelSettings(
            model="m", base_url=fake.base_url, retry_base_delay=0.01, retry_max_delay=1.0
        )
        model = OpenAICompatClient(settings)
        assert (await model.complete(USER)).content == "ok"
        await model.aclose()
    first, second = fake.requests
    assert second.received_at - first.received_at >= 0.9


@pytest.mark.parametrize(
    ("provider", "budget", "calls"),
    [(None, 4, 4), ("litellm", 4, 1), ("litellm", None, 1), ("litellm", 9, 3)],
)
async def test_retry_budget_counts_the_gateways_retries(
    provider: str | None, budget: int | None, calls: int
) -> None:
    """Attack: LiteLLM retries each failed upstream call twice itself, so our 3 retries cost up to
    12 upstream calls. With `retry_budget: 4` and the litellm preset we send 1 request (3 upstream
    calls); directly, the same budget keeps our 3 retries (4 calls). Without a budget the default
    is what our retries cost directly (4), so behind LiteLLM it is 1 request too; 9 allows 3."""
    async with FakeOpenAIServer() as fake:
        fake.script(*[FakeReply.error(503, "overloaded")] * 4)
        settings = ModelSettings(model="m", base_url=fake.base_url, retry_base_delay=0.01, max_retries=3,
                                 retry_budget=budget, provider=provider)  # fmt: skip
        model = OpenAICompatClient(settings)
        with pytest.raises(ModelUnavailable):
            await model.complete(USER)
        await model.aclose()
    assert len(fake.requests) == calls
    assert settings.effective_retries == calls - 1
    # the preset's count is what the real proxy did: 3 upstream calls for one request
    from hermes_core.models.providers import quirks_of

    assert 1 + quirks_of("litellm").upstream_retries == recorded("litellm_rate_limited")["upstream_calls"]
