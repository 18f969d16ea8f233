"""An async client for any OpenAI-compatible `/chat/completions` endpoint.

The failure policy, in one place:
- transient failures (connection errors, timeouts, 408, 429, 5xx, a 200 whose body is not a
  completion) are retried with exponential backoff and jitter, honouring `Retry-After`;
- any other 4xx is the request's own fault: raised at once as `ModelRequestRejected`;
- a model that used up its retries, or that the endpoint does not know (404), hands over to the
  next fallback model; when none is left, `ModelUnavailable` names what failed.

Each model is offered only the tools it may use (models/base.py `offered_to`), and the response
names the model it came from (`answered_by`): a fallback never gets, nor runs, a tool that is
allowed only for the primary.

aiohttp is imported inside methods, so importing this module does not import it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from ..messages import Message, ModelResponse, ToolCall, Usage
from ..observe.metrics import MODEL_RETRIES
from .base import (
    ModelClient,
    ModelRequestRejected,
    ModelUnavailable,
    TextCallback,
    emit_text,
    name_unnamed_calls,
    offered_to,
)
from .settings import ModelSettings
from .sse import DONE, StreamAssembler, sse_data

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("hermes_core.model")


class _Transient(Exception):
    """A failure worth another attempt; `retry_after` is the server's own wait hint in seconds."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class OpenAICompatClient(ModelClient):
    """Calls one endpoint with the primary model, then each fallback model, per `ModelSettings`.

    One aiohttp session and one concurrency semaphore serve all calls made from the same event
    loop; they are created lazily because asyncio objects belong to the loop that made them.
    """

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self.name = settings.model
        self._url = settings.base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Content-Type": "application/json", **settings.extra_headers}
        if settings.api_key:
            self._headers["Authorization"] = f"Bearer {settings.api_key}"
        rate = settings.requests_per_second
        self._spacing = 1.0 / rate if rate else 0.0
        self._next_start = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(settings.max_concurrency)
        self._timeout: aiohttp.ClientTimeout | None = None
        self._stream_timeout: aiohttp.ClientTimeout | None = None

    @property
    def models(self) -> tuple[str, ...]:
        return (self.settings.model, *self.settings.fallback_models)

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        stream = self.settings.stream or on_text is not None
        models = self.models
        failures: list[str] = []
        not_found: list[ModelRequestRejected] = []
        for model in models:
            if failures:
                log.warning("falling back to model %s after %s", model, failures[-1])
            body = self._body(model, messages, offered_to(model, tools), stream)
            try:
                response = await self._with_retries(model, body, stream, on_text)
            except _Transient as exc:
                failures.append(f"{model}: {exc}")
            except ModelRequestRejected as exc:
                if exc.status != 404:
                    log.error("model %s rejected the request (HTTP %d): %s", model, exc.status, exc)
                    raise
                not_found.append(exc)
                failures.append(f"{model}: HTTP 404: {exc}")
            else:
                return name_unnamed_calls(replace(response, answered_by=model), messages)
        summary = "; ".join(failures)
        log.error("model call failed: %s", summary)
        if len(not_found) == len(models):
            raise not_found[-1]  # only wrong model names: a configuration error, not an outage
        raise ModelUnavailable(f"every model failed after retries: {summary}")

    async def aclose(self) -> None:
        session, self._session = self._session, None
        # A session can only be closed from its own loop; one left on a dead loop is just dropped.
        if session is not None and not session.closed and self._loop is asyncio.get_running_loop():
            await session.close()

    def _body(
        self, model: str, messages: list[Message], tools: list[dict[str, Any]] | None, stream: bool
    ) -> bytes:
        settings = self.settings
        body: dict[str, Any] = {"model": model, "messages": messages, "temperature": settings.temperature}
        if settings.max_tokens is not None:
            body["max_tokens"] = settings.max_tokens
        if settings.top_p is not None:
            body["top_p"] = settings.top_p
        if settings.response_format is not None:
            body["response_format"] = settings.response_format
        if tools:
            body["tools"] = tools
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        body.update(settings.extra_body)
        return json.dumps(body, ensure_ascii=False).encode("utf-8")

    async def _with_retries(
        self, model: str, body: bytes, stream: bool, on_text: TextCallback | None
    ) -> ModelResponse:
        settings, attempt = self.settings, 0
        while True:
            try:
                return await self._attempt(body, stream, on_text)
            except _Transient as exc:
                if attempt >= settings.max_retries:
                    raise
                if exc.retry_after is not None:
                    delay = exc.retry_after
                else:
                    delay = settings.retry_base_delay * 2**attempt * random.uniform(0.8, 1.2)
                delay = min(delay, settings.retry_max_delay)
                attempt += 1
                retries = settings.max_retries
                log.warning("model %s: %s; retry %d/%d in %.2fs", model, exc, attempt, retries, delay)
                MODEL_RETRIES.inc(model=model)
                await asyncio.sleep(delay)

    async def _attempt(self, body: bytes, stream: bool, on_text: TextCallback | None) -> ModelResponse:
        import aiohttp

        session = self._session_for_running_loop()
        async with self._slots:
            await self._wait_for_rate_limit()
            timeout = self._stream_timeout if stream else self._timeout
            request = session.post(self._url, data=body, headers=self._headers, timeout=timeout)
            try:
                async with request as reply:
                    if reply.status >= 400:
                        raise _status_error(reply.status, await reply.text(errors="replace"), reply.headers)
                    if stream and reply.content_type == "text/event-stream":
                        return await _read_stream(reply, on_text)
                    response = _parse_completion(await reply.read())
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                raise _Transient(_describe(exc)) from exc
        if on_text is not None and response.content:  # the server ignored stream=true
            await emit_text(on_text, response.content)
        return response

    def _session_for_running_loop(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._session = loop, None
            self._slots = asyncio.Semaphore(self.settings.max_concurrency)
        if self._session is None or self._session.closed:
            import aiohttp

            seconds = self.settings.timeout
            # A whole reply must arrive within `timeout`; a stream only has to keep moving, so a long
            # answer that is still arriving is not cut off.
            self._timeout = aiohttp.ClientTimeout(total=seconds)
            self._stream_timeout = aiohttp.ClientTimeout(sock_connect=seconds, sock_read=seconds)
            connector = aiohttp.TCPConnector(limit=self.settings.max_concurrency)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def _wait_for_rate_limit(self) -> None:
        """Start requests at least `1 / requests_per_second` apart.

        Each caller reserves the next start time before it sleeps, so no lock is needed and
        waiting callers go in arrival order.
        """
        if not self._spacing:
            return
        now = time.monotonic()
        start = max(now, self._next_start)
        self._next_start = start + self._spacing
        if start > now:
            await asyncio.sleep(start - now)


async def _read_stream(reply: aiohttp.ClientResponse, on_text: TextCallback | None) -> ModelResponse:
    """Decode an SSE body, passing each piece of content to `on_text` as it arrives.

    A stream that breaks before any text was shown is retried like any transient failure; once
    text has been shown, a retry would show the user a second beginning, so it is a hard failure.
    """
    import aiohttp

    assembler, shown = StreamAssembler(), False
    try:
        async for data in _sse_payloads(reply.content):
            if data == DONE:
                return assembler.response()
            piece = assembler.feed(json.loads(data))
            if piece and on_text is not None:
                shown = True
                await emit_text(on_text, piece)
        if assembler.finished:  # some servers end the stream without the [DONE] line
            return assembler.response()
        reason = "stream ended before the reply was finished"
    except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = f"stream broke: {_describe(exc)}"
    if shown:
        raise ModelUnavailable(reason)
    raise _Transient(reason)


async def _sse_payloads(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The `data:` payloads of an SSE body. Lines are split here rather than by aiohttp's
    `readline`, which rejects lines over 128 KiB; one chunk can carry a whole large tool argument."""
    pending = b""
    async for block in content.iter_any():
        *lines, pending = (pending + block).split(b"\n")
        for line in lines:
            data = sse_data(line.decode("utf-8"))
            if data is not None:
                yield data
    data = sse_data(pending.decode("utf-8"))
    if data is not None:
        yield data


def _parse_completion(raw: bytes) -> ModelResponse:
    """Decode a non-streamed body. A 200 that is not a completion is garbage from an overloaded
    server or proxy, so it is treated as transient rather than read as an empty reply."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise _Transient(f"response body is not JSON: {_clip(repr(raw), 100)}") from None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _Transient(f"response has no choices: {_clip(repr(raw), 100)}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        message = {}
    content, refusal, model = message.get("content"), message.get("refusal"), data.get("model")
    return ModelResponse(
        content=content if isinstance(content, str) else None,
        tool_calls=_tool_calls(message.get("tool_calls")),
        usage=Usage.from_wire(data.get("usage")),
        model=model if isinstance(model, str) else "",
        finish_reason=choice.get("finish_reason"),
        refusal=refusal if isinstance(refusal, str) else None,
    )


def _tool_calls(items: Any) -> list[ToolCall]:
    """Wire tool calls to `ToolCall`s; arguments sent as an object are re-encoded as JSON text."""
    calls = []
    for item in items if isinstance(items, list) else ():
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not function.get("name"):
            continue
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            arguments = "{}" if arguments is None else json.dumps(arguments, ensure_ascii=False)
        call_id = item.get("id") or ""  # unnamed: `complete` names it for the whole conversation
        calls.append(ToolCall(str(call_id), str(function["name"]), arguments or "{}"))
    return calls


def _status_error(status: int, text: str, headers: Mapping[str, str]) -> Exception:
    """Map an HTTP error status to a retryable `_Transient` or a final `ModelRequestRejected`."""
    message = _error_message(text) or f"HTTP {status}"
    if status in (408, 429) or status >= 500:
        return _Transient(f"HTTP {status}: {message}", _retry_after(headers.get("Retry-After")))
    return ModelRequestRejected(message, status)


def _error_message(text: str) -> str:
    """The human part of an error body: OpenAI's {"error": {"message": ...}}, or the raw text."""
    try:
        data = json.loads(text)
    except ValueError:
        return _clip(text.strip(), 500)
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        error = error.get("message") or error.get("detail") or error
    return _clip(str(error), 500)


def _clip(text: str, limit: int) -> str:
    """An error text for logs and messages: redacted before it is cut, so no start of a secret stays."""
    from ..redaction import cut_text

    return cut_text(text, limit)[0]


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait from a `Retry-After` header given as seconds or as an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
