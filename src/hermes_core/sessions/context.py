"""What of a conversation fits into one model call: turns, a token estimate, the window.

History is cut only between turns. A turn starts at a user message and holds everything up to the
next one, so an assistant message with `tool_calls` always travels with its `role: tool` results —
an OpenAI-compatible API rejects a request in which any call lacks its result.

Token estimate (no tokenizer, no network, within ~20–30% for the common BPE tokenizers, which is
what a budget needs — it is a limit, not a bill):
- a CJK character (ideograph, kana, hangul, full-width punctuation) ≈ 1 token;
- other text ≈ 4 characters per token, rounded up;
- each message adds `MESSAGE_OVERHEAD` tokens (role and the chat template's separators), and each
  tool call adds the same again plus its name and argument text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from ..kernel.messages import Message

MESSAGE_OVERHEAD = 4
_WIDE = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")

Turn = list[Message]


def estimate_tokens(text: str) -> int:
    """Estimated tokens of `text`: CJK characters count one each, other text one per 4 characters."""
    wide = len(_WIDE.findall(text))
    return wide + (len(text) - wide + 3) // 4


def message_tokens(message: Message) -> int:
    """Estimated tokens of one wire-format message, its tool calls included."""
    content = message.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False) if content else ""
    tokens = MESSAGE_OVERHEAD + estimate_tokens(text)
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        tokens += MESSAGE_OVERHEAD + estimate_tokens(f"{function.get('name')}{function.get('arguments')}")
    return tokens


def history_tokens(messages: Sequence[Message]) -> int:
    return sum(message_tokens(message) for message in messages)


def split_turns(messages: Sequence[Message]) -> list[Turn]:
    """Group messages into turns, each starting at a user message (the only safe places to cut)."""
    turns: list[Turn] = []
    for message in messages:
        if message.get("role") == "user" or not turns:
            turns.append([])
        turns[-1].append(message)
    return turns


def newest_turns(turns: Sequence[Turn], max_turns: int, max_tokens: int) -> list[Turn]:
    """The longest run of newest turns with at most `max_turns` turns and `max_tokens` tokens."""
    kept: list[Turn] = []
    total = 0
    for turn in reversed(turns[-max_turns:] if max_turns > 0 else []):
        total += history_tokens(turn)
        if total > max_tokens:
            break
        kept.append(turn)
    kept.reverse()
    return kept


def flatten(turns: Sequence[Turn]) -> list[Message]:
    return [message for turn in turns for message in turn]


def prompt_bytes(
    messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None, model: str = ""
) -> int:
    """UTF-8 size of the chat-completions body an OpenAI-compatible client sends for this request
    (model, messages, tools; sampling options left out): the figure that folding and windowing shrink."""
    body: dict[str, Any] = {"model": model, "messages": list(messages)}
    if tools:
        body["tools"] = list(tools)
    return len(json.dumps(body, ensure_ascii=False).encode("utf-8"))


__all__ = [
    "MESSAGE_OVERHEAD",
    "Turn",
    "estimate_tokens",
    "flatten",
    "history_tokens",
    "message_tokens",
    "newest_turns",
    "prompt_bytes",
    "split_turns",
]
