"""Provider presets: the common OpenAI-compatible endpoints as a one-word choice.

    model:
      provider: deepseek        # or HERMES_PROVIDER=deepseek, or --provider deepseek

fills in the endpoint's base URL, the environment variable its API key is read from and a default
model; `model.name` / `model.base_url` still override the preset's (another model of the same
provider, the international host, a remote Ollama). Without a provider, a model needs both a name
and a base URL (HERMES_MODEL and HERMES_BASE_URL); with neither, nor a provider, the offline demo
model answers. Anything in between is a configuration mistake, and `resolve_endpoint` says which
in one sentence instead of quietly falling back to the demo.

Stdlib only: configuration, the command line and doctor import it before any HTTP library.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

GENERIC_KEY = "HERMES_API_KEY"  # any endpoint's key; a preset's own variable comes first


@dataclass(frozen=True)
class Provider:
    """One preset. `key_env` None: a local server that needs no key (HERMES_API_KEY is still sent
    when set, for a server started with one). `model` None: the server serves whatever it loaded,
    so the model name must be given."""

    name: str
    title: str
    base_url: str
    key_env: str | None
    model: str | None
    doc: str  # where the base URL and model names are documented
    aliases: tuple[str, ...] = field(default=())
    quirks: Quirks = field(default_factory=lambda: Quirks())


@dataclass(frozen=True)
class Quirks:
    """What one endpoint needs beyond the OpenAI format (docs/providers.md has the table).

    - `stream_usage`: `stream_options: {"include_usage": true}` is accepted (an endpoint that refuses
      it, like Azure AI inference, is also found out by its 400 and remembered);
    - `upstream_retries`: how often the endpoint itself retries a failed upstream call (LiteLLM's
      proxy retries twice), counted against `model.retry_budget`.
    """

    stream_usage: bool = True
    upstream_retries: int = 0


NO_QUIRKS = Quirks()


# One table. Base URLs and model names as each provider documents them (the `doc` page).
PROVIDERS: tuple[Provider, ...] = (
    # https://platform.openai.com/docs/models — gpt-4.1-mini takes `temperature` and tools (the
    # gpt-5 reasoning models refuse any temperature but the default).
    Provider("openai", "OpenAI", "https://api.openai.com/v1", "OPENAI_API_KEY", "gpt-4.1-mini",
             "https://platform.openai.com/docs/models"),
    # https://api-docs.deepseek.com/ — base_url https://api.deepseek.com; deepseek-chat and
    # deepseek-reasoner are deprecated names of deepseek-v4-flash's two modes.
    # Thinking mode: reasoning_content must be sent back in a tool loop
    # (https://api-docs.deepseek.com/guides/thinking_mode#tool-calls): every endpoint gets it back
    # (models/openai_compat.py), so DeepSeek behind a gateway or a bare base URL needs no preset.
    Provider("deepseek", "DeepSeek", "https://api.deepseek.com", "DEEPSEEK_API_KEY", "deepseek-v4-flash",
             "https://api-docs.deepseek.com/"),
    # https://help.aliyun.com/zh/model-studio/compatibility-of-openai-with-dashscope — compatible
    # mode (Beijing; Singapore: https://dashscope-intl.aliyuncs.com/compatible-mode/v1).
    Provider("qwen", "Qwen (Alibaba Cloud DashScope, compatible mode)",
             "https://dashscope.aliyuncs.com/compatible-mode/v1", "DASHSCOPE_API_KEY", "qwen-plus",
             "https://help.aliyun.com/zh/model-studio/compatibility-of-openai-with-dashscope",
             ("dashscope", "tongyi")),
    # https://platform.moonshot.cn/docs — China host (international: https://api.moonshot.ai/v1).
    Provider("moonshot", "Moonshot AI (Kimi)", "https://api.moonshot.cn/v1", "MOONSHOT_API_KEY", "kimi-k2.6",
             "https://platform.moonshot.cn/docs", ("kimi",)),
    # https://docs.bigmodel.cn/ — OpenAI-compatible path /api/paas/v4; glm-4-flash is the free model.
    Provider("zhipu", "Zhipu AI (GLM, BigModel)", "https://open.bigmodel.cn/api/paas/v4", "ZHIPUAI_API_KEY",
             "glm-4-flash", "https://docs.bigmodel.cn/", ("glm", "bigmodel", "zhipuai")),
    # https://docs.siliconflow.cn/cn/userguide/quickstart — base_url https://api.siliconflow.cn/v1.
    Provider("siliconflow", "SiliconFlow", "https://api.siliconflow.cn/v1", "SILICONFLOW_API_KEY",
             "Qwen/Qwen2.5-7B-Instruct", "https://docs.siliconflow.cn/cn/userguide/quickstart"),
    # https://openrouter.ai/docs/quickstart — model names are <vendor>/<model>.
    Provider("openrouter", "OpenRouter", "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY",
             "openai/gpt-4.1-mini", "https://openrouter.ai/docs/quickstart"),
    # https://docs.ollama.com/api/openai-compatibility — no key; `ollama pull qwen2.5` first.
    Provider("ollama", "Ollama (local)", "http://127.0.0.1:11434/v1", None, "qwen2.5",
             "https://docs.ollama.com/api/openai-compatibility"),
    # https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html — `vllm serve MODEL`
    # on port 8000; the model is the one it serves (GET /v1/models).
    Provider("vllm", "vLLM (local)", "http://127.0.0.1:8000/v1", None, None,
             "https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html"),
    # https://github.com/ggml-org/llama.cpp/tree/master/tools/server — llama-server serves the one
    # model it loaded whatever the name; its default port 8080 is also serve's: start one on another.
    Provider("llamacpp", "llama.cpp server (local)", "http://127.0.0.1:8080/v1", None, "default",
             "https://github.com/ggml-org/llama.cpp/tree/master/tools/server", ("llama.cpp", "llama-cpp")),
    # https://lmstudio.ai/docs/api/openai-api — port 1234; the model is the identifier LM Studio shows.
    Provider("lmstudio", "LM Studio (local)", "http://127.0.0.1:1234/v1", None, None,
             "https://lmstudio.ai/docs/api/openai-api", ("lm-studio",)),
    # https://docs.litellm.ai/docs/proxy/quick_start — the proxy listens on port 4000 and retries a
    # failed upstream call twice itself (num_retries); the model is a model_name of its config.
    Provider("litellm", "LiteLLM proxy", "http://127.0.0.1:4000/v1", None, None,
             "https://docs.litellm.ai/docs/proxy/quick_start", quirks=Quirks(upstream_retries=2)),
    # https://docs.mistral.ai/api/ — magistral models answer `content` as a list of typed parts.
    Provider("mistral", "Mistral AI", "https://api.mistral.ai/v1", "MISTRAL_API_KEY", "mistral-small-latest",
             "https://docs.mistral.ai/api/"),
)  # fmt: skip


def quirks_of(provider: str | None) -> Quirks:
    """The quirks of a preset by name; none for an endpoint given only by its URL."""
    found = _BY_NAME.get((provider or "").strip().lower()) if provider else None
    return found.quirks if found else NO_QUIRKS


# What servers answer when the model or server cannot take the `tools` parameter at all, as each
# one words it (the bodies are recorded in tests/data/provider_bodies/). Only these switch `auto`
# tool mode to text: any other error that merely mentions a tool is about something else.
NO_TOOL_SUPPORT: tuple[tuple[str, str], ...] = (
    ("vllm", '"auto" tool choice requires --enable-auto-tool-choice'),
    ("vllm", "--tool-call-parser"),
    ("ollama", "does not support tools"),
    ("llamacpp", "tools param requires --jinja"),
    ("openrouter", "no endpoints found that support tool use"),
    ("lmstudio", "tools are not supported"),
    ("llamacpp", "unsupported param: tools"),  # before --jinja existed: a 500 (server/utils.hpp)
    ("gemini", "function calling is not enabled for models/"),  # Gemma on Gemini's endpoint: a 400
)

# A model name the endpoint does not know: a 404 from most, a 400 from gateways (LiteLLM).
UNKNOWN_MODEL: tuple[str, ...] = (
    "invalid model name",
    "model_not_found",
    "is not a valid model id",
)

# Models that refuse any `temperature` but the default (OpenAI's o-series and gpt-5 reasoning
# models: "Unsupported value: 'temperature' does not support 0.2 with this model").
_NO_TEMPERATURE = re.compile(r"(^|/)(o\d([-.\w]*)?|gpt-5(?!-chat)[-.\w]*)$")


def refuses_tools(message: str) -> bool:
    """True when an error text says the endpoint cannot take tools at all."""
    text = message.lower()
    return any(phrase.lower() in text for _, phrase in NO_TOOL_SUPPORT)


def unknown_model(status: int, message: str) -> bool:
    """True when an error says the model name is unknown (a fallback may still answer)."""
    if status == 404:
        return not refuses_tools(message)
    text = message.lower()
    return status == 400 and any(phrase in text for phrase in UNKNOWN_MODEL)


@functools.lru_cache(maxsize=256)  # asked at every request: a regular expression per model name
def refuses_temperature(model: str) -> bool:
    return bool(_NO_TEMPERATURE.search(model.strip().lower()))


_BY_NAME = {key: p for p in PROVIDERS for key in (p.name, *p.aliases)}


class EndpointError(ValueError):
    """A half-configured model, worded as the one thing to set."""


@dataclass(frozen=True)
class Endpoint:
    """The model in use: name, URL, and which variable the key came from (the key kept out of repr)."""

    model: str
    base_url: str
    provider: str | None = None
    key_env: str | None = None  # the variable the key was read from, or would be read from
    api_key: str | None = field(default=None, repr=False)

    def describe(self) -> str:
        """`deepseek-v4-flash at https://api.deepseek.com (provider deepseek, key from DEEPSEEK_API_KEY)`."""
        via = [f"provider {self.provider}"] if self.provider else []
        via.append(f"key from {self.key_env}" if self.api_key else "no API key")
        return f"{self.model} at {without_credentials(self.base_url)} ({', '.join(via)})"


def find_provider(name: str) -> Provider:
    """The preset called `name` (or one of its aliases, any case); EndpointError listing them all."""
    found = _BY_NAME.get(name.strip().lower())
    if found is None:
        raise EndpointError(
            f"model.provider: no provider is named {name!r}; choose one of {', '.join(names())}"
        )
    return found


def names() -> list[str]:
    return [p.name for p in PROVIDERS]


def resolve_endpoint(
    name: str | None,
    base_url: str | None,
    provider: str | None,
    environ: Mapping[str, str] | None = None,
) -> Endpoint | None:
    """The endpoint these settings name, None for the offline demo (nothing configured at all), or
    EndpointError for a half configuration: a model without an endpoint, an endpoint without a
    model, a provider whose key variable is empty."""
    env = os.environ if environ is None else environ
    if provider:
        return _from_preset(find_provider(provider), name, base_url, env)
    if not name and not base_url:
        return None
    if not base_url:
        raise EndpointError(
            f"model {name!r} is set (HERMES_MODEL, model.name or --model) but no endpoint: choose a provider "
            f"with HERMES_PROVIDER / model.provider / --provider ({', '.join(names())}), or set "
            "HERMES_BASE_URL (model.base_url, --base-url)"
        )
    if not name:
        raise EndpointError(
            f"an endpoint is set ({without_credentials(base_url)}) but no model name: set HERMES_MODEL "
            "(model.name, --model) to a model it serves"
        )
    key = env.get(GENERIC_KEY) or None
    return Endpoint(name, base_url, None, GENERIC_KEY, key)


def _from_preset(
    preset: Provider, name: str | None, base_url: str | None, env: Mapping[str, str]
) -> Endpoint:
    model = name or preset.model
    if not model:
        raise EndpointError(
            f"provider {preset.name} serves whatever model it loaded: set HERMES_MODEL (model.name, --model) "
            "to its name (GET /v1/models lists them; `hermes-kernel doctor` shows them)"
        )
    variables = [v for v in (preset.key_env, GENERIC_KEY) if v]
    used = next((v for v in variables if env.get(v)), None)
    if preset.key_env and used is None:
        raise EndpointError(
            f"provider {preset.name} needs an API key: set {preset.key_env} (or {GENERIC_KEY}) in the "
            f"environment or the .env file (see {preset.doc})"
        )
    key = env.get(used) if used else None
    return Endpoint(model, base_url or preset.base_url, preset.name, used or variables[0], key)


def without_credentials(url: str) -> str:
    """`url` without any `user:password@` part, to show or log."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))
