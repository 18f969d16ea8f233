"""A fake OpenAI-compatible chat-completions server: a real HTTP test double.

It listens on 127.0.0.1 and speaks the OpenAI wire format, so a model client's retries, timeouts,
streaming and concurrency are exercised exactly as against a real endpoint, with no network and
no API key. Each reply comes from a FIFO script, from a handler, or from a small default that lets
an agent loop finish a turn (call the first offered tool, then answer "done: <tool result>")::

    from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

    async with FakeOpenAIServer() as fake:
        fake.script(FakeReply.tool_call("add", {"a": 1, "b": 2}), FakeReply.text("3"))
        ...  # point the client under test at fake.base_url
        assert fake.requests[1].messages[-1]["role"] == "tool"

From synchronous code: ``fake = FakeOpenAIServer().start_in_thread()`` ... ``fake.stop()``.
For benchmarks in another process::

    python -m hermes_core.testing.fake_openai --port 0 --latency 0.2 --tool-args '{"a": 1}'

prints one line ``READY http://127.0.0.1:PORT/v1`` and serves until SIGTERM or SIGINT. With
``--script replies.yaml`` it answers the requests in order from a file (``load_script``), then by
the default::

    - Hello! How can I help?                    # a text reply
    - tool_call: current_time                   # one tool call …
      arguments: {timezone: Asia/Shanghai}      # … with its arguments (default {})
    - tool_calls: [{name: calculator, arguments: {expression: "2+3"}}, {name: current_time}]
    - text: It is 15:00 in Shanghai.
    - error: 429                                # an OpenAI-style error, with an optional message
      message: slow down
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import itertools
import json
import math
import os
import re
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from aiohttp import BodyPartReader, web
from multidict import CIMultiDict

from ..kernel.messages import JSON
from ._thread import serve_in_thread

ToolArgs = dict[str, JSON] | str
"""Tool-call arguments: a dict is JSON-encoded by the fake, a str is sent verbatim (may be broken)."""

ALTERNATE_MESSAGE = "Conversation roles must alternate user/assistant/user/assistant/..."
_ERROR_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}
_BAD_KEY = "Incorrect API key provided."
AUDIO_FORMATS = frozenset({"flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "oga", "ogg", "wav", "webm"})
AUDIO_LIMIT = 25 * 1024 * 1024  # the API's 25 MB upload limit
NO_TOOLS_MESSAGE = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


@dataclass
class FakeReply:
    """One answer of the fake server. The defaults describe a plain, successful reply.

    - ``content``: assistant text (``None`` for a tool-call-only reply).
    - ``tool_calls``: ``(name, arguments)`` pairs; ids ``call_<n>`` are assigned when sent.
    - ``call_ids``: the ids to send instead, one per tool call (a model that reuses an id).
    - ``status`` / ``headers``: HTTP status and extra response headers (e.g. ``Retry-After``).
    - ``raw_body``: sent verbatim instead of a completion (errors, malformed JSON, broken SSE).
    - ``delay``: seconds to wait before answering; ``None`` means the server's ``latency``.
    - ``usage``: the ``usage`` object; ``None`` computes a rough estimate (~4 chars per token).
    - ``finish_reason``: ``None`` means ``"tool_calls"`` if there are tool calls, else ``"stop"``;
      ``"length"`` with cut argument text is a call the token limit cut (``FakeReply.cut_off``).
    - ``model``: the ``model`` field of the answer; ``None`` echoes the requested model.
    - ``disconnect``: close the connection after ``delay`` without sending any response.
    - ``chunk_delay``: seconds between streamed chunks (``0`` sends the whole stream at once).

    Endpoint quirks (docs/providers.md), each as the real server sends it:

    - ``reasoning``: thinking text, as ``message.<reasoning_field>`` and streamed as deltas of that
      field before the content (``reasoning_content``: DeepSeek, Qwen, vLLM; ``reasoning``: OpenRouter).
    - ``stream_error``: streamed after the content as ``data: {"error": …}``, then ``[DONE]``
      (vLLM, LiteLLM); the reply is cut there.
    - ``same_index``: every streamed tool call carries ``index: 0``, told apart only by its id (Ollama).
    """

    content: str | None = None
    tool_calls: list[tuple[str, ToolArgs]] = field(default_factory=list)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: str | bytes | None = None
    delay: float | None = None
    usage: dict[str, JSON] | None = None
    finish_reason: str | None = None
    model: str | None = None
    disconnect: bool = False
    chunk_delay: float = 0.0
    call_ids: list[str] | None = None
    reasoning: str | None = None
    reasoning_field: str = "reasoning_content"
    stream_error: dict[str, JSON] | None = None
    same_index: bool = False

    @classmethod
    def text(cls, content: str, **kw: Any) -> FakeReply:
        """A plain text answer."""
        return cls(content=content, **kw)

    @classmethod
    def tool_call(cls, name: str, args: ToolArgs | None = None, **kw: Any) -> FakeReply:
        """An answer that calls one tool; ``args`` may be a dict or verbatim argument text."""
        return cls(tool_calls=[(name, {} if args is None else args)], **kw)

    @classmethod
    def cut_off(cls, name: str, args: ToolArgs, keep: int, **kw: Any) -> FakeReply:
        """A tool call the output token limit cut: only the first ``keep`` characters of its
        argument text are sent, with ``finish_reason: "length"`` (as OpenAI, Ollama and vLLM do),
        streamed or not. ``args`` may be a dict (JSON-encoded first) or argument text."""
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        return cls(tool_calls=[(name, text[:keep])], finish_reason="length", **kw)

    @classmethod
    def parallel_tool_calls(cls, calls: list[tuple[str, ToolArgs]], **kw: Any) -> FakeReply:
        """An answer that calls several tools at once; also reachable as ``FakeReply.tool_calls``."""
        return cls(tool_calls=list(calls), **kw)

    @classmethod
    def error(
        cls,
        status: int,
        message: str = "fake error",
        headers: dict[str, str] | None = None,
        *,
        code: str | None = None,
        error_type: str | None = None,
    ) -> FakeReply:
        """An OpenAI-style error: ``{"error": {"message", "type", "param", "code"}}``."""
        body = json.dumps(_error_body(status, message, code, error_type))
        return cls(status=status, headers=dict(headers or {}), raw_body=body)

    @classmethod
    def malformed(cls, body: str | bytes = '{"choices": [') -> FakeReply:
        """A 200 answer whose body is not a valid completion."""
        return cls(raw_body=body)

    @classmethod
    def slow(cls, seconds: float, reply: FakeReply | None = None) -> FakeReply:
        """``reply`` (default: text "hello") answered after ``seconds``."""
        return replace(reply or cls.text("hello"), delay=seconds)


# `FakeReply.tool_calls([...])` is a constructor while `reply.tool_calls` is the field: a
# dataclass field with a default_factory leaves no class attribute, so the class attribute can be
# the constructor, and each instance's own `tool_calls` value hides it. (Type checkers only know
# the field: typed code should call `FakeReply.parallel_tool_calls`.)
FakeReply.tool_calls = FakeReply.parallel_tool_calls  # type: ignore[assignment]


@dataclass
class RecordedRequest:
    """One request received on a chat-completions route, valid or not."""

    body: dict[str, JSON] | None  # parsed JSON object, or None if the body was not one
    raw: bytes
    headers: Mapping[str, str]  # case-insensitive
    path: str
    received_at: float  # time.monotonic() on arrival

    @property
    def model(self) -> str | None:
        model = (self.body or {}).get("model")
        return model if isinstance(model, str) else None

    @property
    def messages(self) -> list[dict[str, JSON]]:
        messages = (self.body or {}).get("messages")
        return messages if isinstance(messages, list) else []

    @property
    def tools(self) -> list[dict[str, JSON]]:
        tools = (self.body or {}).get("tools")
        return tools if isinstance(tools, list) else []

    @property
    def images(self) -> list[str]:
        """The ``image_url.url`` of every image part of the request's messages, in order."""
        return [
            str(part["image_url"]["url"])
            for message in self.messages
            if isinstance(message, dict) and isinstance(message.get("content"), list)
            for part in message["content"]
            if isinstance(part, dict)
            and part.get("type") == "image_url"
            and isinstance(part.get("image_url"), dict)
        ]


Handler = Callable[[RecordedRequest], FakeReply | Awaitable[FakeReply]]


@dataclass(frozen=True)
class RecordedTranscription:
    """One ``/audio/transcriptions`` request: the uploaded file's name and size, the model, the status."""

    file_name: str | None
    model: str
    size: int
    status: int


class FakeOpenAIServer:
    """An OpenAI-compatible ``/v1/chat/completions`` endpoint with scripted answers.

    Knobs (all plain attributes, changeable while running):

    - ``latency``: seconds before each reply that has no ``delay`` of its own (``asyncio.sleep``,
      so concurrent requests overlap instead of queueing).
    - ``handler``: ``(RecordedRequest) -> FakeReply`` (sync or async), used when no script is left.

    The script is the replies of conversations: a health probe — a request for at most one token,
    as ``doctor`` and ``serve``'s start-up check send (models/probe.py) — takes nothing from it
    and is answered by the handler or the default.
    - ``default_tool_args``: arguments of the default handler's tool call.
    - ``models``: if set, any other requested model gets 404 ``model_not_found``.
    - ``api_key``: if set, requests need ``Authorization: Bearer <key>`` or get 401.
    - ``reject_tools``: answer 400 as vLLM does without a tool-call parser (``"auto" tool choice
      requires --enable-auto-tool-choice …``) when a request has ``tools``.
    - ``text_tool_calls``: the default reply writes its tool call as text, ``<tool_call>{"name": …,
      "arguments": …}</tool_call>`` in the content, as a local model served without a tool-call
      parser does; it also calls the first tool of a ``<tools>`` block in the system prompt (how
      text mode offers tools) when the request has no ``tools``.
    - ``omit_call_ids``: send tool calls without an ``id`` (as some local servers and proxies do).
    - ``vision``: content parts are checked as the OpenAI API checks them (``text`` with a string,
      ``image_url`` with a ``url`` that is a ``data:image/…;base64,`` URL of valid base64 or an
      http(s) link); with ``vision = False`` any image part is refused, as a text-only model does.
      ``RecordedRequest.images`` lists the image URLs a request carried.
    - ``unavailable``: models that always answer 503 (an overloaded primary, to test fallbacks).
    - ``record_requests``: keep every request in ``requests`` (turn off for long benchmarks).
    - ``model_latency``: ``{model: seconds}``, that model's latency instead of ``latency``.
    - ``break_arguments``: ``{model: fraction}``, that share of the model's tool-call replies sent
      with broken arguments (the values as a JSON array instead of an object, which no lenient
      parser turns back into an object). The schedule is fixed, not random: the k-th tool-call
      reply is broken when ``floor(k * fraction)`` grows, so any n replies hold exactly
      ``floor(n * fraction)`` broken ones (0.3: the 4th, 7th, 10th, …).
    - ``honor_max_tokens``: a request's ``max_tokens`` (or ``max_completion_tokens``) cuts a
      tool-call reply at about four characters per token, mid-argument, with
      ``finish_reason: "length"``, as a real server's output limit does.
    - ``alternating_roles``: two user messages in a row are refused with a 400, as a chat template
      that demands alternating roles does (Hugging Face templates served by vLLM raise
      ``Conversation roles must alternate user/assistant/user/assistant/...``).
    - ``prompt_cache``: ``"openai"`` or ``"deepseek"`` — the estimated usage says how much of the
      prompt (its tools, then its messages, as JSON, at four characters per token) a prefix cache
      would have served: the longest prefix shared with one of the last requests, in the field
      that provider uses (``prompt_tokens_details.cached_tokens``, or ``prompt_cache_hit_tokens``
      and ``prompt_cache_miss_tokens``). A scripted ``usage`` is sent as it is.

    Speech to text, ``POST /v1/audio/transcriptions`` (platform.openai.com/docs/api-reference/audio/
    createTranscription): multipart form fields ``file`` (its name's extension is the format:
    flac, m4a, mp3, mp4, mpeg, mpga, oga, ogg, wav, webm) and ``model``; the answer is
    ``{"text": …}``, the next of ``script_transcripts(…)`` (else ``"(no speech)"``). Errors as
    the API gives them: 401 without the key, 400 ``invalid_request_error`` for a missing field or
    an unsupported format (``Invalid file format. Supported formats: [...]``), 413 over 25 MB.
    ``transcriptions`` records each request (file name, model, size, status).

    Records: ``requests`` (every chat request, even rejected ones), ``in_flight`` and
    ``max_in_flight`` (chat requests open at once, from arrival to the end of the answer),
    ``tool_replies`` and ``broken`` (per model: tool-call replies sent, and how many were broken).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        latency: float = 0.0,
        handler: Handler | None = None,
        default_tool_args: dict[str, JSON] | None = None,
        models: list[str] | None = None,
        api_key: str | None = None,
        reject_tools: bool = False,
        record_requests: bool = True,
    ) -> None:
        self.host = host
        self.port = port
        self.latency = latency
        self.handler = handler
        self.default_tool_args: dict[str, JSON] = {} if default_tool_args is None else default_tool_args
        self.models = models
        self.api_key = api_key
        self.reject_tools = reject_tools
        self.text_tool_calls = False
        self.honor_max_tokens = False
        self.alternating_roles = False  # True: two user messages in a row are refused (a strict template)
        self.prompt_cache: str | None = None  # "openai" or "deepseek": usage reports cached tokens
        self._prompts: deque[str] = deque(maxlen=64)  # the latest prompts, for `prompt_cache`
        self.vision = True  # False: image parts are refused, as by a text-only model
        self.record_requests = record_requests
        self.requests: list[RecordedRequest] = []
        self.omit_call_ids = False
        self.unavailable: set[str] = set()
        self.model_latency: dict[str, float] = {}
        self.break_arguments: dict[str, float] = {}
        self.tool_replies: Counter[str] = Counter()
        self.broken: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.transcriptions: list[RecordedTranscription] = []
        self._transcripts: deque[str] = deque()
        self._script: deque[FakeReply] = deque()
        self._model_scripts: dict[str, deque[FakeReply]] = {}
        self._call_ids = itertools.count(1)
        self._completion_ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The URL to give an OpenAI client, e.g. ``http://127.0.0.1:PORT/v1``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    @property
    def pending(self) -> int:
        """How many scripted replies (general and per-model) are not consumed yet."""
        return len(self._script) + sum(len(queue) for queue in self._model_scripts.values())

    # -- scripting ---------------------------------------------------------------------------

    def script(self, *replies: FakeReply) -> None:
        """Queue replies, consumed one per request in order."""
        self._script.extend(replies)

    def script_for(self, model: str, *replies: FakeReply) -> None:
        """Queue replies used only for requests for ``model`` (before the general queue)."""
        self._model_scripts.setdefault(model, deque()).extend(replies)

    def script_transcripts(self, *texts: str) -> None:
        """Queue the texts ``/audio/transcriptions`` answers, one per request in order."""
        self._transcripts.extend(texts)

    def reset(self) -> None:
        """Forget scripts, recorded requests and counts, and the in-flight high-water mark."""
        self._script.clear()
        self._model_scripts.clear()
        self.requests.clear()
        self.tool_replies.clear()
        self.broken.clear()
        self.max_in_flight = self.in_flight

    def default_reply(self, request: RecordedRequest) -> FakeReply:
        """What the fake says when nothing is scripted and there is no handler."""
        messages = request.messages
        last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
        if last.get("role") == "tool":
            content = last.get("content")
            text = content if isinstance(content, str) else json.dumps(content)
            return FakeReply.text("done: " + text[:200])
        name = request.tools[0].get("function", {}).get("name", "tool") if request.tools else None
        if self.text_tool_calls:
            name = name or _prompt_tool(request.messages)
            if name is not None:
                call = json.dumps({"name": name, "arguments": dict(self.default_tool_args)})
                return FakeReply.text(f"<tool_call>\n{call}\n</tool_call>")
        if name is not None:
            return FakeReply.tool_call(name, dict(self.default_tool_args))
        return FakeReply.text("hello")

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> FakeOpenAIServer:
        """Start listening in the running event loop; ``port`` is then the real port."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_post("/v1/audio/transcriptions", self._transcription)
        app.router.add_post("/audio/transcriptions", self._transcription)
        app.router.add_get("/healthz", self._health)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port, backlog=2048).start()
        self._runner = runner
        self.port = runner.addresses[0][1]
        return self

    async def aclose(self) -> None:
        """Stop a server started with ``start()`` / ``async with``."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def start_in_thread(self, timeout: float = 10.0) -> FakeOpenAIServer:
        """Serve from a daemon thread with its own event loop; returns once listening."""
        self._loop, self._thread = serve_in_thread(self.start, self.aclose, "fake-openai", timeout)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a server started with ``start_in_thread()``."""
        if self._thread is None or self._loop is None:
            if self._runner is not None:
                raise RuntimeError("server runs in an event loop: use `await fake.aclose()`")
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        self._thread = self._loop = None

    async def __aenter__(self) -> FakeOpenAIServer:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start_in_thread()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- HTTP handlers -----------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            received_at = time.monotonic()
            raw = await request.read()
            headers = CIMultiDict(request.headers)
            record = RecordedRequest(_json_object(raw), raw, headers, request.path, received_at)
            if self.record_requests:
                self.requests.append(record)
            reply = self._rejection(record) or self._misbehave(record, await self._next_reply(record))
            return await self._answer(request, record, reply)
        finally:
            self.in_flight -= 1

    async def _list_models(self, request: web.Request) -> web.Response:
        if not self._authorized(request.headers):
            return _json_response(401, _error_body(401, _BAD_KEY))
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "fake"} for name in self.models or []
        ]
        return _json_response(200, {"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _transcription(self, request: web.Request) -> web.Response:
        """``POST /audio/transcriptions``: multipart ``file`` and ``model`` → ``{"text"}``."""
        fields: dict[str, tuple[str | None, bytes]] = {}
        try:
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                if isinstance(part, BodyPartReader) and part.name:
                    fields[part.name] = (part.filename, await part.read(decode=False))
        except (ValueError, AssertionError):
            pass  # not multipart: every field is missing
        file_name, data = fields.get("file", (None, b""))
        model = fields.get("model", (None, b""))[1].decode("utf-8", "replace")
        status, body = self._transcription_answer(request.headers, "file" in fields, file_name, data, model)
        self.transcriptions.append(RecordedTranscription(file_name, model, len(data), status))
        return _json_response(status, body)

    def _transcription_answer(
        self, headers: Mapping[str, str], has_file: bool, file_name: str | None, data: bytes, model: str
    ) -> tuple[int, dict[str, JSON]]:
        if not self._authorized(headers):
            return 401, _error_body(401, _BAD_KEY)
        if not has_file or not model:
            missing = "file" if not has_file else "model"
            return 400, _error_body(
                400, f"1 validation error for Request\nbody -> {missing}\n  field required"
            )
        if len(data) > AUDIO_LIMIT:
            return 413, _error_body(413, f"Maximum content size limit ({AUDIO_LIMIT}) exceeded.")
        extension = (file_name or "").rpartition(".")[2].lower()
        if extension not in AUDIO_FORMATS:
            return 400, _error_body(400, f"Invalid file format. Supported formats: {sorted(AUDIO_FORMATS)}")
        if self.models is not None and model not in self.models:
            return 404, _error_body(
                404, f"The model `{model}` does not exist or you do not have access to it."
            )
        return 200, {"text": self._transcripts.popleft() if self._transcripts else "(no speech)"}

    # -- choosing a reply --------------------------------------------------------------------

    def _authorized(self, headers: Mapping[str, str]) -> bool:
        return self.api_key is None or headers.get("Authorization") == f"Bearer {self.api_key}"

    def _rejection(self, record: RecordedRequest) -> FakeReply | None:
        """The immediate error a real server would give this request, if any."""
        body = record.body
        if not self._authorized(record.headers):
            return _instant_error(401, _BAD_KEY)
        if body is None:
            return _instant_error(400, "We could not parse the JSON body of your request.")
        if not isinstance(body.get("model"), str) or not body["model"]:
            return _instant_error(400, "You must provide a model parameter.")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return _instant_error(400, "'messages' must be a non-empty array.")
        if self.models is not None and body["model"] not in self.models:
            message = f"The model `{body['model']}` does not exist or you do not have access to it."
            return _instant_error(404, message, code="model_not_found")
        if self.reject_tools and "tools" in body:
            return _instant_error(400, NO_TOOLS_MESSAGE)
        if self.alternating_roles and _successive_users(body["messages"]):
            return _instant_error(400, ALTERNATE_MESSAGE)
        problem = _content_problem(body["messages"], self.vision)
        if problem is not None:
            return _instant_error(400, problem)
        if body["model"] in self.unavailable:
            return _instant_error(503, f"The model `{body['model']}` is overloaded.")
        return None

    async def _next_reply(self, record: RecordedRequest) -> FakeReply:
        model_queue = self._model_scripts.get(record.model or "")
        probe = _output_limit(record) == 1  # a health probe is no turn of the scripted conversation
        if model_queue and not probe:
            return model_queue.popleft()
        if self._script and not probe:
            return self._script.popleft()
        if self.handler is None:
            return self.default_reply(record)
        reply = self.handler(record)
        return await reply if inspect.isawaitable(reply) else reply

    def _misbehave(self, record: RecordedRequest, reply: FakeReply) -> FakeReply:
        """Apply the per-model knobs: latency, and the fixed schedule of broken arguments."""
        model = record.model or ""
        if reply.delay is None and model in self.model_latency:
            reply = replace(reply, delay=self.model_latency[model])
        if not reply.tool_calls or reply.raw_body is not None:
            return reply
        reply = self._token_limit(record, reply)
        self.tool_replies[model] += 1
        share = Fraction(self.break_arguments.get(model, 0.0)).limit_denominator(1000)
        count = self.tool_replies[model]
        if math.floor(count * share) == math.floor((count - 1) * share):
            return reply
        self.broken[model] += 1
        return replace(reply, tool_calls=[(name, _broken(args)) for name, args in reply.tool_calls])

    def _token_limit(self, record: RecordedRequest, reply: FakeReply) -> FakeReply:
        """The reply as the request's output limit leaves it (``honor_max_tokens``)."""
        limit = _output_limit(record)
        if not self.honor_max_tokens or limit is None:
            return reply
        room = limit * 4 - len(reply.content or "")
        kept: list[tuple[str, ToolArgs]] = []
        for name, args in reply.tool_calls:
            text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            kept.append((name, text[: max(room, 0)]))
            room -= len(text)
            if room < 0:
                return replace(reply, tool_calls=kept, finish_reason="length")
        return reply

    # -- writing the answer ------------------------------------------------------------------

    async def _answer(
        self, request: web.Request, record: RecordedRequest, reply: FakeReply
    ) -> web.StreamResponse:
        delay = self.latency if reply.delay is None else reply.delay
        if delay > 0:
            await asyncio.sleep(delay)
        if reply.disconnect:
            if request.transport is not None:
                request.transport.close()
            return web.Response()  # never sent: the connection is gone
        body = record.body or {}
        streaming = body.get("stream") is True and reply.status == 200
        if reply.raw_body is not None:
            raw = reply.raw_body.encode() if isinstance(reply.raw_body, str) else reply.raw_body
            content_type = "text/event-stream" if streaming else "application/json"
            return web.Response(
                status=reply.status, body=raw, headers={"Content-Type": content_type, **reply.headers}
            )
        completion = self._completion(record, reply)
        if not streaming:
            return _json_response(reply.status, completion, reply.headers)
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        chunks = list(_chunks(completion, include_usage, reply))
        events = [b"data: " + json.dumps(chunk).encode() + b"\n\n" for chunk in chunks]
        events.append(b"data: [DONE]\n\n")
        return await _send_events(request, events, reply)

    def _completion(self, record: RecordedRequest, reply: FakeReply) -> dict[str, JSON]:
        """The non-streamed ``chat.completion`` object for ``reply``."""
        ids = reply.call_ids or [f"call_{next(self._call_ids)}" for _ in reply.tool_calls]
        calls = [
            _wire_tool_call(None if self.omit_call_ids else call_id, name, args)
            for call_id, (name, args) in zip(ids, reply.tool_calls, strict=True)
        ]
        message: dict[str, JSON] = {"role": "assistant", "content": reply.content, "refusal": None}
        if reply.reasoning is not None:
            message[reply.reasoning_field] = reply.reasoning
        if calls:
            message["tool_calls"] = calls
        finish_reason = reply.finish_reason or ("tool_calls" if calls else "stop")
        return {
            "id": f"chatcmpl-fake{next(self._completion_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": reply.model or record.model or "fake-model",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
            "usage": reply.usage or self._usage(record, reply.content, calls),
        }

    def _usage(self, record: RecordedRequest, content: str | None, calls: list[dict[str, JSON]]) -> JSON:
        """The estimated usage; with `prompt_cache`, the tokens a prefix cache would have served."""
        usage = _estimate_usage(record, content, calls)
        if self.prompt_cache is None:
            return usage
        prompt = json.dumps([record.tools, record.messages], ensure_ascii=False)
        shared = max((len(os.path.commonprefix([prompt, seen])) for seen in self._prompts), default=0)
        self._prompts.append(prompt)
        total, cached = len(prompt) // 4, shared // 4
        usage.update(prompt_tokens=total, total_tokens=total + usage["completion_tokens"])
        if self.prompt_cache == "deepseek":
            return usage | {"prompt_cache_hit_tokens": cached, "prompt_cache_miss_tokens": total - cached}
        return usage | {"prompt_tokens_details": {"cached_tokens": cached}}


def _successive_users(messages: list[Any]) -> bool:
    roles = [message.get("role") if isinstance(message, dict) else None for message in messages]
    return any(a == b == "user" for a, b in zip(roles, roles[1:], strict=False))


def _output_limit(record: RecordedRequest) -> int | None:
    """The request's `max_completion_tokens` (or `max_tokens`), when it is a whole number."""
    body = record.body or {}
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


def _prompt_tool(messages: list[dict[str, JSON]]) -> str | None:
    """The name of the first tool in a system message's ``<tools>`` block (one JSON per line)."""
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if message.get("role") != "system" or not isinstance(content, str) or "<tools>" not in content:
            continue
        block = re.search(r"<tools>\n(.*?)\n</tools>", content, re.S)
        for line in block.group(1).splitlines() if block else []:
            try:
                tool = json.loads(line)
            except ValueError:
                continue
            name = (tool.get("function") or tool).get("name") if isinstance(tool, dict) else None
            if isinstance(name, str):
                return name
    return None


def _chunks(
    completion: dict[str, JSON], include_usage: bool, reply: FakeReply | None = None
) -> Iterator[dict[str, JSON]]:
    """The ``chat.completion.chunk`` objects of a completion, in the order OpenAI streams them
    (with the reply's quirks: reasoning deltas first, an error chunk, repeated tool-call indexes)."""
    reply = reply or FakeReply()
    base = {key: completion[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    choice = completion["choices"][0]

    def chunk(delta: dict[str, JSON], finish_reason: str | None = None) -> dict[str, JSON]:
        return {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(reply.reasoning or ""):
        yield chunk({reply.reasoning_field: piece})
    for piece in _pieces(choice["message"]["content"] or ""):
        yield chunk({"content": piece})
    if reply.stream_error is not None:
        yield {"error": reply.stream_error}
        return
    for position, call in enumerate(choice["message"].get("tool_calls", [])):
        function, index = call["function"], 0 if reply.same_index else position
        head = {"index": index, "type": "function"} | ({"id": call["id"]} if "id" in call else {})
        yield chunk({"tool_calls": [{**head, "function": {"name": function["name"], "arguments": ""}}]})
        for piece in _pieces(function["arguments"]):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, choice["finish_reason"])
    if include_usage:
        yield {**base, "choices": [], "usage": completion["usage"]}


async def _send_events(request: web.Request, events: list[bytes], reply: FakeReply) -> web.StreamResponse:
    """Send server-sent events: all in one write, or one by one ``reply.chunk_delay`` apart."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **reply.headers})
    response.headers.setdefault("Cache-Control", "no-cache")
    await response.prepare(request)
    if reply.chunk_delay <= 0:
        await response.write(b"".join(events))
    else:
        for event in events:
            await response.write(event)
            await asyncio.sleep(reply.chunk_delay)
    await response.write_eof()
    return response


def _pieces(text: str) -> Iterator[str]:
    """Split text into pieces of 3 to 8 characters, roughly like a tokenizer's output."""
    start, step = 0, 0
    while start < len(text):
        size = 3 + step % 6
        yield text[start : start + size]
        start, step = start + size, step + 1


def _broken(args: ToolArgs) -> str:
    """Arguments as a model breaks them: the values in a JSON array, not an object."""
    return json.dumps(list(args.values()) if isinstance(args, dict) else [args], ensure_ascii=False)


def _wire_tool_call(call_id: str | None, name: str, args: ToolArgs) -> dict[str, JSON]:
    arguments = args if isinstance(args, str) else json.dumps(args)
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return call if call_id is None else {"id": call_id, **call}


def _estimate_usage(
    record: RecordedRequest, content: str | None, calls: list[dict[str, JSON]]
) -> dict[str, int]:
    """Token counts at roughly four characters per token."""
    prompt_chars = sum(len(str(message.get("content") or "")) for message in record.messages)
    completion_chars = len(content or "") + sum(len(json.dumps(call["function"])) for call in calls)
    prompt, completion = prompt_chars // 4, completion_chars // 4
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _json_object(raw: bytes) -> dict[str, JSON] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _error_body(
    status: int, message: str, code: str | None = None, error_type: str | None = None
) -> dict[str, JSON]:
    default_type = "invalid_request_error" if status < 500 else "server_error"
    code = code or _ERROR_CODES.get(status)
    return {"error": {"message": message, "type": error_type or default_type, "param": None, "code": code}}


_DATA_URL = re.compile(r"^data:image/(png|jpeg|gif|webp);base64,([A-Za-z0-9+/]*={0,2})$")


def _content_problem(messages: list[Any], vision: bool) -> str | None:
    """Why the OpenAI API would refuse these messages' content parts, or None."""
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                continue
            if kind != "image_url":
                return f"Invalid value for '{where}.type': expected 'text' or 'image_url'."
            if not vision:
                return f"Invalid content type at '{where}': image_url is only supported by certain models."
            url = part.get("image_url", {}).get("url") if isinstance(part.get("image_url"), dict) else None
            if not isinstance(url, str) or not (
                _DATA_URL.match(url) or url.startswith(("https://", "http://"))
            ):
                return f"Invalid '{where}.image_url.url': expected a URL or a base64 data URL of an image."
    return None


def _instant_error(status: int, message: str, code: str | None = None) -> FakeReply:
    """An error a real server gives before any model work: not delayed by ``latency``."""
    return replace(FakeReply.error(status, message, code=code), delay=0.0)


def _json_response(
    status: int, body: dict[str, JSON], headers: Mapping[str, str] | None = None
) -> web.Response:
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    return web.Response(status=status, body=json.dumps(body).encode(), headers=all_headers)


# -- command line (benchmarks run the fake in a separate process) ---------------------------------


def _json_dict(text: str) -> dict[str, JSON]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


SCRIPT_KINDS = ("text", "tool_call", "tool_calls", "error")


def load_script(path: str) -> list[FakeReply]:
    """The replies of a script file (module docstring); ValueError naming the item that is wrong."""
    import yaml

    with open(path, encoding="utf-8") as file:
        try:
            items = yaml.safe_load(file)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(items, list):
        raise ValueError(f"{path}: a script is a list of replies (text, tool_call, tool_calls or error)")
    return [_scripted_reply(item, f"{path}: reply {number}") for number, item in enumerate(items, 1)]


def _scripted_reply(item: Any, where: str) -> FakeReply:
    if isinstance(item, str):
        return FakeReply.text(item)
    kinds = [kind for kind in SCRIPT_KINDS if isinstance(item, dict) and kind in item]
    if len(kinds) != 1:
        raise ValueError(f"{where}: give a text, or exactly one of {', '.join(SCRIPT_KINDS)}")
    kind, value = kinds[0], item[kinds[0]]
    if kind == "text":
        return FakeReply.text(str(value))
    if kind == "error":
        if not isinstance(value, int) or not 400 <= value <= 599:
            raise ValueError(f"{where}: error is an HTTP status from 400 to 599")
        return FakeReply.error(value, str(item.get("message", "scripted error")))
    calls = [{"name": value, "arguments": item.get("arguments")}] if kind == "tool_call" else value
    if not isinstance(calls, list) or not all(_is_call(call) for call in calls):
        raise ValueError(f"{where}: each tool call needs a name, and its arguments are a mapping")
    return FakeReply.parallel_tool_calls([(c["name"], dict(c.get("arguments") or {})) for c in calls])


def _is_call(call: Any) -> bool:
    return (
        isinstance(call, dict)
        and isinstance(call.get("name"), str)
        and isinstance(call.get("arguments") or {}, dict)
    )


async def _serve_until_signalled(server: FakeOpenAIServer) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stopping.set)
        except NotImplementedError:  # Windows: Ctrl+C raises KeyboardInterrupt instead
            pass
    async with server:
        print(f"READY {server.base_url}", flush=True)
        await stopping.wait()


def main(argv: list[str] | None = None) -> None:
    """Run the fake with its default handler until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m hermes_core.testing.fake_openai",
        description="Fake OpenAI-compatible chat-completions server. Prints 'READY <base_url>'.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 lets the OS pick a free port")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--tool-args", type=_json_dict, default={}, help="JSON arguments of tool calls")
    parser.add_argument("--script", help="YAML list of replies, answered in order (then the default)")
    args = parser.parse_args(argv)
    try:
        replies = load_script(args.script) if args.script else []
    except (OSError, ValueError) as exc:
        parser.exit(2, f"fake_openai: {exc}\n")
    server = FakeOpenAIServer(
        host=args.host,
        port=args.port,
        latency=args.latency,
        default_tool_args=args.tool_args,
        record_requests=False,  # nobody can read them from another process
    )
    server.script(*replies)
    asyncio.run(_serve_until_signalled(server))


if __name__ == "__main__":
    main()
