"""Parameter values that a format writes as text, typed by the offered tool's JSON Schema.

XML-style formats (Qwen3-Coder, GLM, MiniMax-M2, Step3, Seed-OSS, DeepSeek-V3.2 DSML) write every
value as text: `<parameter=zip>01234</parameter>` does not say whether `01234` is a string or a
number. Without the tool's schema the parser guesses (`parsers._parameter_value`: a number, boolean,
object or array is decoded). With it, the schema decides, as vLLM's and SGLang's parsers do: a
parameter typed `string` keeps its text even when it reads `1` or `true`; `integer`, `number`,
`boolean`, `object`, `array` and `null` are decoded; a text that is not of the declared type, an
unknown parameter or a tool without a schema keeps the guess. `anyOf` / `oneOf` / type lists are
tried in order, the string member last.

Hand-written: a validator library would check values against the schema, not choose how to read a
text, and this is a few small functions over plain dicts.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterable, Mapping

from ..kernel.messages import JSON


class Parameters(dict[str, JSON]):
    """Arguments written as text, one value per parameter: each value as guessed from its text,
    and `texts`, the text itself, so that the offered tool's schema can type it instead."""

    def __init__(self, guessed: Mapping[str, JSON], texts: Mapping[str, str]) -> None:
        super().__init__(guessed)
        self.texts = dict(texts)


ToolSchemas = Mapping[str, Mapping[str, JSON]]  # tool name → its parameters' `properties`


def tool_properties(tools: Iterable[Mapping[str, JSON]] | None) -> ToolSchemas:
    """The `properties` of each offered tool's parameters, by tool name (OpenAI tool shape, or the
    bare function object)."""
    found: dict[str, Mapping[str, JSON]] = {}
    for tool in tools or ():
        function = tool.get("function", tool)
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        if isinstance(properties, Mapping):
            found[str(function["name"])] = properties
    return found


def typed_arguments(arguments: str, texts: Mapping[str, str], properties: Mapping[str, JSON]) -> str:
    """`arguments` (JSON object text) with each parameter written as text typed by its schema."""
    values = json.loads(arguments)
    for name, text in texts.items():
        schema = properties.get(name)
        typed = typed_value(text, schema) if isinstance(schema, Mapping) else _UNTYPED
        if typed is not _UNTYPED:
            values[name] = typed
    return json.dumps(values, ensure_ascii=False)


_UNTYPED = object()  # the schema does not decide: keep the guess


def typed_value(text: str, schema: Mapping[str, JSON]) -> object:
    """`text` read as the type `schema` declares; `_UNTYPED` when the schema does not decide."""
    types = schema_types(schema)
    for kind in [kind for kind in types if kind != "string"]:
        value = _READERS[kind](text.strip()) if kind in _READERS else _UNTYPED
        if value is not _UNTYPED:
            return value
    return text if "string" in types else _UNTYPED


def schema_types(schema: Mapping[str, JSON], depth: int = 0) -> list[str]:
    """The JSON types a schema allows, in the order written (`type`, then `anyOf` / `oneOf`)."""
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else []
    if isinstance(declared, list):
        types = [kind for kind in declared if isinstance(kind, str)]
    for key in ("anyOf", "oneOf"):
        members = schema.get(key)
        if isinstance(members, list) and depth < 4:
            for member in members:
                types += schema_types(member, depth + 1) if isinstance(member, Mapping) else []
    return list(dict.fromkeys(types))


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _UNTYPED


def _integer(text: str) -> object:
    value = _json(text)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else _UNTYPED


def _number(text: str) -> object:
    value = _json(text)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else _UNTYPED


def _boolean(text: str) -> object:
    return {"true": True, "false": False}.get(text.lower(), _UNTYPED)


def _null(text: str) -> object:
    return None if text in ("null", "None") else _UNTYPED


def _container(kind: type) -> Callable[[str], object]:
    def read(text: str) -> object:
        value = _json(text)
        if value is _UNTYPED and len(text) < 20_000:  # a Python literal (single quotes); ast costs µs a token
            try:
                value = ast.literal_eval(text)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return _UNTYPED
        return value if isinstance(value, kind) else _UNTYPED

    return read


_READERS: dict[str, Callable[[str], object]] = {
    "integer": _integer,
    "number": _number,
    "boolean": _boolean,
    "null": _null,
    "object": _container(dict),
    "array": _container(list),
}
