"""Is a repaired object a faithful reading of the text it came from?

A JSON repair library guesses: given single-quoted text with double quotes inside, it once kept
two of five keys and invented two; given arguments cut off mid-value, it closes the string and
returns the cut value ("San Fr"). A guess must never run as a tool call, so a repair is accepted
only when it says exactly what the text says.

The check reads the text a second, independent way: a small tokenizer that knows both quote
styles and escapes, and that keeps the outline of the first `{...}` object — braces, brackets,
colons, and every key and value as a typed atom (string, integer, float, true/false, null);
commas are dropped (a trailing or missing comma changes nothing), and bare words read as strings
(`{mode: fast}`). The repaired object, walked the same way, must give the same outline: a key
lost or invented, a value cut, merged, split or of another type, all show as a difference. An
object whose closing brace never comes (cut off) has no outline and is never faithful.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from typing import Any

Atom = tuple[str, Any]  # ("{", None) for structure, ("s", "text"), ("i", 1), ("f", 1.5), ("l", True)

_TOKEN = re.compile(
    r"""
    (?P<double>"(?:[^"\\]|\\.)*")
  | (?P<single>'(?:[^'\\]|\\.)*')
  | (?P<unclosed>["'](?:[^\\]|\\.)*\\?\Z)
  | (?P<number>-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?![\w.]))
  | (?P<word>[A-Za-z_$][\w$]*)
  | (?P<mark>[{}\[\]:])
  | (?P<comma>,)
  | (?P<space>\s+)
  | (?P<other>.)
    """,
    re.DOTALL | re.VERBOSE,
)
_LITERALS = {"true": True, "True": True, "false": False, "False": False, "null": None, "None": None}


class _Unreadable(Exception):
    """The text has something the outline cannot name: it is not faithfully readable."""


def is_faithful(text: str, repaired: Any) -> bool:
    """True when `repaired` says exactly what the first `{...}` object of `text` says."""
    try:
        written = text_outline(text)
    except _Unreadable:
        return False
    return written is not None and written == list(value_outline(repaired))


def is_cut_off(text: str) -> bool:
    """True when an object starts in `text` but never closes: the text was cut off."""
    try:
        return "{" in text and text_outline(text) is None
    except _Unreadable:
        return False


def text_outline(text: str) -> list[Atom] | None:
    """The outline of the first object in `text`; None when it never closes (cut off)."""
    start = text.find("{")
    if start < 0:
        return None
    outline: list[Atom] = []
    depth = 0
    for match in _TOKEN.finditer(text, start):
        kind, token = match.lastgroup, match.group()
        if kind in ("space", "comma"):
            continue
        if kind == "unclosed":  # a string runs to the end of the text: cut off
            return None
        if kind == "other":
            raise _Unreadable(token)
        outline.append(_atom(kind or "", token))
        if token in "{[" and kind == "mark":
            depth += 1
        elif token in "}]" and kind == "mark":
            depth -= 1
            if depth == 0:
                return outline
    return None


def value_outline(value: Any) -> Iterator[Atom]:
    """The outline of a parsed value, in the same atoms as `text_outline`."""
    if isinstance(value, dict):
        yield ("{", None)
        for key, item in value.items():
            yield from value_outline(key) if isinstance(key, str) else [("?", key)]
            yield (":", None)
            yield from value_outline(item)
        yield ("}", None)
    elif isinstance(value, list):
        yield ("[", None)
        for item in value:
            yield from value_outline(item)
        yield ("]", None)
    elif value is None or isinstance(value, bool):
        yield ("l", value)
    elif isinstance(value, int):
        yield ("i", value)
    elif isinstance(value, float):
        yield ("f", value)
    elif isinstance(value, str):
        yield ("s", value)
    else:
        yield ("?", repr(value))


def _atom(kind: str, token: str) -> Atom:
    if kind == "mark":
        return (token, None)
    if kind == "word":
        return ("l", _LITERALS[token]) if token in _LITERALS else ("s", token)
    if kind == "number":
        is_int = re.fullmatch(r"-?\d+", token) is not None
        return ("i", int(token)) if is_int else ("f", float(token))
    return ("s", _string(kind, token))


def _string(kind: str, token: str) -> str:
    """A quoted token's text: JSON escapes in double quotes, Python's in single quotes."""
    try:
        value = json.loads(token, strict=False) if kind == "double" else ast.literal_eval(token)
    except (ValueError, SyntaxError):
        try:
            value = ast.literal_eval(token)
        except (ValueError, SyntaxError) as exc:
            raise _Unreadable(token) from exc
    if not isinstance(value, str):
        raise _Unreadable(token)
    return value


__all__ = ["is_cut_off", "is_faithful", "text_outline", "value_outline"]
