"""An async client for any OpenAI-compatible `/chat/completions` endpoint.

The failure policy, in one place:
- transient failures (connection errors, timeouts, 408, 429, 5xx, a 200 whose body is not a
  completion) are retried with exponential backoff and jitter, honouring `Retry-After`;
- any other 4xx is the request's own fault: raised at once as `ModelRequestRejected`;
- a model that used up its retries, or that the endpoint does not know (404, or a gateway's 400
  "Invalid model name"), hands over to the next fallback model; when none is left,
  `ModelUnavailable` names what failed;
- an error written into a 200 stream (`data: {"error": …}`, `finish_reason: "error"`) is an error,
  never the answer: retried when transient and nothing was shown yet;
- a refusal of the tools parameter itself (llama.cpp's 500 without --jinja, OpenRouter's 404) is
  raised at once as `ModelRequestRejected`, for `auto` tool mode to decide on (textcalls/wrapper.py);
- a parameter the model refuses (`temperature` on o-series/gpt-5, `stream_options` on Azure AI
  inference) is left out: known ones up front, others after the 400 that names them, remembered;
- reasoning the endpoint returned (`reasoning_content`) goes back with the assistant message of a
  tool loop, as DeepSeek's thinking mode requires, whatever the preset or gateway; a model that
  refuses the field (Cerebras' 400, Mistral's 422) is asked again without it, remembered.

The retry budget counts a gateway's own retries too (models/settings.py `effective_retries`).

Each model is offered only the tools it may use (kernel/model.py `offered_to`), and the response
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
from collections.abc import AsyncIterator, Collection, Mapping
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from ..kernel.messages import Message, ModelResponse, ToolCall, json_encoder
from ..kernel.model import (
    ModelClient,
    ModelRequestRejected,
    ModelUnavailable,
    TextCallback,
    emit_text,
    name_unnamed_calls,
    offered_to,
)
from ..observe.metrics import MODEL_RETRIES
from .providers import quirks_of, refuses_temperature, refuses_tools, unknown_model
from .settings import ModelSettings
from .sse import (
    DONE,
    REASONING_FIELDS,
    SSELines,
    StreamAssembler,
    StreamError,
    content_parts,
    reasoning_text,
    sse_data,
)
from .usage import usage_from_wire

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("hermes_core.model")
_encode = json_encoder()  # a request body
# What a request may fail with: aiohttp's errors once a session was made (aiohttp is imported then).
_CLIENT_FAILURES: tuple[type[BaseException], ...] = (asyncio.TimeoutError,)


_REASONING = frozenset(REASONING_FIELDS)


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
        if not settings.model or not settings.base_url:  # both optional in the settings: resolved before
            raise ValueError("the model client needs a model name and a base URL (model, base_url)")
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
        self._retries = settings.effective_retries  # worked out once, as the headers and the spacing
        self._slots = asyncio.Semaphore(settings.max_concurrency)
        self._timeout: aiohttp.ClientTimeout | None = None
        self._stream_timeout: aiohttp.ClientTimeout | None = None
        self.quirks = quirks_of(settings.provider)
        self.dropped: dict[str, set[str]] = {}  # model → parameters it refused, left out from then on
        self._models = (self.name, *settings.fallback_models)

    @property
    def models(self) -> tuple[str, ...]:
        return self._models

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        stream = self.settings.stream or on_text is not None
        models = self._models
        failures: list[str] = []
        not_found: list[ModelRequestRejected] = []
        for model in models:
            if failures:
                log.warning("falling back to model %s after %s", model, failures[-1])
            try:
                response = await self._call_model(model, messages, offered_to(model, tools), stream, on_text)
            except _Transient as exc:
                failures.append(f"{model}: {exc}")
            except ModelRequestRejected as exc:
                if not unknown_model(exc.status, str(exc)):
                    log.error("model %s rejected the request (HTTP %d): %s", model, exc.status, exc)
                    raise
                not_found.append(exc)
                failures.append(f"{model}: HTTP {exc.status}: {exc}")
            else:
                response.answered_by = model  # the response is this call's own (`_call_model` decodes it)
                return name_unnamed_calls(response, messages)
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
        settings, dropped = self.settings, self.dropped.get(model, ())
        body: dict[str, Any] = {"model": model, "messages": self._wire_messages(messages, dropped)}
        temperature = settings.temperature
        if temperature is not None and "temperature" not in dropped and not refuses_temperature(model):
            body["temperature"] = temperature
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
            if self.quirks.stream_usage and "stream_options" not in dropped:
                body["stream_options"] = {"include_usage": True}
        body.update(settings.extra_body)
        return _encode(body).encode("utf-8")

    def _wire_messages(self, messages: list[Message], dropped: Collection[str] = ()) -> list[Message]:
        """The history as this endpoint takes it: `reasoning_content` unless the model refused it;
        successive user messages (a turn's context and its message) as one, for a model whose
        chat template refused them (`ALTERNATING`, found out by its 400)."""
        if ALTERNATING in dropped:
            messages = _merged_user_turns(messages)
        if REASONING not in dropped or not any(REASONING in m for m in messages):
            return messages
        return [{k: v for k, v in m.items() if k != REASONING} for m in messages]

    async def _call_model(
        self,
        model: str,
        messages: list[Message],
        tools: list[dict[str, Any]] | None,
        stream: bool,
        on_text: TextCallback | None,
    ) -> ModelResponse:
        """One model: attempts until one is answered or the retries are spent, in one coroutine (each
        layer more is paid again at every wait of a request). A 400 naming a parameter we sent is
        answered by leaving the parameter out (remembered for the model) and asking once more."""
        body, attempt, refused = self._body(model, messages, tools, stream), 0, None
        while True:
            session = self._session_for_running_loop()
            try:
                async with self._slots:
                    if self._spacing:  # not a coroutine per request when no rate is set
                        await self._wait_for_rate_limit()
                    timeout = self._stream_timeout if stream else self._timeout
                    request = session.post(self._url, data=body, timeout=timeout)  # headers: the session's
                    try:
                        async with request as reply:
                            if reply.status >= 400:
                                text = await reply.text(errors="replace")
                                raise _status_error(reply.status, text, reply.headers)
                            if stream and reply.content_type == "text/event-stream":
                                return await _read_stream(reply, on_text)
                            response = _parse_completion(await reply.read())
                    except _CLIENT_FAILURES as exc:
                        raise _Transient(_describe(exc)) from exc
                if on_text is not None and response.content:  # the server ignored stream=true
                    await emit_text(on_text, response.content)
                return response
            except _Transient as exc:
                if attempt >= self._retries:
                    raise
                attempt += 1
                await self._pause_before_retry(model, exc, attempt)
            except ModelRequestRejected as exc:
                if refused is not None or (refused := _refused_parameter(exc, json.loads(body))) is None:
                    raise
                change = "merging its user turns" if refused == ALTERNATING else f"leaving {refused} out"
                log.warning("model %s refuses %s (%s); %s from now on", model, refused, exc, change)
                self.dropped.setdefault(model, set()).add(refused)
                body, attempt = self._body(model, messages, tools, stream), 0  # its own retries, as before

    async def _pause_before_retry(self, model: str, exc: _Transient, attempt: int) -> None:
        settings = self.settings
        if exc.retry_after is not None:
            delay = exc.retry_after
        else:
            delay = settings.retry_base_delay * 2 ** (attempt - 1) * random.uniform(0.8, 1.2)
        delay = min(delay, settings.retry_max_delay)
        log.warning("model %s: %s; retry %d/%d in %.2fs", model, exc, attempt, self._retries, delay)
        MODEL_RETRIES.inc(model=model)
        await asyncio.sleep(delay)

    def _session_for_running_loop(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._session = loop, None
            self._slots = asyncio.Semaphore(self.settings.max_concurrency)
        if self._session is None or self._session.closed:
            global _CLIENT_FAILURES
            import aiohttp

            _CLIENT_FAILURES = (aiohttp.ClientError, asyncio.TimeoutError)

            seconds = self.settings.timeout
            # A whole reply must arrive within `timeout`; a stream only has to keep moving, so a long
            # answer that is still arriving is not cut off.
            self._timeout = aiohttp.ClientTimeout(total=seconds)
            self._stream_timeout = aiohttp.ClientTimeout(sock_connect=seconds, sock_read=seconds)
            connector = aiohttp.TCPConnector(limit=self.settings.max_concurrency)
            # The headers are the same for every request: merged once here, not at each request.
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def _wait_for_rate_limit(self) -> None:
        """Start requests at least `1 / requests_per_second` apart.

        Each caller reserves the next start time before it sleeps, so no lock is needed and
        waiting callers go in arrival order.
        """
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
    except StreamError as exc:
        if not exc.transient:
            raise ModelRequestRejected(_clip(str(exc), 500), exc.status or 400) from exc
        reason = _clip(str(exc), 500)
    except (aiohttp.ClientError, asyncio.TimeoutError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = f"stream broke: {_describe(exc)}"
    if shown:
        raise ModelUnavailable(reason)
    raise _Transient(reason)


async def _sse_payloads(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The `data:` payloads of an SSE body. Lines are split here (at CR, LF or CRLF) rather than by
    aiohttp's `readline`, which rejects lines over 128 KiB and knows only LF; one chunk can carry a
    whole large tool argument."""
    lines = SSELines()
    async for block in content.iter_any():
        for line in lines.feed(block):
            if (data := sse_data(line)) is not None:
                yield data
    for line in lines.close():
        if (data := sse_data(line)) is not None:
            yield data


def _parse_completion(raw: bytes) -> ModelResponse:
    """Decode a non-streamed body. A 200 that is not a completion is garbage from an overloaded
    server or proxy, so it is treated as transient rather than read as an empty reply."""
    try:
        data = json.loads(_utf8_or_as_is(raw))
    except ValueError:
        raise _Transient(f"response body is not JSON: {_clip(repr(raw), 100)}") from None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _Transient(f"response has no choices: {_clip(repr(raw), 100)}")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        message = {}
    refusal, model = message.get("refusal"), data.get("model")
    content, thought = content_parts(message.get("content"))  # a string, or Mistral's typed parts
    if not thought and not _REASONING.isdisjoint(message):  # (no loop over the names when none is there)
        thought = reasoning_text(message)
    return ModelResponse(
        content=content if content or isinstance(message.get("content"), str) else None,
        reasoning=thought or None,
        tool_calls=_tool_calls(message.get("tool_calls")),
        usage=usage_from_wire(data.get("usage")),
        model=model if isinstance(model, str) else "",
        finish_reason=choice.get("finish_reason"),
        refusal=refusal if isinstance(refusal, str) else None,
    )


def _utf8_or_as_is(raw: bytes) -> str | bytes:
    """JSON over HTTP is UTF-8 (RFC 8259): decoded here, which costs less than `json.loads`
    sniffing the bytes; a body with a BOM or in UTF-16/32 is left for it to sniff, as before."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
    return raw if text.startswith("\ufeff") or "\x00" in text else text


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
    if status >= 500 and refuses_tools(message):  # llama.cpp without --jinja: no outage, a refusal
        return ModelRequestRejected(message, status)
    if status in (408, 429) or status >= 500:
        return _Transient(f"HTTP {status}: {message}", _wait_hint(headers))
    return ModelRequestRejected(message, status)


def _wait_hint(headers: Mapping[str, str]) -> float | None:
    """The server's wait hint: `Retry-After`, or LiteLLM's `llm_provider-retry-after` (the upstream
    provider's own header, passed on), or `retry-after-ms`."""
    for name in ("Retry-After", "llm_provider-retry-after"):
        seconds = _retry_after(headers.get(name))
        if seconds is not None:
            return seconds
    try:
        return max(0.0, float(headers.get("retry-after-ms", "")) / 1000)
    except ValueError:
        return None


def _refused_parameter(exc: ModelRequestRejected, sent: dict[str, Any]) -> str | None:
    """The optional parameter a 400 says the model refuses, when we sent it (OpenAI: "Unsupported
    parameter: 'temperature' …"; Azure AI inference: "… stream_options …"); `ALTERNATING` when it
    refuses two user messages in a row (a template's "Conversation roles must alternate …", the
    old deepseek-reasoner's "does not support successive user or assistant messages"); `REASONING`
    when it refuses the reasoning sent back (Cerebras: "property 'messages.2.assistant.
    reasoning_content' is unsupported"; Mistral's 422 "Extra inputs are not permitted")."""
    if exc.status not in (400, 422):
        return None
    text = str(exc).lower()
    successive = _merged_user_turns(sent["messages"]) != sent["messages"]
    if successive and ("alternate" in text or "successive" in text):
        return ALTERNATING
    refusal = any(word in text for word in _REFUSAL_WORDS)
    if refusal and REASONING in text and any(REASONING in m for m in sent["messages"]):
        return REASONING
    for name in ("temperature", "stream_options", "top_p"):
        if refusal and name in sent and name in text:
            return name
    return None


ALTERNATING = "alternating roles"  # in `dropped`: the model takes no two user messages in a row
REASONING = "reasoning_content"  # in `dropped`: the model takes no reasoning sent back


def _merged_user_turns(messages: list[Message]) -> list[Message]:
    """`messages` with each run of successive user messages made one (their texts, then any other
    parts, in order): what a template that demands alternating roles accepts."""
    merged: list[Message] = []
    for message in messages:
        previous = merged[-1] if merged else None
        if previous is None or message.get("role") != "user" or previous.get("role") != "user":
            merged.append(message)
            continue
        parts = _parts(previous.get("content")) + _parts(message.get("content"))
        plain = all(part.get("type") == "text" for part in parts)
        content = "\n\n".join(str(part.get("text", "")) for part in parts) if plain else parts
        merged[-1] = {**previous, "content": content}
    return merged


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return [part for part in content if isinstance(part, dict)]
    return [{"type": "text", "text": "" if content is None else str(content)}]


_REFUSAL_WORDS = ("unsupported", "not supported", "unrecognized", "extra", "not permitted")


def _error_message(text: str) -> str:
    """The human part of an error body: OpenAI's {"error": {"message": ...}}, or the raw text."""
    try:
        data = json.loads(text)
    except ValueError:
        return _clip(text.strip(), 500)
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, dict):
        details = error.get("details")  # Azure: which field was refused is only said here
        error = error.get("message") or error.get("detail") or error
        if details and isinstance(error, str):
            error = f"{error}: {json.dumps(details, ensure_ascii=False)}"
    return _clip(str(error), 500)


def _clip(text: str, limit: int) -> str:
    """An error text for logs and messages: redacted before it is cut, so no start of a secret stays."""
    from ..kernel.redaction import cut_text

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
