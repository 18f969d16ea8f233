"""How to reach one OpenAI-compatible endpoint, and how hard to try before giving up.

A plain frozen dataclass (no pydantic, no HTTP library) so that configuration loaders can build it
and tests can construct it without importing aiohttp.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelSettings:
    """Settings for `OpenAICompatClient`. Times are in seconds.

    `api_key` is kept out of `repr()` so that settings can be logged or printed safely.
    `fallback_models` are other model names on the same endpoint, tried in order once the
    primary model has used up its retries. `extra_body` is merged into every request body last, so
    it can add or override any field (`seed`, `tool_choice`, provider-specific options).

    `provider` names the preset whose quirks apply (models/providers.py `Quirks`). The retry
    arithmetic, end to end: one request to a model costs `(1 + retries) × (1 + upstream_retries)`
    upstream calls, where `upstream_retries` is what a gateway retries by itself (LiteLLM: 2).
    `retry_budget` caps that product: our retries become `retry_budget // (1 + upstream_retries) - 1`
    (at least 0), so 3 retries behind LiteLLM (12 upstream calls) become 0 with a budget of 4.
    Without a budget it is `1 + max_retries`, what the same retries cost directly: the total stays
    the same behind a gateway as without one.
    """

    model: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    temperature: float = 0.2
    max_tokens: int | None = None
    top_p: float | None = None
    timeout: float = 30.0
    response_format: dict[str, Any] | None = None
    stream: bool = False
    max_retries: int = 3
    retry_base_delay: float = 1.0
    retry_max_delay: float = 60.0
    fallback_models: tuple[str, ...] = ()
    max_concurrency: int = 64
    requests_per_second: float | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)
    provider: str | None = None
    retry_budget: int | None = None  # upstream calls per model and request; None: 1 + max_retries
    upstream_retries: int | None = None  # None: the preset's (0 without one)

    @property
    def effective_retries(self) -> int:
        """Our retries per model once the endpoint's own retries are counted (see the class doc)."""
        from .providers import quirks_of

        upstream = self.upstream_retries
        upstream = quirks_of(self.provider).upstream_retries if upstream is None else upstream
        budget = 1 + self.max_retries if self.retry_budget is None else self.retry_budget
        return max(0, min(self.max_retries, budget // (1 + upstream) - 1))

    def __post_init__(self) -> None:
        # Fail at construction, not on the first request in production.
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if self.max_retries < 0:
            raise ValueError("max_retries must not be negative")
        if self.timeout <= 0:
            raise ValueError("timeout must be positive")
        if self.retry_budget is not None and self.retry_budget < 1:
            raise ValueError("retry_budget must be at least 1 (one upstream call)")
        if self.requests_per_second is not None and self.requests_per_second <= 0:
            raise ValueError("requests_per_second must be positive (or None for no limit)")
        # A YAML loader hands over a list; keep the declared immutable tuple.
        object.__setattr__(self, "fallback_models", tuple(self.fallback_models))
