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
import importlib
import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import lru_cache

from ..kernel.messages import JSON, ToolCall
from ..kernel.tools.arguments import ArgumentError, parse_arguments, repairable
from .schema import Parameters, ToolSchemas, tool_properties, typed_arguments

# ── What a parse returns ─────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class TextCall:
    """One tool call found in the text."""

    name: str
    arguments: str  # a JSON object as text; the model's own text if it holds no object (the kernel says so)
    span: tuple[int, int]  # the block that held the call, in the text with <think> blocks removed
    format: str  # the parser that found it
    # parameters written as text (XML-style formats), as written: the tool's schema types them
    texts: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)


@dataclass
class ParsedText:
    """A reply split into what the user sees, the calls to run and the model's reasoning."""

    content: str  # calls and <think> blocks removed; whitespace tidied (see ContentBuilder)
    calls: list[TextCall] = field(default_factory=list)
    reasoning: str | None = None  # the <think> contents, never searched for calls

    def tool_calls(self, id_prefix: str = "textcall") -> list[ToolCall]:
        """The calls as kernel ToolCalls, with ids that depend only on their order."""
        return [ToolCall(f"{id_prefix}_{i}", call.name, call.arguments) for i, call in enumerate(self.calls)]


FoundCall = tuple[str, JSON]  # a tool name and its arguments as the model wrote them (dict, text or None)


@dataclass(frozen=True)
class Reasoning:
    """A block that is the model's reasoning (harmony's `analysis` message): taken out of the
    content and returned as `ParsedText.reasoning`, after the `<think>` reasoning."""

    text: str


# ── How blocks are delimited ─────────────────────────────────────────────────────────────────────

_LONGEST_PARTIAL = 400  # no opening tag is longer than this
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
    closer: str | tuple[str, ...] | None  # the closing tag(s); None: the block runs to the end of the text
    nested: bool = False  # the opening tag holds further `<` (harmony's `<|channel|>…<|message|>`)

    def close(self, text: str, pos: int) -> tuple[int, int] | None:
        """Where the first closing tag at or after `pos` starts and ends; None if none follows."""
        closers = (self.closer,) if isinstance(self.closer, str) else self.closer or ()
        found = [(at, at + len(c)) for c in closers if (at := text.find(c, pos)) >= 0]
        return min(found) if found else None


def literal_tag(opening: str, closer: str | tuple[str, ...] | None) -> Tag:
    partial = re.compile("|".join(_proper_prefixes(opening)))
    return Tag(opening, re.compile(re.escape(opening)), partial, closer)


TOOL_CALL = literal_tag("<tool_call>", "</tool_call>")
TOOL = literal_tag("<tool>", "</tool>")
TOOLS = literal_tag("<tools>", "</tools>")
FUNCTION_CALL = literal_tag("<function_call>", "</function_call>")
TOOL_CALLS_TOKEN = literal_tag("[TOOL_CALLS]", None)
RESPONSE = literal_tag("<response>", "</response>")  # llama.cpp's generic wrappers
JSON_TAG = literal_tag("<json>", "</json>")
XML = literal_tag("<xml>", "</xml>")
TOOL_CALLS_TAG = literal_tag("<tool_calls>", "</tool_calls>")  # Apriel
TOOLCALL = literal_tag("<TOOLCALL>", "</TOOLCALL>")  # NVIDIA Nemotron
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
    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | str | Reasoning | None:
        """The calls in one block (`body` runs from the opening tag to the closer); None if this is
        no block of this format. A list may be empty (the block is markup that holds no call: it is
        removed); a str is the visible text the block stands for; `Reasoning` is the model's."""


class MessageParser(TextCallParser):
    """A format whose calls are the whole message (after trimming whitespace and one code fence)."""

    @abstractmethod
    def read_message(self, message: str) -> list[FoundCall] | None:
        """The calls the message consists of, or None if it is anything else."""

    def split_message(self, message: str) -> tuple[list[FoundCall], str] | None:
        """The calls the message starts with and the text after them (here: none)."""
        found = self.read_message(message)
        return (found, "") if found else None


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
        r"<parameter=(?P<name>[^<>\n]+)>(?P<value>.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL
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
        return name, written_parameters((p["name"].strip(), p["value"]) for p in found)


class JsonTagParser(TagParser):
    """A tag around a JSON call object, or a list of them (subclasses name the tags)."""

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | str | None:
        """One call, a list, or several objects joined by `,` or `;` (`{…}, {…}`)."""
        values, _ = JsonMessageParser()._values(body.strip())
        calls = [call for value in values for call in _calls_in(value, bare=False) or []]
        return calls or None


class HermesParser(JsonTagParser):
    """Hermes / Qwen2.5 function calling: a JSON object in `<tool_call>` tags.

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    """

    name = "hermes"
    tags = (TOOL_CALL,)


class ToolTagParser(JsonTagParser):
    """Wrappers seen from local models: `<tool>`, `<tools>` (often a list), `<function_call>`,
    `<tool_calls>` (Apriel), `<TOOLCALL>` (Nemotron), and the `<response>`, `<json>`, `<xml>` that
    llama.cpp's generic format accepts.

    <tools>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]</tools>
    """

    name = "tool_tags"
    tags = (TOOL, TOOLS, FUNCTION_CALL, TOOL_CALLS_TAG, TOOLCALL, RESPONSE, JSON_TAG, XML)
    _generic = (RESPONSE.opener, JSON_TAG.opener, XML.opener)  # also wrap plain structured output

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | str | None:
        """As other tags; but `<response>{"name": "Alice"}</response>` is data, so the generic
        wrappers need what untagged JSON needs (an `arguments` or `parameters` key). A `<response>`
        that holds no call is the reply itself (IBM Granite wraps its answer in one): shown
        without the tags."""
        if opening.re not in self._generic:
            return super().read_block(opening, body)
        values = JsonMessageParser()._values(body.strip())[0] if "name" in body else []
        found = [call for value in values for call in _calls_in(value, bare=True) or []]
        if found:
            return found
        return body if opening.re is RESPONSE.opener else None


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

    Magistral and Ministral reason between `[THINK]` and `[/THINK]`: that is reasoning, and a
    `[TOOL_CALLS]` written inside it is part of the thought (llama.cpp's tests).
    """

    name = "mistral"
    tags = (TOOL_CALLS_TOKEN, literal_tag("[THINK]", "[/THINK]"))
    _named = re.compile(
        rf"(?P<name>{NAME})(?:\[CALL_ID\][\w-]*)?(?:\[ARGS\])?\s*(?P<arguments>\{{.*)", re.DOTALL
    )

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | str | Reasoning | None:
        """The calls; a token with nothing readable after it is removed and the rest shown."""
        if opening.group() == "[THINK]":
            return Reasoning(body)
        return self._calls(body) or body.replace(TOOL_CALLS_TOKEN.start, "").strip()

    def _calls(self, body: str) -> list[FoundCall] | None:
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
        found = self.split_message(message)
        return found[0] if found and not found[1] else None

    def split_message(self, message: str) -> tuple[list[FoundCall], str] | None:
        """Calls, then maybe prose: Llama 3 often goes on after its call ("Would you like…")."""
        if "name" not in message:  # cheap: spares json_repair every reply that merely starts with { or [
            return None
        values, rest = self._values(message)
        calls: list[FoundCall] = []
        for value in values:
            found = _calls_in(value, bare=True)
            if found is None:
                return None
            calls += found
        return (calls, rest) if calls else None

    def _values(self, text: str) -> tuple[list[JSON], str]:
        """JSON values separated by `;`, `,` or whitespace, and the text after them. A message that
        is not valid JSON from its first character is loaded leniently as one value."""
        decoder, values, pos = json.JSONDecoder(parse_float=_number, parse_constant=_number), [], 0
        try:
            while pos < len(text):
                value, pos = decoder.raw_decode(text, pos)
                values.append(value)
                pos = self._separators.match(text, pos).end()  # type: ignore[union-attr]  # always matches
        except (ValueError, RecursionError):
            return (values, text[pos:]) if values else ([_load(text)], "")
        return values, ""


class PythonicParser(MessageParser):
    """Llama 3.2 pythonic calls: a whole message that is a list of calls with keyword arguments.

    [get_weather(city="北京"), add(a=1, b=2)]

    Read with `ast`; argument values must be literals (never evaluated).
    """

    name = "pythonic"
    _most_brackets = 32  # where a list of calls followed by prose may end: tried at each `]`

    def split_message(self, message: str) -> tuple[list[FoundCall], str] | None:
        """A call list, then maybe prose ("[get_weather(city='Tokyo')] Here is the forecast:")."""
        if message.endswith("]") and (whole := self.read_message(message)):
            return whole, ""  # the common case, in one parse
        end = message.find("]")
        for _ in range(self._most_brackets):
            if end < 0:
                return None
            if found := self.read_message(message[: end + 1]):
                return found, message[end + 1 :]
            end = message.find("]", end + 1)
        return None

    def read_message(self, message: str) -> list[FoundCall] | None:
        if not (message.startswith("[") and message.endswith("]")) or not _afford("ast", _ast_cost(message)):
            return None
        try:
            tree = ast.parse(message, mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                return None
            return [self._read_call(node, message) for node in tree.elts]
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None

    def _read_call(self, node: ast.expr, message: str) -> FoundCall:
        """One call. Its shape must be a call (else the list is no call list); a value that is not a
        literal (`b=foo`) keeps the call, with the model's argument text for the kernel to refuse."""
        if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
            raise ValueError("not a call with keyword arguments")
        name = ast.unparse(node.func)  # `get_weather` or `weather.get`; anything else is refused
        if not _NAME.fullmatch(name):
            raise ValueError(f"not a tool name: {name}")
        try:
            return name, {k.arg: ast.literal_eval(_SetsAsLists().visit(k.value)) for k in node.keywords}
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return name, ", ".join(ast.get_source_segment(message, k) or "" for k in node.keywords)


class _SetsAsLists(ast.NodeTransformer):
    """A set literal (`tags={'a', 'b'}`) read as a list in the order written: JSON has no sets."""

    def visit_Set(self, node: ast.Set) -> ast.List:
        return ast.List(elts=[self.visit(item) for item in node.elts], ctx=ast.Load())


# ── Formats of newer open models (special tokens the server did not parse) ──────────────────────


class GlmParser(TagParser):
    """GLM-4.5 / 4.6 / 4.7: the tool name first in `<tool_call>`, then key/value tags.

        <tool_call>get_weather
        <arg_key>city</arg_key>
        <arg_value>北京</arg_value>
        </tool_call>

    GLM-4.7 writes no newline after the name. Values are read like Qwen3-Coder's.
    """

    name = "glm"
    tags = (TOOL_CALL,)
    # possessive runs (`*+`): a run of whitespace is never given back, so it keeps no state per character
    _block = re.compile(rf"\s*(?P<name>{NAME})(?:\s|\\n)*+(?P<arguments>(?:<arg_key>.*)?)", re.DOTALL)
    _pair = re.compile(
        r"(?:\s|\\n)*+<arg_key>(?P<key>.*?)</arg_key>(?:\s|\\n)*+<arg_value>(?P<value>.*?)(?:</arg_value>|\Z)",
        re.DOTALL,
    )

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        block = self._block.fullmatch(body)
        if block is None:
            return None
        pairs, pos, text = [], 0, block["arguments"]
        while pair := self._pair.match(text, pos):
            pairs.append((pair["key"].strip(), pair["value"]))
            pos = pair.end()
        return (
            [(block["name"], written_parameters(pairs))]
            if not text[pos:].replace("\\n", "").strip()
            else None
        )


def _json_or_pythonic(body: str) -> list[FoundCall] | None:
    """A Llama payload: JSON calls joined by `;`, or a pythonic list."""
    body = body.strip()
    if body.startswith("[") and not body.startswith("[{"):
        return PythonicParser().read_message(body)
    values, rest = JsonMessageParser()._values(body)
    if rest.strip():
        return None
    calls: list[FoundCall] = []
    for value in values:
        calls += _calls_in(value, bare=False) or []
    return calls or None


class LlamaTokenParser(TagParser):
    """Llama's own call tokens: `<|python_tag|>` (3.1/3.2, to the end of the message) and
    `<|python_start|>` … `<|python_end|>` (Llama 4), around JSON calls or a pythonic list.

        <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}
        <|python_start|>[get_weather(city="Paris")]<|python_end|>
    """

    name = "llama_tokens"
    tags = (
        literal_tag("<|python_tag|>", ("<|eom_id|>", "<|eot_id|>")),
        literal_tag("<|python_start|>", "<|python_end|>"),
    )

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        calls: list[FoundCall] = []
        for part in body.split("<|python_tag|>"):  # some write the token before each call
            calls += (_json_or_pythonic(part) or []) if part.strip() else []
        return calls or None


class KimiK2Parser(TagParser):
    """Kimi-K2: a section of calls, each named `functions.<name>:<index>`.

        <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
        <|tool_call_argument_begin|>{"city": "北京"}<|tool_call_end|><|tool_calls_section_end|>

    A call whose id is malformed is dropped; its neighbours still run. Text inside a section before
    its first call is noise (vLLM drops it too). A call whose id is a bare counter (`0`) names no
    tool: the serving stack infers the name from the tools offered, which a parser does not know,
    so such a call is removed without running; so is an empty section.
    """

    name = "kimi_k2"
    tags = (
        literal_tag("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"),
        literal_tag("<|tool_call_begin|>", "<|tool_call_end|>"),
    )
    _call = re.compile(
        r"\s*(?:functions\.)?(?P<name>[\w.-]+):\d+\s*<\|tool_call_argument_begin\|>(?P<arguments>.*)",
        re.DOTALL,
    )  # the arguments end trimmed in code: a lazy `.*?\s*…\Z` is quadratic in a whitespace run

    _bare_counter = re.compile(r"\s*\d+\s*<\|tool_call_argument_begin\|>.*", re.DOTALL)

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        chunks = [body] if opening.group() == "<|tool_call_begin|>" else body.split("<|tool_call_begin|>")[1:]
        calls = [
            (call["name"], call["arguments"].rstrip().removesuffix("<|tool_call_end|>").rstrip())
            for chunk in chunks
            if (call := self._call.fullmatch(chunk))
        ]
        if calls or all(self._bare_counter.fullmatch(chunk) for chunk in chunks):
            return calls
        return None


_DS = "<｜tool▁sep｜>"


class DeepSeekParser(TagParser):
    """DeepSeek-V3 and V3.1 (and R1) call tokens.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "北京"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>                               (V3, R1)
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "北京"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>                                          (V3.1, on one line)
    """

    name = "deepseek"
    tags = (
        literal_tag("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"),
        literal_tag("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"),
    )
    _v3 = re.compile(rf"\s*function{_DS}(?P<name>{NAME})\s*\n(?P<arguments>.*)", re.DOTALL)
    _v31 = re.compile(rf"\s*(?P<name>{NAME}){_DS}(?P<arguments>.*)", re.DOTALL)

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        if opening.group() == self.tags[1].start:
            chunks = [body]
        else:
            first, *chunks = body.split(self.tags[1].start)
            if first.strip():
                return None
        calls = []
        for chunk in chunks:
            chunk = chunk.split("<｜tool▁call▁end｜>")[0]
            call = self._v3.fullmatch(chunk) or self._v31.fullmatch(chunk)
            if call is not None:
                calls.append((call["name"], call["arguments"].strip()))
        return calls or None


# a recipient (`functions.get_weather`); matched atomically (a lookahead, then the same text again),
# so a failed header is given up at once instead of retried with every shorter recipient
_RECIPIENT = r"(?=(?P<{0}>[^\s<=]{{1,100}}))(?P={0})"
_HARMONY_TAIL = r"[^<\n]{0,40}(?:<\|constrain\|>[^<\n]{0,40})?<\|message\|>"  # ` json`, `<|constrain|>json`
_HARMONY_HEADER = (  # a message to a recipient (in the role or after the channel), or any analysis
    rf"(?:to={_RECIPIENT.format('before')}[ \t]*)?<\|channel\|>(?P<channel>\w{{1,20}})"
    rf"(?:[ \t]+to={_RECIPIENT.format('after')})?{_HARMONY_TAIL}"
)
# A message the user sees: no recipient, not `analysis`. Only its header is markup: the text after
# it streams as it comes, and the end token that closes it is removed on its own.
_SHOWN_HEADER = (
    r"<\|channel\|>(?!analysis\b)\w{1,20}(?:(?!to=)[^<\n]){0,40}"
    r"(?:<\|constrain\|>[^<\n]{0,40})?<\|message\|>"
)
_HARMONY_END = ("<|call|>", "<|end|>", "<|return|>")


@dataclass(frozen=True, eq=False)
class MarkupTag(Tag):
    """A tag that is markup alone: its block ends where the opening tag does."""

    def close(self, text: str, pos: int) -> tuple[int, int] | None:
        return pos, pos


def _harmony_tag(start: str, opener: str, kind: type[Tag] = Tag) -> Tag:
    partial = rf"{'|'.join(_proper_prefixes(start))}|{re.escape(start)}[^\n]{{0,{_LONGEST_PARTIAL - 30}}}"
    return kind(start, re.compile(opener), re.compile(partial), _HARMONY_END, nested=True)


def _end_token(token: str) -> Tag:
    """A stray end token, markup; a run of them is one block."""
    run = re.compile(rf"(?:{'|'.join(map(re.escape, _HARMONY_END))})+")
    return MarkupTag(token, run, literal_tag(token, None).partial, None)


class HarmonyParser(TagParser):
    """gpt-oss (harmony): messages on channels; a call is a message to `functions.<name>`.

        <|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary
        to=functions.get_weather <|constrain|>json<|message|>{"city": "北京"}<|call|>

    The recipient may stand in the role header instead (`<|start|>assistant to=functions.f<|channel|>…`,
    or ` to=functions.f<|channel|>…` at the start of a reply whose prompt ended with
    `<|start|>assistant`). `analysis` is reasoning; a message without a recipient on another channel
    (`final`, a `commentary` preamble) is visible text: its header and end token are removed.
    """

    name = "harmony"
    tags = (
        _harmony_tag("<|start|>", r"<\|start\|>(?:assistant)?[ \t]*" + _SHOWN_HEADER, MarkupTag),
        _harmony_tag("<|channel|>", _SHOWN_HEADER, MarkupTag),
        _harmony_tag("<|start|>", r"<\|start\|>(?:assistant)?[ \t]*" + _HARMONY_HEADER),
        _harmony_tag("<|channel|>", _HARMONY_HEADER),
        Tag(  # the role header's recipient, the role itself in the prompt: ` to=functions.f<|channel|>…`
            start="to=functions.",
            opener=re.compile(
                rf"to={_RECIPIENT.format('role')}[ \t]*<\|channel\|>(?P<channel>\w{{1,20}}){_HARMONY_TAIL}"
            ),
            partial=re.compile(
                "|".join(_proper_prefixes("to=functions."))
                + rf"|to=functions\.[^\s<=]{{0,100}}[ \t]*(?:{'|'.join(_proper_prefixes('<|channel|>'))}"
                + rf"|<\|channel\|>[^\n]{{0,{_LONGEST_PARTIAL - 130}}})?"
            ),
            closer=_HARMONY_END,
            nested=True,
        ),
        *(_end_token(token) for token in _HARMONY_END),
    )

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | str | Reasoning | None:
        found = opening.groupdict()
        if "channel" not in found:
            return ""  # the header of a visible message, or a stray end token: markup
        recipient = found.get("role") or found.get("before") or found.get("after")
        if recipient:
            return [(recipient.removeprefix("functions."), body.strip())]
        return Reasoning(body)


# ── Registry ─────────────────────────────────────────────────────────────────────────────────────

PARSERS: dict[str, TextCallParser] = {
    parser.name: parser
    for parser in (  # the parse order: where two formats share a tag, the first to read the block wins
        Qwen3CoderParser(),
        GlmParser(),
        HermesParser(),
        FunctionTagParser(),
        ToolTagParser(),
        MistralParser(),
        LlamaTokenParser(),
        KimiK2Parser(),
        DeepSeekParser(),
        HarmonyParser(),
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
    text: str,
    formats: Sequence[str] | None = None,
    *,
    think_open: bool | None = None,
    tools: Sequence[dict[str, JSON]] | None = None,
) -> ParsedText:
    """Find the tool calls a model wrote as text, and the visible text and reasoning around them.

    `think_open=True` says the prompt already opened a `<think>` block (as DeepSeek-R1 and Qwen3
    thinking templates do), so the text starts as reasoning; False says it did not; None (default)
    decides from the text: a `</think>` before any `<think>` means everything before it is reasoning.
    `tools` (the request's, OpenAI shape) type the values a format writes as text (schema.py).
    """
    if think_open is not True and not any(trigger in text for trigger in _TRIGGERS):
        return ParsedText(text.strip())
    return typed_by_schema(parse_selected(text, select_parsers(formats), think_open), tools)


def typed_by_schema(parsed: ParsedText, tools: Sequence[dict[str, JSON]] | None) -> ParsedText:
    """`parsed` with the values written as text typed by the offered tools' schemas (schema.py)."""
    schemas = tool_properties(tools) if tools else {}
    if not any(call.texts and call.name in schemas for call in parsed.calls):
        return parsed
    return replace(parsed, calls=[typed_call(call, schemas) for call in parsed.calls])


def typed_call(call: TextCall, schemas: ToolSchemas) -> TextCall:
    """`call` with its values written as text typed by its tool's schema, if it has one."""
    if not call.texts or call.name not in schemas or not call.arguments.startswith("{"):
        return call
    return replace(call, arguments=typed_arguments(call.arguments, dict(call.texts), schemas[call.name]))


def parse_selected(text: str, parsers: Parsers, think_open: bool | None) -> ParsedText:
    """`parse_text_calls` with the parsers already chosen, and no fast path."""
    if think_open is None:
        first = THINK_TAG.search(text)
        think_open = first is not None and first.group().startswith("</")
    thoughts = ThinkSplitter(think_open)
    visible = thoughts.feed(text, final=True)
    with slow_read_budget(dict(SLOW_READ_BUDGET)):
        whole = whole_message_calls(visible, parsers)
        if whole:
            return ParsedText(whole[1], whole[0], thoughts.reasoning)
        segments, _ = scan_blocks(visible, parsers, final=True)
    content, calls = release(segments, ContentBuilder())
    in_blocks = [segment.text for segment in segments if isinstance(segment, Reasoning)]
    return ParsedText(content, calls, joined_reasoning([thoughts.reasoning or "", *in_blocks]))


THINK_TAG = re.compile(r"</?(?:seed:)?think>")  # Seed-OSS writes <seed:think>…</seed:think>
_THINK_END = re.compile(r"</(?:seed:)?think>")
_THINK_TAGS = ("<think>", "</think>", "<seed:think>", "</seed:think>")


class ThinkSplitter:
    """Separates `<think>…</think>` reasoning from the visible text, piece by piece.

    A `<think>` left open runs to the end of the text; a `</think>` outside a thought is text, as
    Ollama and llama.cpp keep it (only a template that opens thinking, `think_open`, makes the first
    one a closer).
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
            elif tag.group() == "</think>":  # a stray closer: thinking was never opened
                visible.append(text[pos : tag.end()])
                pos = tag.end()
                continue
            else:
                visible.append(text[pos : tag.start()])
            self.inside, pos = not tag.group().startswith("</"), tag.end()
        rest = text[pos:]
        self._held = "" if final else rest[_tag_prefix_start(rest, _THINK_TAGS) :]
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
        return joined_reasoning(self._thoughts)

    @property
    def idle(self) -> bool:
        """Outside a thought, holding nothing: a piece without `<` or `[` passes through unchanged."""
        return not self.inside and not self._held


def joined_reasoning(thoughts: Sequence[str]) -> str | None:
    """Thoughts joined by a blank line; None when all are empty."""
    return "\n\n".join(thought.strip() for thought in thoughts if thought.strip()) or None


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
    if undecided:
        return True
    found = _message_body_span(text)
    return found is not None and _CALL_START.match(text, found[0], found[1]) is not None


def holds_whole_message(text: str) -> bool:
    """Whether a reply that starts with `text` stays a whole-message candidate to its end: it
    starts with a complete call start (`{"`, `[{`, `[name(`). A fence is never sure: it may close
    and prose follow."""
    start = _space_end(text, 0)
    if not text.startswith(("{", "["), start) or text.startswith(TOOL_CALLS_TOKEN.start, start):
        return False
    found = _CALL_START.match(text, start)
    return found is not None and found.end() < len(text)  # no `\Z` branch: nothing can undo it


def open_block_closers(text: str, parsers: Parsers) -> tuple[str, ...] | None:
    """The closing tags the block opening at the start of `text` waits for (empty: it runs to the
    end), or None if `text` does not start with an open block."""
    tags = tags_of(parsers)  # a start literal at 0 (a tag may start with a letter: `functools[`)
    found = _next_opening(text, 0, tags) if tags and _starts_of(tags).match(text) else None
    if found is None or found[1].start() != 0 or found[0].close(text, found[1].end()) is not None:
        return None
    closer = found[0].closer
    return (closer,) if isinstance(closer, str) else closer or ()


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


def whole_message_calls(visible: str, parsers: Parsers) -> tuple[list[TextCall], str] | None:
    """The calls and the text after them, if the (think-stripped) text is calls in a message format."""
    body = message_body(visible)
    if body is None or not _CALL_START.match(body):
        return None
    start = len(visible) - len(visible.lstrip())
    span = (start, len(visible.rstrip()))
    for name, parser in parsers:
        if isinstance(parser, MessageParser) and (found := parser.split_message(body.strip())):
            calls, rest = found
            return [_text_call(call, span, name) for call in calls], rest.strip()
    return None


# How a whole-message call can begin: `{"` or `{'` (JSON), `[{` (a JSON list), `[name(` (pythonic).
# Every prefix of a match matches too, so a stream can tell early that `[a link](…)` is no call.
# The runs are bounded so that a stream decides within a few characters (64 spaces, a 256-character
# name): an unbounded run would be read again at every piece while it grows.
_CALL_START = re.compile(
    r"\s*(?:\{\s{0,64}(?:[\"']|\Z)|\[\s{0,64}(?:\{|[\w.:/-]{1,256}\s{0,64}(?:\(|\Z)|\Z)|\Z)"
)


Segment = str | list[TextCall] | Reasoning  # visible text, the calls of a block taken out, or a thought


def scan_blocks(text: str, parsers: Parsers, *, final: bool, offset: int = 0) -> tuple[list[Segment], int]:
    """Split `text` into visible text and call blocks, in order.

    Unless `final`, stop before anything undecided (an opening tag whose block has not closed, or a
    tail that may grow into an opening tag) and return how much of `text` was used. A block that
    holds no call is visible text. `offset` is where `text` starts, for the spans.
    """
    tags = tags_of(parsers)
    segments: list[Segment] = []
    pos = 0
    while (found := _next_opening(text, pos, tags)) is not None:
        tag, opening = found
        closing = tag.close(text, opening.end())
        if closing is None and not final:  # still open: hold it back
            segments.append(text[pos : opening.start()])
            return segments, opening.start()
        body_end, end = closing or (len(text), len(text))
        segments.append(text[pos : opening.start()])
        span = (offset + opening.start(), offset + end)
        read = _read_block(_owners(parsers)[tag], opening, text[opening.end() : body_end], span)
        segments.append(text[opening.start() : end] if read is None else read)
        pos = end
    held = len(text) if final else partial_opening(text, pos, tags)
    segments.append(text[pos:held])
    return segments, held


@lru_cache(maxsize=32)
def tags_of(parsers: Parsers) -> tuple[Tag, ...]:
    return tuple(dict.fromkeys(tag for _, p in parsers if isinstance(p, TagParser) for tag in p.tags))


def _next_opening(text: str, pos: int, tags: tuple[Tag, ...]) -> tuple[Tag, re.Match[str]] | None:
    """The first opening tag at or after `pos`. The start literals are found by one compiled
    alternation (C speed), so a run of `<` or `[` that starts no tag costs no Python loop; at each
    start only the tags sharing its first three characters are tried (`_led_by`)."""
    if not tags:  # message formats only: an empty alternation would match everywhere
        return None
    starts, led_by = _starts_of(tags), _led_by(tags, 3)
    while (found := starts.search(text, pos)) is not None:
        at = found.start()
        for tag in led_by.get(text[at : at + 3], ()):
            if text.startswith(tag.start, at) and (opening := tag.opener.match(text, at)):
                return tag, opening
        pos = at + 1
    return None


@lru_cache(maxsize=32)
def _starts_of(tags: tuple[Tag, ...]) -> re.Pattern[str]:
    literals = sorted({tag.start for tag in tags}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, literals)))


def partial_opening(text: str, pos: int, tags: tuple[Tag, ...]) -> int:
    """Where a tail that may grow into an opening tag begins (len(text) if there is none).

    Most such tails hold no `<` or `[` after their first character, so only the last one can start
    them; a tag whose opening holds several (harmony's `<|start|>assistant<|channel|>…`) is looked
    for from its own start literal too, and one that starts with a letter from each place in the
    last few characters where that letter stands.
    """
    starts = [max(text.rfind("<", pos), text.rfind("[", pos))]
    for word in word_starts(tags):  # `to=funct`: its first letter may come again in the tail
        at = text.find(word[0], max(pos, len(text) - len(word)))
        while at >= 0:
            if word.startswith(text[at:]):  # so short a tail can only match its partial so
                starts.append(at)
            at = text.find(word[0], at + 1)
    window = max(pos, len(text) - _LONGEST_PARTIAL)
    starts += [at for start in _nested_starts(tags) if (at := text.rfind(start, window)) >= 0]
    partials = _partials_led_by(tags)
    for start in sorted(starts) if len(starts) > 1 else starts:
        if start >= 0 and (partial := partials.get(text[start])) and partial.fullmatch(text, start):
            return start
    return len(text)


@lru_cache(maxsize=32)
def _partials_led_by(tags: tuple[Tag, ...]) -> dict[str, re.Pattern[str]]:
    """By first character, one pattern that fully matches what any tag's `partial` does: a single
    match in C instead of one per tag (thirty-odd start with `<`)."""
    return {
        head: re.compile("|".join(f"(?:{tag.partial.pattern})" for tag in led))
        for head, led in _led_by(tags, 1).items()
    }


@lru_cache(maxsize=32)
def _nested_starts(tags: tuple[Tag, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(tag.start for tag in tags if tag.nested))


@lru_cache(maxsize=32)
def _led_by(tags: tuple[Tag, ...], width: int) -> dict[str, tuple[Tag, ...]]:
    """The tags by the first `width` characters of their opening (every start literal is at least
    three long): only those can start where these characters stand."""
    heads = {tag.start[:width] for tag in tags}
    return {head: tuple(tag for tag in tags if tag.start.startswith(head)) for head in heads}


@lru_cache(maxsize=32)
def word_starts(tags: tuple[Tag, ...]) -> tuple[str, ...]:
    return tuple(sorted({tag.start for tag in tags if tag.start[0].isalpha()}))


@lru_cache(maxsize=32)
def word_pattern(tags: tuple[Tag, ...]) -> re.Pattern[str] | None:
    """Any letter-led tag start (`functools`, `to=functions.`); None: no such tag. A text without
    one, and without `<` or `[`, can open a tag only at its very end (`may_end_in_word`)."""
    words = word_starts(tags)
    return re.compile("|".join(map(re.escape, words))) if words else None


def may_end_in_word(text: str, tags: tuple[Tag, ...]) -> bool:
    """Whether `text` may end in a partial letter-led opening (`funct`, `to=functions.f`): a filter
    before `partial_opening`, which says where."""
    tail = _word_tail(tags)
    return tail is not None and tail.search(text, max(0, len(text) - _LONGEST_PARTIAL)) is not None


@lru_cache(maxsize=32)
def _word_tail(tags: tuple[Tag, ...]) -> re.Pattern[str] | None:
    partials = [tag.partial.pattern for tag in tags if tag.start[0].isalpha()]
    return re.compile("|".join(f"(?:{partial})\\Z" for partial in partials)) if partials else None


@lru_cache(maxsize=32)
def _owners(parsers: Parsers) -> dict[Tag, tuple[tuple[str, TagParser], ...]]:
    """For each tag, the formats that own it, in parse order."""
    tag_parsers = [(name, parser) for name, parser in parsers if isinstance(parser, TagParser)]
    return {tag: tuple((n, p) for n, p in tag_parsers if tag in p.tags) for tag in tags_of(parsers)}


def _read_block(
    owners: Sequence[tuple[str, TagParser]], opening: re.Match[str], body: str, span: tuple[int, int]
) -> Segment | None:
    """What the first format that reads this block makes of it: its calls, the visible text it
    stands for (a bare `[TOOL_CALLS]`) or the reasoning it holds; None if no format reads it."""
    for name, parser in owners:
        found = parser.read_block(opening, body)
        if isinstance(found, (str, Reasoning)):
            return found
        if found is not None:  # [] too: a block that is consumed but holds no call
            return [_text_call(call, span, name) for call in found]
    return None


class ContentBuilder:
    """Joins visible pieces into the content, one piece at a time (so streaming gets the same text).

    Whitespace at the very start and end is dropped, and the whitespace on both sides of a removed
    block collapses to the longer side. Nothing else changes. Held whitespace is kept as a list of
    pieces and a length: `+=` on a growing str copies it at every piece (quadratic in a long run).
    """

    def __init__(self) -> None:
        self._started = False  # some visible character was released
        self._before = _Space()  # whitespace after the last visible character
        self._after = _Space()  # whitespace after the last removed block
        self._gap = False  # a block was removed since the last visible character

    def gap(self) -> None:
        if self._gap:
            self._before, self._after = _longer(self._before, self._after), _Space()
        self._gap = True

    def add(self, piece: str) -> str:
        """The text that is final now."""
        body = piece.lstrip()
        if len(body) < len(piece):
            (self._after if self._gap else self._before).add(piece[: len(piece) - len(body)])
        if not body:
            return ""
        space = _longer(self._before, self._after) if self._gap else self._before
        text = body.rstrip()
        released = space.text() + text if self._started else text
        if self._gap:
            self._gap, self._after = False, _Space()
        self._started, self._before = True, _Space(body[len(text) :])
        return released


class _Space:
    """Whitespace held piece by piece."""

    def __init__(self, first: str = "") -> None:
        self.pieces, self.length = [first], len(first)

    def add(self, piece: str) -> None:
        if piece:
            self.pieces.append(piece)
            self.length += len(piece)

    def text(self) -> str:
        return "".join(self.pieces)


def _longer(first: _Space, second: _Space) -> _Space:
    return second if second.length > first.length else first


def release(segments: list[Segment], content: ContentBuilder) -> tuple[str, list[TextCall]]:
    """Feed segments to the content builder; return the text it released and the calls."""
    text, calls = [], []
    for segment in segments:
        if isinstance(segment, str):
            text.append(content.add(segment))
        else:
            content.gap()
            calls += segment if isinstance(segment, list) else []
    return "".join(text), calls


# ── Payloads ─────────────────────────────────────────────────────────────────────────────────────

_CALL_KEYS = {"name", "arguments", "parameters", "id", "type"}


def _calls_in(value: JSON, *, bare: bool) -> list[FoundCall] | None:
    """The calls in a decoded payload (one call object or a list of them).

    Untagged (`bare`), every item must be a call, or the payload is data. Inside a tag the tag says
    "calls", so an item that is not one is dropped and its valid neighbours still run.
    """
    calls = []
    for item in value if isinstance(value, list) else [value]:
        call = _call_from_object(item, bare=bare)
        if call is None and bare:
            return None
        if call is not None:
            calls.append(call)
    return calls or None


def _call_from_object(value: JSON, *, bare: bool) -> FoundCall | None:
    if not isinstance(value, dict):
        return None
    if isinstance(value.get("function"), dict):  # the OpenAI wire shape
        value = value["function"]
    name = value.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name.strip()):
        return None
    if bare and ("arguments" not in value and "parameters" not in value or value.keys() - _CALL_KEYS):
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if not isinstance(arguments, (dict, str, type(None))):  # a list or a number: broken JSON, repaired
        return None
    return name.strip(), arguments


def _text_call(call: FoundCall, span: tuple[int, int], format: str) -> TextCall:
    name, arguments = call
    texts = tuple(arguments.texts.items()) if isinstance(arguments, Parameters) else ()
    return TextCall(name, arguments_text(arguments), span, format, texts)


def arguments_text(arguments: JSON) -> str:
    """Arguments as JSON object text; the model's own text when no object can be recovered from it
    (or the reply's budget for the slow readers is spent: the kernel then reads the text itself)."""
    if arguments is None:
        return "{}"
    if isinstance(arguments, str):
        text = arguments
        try:
            arguments = json.loads(text)
            if not isinstance(arguments, dict):
                raise ValueError("not an object")
        except (ValueError, RecursionError):
            if not _may_read_slowly(text):
                return text
            try:
                arguments = parse_arguments(text)  # JSON-encoded, fenced, single-quoted, truncated…
            except ArgumentError:
                return text
    try:
        return json.dumps(arguments, ensure_ascii=False, default=str, allow_nan=False)
    except ValueError:  # inf or nan from a Python literal: JSON has no such number
        return json.dumps(_finite(arguments), ensure_ascii=False, default=str)
    except TypeError:  # e.g. tuple keys from a Python literal
        return str(arguments)


def _finite(value: JSON) -> JSON:
    """`value` with every non-finite float replaced by its text ("inf"), so it is valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _number(text: str) -> float | str:
    """A JSON number; one too large for a float (`1e999`) stays its own text, never `Infinity`."""
    number = float(text)
    return number if math.isfinite(number) else text


def _load(text: str) -> JSON:
    """JSON, else a Python literal (single quotes, True/None), else what json_repair recovers."""
    text = text.strip()
    if text.startswith("```"):
        text = (unfence(text) or text).strip()
    try:
        return json.loads(text, parse_float=_number, parse_constant=_number)
    except (ValueError, RecursionError):
        pass
    try:
        return ast.literal_eval(text) if _afford("ast", _ast_cost(text)) else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if not text.startswith(("{", "[")):  # prose: json_repair would make a string or a list of it
        return None
    if not (repairable(text) and _afford("repair", len(text))):
        return None
    from json_repair import repair_json  # imported on the first broken payload only

    try:
        return repair_json(text, return_objects=True)
    except Exception:  # the library must never crash the parse on hostile text
        return None


# ── The slow readers, within a budget per reply ──────────────────────────────────────────────────

# `ast` and json_repair read what json.loads cannot (single quotes, pythonic calls, trailing commas),
# but cost microseconds per token (ast) and up to a millisecond per character (json_repair, on
# nested brackets), and a hostile reply can hold thousands of broken payloads. So each reply may
# spend this much on them, in payload order (a stream spends in the same order as a whole parse, so
# the two still agree); past it a payload is read by json.loads alone.
SLOW_READ_BUDGET = {"ast": 8_192, "repair": 1_024}  # ast: ~tokens (see _ast_cost); repair: characters
_budget: ContextVar[dict[str, int] | None] = ContextVar("textcalls_slow_read_budget", default=None)


@contextmanager
def slow_read_budget(budget: dict[str, int]) -> Iterator[None]:
    """Charge the slow readers run inside the block to `budget` (a copy of SLOW_READ_BUDGET)."""
    token = _budget.set(budget)
    try:
        yield
    finally:
        _budget.reset(token)


def _afford(reader: str, cost: int) -> bool:
    """Whether `reader` may take a payload of this cost now (and charge it); always outside a parse."""
    left = _budget.get()
    if left is None:
        return True
    if cost > left[reader]:
        return False
    left[reader] -= cost
    return True


def _may_read_slowly(text: str) -> bool:
    """Whether `parse_arguments` may read `text`: it tries `ast` on up to three candidates, then
    json_repair."""
    return _afford("ast", 3 * _ast_cost(text)) and not (repairable(text) and not _afford("repair", len(text)))


def _ast_cost(text: str) -> int:
    """About the number of tokens `ast` reads in `text`: long string literals are cheap."""
    return len(text) // 64 + sum(map(text.count, ",:=([{"))


_MISSPELLED_CLOSER = re.compile(r"</pa?r[a-z_]*>?")  # </paramter>, </parameters>, </parameter


def written_parameters(pairs: Iterable[tuple[str, str]]) -> Parameters:
    """Qwen3-Coder or GLM parameters (name, raw text): each value guessed, its tidied text kept."""
    texts = {name: _parameter_text(raw) for name, raw in pairs}
    return Parameters({name: guess_value(text) for name, text in texts.items()}, texts)


def _parameter_text(raw: str) -> str:
    """A Qwen3-Coder or GLM value as text: trimmed (models indent it), a misspelled closing tag dropped."""
    value = raw.strip()
    closer = value.rfind("</")  # it can only be the last tag: tried once, so linear in the text
    return value[:closer].rstrip() if closer >= 0 and _MISSPELLED_CLOSER.fullmatch(value, closer) else value


def _parameter_value(raw: str) -> JSON:
    """A Qwen3-Coder or GLM value (`_parameter_text`), guessed (`guess_value`)."""
    return guess_value(_parameter_text(raw))


_JSON_VALUE_START = frozenset("-0123456789[{tf")  # a number, array, object or boolean


def guess_value(value: str) -> JSON:
    """A value written as text, without the tool's schema: JSON-decoded when it is a number, object
    or array, else the text."""
    if value[:1] not in _JSON_VALUE_START:  # cheap: most values are plain text
        return value
    try:
        decoded = json.loads(value, parse_constant=_reject, parse_float=_number)
    except (ValueError, RecursionError):
        if value.startswith(("[", "{")) and '\\"' in value:  # GLM-4.6 sometimes escapes the quotes
            return _parameter_value(value.replace('\\"', '"'))
        return value
    return decoded if isinstance(decoded, (int, float, dict, list)) else value  # bool is an int


def _reject(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON number")


# ── The XML-style families (xmlcalls.py) and the special-token formats of newer small models
# (tokens.py) build on the classes above, so they load last and register themselves (either module
# may also be imported first: it then imports this one, and registers once it is complete, after
# the other; their tags are distinct, so what any reply parses into does not depend on that order).

for _late in ("xmlcalls", "tokens"):  # in this order: it is the registry's parse order
    importlib.import_module(f".{_late}", __package__)
