"""Tool calls that local models write as text instead of native `tool_calls`.

    from hermes_core.textcalls import parse_text_calls, StreamingTextCallParser

    parsed = parse_text_calls('Checking.\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    parsed.content        # 'Checking.'
    parsed.tool_calls()   # [ToolCall(id='textcall_0', name='add', arguments='{"a": 1}')]

Pure parsing: no I/O, no asyncio. The formats and every decision are in docs/text-tool-calls.md.
"""

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
