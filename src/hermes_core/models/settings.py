"""Every option of the model, declared once: the YAML `model:` section, `Agent(settings=…)` and
what the client reads are this one type; adding an option is one field here, with its comment.

A pydantic dataclass: a configuration file validates straight into it (a bad value names its key
and what is allowed), and code that builds one is held to the same bounds. No HTTP library.
"""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, ConfigDict, Field, field_validator
from pydantic.dataclasses import dataclass

from ..kernel.model import ToolMode
from .families import FAMILIES


@dataclass(config=ConfigDict(extra="forbid"))
class ModelRoute:
    """One of `model.routes` (models/routing.py): a question that `when` matches, at most `max_chars`
    characters long, goes to `model` (a model of the same endpoint) instead of the main model.
    `short`: any question that short; `small_talk`: a greeting of `agent.greeting_patterns`. Only a
    task's first model call is routed; a routed model that answers with tool calls escalates (its
    answer is dropped and the main model answers instead, then runs the task's tools). It is offered
    only the tools it may use (`allowed_models`)."""

    when: Literal["short", "small_talk"]
    model: Annotated[str, Field(min_length=1)]
    max_chars: Annotated[int, Field(ge=1, le=10_000)] = 40


@dataclass(config=ConfigDict(extra="forbid"))
class ModelSettings:
    """Settings for the model: its endpoint, how it is asked, how hard to try. Times are in seconds.

    `model` (YAML: `name`) and `base_url` may be left out: a provider preset or the environment
    fills them in (config.py `model_endpoint`, agent.py). `api_key` comes only from the environment
    (a file that holds one is refused) and is kept out of `repr()`, so settings can be logged safely.
    `fallback_models` (YAML: `fallback`) are other model names on the same endpoint, tried in order
    once the primary model has used up its retries. `extra_body` is merged into every request body
    last, so it can add or override any field (`seed`, `tool_choice`, provider-specific options).

    `provider` names the preset whose quirks apply (models/providers.py `Quirks`). The retry
    arithmetic, end to end: one request to a model costs `(1 + retries) × (1 + upstream_retries)`
    upstream calls, where `upstream_retries` is what a gateway retries by itself (LiteLLM: 2).
    `retry_budget` caps that product: our retries become `retry_budget // (1 + upstream_retries) - 1`
    (at least 0), so 3 retries behind LiteLLM (12 upstream calls) become 0 with a budget of 4.
    Without a budget it is `1 + max_retries`, what the same retries cost directly: the total stays
    the same behind a gateway as without one.
    """

    model: Annotated[str | None, Field(validation_alias=AliasChoices("name", "model"))] = None
    base_url: str | None = None  # None: HERMES_BASE_URL, or the preset's; neither: the offline demo model
    api_key: str | None = field(default=None, repr=False)  # None: HERMES_API_KEY (or the preset's variable)
    provider: str | None = None  # a preset of models/providers.py: openai, deepseek, qwen, ollama…
    temperature: Annotated[float, Field(ge=0, le=2)] = 0.2
    max_tokens: Annotated[int | None, Field(gt=0)] = None
    top_p: Annotated[float | None, Field(gt=0, le=1)] = None
    timeout: Annotated[float, Field(gt=0)] = 30.0  # seconds one request may take
    response_format: dict[str, Any] | None = None
    stream: bool = False
    max_retries: Annotated[int, Field(ge=0, le=10)] = 3
    retry_base_delay: float = 1.0
    retry_max_delay: float = 60.0
    fallback_models: Annotated[
        tuple[str, ...], Field(validation_alias=AliasChoices("fallback", "fallback_models"))
    ] = ()
    max_concurrency: Annotated[int, Field(ge=1)] = 64  # requests in flight at once
    requests_per_second: Annotated[float | None, Field(gt=0)] = None  # None: no limit
    extra_headers: dict[str, str] = field(default_factory=dict)  # never a credential (config.py refuses one)
    extra_body: dict[str, Any] = field(default_factory=dict)
    retry_budget: Annotated[int | None, Field(ge=1)] = None  # upstream calls per model and request
    upstream_retries: Annotated[int | None, Field(ge=0)] = None  # None: the preset's (0 without one)
    tool_mode: ToolMode = "auto"  # native | text | auto: how tools reach the model (textcalls/wrapper.py)
    # the family of text tool calls the model writes (models/families.py): only it (and the Hermes
    # format of text mode) is read; None: every family, until `auto` recognises one in a reply
    tool_format: str | None = None
    think_open: bool = False  # the model's template opens <think> in the prompt (R1, QwQ, Qwen3 thinking)
    routes: list[ModelRoute] = field(default_factory=list)  # cheaper models for simple questions
    vision: bool = False  # the model (and its fallbacks) takes pictures as image parts (docs/media.md)

    @field_validator("tool_format")
    @classmethod
    def _known_family(cls, value: str | None) -> str | None:
        if value is not None and value not in FAMILIES:
            raise ValueError(f"unknown tool-call family {value!r}; known: {', '.join(FAMILIES)}")
        return value

    @property
    def name(self) -> str | None:
        """The model's name, as the YAML section calls it (`model.name`)."""
        return self.model

    @name.setter
    def name(self, value: str | None) -> None:
        self.model = value

    @property
    def fallback(self) -> list[str]:
        """`fallback_models`, as the YAML section calls it (`model.fallback`)."""
        return list(self.fallback_models)

    @property
    def effective_retries(self) -> int:
        """Our retries per model once the endpoint's own retries are counted (see the class doc)."""
        from .providers import quirks_of

        upstream = self.upstream_retries
        upstream = quirks_of(self.provider).upstream_retries if upstream is None else upstream
        budget = 1 + self.max_retries if self.retry_budget is None else self.retry_budget
        return max(0, min(self.max_retries, budget // (1 + upstream) - 1))
