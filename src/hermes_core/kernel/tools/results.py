"""What the model reads back from a tool: JSON text, redacted, capped, with errors as data.

A value that cannot be serialised (a circular reference, nesting too deep for the encoder, an
object whose `__str__` raises, keys that are not strings) raises `UnrenderableResult`, which the
registry turns into an error result: the task goes on, the model reads what went wrong.

Redaction comes before the cap (kernel/redaction.py `cut_text`): a secret straddling the limit is replaced
whole, and nothing of one is left at the cut.
"""

from __future__ import annotations

import dataclasses
import json

from ..messages import JSON, json_encoder
from ..redaction import cut_text

DEFAULT_MAX_CHARS = 3000  # characters of one tool result the model reads (the rest is cut, with a note)


def to_jsonable(value: object) -> object:
    """Plain data for json.dumps: pydantic models and dataclasses become dicts."""
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return value


class UnrenderableResult(ValueError):
    """A tool's return value has no JSON form; the message says why, for the model to read."""


def render_result(value: object, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """Serialise a tool's return value as JSON (a string stays as it is), then redact and cap it."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = _RENDER(value)
        except Exception as exc:  # ValueError (circular), RecursionError, TypeError, a raising __str__
            raise UnrenderableResult(
                f"returned a result that cannot be serialised as JSON ({type(exc).__name__}: {exc})"
            ) from None
    return cap(text, max_chars)


def cap(text: str, max_chars: int) -> str:
    """`text` redacted and, beyond `max_chars` (0: no limit), cut with a note of what was left out."""
    shown, total = cut_text(text, max_chars if max_chars > 0 else len(text) + 1)
    if total <= max_chars or max_chars <= 0:
        return shown
    return f"{shown}\n[truncated: shown {max_chars} of {total} chars]"


def error_result(message: str, **details: JSON) -> str:
    """A tool failure as the model sees it: a JSON object with an `error` field."""
    return json.dumps({"error": message, **details}, ensure_ascii=False, default=str)


def is_error_value(value: object) -> bool:
    """A business error returned (not raised) by a tool: a mapping with a truthy `error`."""
    return isinstance(value, dict) and bool(value.get("error"))


def _fallback(value: object) -> object:
    converted = to_jsonable(value)
    return str(value) if converted is value else converted


_RENDER = json_encoder(default=_fallback)
