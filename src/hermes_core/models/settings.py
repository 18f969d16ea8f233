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

    def __post_init__(self) -> None:
        # Fail at construction, not on the first request in production.
        if self.max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if self.max_retries < 0:
            raise ValueError("max_retries must not be negative")
        if self.timeout <= 0:
            raise ValueError("timeout must be positive")
        if self.requests_per_second is not None and self.requests_per_second <= 0:
            raise ValueError("requests_per_second must be positive (or None for no limit)")
        # A YAML loader hands over a list; keep the declared immutable tuple.
        object.__setattr__(self, "fallback_models", tuple(self.fallback_models))
