"""From the text a model wrote to validated Python arguments.

Models write arguments as text, and often not quite JSON: code fences, prose around the object,
single quotes, Python literals, trailing commas, or output cut off mid-object. `parse_arguments`
recovers the object when it can, and only when the reading is faithful: a repair that loses,
invents or changes a key or value, or completes a cut-off object, is refused with an error the
model reads (kernel/tools/faithful.py). `validate_arguments` then coerces it through pydantic's lax
JSON mode ("5" → 5, "true" → True) and, when that fails, says which field expected what and what
came, so the model can fix its call.
"""

from __future__ import annotations

import ast
import copy
import functools
import json
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel, ValidationError

from ..messages import JSON, json_encoder

if TYPE_CHECKING:
    from .declare import Tool

_FENCE = re.compile(r"^```[\w-]*\s*\n?(.*?)\n?```\s*$", re.DOTALL)
_ENCODE = json_encoder(default=str)


class ArgumentError(ValueError):
    """The arguments cannot be used; the message is written for the model to read."""


def parse_arguments(raw: str | dict[str, JSON] | None) -> dict[str, JSON]:
    """Recover a JSON object from a model's argument text, or raise ArgumentError."""
    if isinstance(raw, dict):
        return raw
    text = (raw or "").strip()
    if not text:
        return {}
    for candidate in _candidates(text):
        value = _loads(candidate)
        if isinstance(value, str):  # arguments JSON-encoded twice
            value = _loads(value.strip())
        if isinstance(value, dict):
            return value
    value = _repair(text)
    if isinstance(value, dict) and (value or "{" in text):
        return _faithful(text, value)
    raise ArgumentError(f"arguments must be a JSON object, got: {_preview(text)}")


def _faithful(text: str, repaired: dict[str, JSON]) -> dict[str, JSON]:
    """The repaired object, only if it says exactly what the text says (kernel/tools/faithful.py)."""
    from .faithful import is_cut_off, is_faithful

    if is_faithful(text, repaired):
        return repaired
    if is_cut_off(text):
        raise ArgumentError(
            f"arguments end before the JSON object closes (cut off?): {_preview(text)}; "
            "call again with complete arguments"
        )
    raise ArgumentError(
        f"arguments are not valid JSON and cannot be read unambiguously: {_preview(text)}; "
        "write one JSON object with double-quoted keys and strings"
    )


def _candidates(text: str) -> Iterator[str]:
    """The text itself, then without a code fence, then the outermost {...} inside prose: lazily."""
    yield text
    fenced = _FENCE.match(text)
    if fenced:
        yield fenced.group(1).strip()
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        yield text[start : end + 1]


def _loads(text: str) -> JSON:
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:  # Python literal syntax: single quotes, True/False/None
        value = ast.literal_eval(text) if len(text) < 100_000 else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return value if _json_shaped(value) else None  # a set, tuple, bytes or int key has no JSON reading


def _json_shaped(value: object, depth: int = 0) -> bool:
    if depth > 100:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_shaped(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_shaped(item, depth + 1) for item in value)
    return value is None or isinstance(value, (str, int, float, bool))


def repairable(text: str) -> bool:
    """Whether json_repair may read `text` (it costs up to ~0.2 ms a character on brackets)."""
    return len(text) <= 1024 and sum(map(text.count, "{[")) - sum(map(text.count, "}]")) <= 16


def _repair(text: str) -> JSON:
    """Last resort: a maintained JSON repair library (trailing commas, truncation, bare words)."""
    from json_repair import repair_json  # imported on first broken input only

    text = text[max(text.find("{"), 0) :]  # from the first brace, if any
    try:
        return repair_json(text, return_objects=True) if repairable(text) else None
    except Exception:  # the library must never crash the loop on hostile text
        return None


def validate_arguments(model: type[BaseModel], arguments: dict[str, JSON]) -> BaseModel:
    """Validate in pydantic's lax JSON mode; raise ArgumentError naming every bad field."""
    try:
        return model.model_validate_json(_ENCODE(arguments))
    except ValidationError as exc:
        raise ArgumentError(describe_validation_error(exc)) from None


def bind_arguments(declared: Tool, arguments: dict[str, JSON]) -> dict[str, object]:
    """The one validation path of every tool (`ToolRegistry` calls it for each call).

    A tool declared by a JSON Schema (`declared.arguments_model` is None, or a dict entry) is
    checked by kernel/tools/schema.py — lax coercion as pydantic's, then the schema; a typed handler is
    then validated by its pydantic model. Returns the handler's keyword arguments, a private copy.
    """
    if declared.schema_arguments is None and declared.arguments_model is None:
        from .declare import ToolDefinitionError, schema_checks  # a Tool built directly from a schema

        try:
            declared.parameters, declared.schema_arguments = schema_checks(declared.name, declared.parameters)
        except ToolDefinitionError as exc:
            raise ArgumentError(f"the tool cannot be called: {exc}") from None
    if declared.schema_arguments is not None:
        arguments = declared.schema_arguments.validate(arguments)
    if declared.arguments_model is None:
        return copy.deepcopy(arguments)
    validated = validate_arguments(declared.arguments_model, arguments)
    return {keyword: getattr(validated, name) for name, keyword in _keywords(type(validated))}


@functools.lru_cache(maxsize=1024)
def _keywords(model: type[BaseModel]) -> tuple[tuple[str, str], ...]:
    """(field, the handler's keyword) of an arguments model, read once per model."""
    return tuple((name, info.alias or name) for name, info in model.model_fields.items())


def describe_validation_error(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"]) or "(arguments)"
        if error["type"] == "missing":
            problems.append(f"field '{where}' is required but missing")
        else:
            problems.append(f"field '{where}': {error['msg'].lower()}, got {_preview(error.get('input'))}")
    return "; ".join(problems)


def _preview(value: object, limit: int = 80) -> str:
    text = value if isinstance(value, str) else _ENCODE(value)
    text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= limit else text[: limit - 1] + "…"
