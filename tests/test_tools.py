"""Declaring tools (T1), lenient arguments (T2) and the coercion table they must agree with."""

from __future__ import annotations

import datetime as dt
import enum
import json
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from hermes_core import ToolCall, tool
from hermes_core.kernel.tools.arguments import ArgumentError, parse_arguments, validate_arguments
from hermes_core.kernel.tools.declare import ToolDefinitionError
from hermes_core.tools import ToolRegistry

CONFORMANCE = Path(__file__).resolve().parent / "data"


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Address(BaseModel):
    city: str
    street: str | None = None


def test_schema_from_hints_and_docstring() -> None:
    @tool
    def forecast(
        city: Annotated[str, Field(description="City name, e.g. 北京")],
        days: int = 3,
        unit: Unit = Unit.CELSIUS,
        detail: Literal["brief", "full"] = "brief",
        tags: Optional[list[str]] = None,  # noqa: UP045 - Optional spelled out on purpose
        address: Address | None = None,
    ) -> dict:
        """Get the weather forecast.

        Use it for future weather only.

        Args:
            city: ignored because the Field description wins
            days: How many days ahead,
                from 1 to 7.
        """
        return {}

    params = forecast.parameters
    assert forecast.description == "Get the weather forecast.\n\nUse it for future weather only."
    assert params["required"] == ["city"]
    props = params["properties"]
    assert props["city"] == {"description": "City name, e.g. 北京", "type": "string"}
    assert props["days"] == {
        "default": 3,
        "description": "How many days ahead, from 1 to 7.",
        "type": "integer",
    }
    assert params["$defs"]["Unit"]["enum"] == ["celsius", "fahrenheit"]
    assert props["detail"]["enum"] == ["brief", "full"]
    assert {"type": "null"} in props["tags"]["anyOf"] and {
        "items": {"type": "string"},
        "type": "array",
    } in props["tags"]["anyOf"]
    assert params["$defs"]["Address"]["required"] == ["city"]
    assert "title" not in json.dumps(params)


def test_sphinx_docstring_params() -> None:
    @tool
    def greet(name: str) -> str:
        """Greet someone.

        :param name: who to greet
        """
        return name

    assert greet.parameters["properties"]["name"]["description"] == "who to greet"
    assert greet("x") == "x"  # still callable as a function


def test_missing_description_fails_at_declaration() -> None:
    with pytest.raises(ToolDefinitionError, match="no description"):

        @tool
        def nothing(x: int) -> int:
            return x


def test_missing_type_hint_and_bad_name_fail_at_declaration() -> None:
    with pytest.raises(ToolDefinitionError, match="no type hint"):

        @tool
        def untyped(x) -> int:  # type: ignore[no-untyped-def]
            """Has no hint."""
            return 1

    with pytest.raises(ToolDefinitionError, match="must match"):
        tool(name="bad name!")(lambda: 1)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('{"a": 1, "b": [1, 2,],}', {"a": 1, "b": [1, 2]}),
        ("{'a': 'x', 'b': True, 'c': None}", {"a": "x", "b": True, "c": None}),
        ('Sure! Here are the arguments: {"a": 2} hope that helps', {"a": 2}),
        ('"{\\"a\\": 3}"', {"a": 3}),
        ("", {}),
        (None, {}),
    ],
)
def test_lenient_parsing(raw: str | None, expected: dict[str, Any]) -> None:
    assert parse_arguments(raw) == expected


@pytest.mark.parametrize("raw", ['{"a": 1, "b": "hel', '{"city": "北京"'])
def test_cut_off_arguments_are_refused_not_completed(raw: str) -> None:
    """A repair would close the object and run the cut value ("hel"): the model is told instead."""
    with pytest.raises(ArgumentError, match="cut off"):
        parse_arguments(raw)


@pytest.mark.parametrize("raw", ["hello", "[1, 2]", "null", "42"])
def test_non_objects_are_refused(raw: str) -> None:
    with pytest.raises(ArgumentError, match="JSON object"):
        parse_arguments(raw)


def load_coercion_cases() -> list[dict[str, Any]]:
    lines = (CONFORMANCE / "pydantic_lax_coercion_cases.jsonl").read_text(encoding="utf-8").splitlines()
    return [case for case in map(json.loads, lines) if not case["strict"]]


TARGETS = {
    "int": int, "float": float, "bool": bool, "str": str, "date": dt.date,
    "datetime": dt.datetime, "time": dt.time, "timedelta": dt.timedelta, "None": type(None),
}  # fmt: skip


@pytest.mark.parametrize("case", load_coercion_cases(), ids=lambda case: case["id"])
def test_coercion_agrees_with_pydantic_lax_table(case: dict[str, Any]) -> None:
    target = TARGETS[case["target_type"]]

    def handler(value):  # type: ignore[no-untyped-def]
        """Echo."""
        return value

    handler.__annotations__ = {"value": target, "return": Any}
    declared = tool(handler)
    assert declared.arguments_model is not None
    # through the same path a model's call takes: raw text → parse → validate
    arguments = parse_arguments(json.dumps({"value": case["json_input"]}))
    if not case["expected_accept"]:
        with pytest.raises(ArgumentError, match="field 'value'"):
            validate_arguments(declared.arguments_model, arguments)
        return
    value = validate_arguments(declared.arguments_model, arguments).value  # type: ignore[attr-defined]
    expected = case["coerced_value"]
    if isinstance(expected, dict) and "__repr__" in expected:
        assert repr(value).replace("TzInfo(UTC)", "TzInfo(0)") == expected["__repr__"]
    else:
        assert value == expected and type(value) is type(expected) or (expected is None and value is None)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=15,
)


@tool
def typed(count: int, ratio: float = 1.0, name: str = "", flags: list[bool] | None = None) -> str:
    """A tool with several typed parameters."""
    return f"{count}{ratio}{name}{flags}"


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=200), json_values.map(lambda v: json.dumps(v))))
async def test_arbitrary_argument_text_never_crashes(raw: str) -> None:
    registry = ToolRegistry([typed])
    outcome = await registry.execute(ToolCall("c1", "typed", raw))
    assert isinstance(outcome.content, str)
    if not outcome.ok:
        assert outcome.error == "bad_arguments" and "error" in json.loads(outcome.content)


def test_levels_and_idempotence_are_declared_and_checked() -> None:
    @tool(level=0)
    def look(key: str) -> str:
        """Read a value."""
        return key

    @tool(idempotent=True)
    def put(key: str) -> str:
        """Write a value."""
        return key

    assert (look.level, look.idempotent, put.level, put.idempotent) == (0, False, 1, True)
    with pytest.raises(ToolDefinitionError, match="level must be"):

        @tool(level=3)
        def nuke() -> str:
            """Irreversible beyond irreversible."""
            return ""
