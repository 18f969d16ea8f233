"""One tiny request to a model endpoint, and what its answer says about the configuration.

`hermes-kernel doctor` prints it as its "model endpoint" line; `serve` makes the same request in the
background once it listens and keeps a refusal visible (gateway/model_health.py). The request is one
chat completion of at most one token, through the client `serve` uses, without retries or fallback
models, cut after `PROBE_TIMEOUT` seconds. The verdicts:

- `ok`: the endpoint answered;
- `key_refused`: 401/403 — the fix names the variable the key comes from, never the key;
- `unknown_model`: 404, or the endpoint's own "model not found" words — the fix names the closest
  models it lists at GET /models, when it lists any;
- `rejected`: another refusal of the request itself;
- `unreachable`: no answer (connection refused, timeouts, 5xx after the one try).

`misconfigured` (a refused key, an unknown model) is what no retry can fix: an operator must.
"""

from __future__ import annotations

import asyncio
import difflib
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..kernel.model import ModelRequestRejected, ModelUnavailable
from .providers import Endpoint, without_credentials

if TYPE_CHECKING:
    from .openai_compat import OpenAICompatClient

PROBE_TIMEOUT = 10.0  # seconds: a probe answers quickly even when the host does not
MODEL_UNAVAILABLE_PREFIX = "every model failed after retries: "
Verdict = Literal["ok", "key_refused", "unknown_model", "rejected", "unreachable"]

_MODEL_NOT_FOUND = re.compile(r"model[^.]{0,80}(not (?:be )?found|does not exist|not exist|unknown)|"
                              r"(unknown|invalid|no such) model", re.I)  # fmt: skip


@dataclass(frozen=True)
class ProbeResult:
    """What the probe found, in words an operator acts on: `detail`, and `fix` when it failed."""

    verdict: Verdict
    detail: str
    fix: str = ""

    @property
    def misconfigured(self) -> bool:
        """A refused key or an unknown model: waiting will not help, the configuration must change."""
        return self.verdict in ("key_refused", "unknown_model")


async def probe_model(endpoint: Endpoint, *, timeout: float = PROBE_TIMEOUT) -> ProbeResult:
    """One chat completion of at most one token to `endpoint`, cut after `timeout` seconds."""
    shown, model = without_credentials(endpoint.base_url), endpoint.model
    client = probe_client(endpoint, timeout=timeout, max_tokens=1)
    started = time.monotonic()
    try:
        # the client's timeout bounds each read; this bounds the whole request (a server that trickles)
        await asyncio.wait_for(client.complete([{"role": "user", "content": "ping"}]), timeout + 1)
    except ModelRequestRejected as exc:
        return await judge_rejection(endpoint, exc)
    except (ModelUnavailable, asyncio.TimeoutError) as exc:
        reason = str(exc).removeprefix(MODEL_UNAVAILABLE_PREFIX).removeprefix(f"{model}: ")
        reason = reason or f"no answer within {timeout:g} s"
        where = "HERMES_BASE_URL (or model.base_url)"
        where = "model.base_url or the provider" if endpoint.provider else where
        fix = f"check {where} and that the server runs and is reachable from here"
        return ProbeResult("unreachable", f"cannot get an answer from {shown} ({reason})", fix)
    finally:
        await client.aclose()
    elapsed = (time.monotonic() - started) * 1000
    return ProbeResult("ok", f"{model} at {shown} answered in {elapsed:.0f} ms")


async def judge_rejection(endpoint: Endpoint, exc: ModelRequestRejected) -> ProbeResult:
    """`rejection`, with the closest model names the endpoint lists when the model is unknown."""
    listed = await list_models(endpoint) if is_unknown_model(exc) and exc.status not in (401, 403) else None
    return rejection(endpoint, exc, listed)


def rejection(endpoint: Endpoint, exc: ModelRequestRejected, listed: list[str] | None = None) -> ProbeResult:
    """What a refused request says: the key's variable (401/403), or the model and the closest
    names of `listed` (an unknown model), or the endpoint's words."""
    shown, model = without_credentials(endpoint.base_url), endpoint.model
    if exc.status in (401, 403):
        key = endpoint.key_env or "HERMES_API_KEY"
        state = "is not set" if not endpoint.api_key else "was refused"
        detail = f"{shown} refused the API key for {model} ({key} {state}; HTTP {exc.status})"
        return ProbeResult("key_refused", detail, f"set {key} to a key this endpoint accepts")
    if is_unknown_model(exc):
        fix = "set HERMES_MODEL (model.name, --model) to a model this endpoint serves"
        if listed:
            closest = difflib.get_close_matches(model, listed, n=3, cutoff=0.3) or listed[:3]
            fix += f"; closest it lists: {', '.join(closest)}"
        else:
            fix += ", and check the /v1 part of the base URL"
        detail = f"{shown} does not know the model {model!r} (HTTP {exc.status}: {exc})"
        return ProbeResult("unknown_model", detail, fix)
    detail = f"{shown} refused the request for {model} (HTTP {exc.status}: {exc})"
    fix = "check model.name, model.base_url and the endpoint's documentation"
    return ProbeResult("rejected", detail, fix)


def is_unknown_model(exc: ModelRequestRejected) -> bool:
    return exc.status == 404 or bool(_MODEL_NOT_FOUND.search(str(exc)))


async def list_models(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT) -> list[str]:
    """The model ids GET <base_url>/models lists, or [] when it does not answer with a list."""
    import aiohttp

    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    url = endpoint.base_url.rstrip("/") + "/models"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(url, headers=headers) as response,
        ):
            data = await response.json(content_type=None) if response.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return []
    entries = data.get("data") if isinstance(data, dict) else None
    return [str(e["id"]) for e in entries or [] if isinstance(e, dict) and e.get("id")]


def probe_client(endpoint: Endpoint, *, timeout: float, max_tokens: int) -> OpenAICompatClient:
    """The client `serve` would use for this endpoint, without retries or fallbacks."""
    from .openai_compat import OpenAICompatClient
    from .settings import ModelSettings

    probe = ModelSettings(
        model=endpoint.model, base_url=endpoint.base_url, api_key=endpoint.api_key, max_tokens=max_tokens,
        timeout=timeout, max_retries=0, provider=endpoint.provider,
    )  # fmt: skip
    return OpenAICompatClient(probe)


__all__ = ["PROBE_TIMEOUT", "ProbeResult", "judge_rejection", "list_models", "probe_client", "probe_model",
           "rejection"]  # fmt: skip
