"""The XML-style call formats of newer open models: MiniMax-M2, Step3, Seed-OSS, DeepSeek-V3.2
(DSML), LongCat and OLMo 3.

    <minimax:tool_call><invoke name="f"><parameter name="a">v</parameter></invoke></minimax:tool_call>
    <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="f">
        <steptml:parameter name="a">v</steptml:parameter></steptml:invoke>
        <｜tool_call_end｜><｜tool_calls_end｜>
    <seed:tool_call><function=f><parameter=a>v</parameter></function></seed:tool_call>
    <｜DSML｜function_calls><｜DSML｜invoke name="f"><｜DSML｜parameter name="a" string="true">v
        </｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>
    <longcat_tool_call>{"name": "f", "arguments": {"a": "v"}}</longcat_tool_call>
    <function_calls>f(a='v')
    g()</function_calls>

They are tag formats (parsers.py `TagParser`): a block counts wherever it appears and is handed over
when it closes. Values written as text are `Parameters`, typed by the offered tool's schema when
the request has one (schema.py). Everything is found with `str.find`, so reading is linear in the
text; the only patterns run on a short tag head or a gap between two calls and have no nested or
adjacent quantifiers over the same characters. Every rule and where upstream parsers disagree is
in docs/text-tool-calls.md.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from ..kernel.messages import JSON
from .parsers import (
    NAME,
    FoundCall,
    JsonTagParser,
    TagParser,
    TextCallParser,
    _parameter_text,
    _parameter_value,
    literal_tag,
    register_parser,
)
from .schema import Parameters

_NAME = re.compile(NAME)


@dataclass(frozen=True)
class Invokes:
    """How one family spells its call and parameter tags: `<invoke name="f">` and
    `<parameter name="a">`, or (`equals`) `<function=f>` and `<parameter=a>`. `tidy`: values are
    trimmed like Qwen3-Coder's (the template puts them on lines of their own); otherwise a string
    keeps its whitespace, because it sits inline between the tags and the model means it.

    A call with more than `most_parameters` parameter tags is not read: no tool takes that many,
    and each costs a few µs of Python (the 1 MB bound of docs/text-tool-calls.md)."""

    most_parameters: ClassVar[int] = 1_000
    invoke: str
    parameter: str
    equals: bool = False
    tidy: bool = False

    def read(self, body: str, gap_is_framing: Callable[[str], bool]) -> list[FoundCall] | None:
        """The calls in a block: invoke tags, with nothing between them but framing; None if the
        block holds anything else."""
        calls: list[FoundCall] = []
        pos, closer, finder = 0, f"</{self.invoke}>", _Finder(body)
        while (start := self._find_tag(body, self.invoke, pos)) >= 0:
            head_end = body.find(">", start)
            if head_end < 0 or not gap_is_framing(body[pos:start]):
                return None
            end = finder.find(closer, head_end)
            stop = end if end >= 0 else len(body)
            name = self._name(body[start:head_end])
            parameters = self._parameters(body[head_end + 1 : stop])
            if name is None or not _NAME.fullmatch(name) or parameters is None:
                return None
            calls.append((name, parameters))
            pos = stop + len(closer) if end >= 0 else stop
        return calls if calls and gap_is_framing(body[pos:]) else None

    def _parameters(self, inner: str) -> Parameters | None:
        """One call's parameters. A value runs to the last closing tag before the next parameter (so
        it may hold the closing tag itself, as SGLang reads it); without one, to the next parameter."""
        guessed: dict[str, JSON] = {}
        texts: dict[str, str] = {}
        closer = f"</{self.parameter}>"
        start = self._find_tag(inner, self.parameter, 0)
        if inner[: start if start >= 0 else len(inner)].strip():
            return None
        for _ in range(self.most_parameters + 1):
            if start < 0:
                return Parameters(guessed, texts)
            head_end = inner.find(">", start)
            name = self._name(inner[start:head_end]) if head_end >= 0 else None
            if name is None:
                return None
            following = self._find_tag(inner, self.parameter, head_end)  # the next one starts there
            limit = following if following >= 0 else len(inner)
            end = inner.rfind(closer, head_end, limit)  # the spans up to each `limit` do not overlap
            stop, after = (end, end + len(closer)) if end >= 0 else (limit, limit)
            raw = inner[head_end + 1 : stop]
            texts[name] = _parameter_text(raw) if self.tidy else raw
            guessed[name] = _guess(raw, _attribute(inner[start:head_end], "string"))
            if inner[after:limit].strip():
                return None
            start = following
        return None

    def _find_tag(self, text: str, tag: str, pos: int) -> int:
        """Where `<tag` starts as a whole tag name at or after `pos`; -1 if nowhere."""
        opening = f"<{tag}"
        while (at := text.find(opening, pos)) >= 0:
            after = text[at + len(opening) : at + len(opening) + 1]
            if after == "=" if self.equals else after in (" ", "\t", "\n", ">"):
                return at
            pos = at + 1
        return -1

    def _name(self, head: str) -> str | None:
        """The name in an opening tag's head (`<invoke name="f"` or `<function=f`)."""
        if self.equals:
            return head[head.find("=") + 1 :].strip().strip("\"'") or None
        return _attribute(head, "name")


class _Finder:
    """`str.find` of a closing tag that remembers where the next one is, so that looking for it
    again from a later position (many openers, no closer) costs nothing: linear, not quadratic."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._found: dict[str, tuple[int, int]] = {}  # closer → (searched from, found at or -1)

    def find(self, sub: str, pos: int) -> int:
        start, at = self._found.get(sub, (len(self._text) + 1, -1))
        if not (start <= pos and (at < 0 or at >= pos)):
            at = self._text.find(sub, pos)
            self._found[sub] = (pos, at)
        return at


def _attribute(head: str, key: str) -> str | None:
    """The value of `key="…"` (or `'…'`, or unquoted) in an opening tag's head."""
    pos = 0
    while (at := head.find(f"{key}=", pos)) >= 0:
        if at > 0 and not head[at - 1].isspace():
            pos = at + 1
            continue
        value = head[at + len(key) + 1 :]
        if value[:1] in ('"', "'"):
            close = value.find(value[0], 1)
            return value[1:close] if close > 0 else None
        return value.split()[0] if value.strip() else None
    return None


def _guess(text: str, string: str | None) -> JSON:
    """A value without the schema: DSML's `string="true"` is text and `string="false"` JSON; any
    other is guessed like Qwen3-Coder's (`parsers._parameter_value`)."""
    if string == "true":
        return text
    if string == "false":
        try:
            return json.loads(text)
        except (ValueError, RecursionError):
            pass
    return _parameter_value(text)


def _only_space(gap: str) -> bool:
    return not gap.strip()


class MiniMaxM2Parser(TagParser):
    """MiniMax-M2: one `<minimax:tool_call>` block holding one or more `<invoke>` calls.

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">北京</parameter>
    </invoke>
    </minimax:tool_call>
    """

    name = "minimax_m2"
    tags = (literal_tag("<minimax:tool_call>", "</minimax:tool_call>"),)
    _invokes = Invokes("invoke", "parameter")

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        return self._invokes.read(body, _only_space)


_STEP3_TOKENS = ("<｜tool_call_begin｜>", "<｜tool_call_end｜>", "<｜tool_sep｜>")


def _step3_framing(gap: str) -> bool:
    """Between Step3 calls: the call tokens and the `function<｜tool_sep｜>name` header."""
    for token in _STEP3_TOKENS:
        gap = gap.replace(token, " ")
    words = gap.split()
    if words[:1] == ["function"]:
        words = words[1:]
    return not words or (len(words) == 1 and _NAME.fullmatch(words[0]) is not None)


class Step3Parser(TagParser):
    """Step3: `steptml` invoke tags inside the call tokens.

    <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">
    <steptml:parameter name="city">北京</steptml:parameter></steptml:invoke>
    <｜tool_call_end｜><｜tool_calls_end｜>

    A string value keeps its whitespace (it sits inline between the tags: the model means it).
    """

    name = "step3"
    tags = (
        literal_tag("<｜tool_calls_begin｜>", "<｜tool_calls_end｜>"),
        literal_tag("<｜tool_call_begin｜>", "<｜tool_call_end｜>"),
    )
    _invokes = Invokes("steptml:invoke", "steptml:parameter")

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        return self._invokes.read(body, _step3_framing)


class SeedOssParser(TagParser):
    """Seed-OSS (ByteDance): Qwen3-Coder's function and parameter tags in `<seed:tool_call>`.

    <seed:tool_call>
    <function=get_weather>
    <parameter=city>北京</parameter>
    </function>
    </seed:tool_call>

    The hosted Doubao Seed models write the names as attributes, with DSML's string attribute:
    `<function name="f"><parameter name="a" string="true">v</parameter></function>`. Its reasoning,
    `<seed:think>…</seed:think>`, is read like `<think>` (parsers.py `ThinkSplitter`).
    """

    name = "seed_oss"
    tags = (literal_tag("<seed:tool_call>", "</seed:tool_call>"),)
    _invokes = Invokes("function", "parameter", equals=True, tidy=True)
    _named = Invokes("function", "parameter")

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        return self._invokes.read(body, _only_space) or self._named.read(body, _only_space)


class DeepSeekDsmlParser(TagParser):
    """DeepSeek-V3.2 DSML: invoke tags whose parameters say whether the value is a string.

    <｜DSML｜function_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="city" string="true">北京</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜function_calls>

    `string="true"` is text as written, `string="false"` JSON; the tool's schema, when known, decides.
    """

    name = "deepseek_dsml"
    tags = (literal_tag("<｜DSML｜function_calls>", "</｜DSML｜function_calls>"),)
    _invokes = Invokes("｜DSML｜invoke", "｜DSML｜parameter")

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        return self._invokes.read(body, _only_space)


class LongCatParser(JsonTagParser):
    """LongCat (Meituan): a Hermes-style JSON call in its own tag.

    <longcat_tool_call>{"name": "get_weather", "arguments": {"city": "北京"}}</longcat_tool_call>
    """

    name = "longcat"
    tags = (literal_tag("<longcat_tool_call>", "</longcat_tool_call>"),)


class Olmo3Parser(TagParser):
    """OLMo 3 (AI2): pythonic calls, one per line, in `<function_calls>`.

    <function_calls>get_weather(city='北京')
    get_time()</function_calls>

    Values are Python literals or JSON's `true`, `false`, `null` (never evaluated). A line that is
    no call, or whose values JSON cannot hold (bytes, `1e999`), is dropped; its neighbours run. A
    block with more than `most_delimiters` brackets, commas and `=` is not read: `ast` costs a few
    µs per token, and no model writes that many calls at once.
    """

    name = "olmo3"
    tags = (literal_tag("<function_calls>", "</function_calls>"),)
    most_delimiters = 10_000

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        if sum(body.count(char) for char in "([{,=") > self.most_delimiters:
            return None
        try:  # usually every line is a call: one parse
            nodes = [
                statement.value
                for statement in ast.parse(body.strip()).body
                if isinstance(statement, ast.Expr)
            ]
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            nodes = [node for line in body.splitlines() if (node := _expression(line.strip()))]
        calls = [call for node in nodes if (call := _pythonic_call(node))]
        return calls or None


_JSON_WORDS: dict[str, JSON] = {"true": True, "false": False, "null": None}


class _JsonWords(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(_JSON_WORDS[node.id]) if node.id in _JSON_WORDS else node


def _expression(line: str) -> ast.expr | None:
    try:
        return ast.parse(line, mode="eval").body if line else None
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _pythonic_call(node: ast.expr) -> FoundCall | None:
    """`name(key=literal, …)` as a call; None for anything else."""
    if not isinstance(node, ast.Call) or node.args or any(k.arg is None for k in node.keywords):
        return None
    try:
        name = ast.unparse(node.func)
        arguments = {str(k.arg): ast.literal_eval(_JsonWords().visit(k.value)) for k in node.keywords}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return (name, arguments) if _NAME.fullmatch(name) and _json_value(arguments) else None


def _json_value(value: object) -> bool:
    """Whether JSON can hold `value` as it is (no bytes, sets, complex or non-finite numbers)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _json_value(item) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return all(_json_value(item) for item in value)
    return value is None or isinstance(value, (str, int))


XML_PARSERS: tuple[TextCallParser, ...] = (
    MiniMaxM2Parser(),
    Step3Parser(),
    SeedOssParser(),
    DeepSeekDsmlParser(),
    LongCatParser(),
    Olmo3Parser(),
)

for _parser in XML_PARSERS:
    register_parser(_parser.name, _parser)
