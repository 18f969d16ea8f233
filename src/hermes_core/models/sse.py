"""Decoding a streamed chat completion: SSE lines in, one `ModelResponse` per choice out.

Pure code with no I/O, so the HTTP client and the conformance tests that replay recorded streams
run exactly the same decoder.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..messages import ModelResponse, ToolCall, Usage

DONE = "[DONE]"


def sse_data(line: str) -> str | None:
    """The payload of one `data:` line; None for blank lines, `:` comments and other fields.

    OpenAI-compatible servers write each JSON chunk on a single `data:` line, so every such line is
    one event; the general SSE rule of joining several `data:` lines is not needed here.
    """
    if not line.startswith("data:"):
        return None
    return line[5:].strip() or None


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
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None

    def add_tool_call(self, delta: Any, position: int) -> None:
        # Only the first delta of a call usually carries id and name; later ones carry argument text.
        if not isinstance(delta, dict):
            return
        index = delta.get("index", position)
        call = self.tool_calls.setdefault(index if isinstance(index, int) else position, _ToolCallParts())
        if isinstance(delta.get("id"), str) and delta["id"]:
            call.id = delta["id"]
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
        # whole conversation (models/base.py `name_unnamed_calls`); an index alone would repeat
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

    def feed(self, chunk: dict[str, Any]) -> str:
        """Add one decoded chunk; return the content text it added to choice 0, for live display."""
        if not isinstance(chunk, dict):
            return ""
        if isinstance(chunk.get("model"), str) and chunk["model"]:
            self.model = chunk["model"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = Usage.from_wire(chunk["usage"])
        added = ""
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = choice.get("index")
            index = index if isinstance(index, int) else 0
            parts = self._choices.setdefault(index, _ChoiceParts())
            if choice.get("finish_reason"):
                parts.finish_reason = choice["finish_reason"]
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            text = delta.get("content")
            if isinstance(text, str) and text:
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
        )
