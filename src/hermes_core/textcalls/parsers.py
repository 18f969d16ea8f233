"""Tool calls that local models write as text, found and taken out of the reply.

Models served by vLLM, Ollama or llama.cpp often write a tool call into the content instead of the
`tool_calls` field. `parse_text_calls` finds those calls, removes them and any `<think>` reasoning
from the visible text, and returns what is left. There are two kinds of format:

- **tag formats** (`TagParser`): the call sits in a tagged block (`<tool_call>…</tool_call>`); a block
  counts wherever it appears, because nobody writes those tags by accident;
- **message formats** (`MessageParser`): bare JSON or a pythonic list counts only when it is the whole
  message, because prose that shows an example must not run tools.

The streaming parser (`stream.py`) is built from the same pieces (`ThinkSplitter`, `scan_blocks`,
`ContentBuilder`), so a streamed reply and a whole one always agree. Every rule and the reason for
it is in docs/text-tool-calls.md.
"""

from __future__ import annotations

import ast
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..messages import ToolCall
from ..tools.arguments import ArgumentError, parse_arguments

# ── What a parse returns ─────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class TextCall:
    """One tool call found in the text."""

    name: str
    arguments: str  # a JSON object as text; the model's own text if it holds no object (the kernel says so)
    span: tuple[int, int]  # the block that held the call, in the text with <think> blocks removed
    format: str  # the parser that found it


@dataclass
class ParsedText:
    """A reply split into what the user sees, the calls to run and the model's reasoning."""

    content: str  # calls and <think> blocks removed; whitespace tidied (see ContentBuilder)
    calls: list[TextCall] = field(default_factory=list)
    reasoning: str | None = None  # the <think> contents, never searched for calls

    def tool_calls(self, id_prefix: str = "textcall") -> list[ToolCall]:
        """The calls as kernel ToolCalls, with ids that depend only on their order."""
        return [ToolCall(f"{id_prefix}_{i}", call.name, call.arguments) for i, call in enumerate(self.calls)]


FoundCall = tuple[str, Any]  # a tool name and its arguments as the model wrote them (dict, text or None)

# ── How blocks are delimited ─────────────────────────────────────────────────────────────────────

NAME = r"[\w.:/-]+"  # what a tool name may look like: letters, digits, _ . : / -
_NAME = re.compile(NAME)


def _proper_prefixes(*words: str) -> list[str]:
    return sorted({re.escape(word[:i]) for word in words for i in range(1, len(word))})


@dataclass(frozen=True, eq=False)  # a tag is equal only to itself
class Tag:
    """How a block of calls is delimited: `<tool_call>` … `</tool_call>`."""

    start: str  # the literal every opening tag begins with
    opener: re.Pattern[str]  # the whole opening tag (group `name` when the tag carries the tool name)
    partial: re.Pattern[str]  # text that may still grow into an opening tag (held back while streaming)
    closer: str | None  # the closing tag; None: the block runs to the end of the text


def literal_tag(opening: str, closer: str | None) -> Tag:
    partial = re.compile("|".join(_proper_prefixes(opening)))
    return Tag(opening, re.compile(re.escape(opening)), partial, closer)


TOOL_CALL = literal_tag("<tool_call>", "</tool_call>")
TOOL = literal_tag("<tool>", "</tool>")
TOOLS = literal_tag("<tools>", "</tools>")
FUNCTION_CALL = literal_tag("<function_call>", "</function_call>")
TOOL_CALLS_TOKEN = literal_tag("[TOOL_CALLS]", None)
FUNCTION = Tag(  # <function=get_weather> or <function name="get_weather">
    start="<function",
    opener=re.compile(rf"<function(?:=| name=)([\"']?)(?P<name>{NAME})\1>"),
    partial=re.compile(
        "|".join([*_proper_prefixes("<function name="), rf"<function(?:=| name=)[\"']?(?:{NAME})?[\"']?"])
    ),
    closer="</function>",
)

# ── The two kinds of parser ──────────────────────────────────────────────────────────────────────


class TextCallParser(ABC):
    """One format of tool calls written as text. Subclass `TagParser` or `MessageParser`."""

    name: str

    def find(self, text: str) -> list[TextCall]:
        """The calls of this format alone in `text`."""
        return parse_selected(text, ((self.name, self),), think_open=None).calls


class TagParser(TextCallParser):
    """A format whose calls sit in tagged blocks; a block counts wherever it appears."""

    tags: tuple[Tag, ...]

    @abstractmethod
    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        """The calls in one block (`body` runs from the opening tag to the closer), or None if none."""


class MessageParser(TextCallParser):
    """A format whose calls are the whole message (after trimming whitespace and one code fence)."""

    @abstractmethod
    def read_message(self, message: str) -> list[FoundCall] | None:
        """The calls the message consists of, or None if it is anything else."""


# ── The formats ──────────────────────────────────────────────────────────────────────────────────


class Qwen3CoderParser(TagParser):
    """Qwen3-Coder XML: a function tag with one tag per parameter, usually inside `<tool_call>`.

        <tool_call>
        <function=get_weather>
        <parameter=city>
        北京
        </parameter>
        </function>
        </tool_call>

    A value is JSON-decoded when it is a number, boolean, object or array; otherwise it is kept as
    text, without one leading and one trailing newline.
    """

    name = "qwen3_coder"
    tags = (TOOL_CALL, FUNCTION)
    _function = re.compile(rf"<function=(?P<name>{NAME})>(?P<body>.*?)(?:</function>|\Z)", re.DOTALL)
    _parameter = re.compile(
        r"<parameter=(?P<name>[^>\n]+)>(?P<value>.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL
    )

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        if opening.re is FUNCTION.opener:  # a bare <function=…> block
            call = self._read_function(opening["name"], body)
            return [call] if call else None
        calls, end = [], 0
        for function in self._function.finditer(body):
            call = self._read_function(function["name"], function["body"])
            if call is None or body[end : function.start()].strip():
                return None
            calls.append(call)
            end = function.end()
        return calls if calls and not body[end:].strip() else None

    def _read_function(self, name: str, body: str) -> FoundCall | None:
        if body.strip() and not body.lstrip().startswith("<parameter="):
            return None  # e.g. a JSON body: another format's
        found = self._parameter.finditer(body)
        return name, {parameter["name"].strip(): _parameter_value(parameter["value"]) for parameter in found}


class JsonTagParser(TagParser):
    """A tag around a JSON call object, or a list of them (subclasses name the tags)."""

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        return _calls_in(_load(body), bare=False)


class HermesParser(JsonTagParser):
    """Hermes / Qwen2.5 function calling: a JSON object in `<tool_call>` tags.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    """

    name = "hermes"
    tags = (TOOL_CALL,)


class ToolTagParser(JsonTagParser):
    """Wrappers seen from local models: `<tool>`, `<tools>` (often a list) and `<function_call>`.

    <tools>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]</tools>
    """

    name = "tool_tags"
    tags = (TOOL, TOOLS, FUNCTION_CALL)


class FunctionTagParser(TagParser):
    """The tool name in a function tag and the JSON arguments inside (Llama 3.1's custom format).

    <function=get_weather>{"city": "Paris"}</function>
    <function name="get_weather">{"city": "Paris"}</function>
    """

    name = "function_tag"
    tags = (FUNCTION,)

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        arguments = _load(body) if body.strip() else {}
        return [(opening["name"], arguments)] if isinstance(arguments, dict) else None


class MistralParser(TagParser):
    """Mistral: the `[TOOL_CALLS]` token, then the calls up to the end of the message.

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]      (v3 tokenizer)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]add[ARGS]{…}   (v11 and later)
    """

    name = "mistral"
    tags = (TOOL_CALLS_TOKEN,)
    _named = re.compile(
        rf"(?P<name>{NAME})(?:\[CALL_ID\][\w-]*)?(?:\[ARGS\])?\s*(?P<arguments>\{{.*)", re.DOTALL
    )

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        calls: list[FoundCall] = []
        for chunk in filter(None, (part.strip() for part in body.split(TOOL_CALLS_TOKEN.start))):
            named = self._named.fullmatch(chunk)
            found = [(named["name"], named["arguments"])] if named else _calls_in(_load(chunk), bare=False)
            if found is None:
                return None
            calls += found
        return calls or None


class JsonMessageParser(MessageParser):
    """A whole message of JSON calls: Llama 3.1 JSON, bare or fenced Hermes-style objects, lists.

    {"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "add", "parameters": {"a": 1}}

    Untagged JSON must look like a call, not like data that has a `name`: the object needs an
    `arguments` or `parameters` key and no keys besides `name`, `id` and `type`.
    """

    name = "json"
    _separators = re.compile(r"[\s;,]*")

    def read_message(self, message: str) -> list[FoundCall] | None:
        if "name" not in message:  # cheap: spares json_repair every reply that merely starts with { or [
            return None
        calls: list[FoundCall] = []
        for value in self._values(message):
            found = _calls_in(value, bare=True)
            if found is None:
                return None
            calls += found
        return calls or None

    def _values(self, text: str) -> list[Any]:
        """JSON values separated by `;`, `,` or whitespace. A message that is not valid JSON from its
        first character is loaded leniently as one value; valid JSON followed by prose is no call."""
        decoder, values, pos = json.JSONDecoder(), [], 0
        try:
            while pos < len(text):
                value, pos = decoder.raw_decode(text, pos)
                values.append(value)
                pos = self._separators.match(text, pos).end()  # type: ignore[union-attr]  # always matches
        except (ValueError, RecursionError):
            return [] if values else [_load(text)]
        return values


class PythonicParser(MessageParser):
    """Llama 3.2 pythonic calls: a whole message that is a list of calls with keyword arguments.

    [get_weather(city="北京"), add(a=1, b=2)]

    Read with `ast`; argument values must be literals (never evaluated).
    """

    name = "pythonic"

    def read_message(self, message: str) -> list[FoundCall] | None:
        if not (message.startswith("[") and message.endswith("]")):
            return None
        try:
            tree = ast.parse(message, mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                return None
            return [self._read_call(node) for node in tree.elts]
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None

    def _read_call(self, node: ast.expr) -> FoundCall:
        if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
            raise ValueError("not a call with keyword arguments")
        name = ast.unparse(node.func)  # `get_weather` or `weather.get`; anything else is refused
        if not _NAME.fullmatch(name):
            raise ValueError(f"not a tool name: {name}")
        return name, {k.arg: ast.literal_eval(k.value) for k in node.keywords}


# ── Registry ─────────────────────────────────────────────────────────────────────────────────────

PARSERS: dict[str, TextCallParser] = {
    parser.name: parser
    for parser in (  # the parse order: where two formats share a tag, the first to read the block wins
        Qwen3CoderParser(),
        HermesParser(),
        FunctionTagParser(),
        ToolTagParser(),
        MistralParser(),
        PythonicParser(),
        JsonMessageParser(),
    )
}


def register_parser(name: str, parser: TextCallParser) -> None:
    """Add a format (tried after the others) or replace one in place; `name` is what `formats=` selects."""
    PARSERS[name] = parser


Parsers = tuple[tuple[str, TextCallParser], ...]


def select_parsers(formats: Sequence[str] | None = None) -> Parsers:
    """The chosen formats (all by default), in registry order."""
    if formats is None:
        return tuple(PARSERS.items())
    if isinstance(formats, str):  # one name, not its letters
        formats = [formats]
    unknown = sorted(set(formats) - PARSERS.keys())
    if unknown:
        raise ValueError(f"unknown text tool-call format(s) {unknown}; known: {sorted(PARSERS)}")
    return tuple((name, parser) for name, parser in PARSERS.items() if name in formats)


# ── Parsing ──────────────────────────────────────────────────────────────────────────────────────

_TRIGGERS = ("<", "[", "{", "```")  # nothing can be found in a text without one of these


def parse_text_calls(
    text: str, formats: Sequence[str] | None = None, *, think_open: bool | None = None
) -> ParsedText:
    """Find the tool calls a model wrote as text, and the visible text and reasoning around them.

    `think_open=True` says the prompt already opened a `<think>` block (as DeepSeek-R1 and Qwen3
    thinking templates do), so the text starts as reasoning; False says it did not; None (default)
    decides from the text: a `</think>` before any `<think>` means everything before it is reasoning.
    """
    if think_open is not True and not any(trigger in text for trigger in _TRIGGERS):
        return ParsedText(text.strip())
    return parse_selected(text, select_parsers(formats), think_open)


def parse_selected(text: str, parsers: Parsers, think_open: bool | None) -> ParsedText:
    """`parse_text_calls` with the parsers already chosen, and no fast path."""
    if think_open is None:
        first = THINK_TAG.search(text)
        think_open = first is not None and first.group() == "</think>"
    thoughts = ThinkSplitter(think_open)
    visible = thoughts.feed(text, final=True)
    calls = whole_message_calls(visible, parsers)
    if calls:
        return ParsedText("", calls, thoughts.reasoning)
    segments, _ = scan_blocks(visible, parsers, final=True)
    content, calls = release(segments, ContentBuilder())
    return ParsedText(content, calls, thoughts.reasoning)


THINK_TAG = re.compile(r"</?think>")
_THINK_END = re.compile(r"</think>")


class ThinkSplitter:
    """Separates `<think>…</think>` reasoning from the visible text, piece by piece.

    A `<think>` left open runs to the end of the text; a `</think>` outside a thought is dropped.
    """

    def __init__(self, think_open: bool) -> None:
        self.inside = think_open
        self._held = ""  # a tail that may be the start of a think tag
        self._thought: list[str] = []  # the pieces of the thought being read
        self._thoughts: list[str] = []

    def feed(self, piece: str, final: bool = False) -> str:
        """The visible text in `piece`, minus a tail that may still become a think tag (unless final)."""
        text, visible, pos = self._held + piece, [], 0
        while (tag := (_THINK_END if self.inside else THINK_TAG).search(text, pos)) is not None:
            if self.inside:
                self._thoughts.append("".join([*self._thought, text[pos : tag.start()]]))
                self._thought = []
            else:
                visible.append(text[pos : tag.start()])
            self.inside, pos = tag.group() == "<think>", tag.end()
        rest = text[pos:]
        self._held = "" if final else rest[_tag_prefix_start(rest, ("<think>", "</think>")) :]
        rest = rest[: len(rest) - len(self._held)]
        if self.inside:
            self._thought.append(rest)
        else:
            visible.append(rest)
        if final and self.inside:
            self._thoughts.append("".join(self._thought))
        return "".join(visible)

    @property
    def reasoning(self) -> str | None:
        return "\n\n".join(thought.strip() for thought in self._thoughts if thought.strip()) or None


def _tag_prefix_start(text: str, tags: tuple[str, ...]) -> int:
    """Where a tail of `text` that is the start of one of `tags` begins (len(text) if none)."""
    start = text.rfind("<")
    return start if start >= 0 and any(tag.startswith(text[start:]) for tag in tags) else len(text)


_FENCE_OPEN = re.compile(r"```[\w+-]*[ \t]*\n?")
_SPACE = re.compile(r"\s*")


def message_body(text: str) -> str | None:
    """What to read as a whole-message call: the text itself, or the inside of the one code fence
    it consists of. None when the text starts with anything else or goes on after its fence."""
    found = _message_body_span(text)
    return text[found[0] : found[1]] if found else None


def may_be_whole_message(text: str) -> bool:
    """Whether a reply that starts with `text` may still turn out to be a whole-message call."""
    start = _space_end(text, 0)
    undecided = len(text) - start < 3 and "```".startswith(text[start:])  # nothing yet, "`" or "``"
    return undecided or _message_body_span(text) is not None


def unfence(text: str, start: int = 0) -> str | None:
    """The inside of the code fence at `start`, if only whitespace follows it (a fence that is cut
    off before its closing ``` runs to the end); None otherwise."""
    found = _fence_inside(text, start)
    return text[found[0] : found[1]] if found else None


def _message_body_span(text: str) -> tuple[int, int] | None:
    start = _space_end(text, 0)
    if text.startswith("```", start):
        return _fence_inside(text, start)
    if text.startswith(("{", "["), start) and not text.startswith(TOOL_CALLS_TOKEN.start, start):
        return start, len(text)
    return None


def _fence_inside(text: str, start: int) -> tuple[int, int] | None:
    opening = _FENCE_OPEN.match(text, start)
    if opening is None:
        return None
    close = _find_fence(text, opening.end())
    if close < 0:
        return opening.end(), len(text)
    return (opening.end(), close) if _space_end(text, close + 3) == len(text) else None


def _find_fence(text: str, pos: int) -> int:
    """text.find("```", pos), but fast: finding one character is ~50 times faster on long text."""
    while (at := text.find("`", pos)) >= 0 and not text.startswith("```", at):
        pos = at + 1
    return at


def _space_end(text: str, pos: int) -> int:
    return _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # \s* always matches


def whole_message_calls(visible: str, parsers: Parsers) -> list[TextCall] | None:
    """The calls, if the whole (think-stripped) text is calls in a message format."""
    body = message_body(visible)
    if body is None:
        return None
    start = len(visible) - len(visible.lstrip())
    span = (start, len(visible.rstrip()))
    for name, parser in parsers:
        if isinstance(parser, MessageParser) and (found := parser.read_message(body.strip())):
            return [_text_call(call, span, name) for call in found]
    return None


Segment = str | list[TextCall]  # visible text, or the calls of a block taken out


def scan_blocks(text: str, parsers: Parsers, *, final: bool, offset: int = 0) -> tuple[list[Segment], int]:
    """Split `text` into visible text and call blocks, in order.

    Unless `final`, stop before anything undecided (an opening tag whose block has not closed, or a
    tail that may grow into an opening tag) and return how much of `text` was used. A block that
    holds no call is visible text. `offset` is where `text` starts, for the spans.
    """
    tags = _tags_of(parsers)
    segments: list[Segment] = []
    pos = 0
    while (found := _next_opening(text, pos, tags)) is not None:
        tag, opening = found
        close = text.find(tag.closer, opening.end()) if tag.closer else -1
        if close < 0 and not final:  # still open: hold it back
            segments.append(text[pos : opening.start()])
            return segments, opening.start()
        body_end = close if close >= 0 else len(text)
        end = body_end + len(tag.closer or "") if close >= 0 else len(text)
        segments.append(text[pos : opening.start()])
        span = (offset + opening.start(), offset + end)
        calls = _read_block(parsers, tag, opening, text[opening.end() : body_end], span)
        segments.append(calls or text[opening.start() : end])
        pos = end
    held = len(text) if final else _partial_opening(text, pos, tags)
    segments.append(text[pos:held])
    return segments, held


@lru_cache(maxsize=32)
def _tags_of(parsers: Parsers) -> tuple[Tag, ...]:
    return tuple(dict.fromkeys(tag for _, p in parsers if isinstance(p, TagParser) for tag in p.tags))


def _next_opening(text: str, pos: int, tags: tuple[Tag, ...]) -> tuple[Tag, re.Match[str]] | None:
    """The first opening tag at or after `pos` (found with str.find: much faster than a regex scan)."""
    next_at = {char: text.find(char, pos) for char in {tag.start[0] for tag in tags}}
    while live := [at for at in next_at.values() if at >= 0]:
        at = min(live)
        for tag in tags:
            if text.startswith(tag.start, at) and (opening := tag.opener.match(text, at)):
                return tag, opening
        next_at[text[at]] = text.find(text[at], at + 1)
    return None


def _partial_opening(text: str, pos: int, tags: tuple[Tag, ...]) -> int:
    """Where a tail that may grow into an opening tag begins (len(text) if there is none).

    Such a tail holds no `<` or `[` after its first character, so only the last one can start it.
    """
    start = max(text.rfind("<", pos), text.rfind("[", pos))
    if start >= 0 and any(tag.partial.fullmatch(text, start) for tag in tags):
        return start
    return len(text)


def _read_block(
    parsers: Parsers, tag: Tag, opening: re.Match[str], body: str, span: tuple[int, int]
) -> list[TextCall]:
    """The calls of the first format that reads this block; none if no format does."""
    for name, parser in parsers:
        if isinstance(parser, TagParser) and tag in parser.tags:
            if found := parser.read_block(opening, body):
                return [_text_call(call, span, name) for call in found]
    return []


class ContentBuilder:
    """Joins visible pieces into the content, one piece at a time (so streaming gets the same text).

    Whitespace at the very start and end is dropped, and the whitespace on both sides of a removed
    block collapses to the longer side. Nothing else changes.
    """

    def __init__(self) -> None:
        self._started = False  # some visible character was released
        self._before = ""  # whitespace after the last visible character
        self._after = ""  # whitespace after the last removed block
        self._gap = False  # a block was removed since the last visible character

    def gap(self) -> None:
        if self._gap:
            self._before, self._after = _longer(self._before, self._after), ""
        self._gap = True

    def add(self, piece: str) -> str:
        """The text that is final now."""
        body = piece.lstrip()
        if self._gap:
            self._after += piece[: len(piece) - len(body)]
        else:
            self._before += piece[: len(piece) - len(body)]
        if not body:
            return ""
        space = _longer(self._before, self._after) if self._gap else self._before
        text = body.rstrip()
        released = space + text if self._started else text
        self._started, self._gap, self._before, self._after = True, False, body[len(text) :], ""
        return released


def _longer(first: str, second: str) -> str:
    return second if len(second) > len(first) else first


def release(segments: list[Segment], content: ContentBuilder) -> tuple[str, list[TextCall]]:
    """Feed segments to the content builder; return the text it released and the calls."""
    text, calls = [], []
    for segment in segments:
        if isinstance(segment, str):
            text.append(content.add(segment))
        else:
            content.gap()
            calls += segment
    return "".join(text), calls


# ── Payloads ─────────────────────────────────────────────────────────────────────────────────────

_CALL_KEYS = {"name", "arguments", "parameters", "id", "type"}


def _calls_in(value: Any, *, bare: bool) -> list[FoundCall] | None:
    """The calls in a decoded payload (one call object or a list of them); None if any item is not one."""
    calls = []
    for item in value if isinstance(value, list) else [value]:
        call = _call_from_object(item, bare=bare)
        if call is None:
            return None
        calls.append(call)
    return calls or None


def _call_from_object(value: Any, *, bare: bool) -> FoundCall | None:
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):  # the OpenAI wire shape
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name.strip()):
        return None
    if bare and ("arguments" not in value and "parameters" not in value or value.keys() - _CALL_KEYS):
        return None
    return name.strip(), value.get("arguments", value.get("parameters"))


def _text_call(call: FoundCall, span: tuple[int, int], format: str) -> TextCall:
    name, arguments = call
    return TextCall(name, arguments_text(arguments), span, format)


def arguments_text(arguments: Any) -> str:
    """Arguments as JSON object text; the model's own text when no object can be recovered from it."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        try:
            arguments = parse_arguments(arguments)  # JSON-encoded, fenced, single-quoted, truncated…
        except ArgumentError:
            return arguments
    try:
        return json.dumps(arguments, ensure_ascii=False, default=str)
    except (TypeError, ValueError):  # e.g. tuple keys from a Python literal
        return str(arguments)


def _load(text: str) -> Any:
    """JSON, else a Python literal (single quotes, True/None), else what json_repair recovers."""
    text = text.strip()
    if text.startswith("```"):
        text = (unfence(text) or text).strip()
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text) if len(text) < 100_000 else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    from json_repair import repair_json  # imported on the first broken payload only

    try:
        return repair_json(text, return_objects=True)
    except Exception:  # the library must never crash the parse on hostile text
        return None


def _parameter_value(raw: str) -> Any:
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    try:
        decoded = json.loads(value, parse_constant=_reject)
    except (ValueError, RecursionError):
        return value
    return decoded if isinstance(decoded, (int, float, dict, list)) else value  # bool is an int


def _reject(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON number")
