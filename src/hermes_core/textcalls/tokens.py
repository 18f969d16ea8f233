"""Tool calls in the special tokens of newer small open models: LFM2, FunctionGemma, Gemma 4,
Granite, InternLM2, Phi-4-mini (and FireFunction) and Apertus.

    <|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>                         LFM2
    <start_function_call>call:get_weather{city:<escape>Paris<escape>}<end_function_call>    FunctionGemma
    <|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>                          Gemma 4
    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]                  Granite
    <|action_start|><|plugin|>{"name": "get_weather", "parameters": {…}}<|action_end|>       InternLM2
    functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]                      Phi-4-mini
    <|tools_prefix|>[{"get_weather": {"city": "Paris"}}]<|tools_suffix|>                    Apertus

All are tag formats (the tokens are written on purpose, so a call counts after prose too), read with
the payload readers of parsers.py: JSON with repair, pythonic lists with `ast`. FunctionGemma's
argument syntax is its own (`key:<escape>text<escape>`, bare numbers and booleans, nested `{…}` and
`[…]`); no library reads it, so `_GemmaArguments` below does, in one pass over the text. The formats
are registered after the built-in ones when parsers.py is imported; docs/text-tool-calls.md has
each format's rules and the choices where the serving stacks disagree.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..kernel.messages import JSON
from .parsers import (
    NAME,
    FoundCall,
    JsonMessageParser,
    JsonTagParser,
    MarkupTag,
    Reasoning,
    Tag,
    TagParser,
    _json_or_pythonic,
    _proper_prefixes,
    literal_tag,
    register_parser,
)


class Lfm2Parser(TagParser):
    """LFM2 / LFM2.5: a pythonic call list (or JSON calls) between `<|tool_call_start|>` and
    `<|tool_call_end|>`. An empty list is the model calling nothing, and a list cut off before its
    `]` (the output limit) is a call being written: both blocks are removed without a call."""

    name = "lfm2"
    tags = (literal_tag("<|tool_call_start|>", "<|tool_call_end|>"),)

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        listed = body.strip()
        if listed.removeprefix("[").removesuffix("]").strip() == "":
            return []
        found = _json_or_pythonic(body) or _json_or_pythonic(_as_python(body))
        return [] if found is None and listed.startswith("[") and not listed.endswith("]") else found


_PY_STRING = re.compile(r"'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"', re.DOTALL)  # a quoted string
_LEADING_ZEROS = re.compile(r"(?<![\w.])0+(?=\d)")


def _as_python(body: str) -> str:
    """LFM2's near-Python made Python: a raw newline or NUL inside a string escaped, and leading
    zeros outside strings dropped (`month=07`). One pass over the strings and the code between them."""
    pieces, pos = [], 0
    for string in _PY_STRING.finditer(body):
        pieces.append(_LEADING_ZEROS.sub("", body[pos : string.start()]))
        pieces.append(string.group().replace("\n", "\\n").replace("\x00", "\\x00"))
        pos = string.end()
    pieces.append(_LEADING_ZEROS.sub("", body[pos:]))
    return "".join(pieces)


class GraniteParser(JsonTagParser):
    """IBM Granite 3.x: `<|tool_call|>` then a JSON list of calls, to the end of the message (the
    model ends its turn after it). Granite 3.1's `<tool_call>` spelling is Hermes' tag, read there."""

    name = "granite"
    tags = (literal_tag("<|tool_call|>", None),)


class InternLm2Parser(JsonTagParser):
    """InternLM2 / 2.5: one JSON call (`parameters` for the arguments) after the plugin token.
    `<|action_start|><|interpreter|>` (code for the interpreter) is no function call: it stays text."""

    name = "internlm2"
    tags = (
        Tag(  # SGLang's tests write a space between the two tokens
            start="<|action_start|>",
            opener=re.compile(r"<\|action_start\|>[ \t\n]{0,4}<\|plugin\|>"),
            partial=re.compile(
                "|".join([*_proper_prefixes("<|action_start|>"), r"<\|action_start\|>[ \t\n]{0,4}"])
                + "".join(f"(?:{re.escape(c)}" for c in "<|plugin|")
                + ")?" * len("<|plugin|")
            ),
            closer="<|action_end|>",
            nested=True,
        ),
    )


class Phi4MiniParser(JsonTagParser):
    """Phi-4-mini and FireFunction-v2: `functools` and a JSON list of calls, to the end of the message."""

    name = "phi4_mini"
    tags = (Tag("functools", re.compile(r"functools(?=\[)"), literal_tag("functools[", None).partial, None),)


class ApertusParser(TagParser):
    """Apertus: a JSON list of one-key objects, the key the tool's name and the value its arguments.
    Without `<|tools_suffix|>` the block runs to the end of the message."""

    name = "apertus"
    tags = (literal_tag("<|tools_prefix|>", "<|tools_suffix|>"),)

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        values, _ = JsonMessageParser()._values(body.strip())
        items = [item for value in values for item in (value if isinstance(value, list) else [value])]
        calls = [
            (name.strip(), arguments)
            for item in items
            if isinstance(item, dict)
            for name, arguments in item.items()
            if _NAME.fullmatch(name.strip()) and isinstance(arguments, (dict, str))
        ]
        return calls or None


_NAME = re.compile(NAME)


class FunctionGemmaParser(TagParser):
    """FunctionGemma: `call:<name>{<arguments>}` between `<start_function_call>` and
    `<end_function_call>`, the arguments in the chat template's own syntax (`_GemmaArguments`)."""

    name = "functiongemma"
    tags: tuple[Tag, ...] = (literal_tag("<start_function_call>", "<end_function_call>"),)
    escape = "<escape>"
    _head = re.compile(rf"\s*call:(?P<name>{NAME})\s*\{{")

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | str | Reasoning | None:
        head = self._head.match(body)
        if head is None:
            return None
        try:
            arguments, end = _GemmaArguments(body, self.escape).object(head.end())
        except ValueError:
            return None
        return [(head["name"], arguments)] if not body[end:].strip() else None


class Gemma4Parser(FunctionGemmaParser):
    """Gemma 4: FunctionGemma's call syntax between `<|tool_call>` and `<tool_call|>`, strings
    between two `<|"|>`; its thinking is a `thought` channel, `<|channel>thought\n…<channel|>`, returned
    as reasoning. A stray `<channel|>` is markup, removed (llama.cpp's edge cases)."""

    name = "gemma4"
    tags = (
        literal_tag("<|tool_call>", "<tool_call|>"),
        literal_tag("<|channel>", "<channel|>"),
        MarkupTag(
            "<channel|>", re.compile(re.escape("<channel|>")), literal_tag("<channel|>", None).partial, None
        ),
    )
    escape = '<|"|>'

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | str | Reasoning | None:
        if opening.group() == "<channel|>":
            return ""
        if opening.group() == "<|channel>":  # `thought` names the channel; a repeated opener is noise
            return Reasoning(body.replace("<|channel>", "").removeprefix("thought").strip())
        return super().read_block(opening, body)


_ESCAPE = "<escape>"
_BARE = re.compile(r"[^,}\]]*")  # a value without <escape>: a number, a boolean, null, or a word
_INTEGER = re.compile(r"-?\d+")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_SEPARATORS = re.compile(r"[\s,]*")
_SPACE = re.compile(r"\s*")


class _GemmaArguments:
    """FunctionGemma's argument syntax, as its chat template writes it: `key:value` pairs joined by
    commas (sometimes without), a string between two `<escape>` tokens, numbers, booleans and null
    bare, objects in `{}` and lists in `[]`. One pass: every step moves forward or gives up."""

    _deepest = 64

    def __init__(self, text: str, escape: str = _ESCAPE) -> None:
        self.text, self.escape, self._simple_pair = text, escape, _simple_pair(escape)

    def object(self, pos: int, depth: int = 0) -> tuple[dict[str, JSON], int]:
        """The pairs after an opening `{`, and where the closing `}` ends (the text's end if cut off)."""
        found: dict[str, JSON] = {}
        while True:
            while pair := self._simple_pair.match(self.text, pos):  # `key:<escape>text<escape>`, `key:3`
                text, bare = pair["text"], pair["bare"]
                found[pair["key"].strip()], pos = _scalar(bare.strip()) if text is None else text, pair.end()
            if (pos := self._skip(pos)) >= len(self.text) or self.text[pos] == "}":
                return found, pos + 1
            colon = self.text.find(":", pos)
            if colon < 0:
                raise ValueError("a key without a value")
            found[self.text[pos:colon].strip()], pos = self.value(colon + 1, depth)

    def array(self, pos: int, depth: int) -> tuple[list[JSON], int]:
        found: list[JSON] = []
        while (pos := self._skip(pos)) < len(self.text) and self.text[pos] != "]":
            value, end = self.value(pos, depth)
            if end == pos:
                raise ValueError("no value where a list item belongs")
            found.append(value)
            pos = end
        return found, pos + 1

    def value(self, pos: int, depth: int) -> tuple[JSON, int]:
        if depth > self._deepest:
            raise ValueError("nested too deep")
        pos = _end(_SPACE, self.text, pos)
        if self.text.startswith(self.escape, pos):
            end = self.text.find(self.escape, pos + len(self.escape))
            end = len(self.text) if end < 0 else end
            return self.text[pos + len(self.escape) : end], end + len(self.escape)
        if self.text.startswith("{", pos):
            return self.object(pos + 1, depth + 1)
        if self.text.startswith("[", pos):
            return self.array(pos + 1, depth + 1)
        end = _end(_BARE, self.text, pos)
        return _scalar(self.text[pos:end].strip()), end

    def _skip(self, pos: int) -> int:
        return _end(_SEPARATORS, self.text, pos)


@lru_cache(maxsize=4)
def _simple_pair(escape: str) -> re.Pattern[str]:
    """A pair whose value is an escaped string or a bare word, with the separators before it."""
    quote = re.escape(escape)
    key = r"[^\s:{}\[\],<][^:{}\[\],<]*"
    return re.compile(
        rf"[\s,]*(?P<key>{key}):[ \t]*(?:{quote}(?P<text>.*?){quote}|(?P<bare>[^\s,}}\]{{\[<][^,}}\]]*))",
        re.DOTALL,
    )


def _end(pattern: re.Pattern[str], text: str, pos: int) -> int:
    """Where `pattern` (one that matches the empty text too) stops matching from `pos`."""
    return pattern.match(text, pos).end()  # type: ignore[union-attr]  # it always matches


_CONSTANTS: dict[str, JSON] = {"true": True, "false": False, "null": None}


def _scalar(word: str) -> JSON:
    """A bare value: true, false, null, a number, or else the word itself."""
    if word in _CONSTANTS:
        return _CONSTANTS[word]
    if _INTEGER.fullmatch(word):  # leading zeros too (`07`): the template writes numbers as Python does
        return int(word)
    if _NUMBER.fullmatch(word):
        return float(word)
    return word


for _parser in (
    Lfm2Parser(),
    FunctionGemmaParser(),
    Gemma4Parser(),
    GraniteParser(),
    InternLm2Parser(),
    Phi4MiniParser(),
    ApertusParser(),
):
    register_parser(_parser.name, _parser)
