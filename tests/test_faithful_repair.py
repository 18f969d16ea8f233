"""Argument repair never changes meaning (kernel/tools/arguments.py, kernel/tools/faithful.py).

For random objects written in the broken ways models write them (single quotes, trailing commas,
code fences, prose around, Python literals, cut off), `parse_arguments` returns either exactly the
object or an ArgumentError for the model to read — never a different object. One case end to end:
a scripted model's call with such arguments never reaches the tool.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hermes_core import Agent, tool
from hermes_core.kernel.tools.arguments import ArgumentError, parse_arguments
from hermes_core.testing import ScriptedModel, call, reply

# Characters that make quoting hard: both quotes, backslash, JSON punctuation, spaces, CJK.
TEXT = st.text(alphabet=st.sampled_from(list("ab xyz\"'\\,:{}[]\n\t") + ["北", "京", "é"]), max_size=10)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
OBJECTS = st.dictionaries(TEXT, VALUES, min_size=1, max_size=5)

# The issue's case: single-quoted JSON with double quotes inside. The repair library read it as a
# different object (`q` cut at the first inner quote, a key "then" invented).
ISSUE_CASE = """{'q': 'he said "stop", then: "go"', 'k': 1, 'flag': false}"""
ISSUE_OBJECT = {"q": 'he said "stop", then: "go"', "k": 1, "flag": False}


def single_quoted(value: Any, python: bool = False) -> str:
    """JSON with single-quoted strings (and, with `python`, True/False/None)."""
    if isinstance(value, dict):
        items = ", ".join(f"{single_quoted(k, python)}: {single_quoted(v, python)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, list):
        return "[" + ", ".join(single_quoted(v, python) for v in value) + "]"
    if isinstance(value, str):
        escaped = json.dumps(value, ensure_ascii=False)[1:-1].replace('\\"', '"').replace("'", "\\'")
        return f"'{escaped}'"
    if python and (value is None or isinstance(value, bool)):
        return repr(value)
    return json.dumps(value)


def trailing_commas(value: Any) -> str:
    """JSON with a comma after the last item of every non-empty object and array."""
    if isinstance(value, dict) and value:
        return "{" + "".join(f"{json.dumps(k)}: {trailing_commas(v)}, " for k, v in value.items()) + "}"
    if isinstance(value, list) and value:
        return "[" + "".join(f"{trailing_commas(v)}, " for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


BROKEN_WAYS = {
    "single quotes": lambda o: single_quoted(o),
    "python literals": lambda o: single_quoted(o, python=True),
    "trailing commas": trailing_commas,
    "fence": lambda o: "```json\n" + trailing_commas(o) + "\n```",
    "prose": lambda o: "Sure! Here are the arguments: " + single_quoted(o) + " Hope that helps.",
    "fence and quotes": lambda o: "```\n" + single_quoted(o) + ",\n```",
}


def same(a: Any, b: Any) -> bool:
    """Equal with types: 1 is not 1.0 and True is not 1."""
    return json.dumps(a, ensure_ascii=False) == json.dumps(b, ensure_ascii=False)


def exact_or_refused(text: str, intended: dict[str, Any]) -> bool:
    try:
        parsed = parse_arguments(text)
    except ArgumentError:
        return True
    assert same(parsed, intended), f"{text!r} was read as {parsed!r}, not {intended!r}"
    return False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OBJECTS, st.sampled_from(sorted(BROKEN_WAYS)))
@example(ISSUE_OBJECT, "python literals")
def test_a_repair_is_exact_or_refused(obj: dict[str, Any], way: str) -> None:
    """Attack: random objects, serialised in the broken ways models write them; whatever the repair
    library guesses, the caller gets exactly the object or an error."""
    exact_or_refused(BROKEN_WAYS[way](obj), obj)


@settings(max_examples=200, deadline=None)
@given(OBJECTS, st.sampled_from(["json", "single quotes", "trailing commas"]), st.data())
def test_cut_off_arguments_are_always_refused(obj: dict[str, Any], way: str, data: st.DataObject) -> None:
    """Attack: arguments cut off at any point (output token limit): a repair would close the
    object around a cut value; every prefix is refused instead."""
    text = json.dumps(obj, ensure_ascii=False) if way == "json" else BROKEN_WAYS[way](obj)
    cut = data.draw(st.integers(1, len(text) - 1))
    assert exact_or_refused(text[:cut], obj)


@pytest.mark.parametrize(
    ("text", "intended"),
    [
        (ISSUE_CASE, ISSUE_OBJECT),
        ("""{'a': 'x", "b": "y', 'c': true}""", {"a": 'x", "b": "y', "c": True}),
        ('{"a": "he said "hi" ok", "n": 1}', None),  # inner quotes unescaped: ambiguous, refused
        ('{"city": "San Fr', None),
        ("{'tags': {'a', 'b'}}", None),  # a Python set: it would arrive as the string "{'a', 'b'}"
        ("{1: 'x', 'b': b'raw'}", None),  # an int key and bytes: no JSON reading
    ],
)
def test_known_misreadings_are_refused(text: str, intended: dict[str, Any] | None) -> None:
    """Attack: texts the repair library misreads (keys lost or invented, values cut at a quote)."""
    with pytest.raises(ArgumentError):
        parsed = parse_arguments(text)
        if intended is not None and same(parsed, intended):
            raise ArgumentError("read exactly")  # exact is as good as refused


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1, "b": [1, 2,],}', {"a": 1, "b": [1, 2]}),
        ("{'q': \"it's\", 'n': null, 'ok': true}", {"q": "it's", "n": None, "ok": True}),
        ('{mode: fast, "n": 2}', {"mode": "fast", "n": 2}),
        ('```json\n{"a": "x",}\n```', {"a": "x"}),
        ('{"a": 1 "b": 2}', {"a": 1, "b": 2}),
    ],
)
def test_faithful_repairs_still_work(text: str, expected: dict[str, Any]) -> None:
    """The lenient cases stay lenient: a repair that says what the text says is kept."""
    assert same(parse_arguments(text), expected)


async def test_a_misread_call_never_reaches_the_tool() -> None:
    """Attack end to end: the model sends the issue's single-quoted arguments; the old loop ran
    `search(q='he said "stop"', then='go', …)`. Now the tool does not run and the model reads an
    error; its corrected call runs with the meaning it wrote."""
    seen: list[dict[str, Any]] = []

    @tool(level=0)
    def search(q: str, k: int = 10, flag: bool = True) -> str:
        """Search."""
        seen.append({"q": q, "k": k, "flag": flag})
        return "found"

    fixed = json.dumps(ISSUE_OBJECT)
    model = ScriptedModel([call("search", ISSUE_CASE), call("search", fixed), reply("found it")])
    result = await Agent(model=model, tools=[search]).run("search")
    assert seen == [ISSUE_OBJECT]
    first = json.loads(result.tool_calls[0].content)["error"]
    assert result.tool_calls[0].error == "bad_arguments" and "cannot be read unambiguously" in first
