"""Decoding a streamed chat completion: SSE lines in, one `ModelResponse` per choice out.

Pure code with no I/O, so the HTTP client and the conformance tests that replay recorded streams
run exactly the same decoder. What real servers send beyond OpenAI's own format is decoded here
too (docs/providers.md has the table): reasoning deltas (`reasoning_content`, `reasoning`), an
error written into the stream (`data: {"error": …}`, `finish_reason: "error"`), parallel calls
that all carry `index: 0` (Ollama), and `content` sent as a list of typed parts (Mistral).
Lines end in CR, LF or CRLF, as the SSE grammar allows (`SSELines`); a CRLF may be split between
two chunks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from ..kernel.messages import JSON, ModelResponse, ToolCall, Usage
from .usage import usage_from_wire

DONE = "[DONE]"

REASONING_FIELDS = ("reasoning_content", "reasoning")  # DeepSeek/Qwen/vLLM/LiteLLM, OpenRouter/Ollama


class StreamError(Exception):
    """The server wrote an error into a stream that had started as a 200 (vLLM, LiteLLM, OpenRouter).

    `status` is the HTTP status the error names, when it names one; `transient` says whether another
    attempt may succeed (no status, 408, 429, 5xx)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def transient(self) -> bool:
        return self.status is None or self.status in (408, 429) or self.status >= 500


def stream_error(chunk: dict[str, JSON]) -> StreamError | None:
    """The error an `{"error": …}` chunk carries, or None for an ordinary chunk."""
    error = chunk.get("error")
    if error is None or error is False:
        return None
    message: JSON = error
    status: JSON = None
    if isinstance(error, dict):
        message = error.get("message") or error
        status = _status_of(error.get("code")) or _status_of(error.get("status_code"))
    return StreamError(f"the server sent an error in the stream: {message}", status)


def _status_of(value: JSON) -> int | None:
    """An HTTP status given as a number or as digits (LiteLLM writes `"code": "500"`)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 100 <= value < 600 else None
    if isinstance(value, str) and value.isdigit():
        return _status_of(int(value))
    return None


def content_parts(value: JSON) -> tuple[str, str]:
    """(text, reasoning) of a `content` field: a string, or a list of typed parts (Mistral's
    `[{"type": "thinking", "thinking": [...]}, {"type": "text", "text": "..."}]`)."""
    if isinstance(value, str):
        return value, ""
    if not isinstance(value, list):
        return "", ""
    text: list[str] = []
    thought: list[str] = []
    for part in value:
        if isinstance(part, str):
            text.append(part)
        elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif isinstance(part, dict) and part.get("type") == "thinking":
            inner = part.get("thinking")
            thought.append(inner if isinstance(inner, str) else content_parts(inner)[0])
    return "".join(text), "".join(thought)


def reasoning_text(fields: dict[str, JSON]) -> str:
    """The reasoning a message or delta carries under any of its known names."""
    for name in REASONING_FIELDS:
        value = fields.get(name)
        if isinstance(value, str) and value:
            return value
    return ""


def sse_data(line: str) -> str | None:
    """The payload of one `data:` line; None for blank lines, `:` comments and other fields.

    OpenAI-compatible servers write each JSON chunk on a single `data:` line, so every such line is
    one event; the general SSE rule of joining several `data:` lines is not needed here.
    """
    if not line.startswith("data:"):
        return None
    return line[5:].strip() or None


_LINE_END = re.compile(rb"\r\n|\r|\n")  # the SSE grammar's end-of-line: CRLF, lone CR or lone LF


class SSELines:
    """Splits the bytes of an event stream into lines as they arrive, at CRLF, CR or LF (the HTML
    standard's `end-of-line`). A chunk ending in CR holds that line back until the next byte shows
    whether an LF completes the CRLF, so a CRLF split between two chunks ends one line, not two.
    Written here rather than taken from a library because aiohttp (which reads the body) has no
    SSE decoder, and this is the only part of SSE the client needs."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, block: bytes) -> list[str]:
        """The lines completed by `block`, without their line ends."""
        buffer = self._pending + block
        *lines, self._pending = _LINE_END.split(buffer)
        if buffer.endswith(b"\r"):  # maybe the first half of a CRLF: decided by the next chunk
            self._pending = lines.pop() + b"\r"
        return [line.decode("utf-8") for line in lines]

    def close(self) -> list[str]:
        """The last line: one held back after its CR, or one the stream ended without a line end."""
        held, self._pending = self._pending, b""
        return [held.removesuffix(b"\r").decode("utf-8")] if held else []


def parse_sse_lines(lines: Iterable[str]) -> Iterator[str]:
    """Yield the JSON payload of each `data:` event, stopping at the `[DONE]` sentinel."""
    for line in lines:
        data = sse_data(line)
        if data == DONE:
            return
        if data is not None:
            yield data


@dataclass
class _ToolCallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _ChoiceParts:
    """What has arrived so far for one choice index."""

    content: list[str] = field(default_factory=list)
    refusal: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    slots: dict[int, int] = field(default_factory=dict)  # wire index → key in `tool_calls`
    finish_reason: str | None = None

    def add_tool_call(self, delta: JSON, position: int) -> None:
        # Only the first delta of a call usually carries id and name; later ones carry argument text.
        if not isinstance(delta, dict):
            return
        index = delta.get("index", position)
        index = index if isinstance(index, int) else position
        new_id = delta.get("id") if isinstance(delta.get("id"), str) else ""
        slot = self.slots.get(index, index)
        held = self.tool_calls.get(slot)
        if held is not None and new_id and held.id and held.id != new_id:
            # Another call under an index already in use (Ollama sends every parallel call as
            # index 0): a new id starts a new call; deltas without an id go to the latest one.
            slot = max(self.tool_calls) + 1
        self.slots[index] = slot
        call = self.tool_calls.setdefault(slot, _ToolCallParts())
        if new_id:
            call.id = new_id
        function = delta.get("function")
        if not isinstance(function, dict):
            return
        if isinstance(function.get("name"), str) and function["name"]:
            call.name = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            call.arguments.append(arguments)
        elif isinstance(arguments, dict):
            call.arguments.append(json.dumps(arguments, ensure_ascii=False))

    def finished_tool_calls(self) -> list[ToolCall]:
        # A call without a name cannot be run. A missing id stays "": the client names it for the
        # whole conversation (kernel/model.py `name_unnamed_calls`); an index alone would repeat
        # in every turn.
        return [
            ToolCall(parts.id, parts.name, "".join(parts.arguments) or "{}")
            for index, parts in sorted(self.tool_calls.items())
            if parts.name
        ]


class StreamAssembler:
    """Accumulates `chat.completion.chunk` objects into whole responses, one per choice index.

    Choices of an `n > 1` request arrive interleaved, so everything is keyed by `choice.index`;
    tool calls are keyed by their own `index` within the choice. `model` and `usage` belong to the
    whole stream (usage arrives in a final chunk with no choices when `include_usage` is set).
    """

    def __init__(self) -> None:
        self.model = ""
        self.usage = Usage()
        self._choices: dict[int, _ChoiceParts] = {}

    def feed(self, chunk: dict[str, JSON]) -> str:
        """Add one decoded chunk; return the content text it added to choice 0, for live display."""
        if not isinstance(chunk, dict):
            return ""
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = usage_from_wire(chunk["usage"])
        error = stream_error(chunk)
        if error is not None:
            raise error
        added = ""
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = choice.get("index")
            index = index if isinstance(index, int) else 0
            parts = self._choices.setdefault(index, _ChoiceParts())
            if choice.get("finish_reason") == "error":  # OpenRouter: the generation failed mid-way
                raise StreamError('the server ended the stream with finish_reason "error"')
            if choice.get("finish_reason"):
                parts.finish_reason = choice["finish_reason"]
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            text, thought = content_parts(delta.get("content"))
            thought = thought or reasoning_text(delta)
            if thought:
                parts.reasoning.append(thought)
            if text:
                parts.content.append(text)
                if index == 0:
                    added += text
            if isinstance(delta.get("refusal"), str):
                parts.refusal.append(delta["refusal"])
            for position, call in enumerate(delta.get("tool_calls") or ()):
                parts.add_tool_call(call, position)
        return added

    @property
    def finished(self) -> bool:
        """True once every choice seen so far has a finish_reason (a stream cut short has none)."""
        return bool(self._choices) and all(parts.finish_reason for parts in self._choices.values())

    def response(self, index: int = 0) -> ModelResponse:
        """The assembled response of one choice; text fields are None when nothing arrived."""
        parts = self._choices.get(index) or _ChoiceParts()
        return ModelResponse(
            content="".join(parts.content) or None,
            tool_calls=parts.finished_tool_calls(),
            usage=self.usage,
            model=self.model,
            finish_reason=parts.finish_reason,
            refusal="".join(parts.refusal) or None,
            reasoning="".join(parts.reasoning) or None,
        )
