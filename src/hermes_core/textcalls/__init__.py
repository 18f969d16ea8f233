"""Tool calls that local models write as text instead of native `tool_calls`.

    from hermes_core.textcalls import parse_text_calls, StreamingTextCallParser

    parsed = parse_text_calls('Checking.\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    parsed.content        # 'Checking.'
    parsed.tool_calls()   # [ToolCall(id='textcall_0', name='add', arguments='{"a": 1}')]

Pure parsing: no I/O, no asyncio. The formats and every decision are in docs/text-tool-calls.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .parsers import (
        PARSERS,
        MessageParser,
        ParsedText,
        Tag,
        TagParser,
        TextCall,
        TextCallParser,
        parse_text_calls,
        register_parser,
    )
    from .stream import StreamingTextCallParser, StreamUpdate

# Imported on first use: the model stack's wrapper (wrapper.py) is always built, the parsers (their
# patterns, about 1.5 MB and 12 ms) only once a reply's text may hold a call.
_MODULE_OF = {
    **dict.fromkeys(
        ("PARSERS", "MessageParser", "ParsedText", "Tag", "TagParser", "TextCall", "TextCallParser",
         "parse_text_calls", "register_parser"),
        "parsers",
    ),
    "StreamingTextCallParser": "stream",
    "StreamUpdate": "stream",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


__all__ = [
    "PARSERS",
    "MessageParser",
    "ParsedText",
    "StreamUpdate",
    "StreamingTextCallParser",
    "Tag",
    "TagParser",
    "TextCall",
    "TextCallParser",
    "parse_text_calls",
    "register_parser",
]
