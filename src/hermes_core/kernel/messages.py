"""The typed values that flow through the loop: tool calls, token usage, one model response.

Conversation history itself stays in the OpenAI wire format (a list of plain dicts), because that
is what every OpenAI-compatible endpoint reads and what a person debugging a run expects to see.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A value read from JSON or written as JSON: a dict with str keys, a list, a str, an int, a float, a
# bool or None. Declared once, here; it stays `Any` to mypy because wire data is read by key and
# checked where it is used (every seam that carries it says so by this name).
JSON = Any

Message = dict[str, JSON]  # one message of the conversation, in the OpenAI wire format


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for. `arguments` is the raw text the model wrote."""

    id: str
    name: str
    arguments: str = "{}"

    def to_wire(self) -> dict[str, JSON]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @functools.cached_property
    def key(self) -> tuple[str, str]:
        """What the call does, whatever its id: an approval covers exactly this (tasks/pending.py).
        Worked out once per call (the guards ask at admission and again at its outcome)."""
        return self.name, canonical_arguments(self.arguments)


def json_encoder(
    *, sort_keys: bool = False, default: Callable[[JSON], JSON] | None = None
) -> Callable[[JSON], str]:
    """`json.JSONEncoder(ensure_ascii=False, …).encode` calling the C encoder at once (`encode` runs ~100
    bytecodes first, at each body, result and key); the stdlib's where they differ on a sample."""
    stdlib = json.JSONEncoder(ensure_ascii=False, sort_keys=sort_keys, default=default)
    make, quote = getattr(json.encoder, "c_make_encoder", None), json.encoder.encode_basestring
    fallback = stdlib.default

    def encode(value: JSON) -> str:  # a fresh `markers` per call, as the stdlib's: circular values fail
        encoder = make({}, fallback, quote, None, ": ", ", ", sort_keys, False, True)  # type: ignore[misc]
        return "".join(encoder(value, 0))

    sample = {"b": [1, 2.5, None, True, 'é\n"', {"a": float("inf")}], "a": {}}
    try:
        return encode if encode(sample) == stdlib.encode(sample) else stdlib.encode
    except Exception:  # no C encoder, or one that takes other arguments (another Python)
        return stdlib.encode


CANONICAL_JSON = json_encoder(sort_keys=True)


def canonical_arguments(arguments: str) -> str:
    """Same arguments written differently (spacing, key order) count as the same call."""
    try:
        return CANONICAL_JSON(json.loads(arguments))
    except ValueError:
        return arguments.strip()


def request_digest(messages: list[Message]) -> str:
    """A short name for one request's conversation, for the ids of calls an endpoint left unnamed.

    The conversation grows every turn, so the ids differ from turn to turn within a task, and the
    same conversation (a task run again) names its calls the same way.
    """
    text = json.dumps(messages, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def user_message(text: str, images: Sequence[str] = ()) -> Message:
    """The user's message in wire format: plain text, or OpenAI content parts when it has pictures
    (`images`: `data:` URLs), the text part first."""
    if not images:
        return {"role": "user", "content": text}
    parts: list[dict[str, JSON]] = [{"type": "text", "text": text}] if text else []
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return {"role": "user", "content": parts}


def without_images(messages: Sequence[Message]) -> list[Message]:
    """`messages` with each message that has pictures made plain text: its text parts, then
    `[image: N attached, 34 KB]`. What history, traces and logs keep: a picture is sent to the model
    in its own turn only, never stored (megabytes of base64 would ride along in every later turn)."""
    return [_placeholder(message) if _has_image(message) else message for message in messages]


def _has_image(message: Message) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(_is_image(part) for part in content)


def _is_image(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def _placeholder(message: Message) -> Message:
    parts = message["content"]
    texts = [
        str(part.get("text", "")) for part in parts if isinstance(part, dict) and part.get("type") == "text"
    ]
    urls = [str((part.get("image_url") or {}).get("url", "")) for part in parts if _is_image(part)]
    size = sum(len(url.partition(",")[2]) * 3 // 4 for url in urls)
    shown = f"{size / 1048576:.1f} MB" if size >= 1048576 else f"{max(1, round(size / 1024))} KB"
    note = f"[image: {len(urls)} attached, {shown}]"
    return {**message, "content": "\n".join([*(t for t in texts if t), note])}


@dataclass(frozen=True)
class Usage:
    """Tokens of one call or a task; `cached_tokens`: the part of `prompt_tokens` the provider's
    prompt cache served (billed lower). Read from each provider's fields by models/usage.py."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        if not (other.prompt_tokens or other.completion_tokens or other.total_tokens):
            return self  # frozen: the sum with nothing is this one itself
        if not (self.prompt_tokens or self.completion_tokens or self.total_tokens):
            return other
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.total_tokens + other.total_tokens,
            self.cached_tokens + other.cached_tokens,
        )


@dataclass
class ModelResponse:
    """What one model call returned, already decoded from the wire (streamed or not)."""

    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = Usage()  # frozen: one shared zero, not a new one per response
    model: str = ""
    finish_reason: str | None = None
    refusal: str | None = None
    # The model's reasoning (<think> text, `reasoning_content` / `reasoning` fields): kept for the
    # trace, never shown; sent back in a tool loop unless the model refuses it (models/openai_compat.py).
    reasoning: str | None = None
    # The configured model the request went to (a fallback, if the primary failed); "" when the
    # client does not say. Permissions (`allowed_models`) are checked against it, never against
    # `model`, which is whatever the endpoint wrote.
    answered_by: str = ""

    @property
    def cut_off(self) -> bool:
        """The output token limit ended the response (OpenAI-compatible servers, Ollama and vLLM
        say "length"): a tool call in it may have incomplete arguments."""
        return self.finish_reason in ("length", "max_tokens")

    @property
    def text(self) -> str:
        """The visible reply: the content, or the refusal when the model refused."""
        return self.content or self.refusal or ""

    def to_message(self) -> Message:
        """The assistant message to append to the history, in wire format."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_wire() for call in self.tool_calls]
            if self.reasoning:  # the client strips it for endpoints that do not want it back
                message["reasoning_content"] = self.reasoning
        elif self.content is None:
            message["content"] = self.text
        return message
