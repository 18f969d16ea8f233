"""Tools declared by a JSON Schema (dict entries, MCP servers): checked once, then every call.

A typed `@tool` gets its checks from pydantic. A tool that only brings a schema — a dict entry
of the registry, a tool an MCP server lists — gets the same from here, so the model meets one
set of rules whichever way a tool was written:

- **Declared**: `declared_schema` normalises the common non-standard type names that
  hand-written and dataset definitions use (`NON_STANDARD_TYPES`: `dict`→`object`, `float`→
  `number`, `tuple`/`list`→`array`, `int`→`integer`, `bool`→`boolean`, `str`→`string`, `any`→
  no type), then checks the result against the JSON Schema metaschema. A schema that is still
  invalid is a `SchemaDefinitionError` naming the tool and the JSON pointer of the problem, at
  start-up, not at the first call. `wire_name` maps a tool name the OpenAI API would refuse
  (`pay.out`, too long) to one it accepts; it is the one mapping used for dict entries and MCP.
- **Called**: `SchemaArguments.validate` first coerces, as pydantic's lax JSON mode does for
  typed tools ("5"→5, "3.0"→3.0, "true"→True, 2.0→2, inside arrays and nested objects), then
  validates: types, enums, required, `additionalProperties`, formats (date, date-time, time,
  duration, email, ipv4/ipv6, uuid, uri…), and raises `ArgumentError` naming each bad field and
  what it expected. Scalars are coerced by pydantic itself (`TypeAdapter(int)` etc.), so a
  schema tool accepts and converts exactly what a typed tool with the same types would.
  A string with a date/time format is checked by pydantic's parser too and passed on in its
  ISO form (a typed tool gets the `date` object; a schema tool's handler gets JSON).
- **Unknown arguments**: a schema that lists `properties` and says nothing about
  `additionalProperties` gets unknown top-level names refused (naming the tool's parameters),
  since a model inventing a parameter is a mistake it can fix; `additionalProperties: true`
  lets them through.

Validator: `jsonschema` (Draft 2020-12, and the draft a schema names in `$schema`). Measured
against `fastjsonschema` (benchmarks/bench_schema_validation.py): fastjsonschema is faster per
call, but it compiles each schema into Python source and `exec`s it — for schemas written by an
MCP server that is code generated from someone else's text — it stops at the first error (the
model should hear every bad field at once), gives no JSON pointer for a bad schema, and knows
drafts 4–7 only. Indicatively, on a five-field schema: fastjsonschema ~1 µs to validate, jsonschema
~30 µs, the whole check here (coercion + jsonschema) ~50 µs against ~6 µs for a typed tool —
small beside a model's turn of hundreds of milliseconds. It is imported on the first schema
tool, never by `import hermes_core`.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from ..messages import JSON
from .arguments import ArgumentError

WIRE_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_-]")

NON_STANDARD_TYPES: dict[str, str | None] = {
    "dict": "object",
    "float": "number",
    "tuple": "array",
    "list": "array",
    "int": "integer",
    "bool": "boolean",
    "str": "string",
    "any": None,  # no type: anything goes
}
# keywords whose value is one schema, a list of schemas, or a name → schema mapping
_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else",
        "unevaluatedItems", "unevaluatedProperties", "additionalItems")  # fmt: skip
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "integer": (int,), "number": (int, float), "boolean": (bool,), "string": (str,),
    "null": (type(None),), "array": (list,), "object": (dict,),
}  # fmt: skip
_DATE_FORMATS = {"date": dt.date, "date-time": dt.datetime, "time": dt.time, "duration": dt.timedelta}
_MAX_DEPTH = 32
_NOT_COERCED = object()


class SchemaDefinitionError(ValueError):
    """A tool's `parameters` are not a JSON Schema; the message names the tool and the pointer."""


def wire_name(name: str) -> str:
    """The name the model sees: `name` itself when the OpenAI API accepts it, else with every
    character outside `[a-zA-Z0-9_-]` replaced by `_`, cut to 64 characters."""
    if WIRE_NAME.match(name):
        return name
    mapped = _INVALID_NAME_CHARS.sub("_", name)[:64]
    if not mapped:
        raise SchemaDefinitionError("a tool needs a non-empty name")
    return mapped


def wire_names(names: Iterable[str]) -> dict[str, str]:
    """`wire_name` of each name (original → wire); two names mapped to one is an error."""
    mapped: dict[str, str] = {}
    taken: dict[str, str] = {}
    for name in names:
        wire = wire_name(name)
        if wire in taken and taken[wire] != name:
            raise SchemaDefinitionError(
                f"tools {taken[wire]!r} and {name!r} both become {wire!r} for the model; rename one"
            )
        taken[wire], mapped[name] = name, wire
    return mapped


def normalise(schema: JSON, depth: int = 0) -> JSON:
    """A copy of `schema` with the `NON_STANDARD_TYPES` names replaced where a type is expected
    (and standard names written in capitals, `String`, lowered); property names are left alone."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return schema
    out = dict(schema)
    if "type" in out:
        declared = out["type"]
        kinds = [_standard(k) for k in declared] if isinstance(declared, list) else [_standard(declared)]
        if None in kinds:  # `any`: no type at all
            del out["type"]
        else:
            out["type"] = list(dict.fromkeys(kinds)) if isinstance(declared, list) else kinds[0]
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = normalise(out[key], depth + 1)
    if isinstance(out.get("items"), list):  # draft-4 tuple form
        out["items"] = [normalise(item, depth + 1) for item in out["items"]]
    for key in _MANY:
        if isinstance(out.get(key), list):
            out[key] = [normalise(item, depth + 1) for item in out[key]]
    for key in _NAMED:
        if isinstance(out.get(key), dict):
            out[key] = {name: normalise(sub, depth + 1) for name, sub in out[key].items()}
    return out


def _standard(kind: JSON) -> JSON:
    """The standard name of one type name: `float` → `number`, `String` → `string`, `any` → None."""
    if not isinstance(kind, str):
        return kind
    lowered = kind.lower()
    if lowered in NON_STANDARD_TYPES:
        return NON_STANDARD_TYPES[lowered]
    return lowered if lowered in _PYTHON_TYPES else kind


def declared_schema(tool: str, parameters: JSON) -> dict[str, JSON]:
    """The normalised, checked `parameters` of `tool`, or SchemaDefinitionError naming the problem."""
    if not isinstance(parameters, Mapping):
        raise SchemaDefinitionError(
            f"tool {tool!r}: parameters must be a JSON Schema object, got {parameters!r}"
        )
    schema: dict[str, JSON] = normalise(copy.deepcopy(dict(parameters)))
    if "type" not in schema and "properties" in schema:
        schema["type"] = "object"
    if schema.get("type", "object") != "object":
        raise SchemaDefinitionError(
            f"tool {tool!r}: parameters at '/type' must be \"object\" (arguments are an object), "
            f"got {schema.get('type')!r}"
        )
    problem = _first_schema_error(schema) or _remote_ref(schema, "")
    if problem:
        raise SchemaDefinitionError(f"tool {tool!r}: parameters are not a valid JSON Schema: {problem}")
    return schema


def _first_schema_error(schema: dict[str, JSON]) -> str | None:
    from jsonschema import exceptions, validators

    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    error = exceptions.best_match(cls(cls.META_SCHEMA).iter_errors(schema))
    if error is None:
        return None
    pointer = "/" + "/".join(str(part).replace("~", "~0").replace("/", "~1") for part in error.absolute_path)
    return f"at '{pointer}': {_short(error.message)}"


def _remote_ref(node: JSON, pointer: str, depth: int = 0) -> str | None:
    """A `$ref` to another document: refused (no schema is ever fetched), with its pointer."""
    if depth > _MAX_DEPTH:
        return None
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            return f"at '{pointer}/$ref': {ref!r} is in another document; only '#/…' references are followed"
        children = node.items()
    elif isinstance(node, list):
        children = enumerate(node)  # type: ignore[assignment]
    else:
        return None
    for key, child in children:
        found = _remote_ref(child, f"{pointer}/{str(key).replace('~', '~0').replace('/', '~1')}", depth + 1)
        if found:
            return found
    return None


class SchemaArguments:
    """The checks of one schema tool's arguments: lax coercion, then JSON Schema validation."""

    def __init__(self, tool: str, schema: dict[str, JSON]) -> None:
        from jsonschema import validators

        self.tool = tool
        self.schema = schema
        cls = validators.validator_for(schema, default=validators.Draft202012Validator)
        checked = dict(schema)
        if checked.get("properties") and "additionalProperties" not in checked:
            checked["additionalProperties"] = False  # unknown names are refused (module docstring)
        self._validator = cls(checked, format_checker=_format_checker())

    def validate(self, arguments: dict[str, JSON]) -> dict[str, JSON]:
        """The coerced arguments, or ArgumentError naming every bad field and what it expected."""
        coerced = _coerce(arguments, self.schema, self.schema, 0)
        try:
            errors = sorted(self._validator.iter_errors(coerced), key=lambda e: [*map(str, e.absolute_path)])
        except Exception as exc:  # e.g. a `$ref` to a document elsewhere: never fetched, never a crash
            raise ArgumentError(f"the schema of {self.tool} cannot be applied: {_short(str(exc))}") from None
        if errors:
            raise ArgumentError("; ".join(self._describe(error) for error in errors))
        return coerced if isinstance(coerced, dict) else arguments

    def _describe(self, error: Any) -> str:  # a jsonschema ValidationError
        where = ".".join(str(part) for part in error.absolute_path)
        if error.validator == "required":
            missing = error.message.split("'")[1] if error.message.count("'") >= 2 else error.message
            return f"field '{where + '.' if where else ''}{missing}' is required but missing"
        if error.validator == "additionalProperties" and error.validator_value is False:
            known = ", ".join(sorted(error.schema.get("properties", {}))) or "none"
            extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
            field = ", ".join(f"'{where + '.' if where else ''}{name}'" for name in extra)
            return f"field {field} is not a parameter of {self.tool} (its parameters: {known})"
        if error.validator == "enum":
            allowed = ", ".join(json.dumps(v, ensure_ascii=False) for v in error.validator_value)
            return (
                f"field '{where or '(arguments)'}': expected one of {allowed}, got {_preview(error.instance)}"
            )
        if error.validator == "type":
            kinds = (
                error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
            )
            expected = " or ".join(map(str, kinds))
            return f"field '{where or '(arguments)'}': expected {expected}, got {_preview(error.instance)}"
        return f"field '{where or '(arguments)'}': {_short(error.message)}"


def _coerce(value: JSON, schema: JSON, root: dict[str, JSON], depth: int) -> JSON:
    """`value` converted where it does not have the schema's type and pydantic's lax JSON mode
    would convert it; anything else unchanged (validation then says what is wrong)."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return value
    if isinstance(schema.get("$ref"), str):
        schema = _resolve(schema["$ref"], root) or schema
    kinds = _kinds(schema)
    if isinstance(value, dict) and (not kinds or "object" in kinds):
        return _coerce_object(value, schema, root, depth)
    if isinstance(value, list) and (not kinds or "array" in kinds):
        return _coerce_array(value, schema, root, depth)
    if not kinds or any(_is(value, kind) for kind in kinds):
        return _formatted(value, schema)
    if "string" in kinds and schema.get("format") in _DATE_FORMATS:
        written = _formatted(value, schema)
        if isinstance(written, str):
            return written
    for kind in kinds:
        coerced = _scalar(kind, value)
        if coerced is not _NOT_COERCED:
            return _formatted(coerced, schema)
    return value


def _coerce_object(
    value: dict[str, JSON], schema: dict[str, JSON], root: dict[str, JSON], depth: int
) -> JSON:
    declared = schema.get("properties")
    properties: dict[str, JSON] = declared if isinstance(declared, dict) else {}
    extra = schema.get("additionalProperties")
    out = {}
    for name, item in value.items():
        sub = properties.get(name, extra if isinstance(extra, dict) else None)
        out[name] = _coerce(item, sub, root, depth + 1)
    return out


def _coerce_array(value: list[JSON], schema: dict[str, JSON], root: dict[str, JSON], depth: int) -> JSON:
    prefix = schema.get("prefixItems")
    items = schema.get("items")
    if isinstance(items, list):  # draft-4 tuple form
        prefix, items = items, schema.get("additionalItems")
    prefix = prefix if isinstance(prefix, list) else []
    return [
        _coerce(item, prefix[i] if i < len(prefix) else items, root, depth + 1)
        for i, item in enumerate(value)
    ]


def _kinds(schema: dict[str, JSON]) -> list[str]:
    """The JSON types `schema` allows: its `type`, else those of its anyOf/oneOf branches, else
    those of its enum or const values; empty when it says nothing."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [kind for kind in declared if isinstance(kind, str)]
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list):
        found = [kind for branch in branches if isinstance(branch, dict) for kind in _kinds(branch)]
        return list(dict.fromkeys(found))
    values = (
        schema["enum"]
        if isinstance(schema.get("enum"), list)
        else [schema["const"]]
        if "const" in schema
        else []
    )
    return list(dict.fromkeys(kind for v in values for kind in _PYTHON_TYPES if _is(v, kind)))


def _is(value: JSON, kind: str) -> bool:
    if isinstance(value, bool):
        return kind == "boolean"
    return isinstance(value, _PYTHON_TYPES.get(kind, ()))


def _scalar(kind: str, value: JSON) -> JSON:
    """pydantic's lax JSON conversion of `value` to `kind`, or _NOT_COERCED."""
    adapter = _adapters().get(kind)
    if adapter is None or isinstance(value, (dict, list)):
        return _NOT_COERCED
    try:
        return adapter.validate_json(json.dumps(value))
    except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
        return _NOT_COERCED


def _formatted(value: JSON, schema: dict[str, JSON]) -> JSON:
    """A date/time string checked by pydantic's parser and written in its ISO form."""
    target = _DATE_FORMATS.get(schema.get("format", "")) if isinstance(value, (str, int, float)) else None
    if target is None or isinstance(value, bool):
        return value
    adapter = _date_adapters()[target]
    try:
        return adapter.dump_python(adapter.validate_json(json.dumps(value)), mode="json")
    except (ValueError, TypeError):
        return value  # the format checker refuses it with the field's name


def _resolve(ref: str, root: dict[str, JSON]) -> dict[str, JSON] | None:
    """A local `#/…` reference inside the tool's own schema (no remote fetches, ever)."""
    if not ref.startswith("#"):
        return None
    node: JSON = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


@lru_cache(maxsize=1)
def _adapters() -> dict[str, Any]:
    from pydantic import TypeAdapter

    return {"integer": TypeAdapter(int), "number": TypeAdapter(float), "boolean": TypeAdapter(bool),
            "string": TypeAdapter(str), "null": TypeAdapter(type(None))}  # fmt: skip


@lru_cache(maxsize=1)
def _date_adapters() -> dict[type, Any]:
    from pydantic import TypeAdapter

    return {target: TypeAdapter(target) for target in _DATE_FORMATS.values()}


@lru_cache(maxsize=1)
def _format_checker() -> Any:
    """jsonschema's format checker, with the date/time formats checked by pydantic's parser (the
    same strings a typed tool accepts) rather than needing optional packages."""
    from jsonschema import FormatChecker

    checker = FormatChecker()
    for name, target in _DATE_FORMATS.items():
        adapter = _date_adapters()[target]

        def check(value: JSON, adapter: Any = adapter) -> bool:
            if not isinstance(value, str):
                return True
            adapter.validate_python(value)
            return True

        checker.checks(name, raises=(ValueError,))(check)
    return checker


def _preview(value: JSON, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short(text: str, limit: int = 240) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["NON_STANDARD_TYPES", "SchemaArguments", "SchemaDefinitionError", "declared_schema", "normalise",
           "wire_name", "wire_names"]  # fmt: skip
