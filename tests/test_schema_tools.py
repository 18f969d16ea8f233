"""Tools declared by a JSON Schema (dict entries, MCP servers) get the checks typed tools get.

Each test drives a real `Agent` with a `ScriptedModel` (the model's call goes through the
registry exactly as in production), or a real MCP server (tests/mcp_demo_server.py over stdio).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from hermes_core import Agent
from hermes_core.kernel.tools.declare import ToolDefinitionError
from hermes_core.kernel.tools.schema import NON_STANDARD_TYPES, normalise, wire_name, wire_names
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.tools import ToolRegistry, tool

DATA = Path(__file__).parent / "data"
DEMO_SERVER = Path(__file__).with_name("mcp_demo_server.py")


def entry(name: str, parameters: dict[str, Any], seen: list[dict[str, Any]]) -> dict[str, Any]:
    """A dict-style tool that records what its handler received."""

    def handler(**arguments: Any) -> str:
        seen.append(arguments)
        return "ok"

    return {"name": name, "description": f"the {name} tool", "parameters": parameters, "handler": handler}


async def run_one(tools: list[Any], name: str, arguments: dict[str, Any] | str) -> tuple[Any, ScriptedModel]:
    model = ScriptedModel([call(name, arguments), reply("done")])
    result = await Agent(model=model, tools=tools).run("go")
    return result.tool_calls[0], model


BOOKING = {
    "type": "object",
    "properties": {
        "guests": {"type": "integer"},
        "budget": {"type": "number"},
        "breakfast": {"type": "boolean"},
        "room": {"type": "string", "enum": ["single", "double"]},
        "nights": {"type": "array", "items": {"type": "integer"}},
        "contact": {
            "type": "object",
            "properties": {"floor": {"type": "integer"}, "email": {"type": "string", "format": "email"}},
            "required": ["email"],
        },
        "arrival": {"type": "string", "format": "date"},
    },
    "required": ["guests"],
}


async def test_stringified_values_reach_a_dict_tool_typed() -> None:
    """Attack: the model writes every value as a string ("5", "3.0", "true", numbers in arrays and in
    nested objects); before, the dict tool's handler received the strings unchanged."""
    seen: list[dict[str, Any]] = []
    arguments = {
        "guests": "5", "budget": "3.0", "breakfast": "true", "room": "double", "nights": ["1", 2, "3"],
        "contact": {"floor": "7", "email": "a@example.org"}, "arrival": "2026-12-24",
    }  # fmt: skip
    outcome, _ = await run_one([entry("book", BOOKING, seen)], "book", arguments)
    assert outcome.ok, outcome.content
    assert seen == [
        {
            "guests": 5, "budget": 3.0, "breakfast": True, "room": "double", "nights": [1, 2, 3],
            "contact": {"floor": 7, "email": "a@example.org"}, "arrival": "2026-12-24",
        }
    ]  # fmt: skip
    assert type(seen[0]["guests"]) is int and type(seen[0]["budget"]) is float


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"guests": 2, "room": "suite"}, 'field \'room\': expected one of "single", "double", got "suite"'),
        ({"guests": "two"}, "field 'guests': expected integer, got \"two\""),
        ({"guests": 2, "breakfast": "maybe"}, "field 'breakfast': expected boolean, got \"maybe\""),
        ({"guests": 2, "nights": [1, "x"]}, "field 'nights.1': expected integer, got \"x\""),
        ({"room": "single"}, "field 'guests' is required but missing"),
        ({"guests": 2, "contact": {}}, "field 'contact.email' is required but missing"),
        ({"guests": 2, "contact": {"email": "nobody"}}, "field 'contact.email': 'nobody' is not a 'email'"),
        ({"guests": 2, "arrival": "tomorrow"}, "field 'arrival': 'tomorrow' is not a 'date'"),
        (
            {"guests": 2, "pets": 3},
            "field 'pets' is not a parameter of book (its parameters: arrival, breakfast",
        ),
    ],
)
async def test_invalid_calls_to_a_dict_tool_are_refused_naming_the_field(
    arguments: dict[str, Any], expected: str
) -> None:
    """Attack: enum violations, wrong types, missing required fields (also nested), bad formats and
    invented parameters; before, all of them (except a missing top-level field) reached the handler."""
    seen: list[dict[str, Any]] = []
    outcome, _ = await run_one([entry("book", BOOKING, seen)], "book", arguments)
    assert not outcome.ok and outcome.error == "bad_arguments"
    assert expected in json.loads(outcome.content)["error"]
    assert seen == []


async def test_additional_properties_true_lets_unknown_names_through() -> None:
    """Attack (the other side): a schema that allows any extra name must not refuse it."""
    seen: list[dict[str, Any]] = []
    schema = {**BOOKING, "additionalProperties": True}
    outcome, _ = await run_one([entry("book", schema, seen)], "book", {"guests": 1, "pets": "3"})
    assert outcome.ok and seen == [{"guests": 1, "pets": "3"}]


async def test_non_standard_type_names_are_normalised_and_offered_standard() -> None:
    """Attack: definitions as function-calling datasets write them (`dict`, `float`, `tuple`, `any`,
    `int`, `bool`, `str`, `list`, from the BFCL data); before, the model was offered `"type": "dict"`
    (which the OpenAI API refuses) and "2.5" reached the handler as a string."""
    seen: list[dict[str, Any]] = []
    schema = {
        "type": "dict",
        "properties": {
            "price": {"type": "float"}, "point": {"type": "tuple", "items": {"type": "int"}},
            "extra": {"type": "any"}, "flag": {"type": "bool"},
            "tags": {"type": "list", "items": {"type": "str"}},
        },
        "required": ["price"],
    }  # fmt: skip
    outcome, model = await run_one(
        [entry("quote", schema, seen)], "quote", {"price": "2.5", "point": ["1", "2"]}
    )
    assert outcome.ok, outcome.content
    assert seen == [{"price": 2.5, "point": [1, 2]}]
    offered = model.calls[0].tools[0]["function"]["parameters"]
    assert offered["type"] == "object"
    assert offered["properties"]["price"] == {"type": "number"}
    assert offered["properties"]["point"] == {"type": "array", "items": {"type": "integer"}}
    assert offered["properties"]["extra"] == {}
    assert set(NON_STANDARD_TYPES) == {"dict", "float", "tuple", "list", "int", "bool", "str", "any"}


@pytest.mark.parametrize(
    ("parameters", "pointer"),
    [
        ({"type": "object", "properties": {"a": {"type": "strnig"}}}, "'/properties/a/type'"),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": "a"}, "'/required'"),
        ({"type": "object", "properties": {"a": {"enum": 3}}}, "'/properties/a/enum'"),
        ({"type": "array"}, "'/type'"),
        (
            {"type": "object", "properties": {"a": {"$ref": "https://example.org/a.json"}}},
            "'/properties/a/$ref'",
        ),
        ("not a schema", "must be a JSON Schema object"),
    ],
)
def test_an_invalid_schema_is_an_error_at_start_up_naming_tool_and_pointer(
    parameters: Any, pointer: str
) -> None:
    """Attack: a definition that is not JSON Schema; before, it was accepted and every call reached
    the handler unchecked (or the model endpoint refused the whole request)."""
    with pytest.raises(ToolDefinitionError) as raised:
        Agent(model=ScriptedModel([]), tools=[entry("broken", parameters, [])])
    assert "'broken'" in str(raised.value) and pointer in str(raised.value)


async def test_a_dotted_name_is_offered_as_a_wire_name_and_runs() -> None:
    """Attack: a tool name the OpenAI API refuses (`weather.get`, as MCP servers and datasets name
    them); before, declaring it was an error."""
    seen: list[dict[str, Any]] = []
    tools = [entry("weather.get", {"type": "object", "properties": {"city": {"type": "string"}}}, seen)]
    outcome, model = await run_one(tools, "weather_get", {"city": "Paris"})
    assert outcome.ok and seen == [{"city": "Paris"}]
    assert [t["function"]["name"] for t in model.calls[0].tools] == ["weather_get"]
    assert (
        Agent(model=ScriptedModel([]), tools=tools).registry.get("weather_get").declared_name == "weather.get"
    )


def test_two_names_that_map_to_one_are_an_error_at_start_up() -> None:
    """Attack: `a.b` and `a_b` would reach the model under one name: the second must not silently
    replace or shadow the first."""
    tools = [entry("a.b", {"type": "object"}, []), entry("a_b", {"type": "object"}, [])]
    with pytest.raises(ValueError, match="a_b"):
        Agent(model=ScriptedModel([]), tools=tools)
    with pytest.raises(ValueError, match="'a.b' and 'a_b' both become 'a_b'"):
        wire_names(["a.b", "a_b"])
    assert wire_name("x" * 70) == "x" * 64 and wire_name("ok-name_1") == "ok-name_1"


async def test_parameter_names_starting_with_an_underscore_work() -> None:
    """Attack: a parameter named `_limit` (found in public definitions); before, a typed tool with it
    crashed in pydantic at declaration ("fields must not use names with leading underscores")."""

    @tool
    def page(_limit: int, query: str = "") -> str:
        """Page through results.

        Args:
            _limit: how many.
            query: what.
        """
        return f"{_limit!r} {query}"

    assert page.parameters["properties"]["_limit"]["type"] == "integer"
    outcome, _ = await run_one([page], "page", {"_limit": "3", "query": "q"})
    assert outcome.ok and outcome.content == "3 q"
    seen: list[dict[str, Any]] = []
    schema = {"type": "object", "properties": {"_id": {"type": "integer"}}, "required": ["_id"]}
    outcome, _ = await run_one([entry("fetch", schema, seen)], "fetch", {"_id": "9"})
    assert outcome.ok and seen == [{"_id": 9}]


def load_lax_rows() -> list[dict[str, Any]]:
    lines = (DATA / "pydantic_lax_coercion_cases.jsonl").read_text(encoding="utf-8").splitlines()
    return [row for row in map(json.loads, lines) if not row["strict"]]


SCHEMA_OF = {
    "int": {"type": "integer"}, "float": {"type": "number"}, "bool": {"type": "boolean"},
    "str": {"type": "string"}, "None": {"type": "null"},
    "date": {"type": "string", "format": "date"}, "datetime": {"type": "string", "format": "date-time"},
    "time": {"type": "string", "format": "time"}, "timedelta": {"type": "string", "format": "duration"},
}  # fmt: skip
PYTHON_OF = {
    "int": int, "float": float, "bool": bool, "str": str, "None": type(None), "date": dt.date,
    "datetime": dt.datetime, "time": dt.time, "timedelta": dt.timedelta,
}  # fmt: skip


@pytest.mark.parametrize("row", load_lax_rows(), ids=lambda row: row["id"])
async def test_schema_tools_coerce_exactly_as_typed_tools_on_pydantic_lax_table(row: dict[str, Any]) -> None:
    """Attack: every lax-mode row of pydantic's conversion table (from pydantic's docs, in
    tests/data/pydantic_lax_coercion_cases.jsonl) sent to a schema tool and to a typed tool of the
    same type: both accept the same inputs; a scalar arrives as the same value and type, a
    date/time as the JSON form of the typed tool's value."""
    seen: list[dict[str, Any]] = []
    registry = ToolRegistry()
    registry.add(
        entry("echo", {"type": "object", "properties": {"value": SCHEMA_OF[row["target_type"]]}}, seen)
    )
    typed = TypeAdapter(PYTHON_OF[row["target_type"]])
    outcome = await registry.execute(call("echo", {"value": row["json_input"]}).tool_calls[0])
    assert outcome.ok is row["expected_accept"], outcome.content
    if not row["expected_accept"]:
        assert "field 'value'" in json.loads(outcome.content)["error"]
        return
    as_typed = typed.validate_json(json.dumps(row["json_input"]))
    value = seen[0]["value"]
    if row["target_type"] in ("date", "datetime", "time", "timedelta"):
        assert value == typed.dump_python(as_typed, mode="json")
    else:
        assert value == as_typed and type(value) is type(as_typed)


def test_normalise_keeps_names_and_reaches_nested_schemas() -> None:
    """Attack: a property literally named `type` or `dict` must not be rewritten, nested ones must."""
    schema = {"type": "dict", "properties": {"type": {"type": "str"}, "dict": {"anyOf": [{"type": "int"}]}}}
    assert normalise(schema) == {
        "type": "object",
        "properties": {"type": {"type": "string"}, "dict": {"anyOf": [{"type": "integer"}]}},
    }
    assert normalise({"type": ["String", "null"]}) == {"type": ["string", "null"]}
    assert normalise({"type": ["float", "any"]}) == {}


def test_import_hermes_core_does_not_import_the_validator() -> None:
    """Attack on the import budget: the validator is loaded for the first schema tool only."""
    code = (
        "import sys, hermes_core\n"
        "from hermes_core import Agent, tool\n"
        "print('jsonschema' in sys.modules)\n"
        "from hermes_core.tools import ToolRegistry\n"
        "ToolRegistry().add({'name': 'x', 'description': 'x', 'parameters': {'type': 'object'},"
        " 'handler': lambda: 1})\n"
        "print('jsonschema' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


# --- MCP: the server's schema checks the call before it is sent ----------------------------------


def demo(log: Path) -> Any:
    from hermes_core.tools.mcp import MCPConnection

    return MCPConnection(
        "demo", command=sys.executable, args=[str(DEMO_SERVER)], env={"DEMO_CALL_LOG": str(log)}
    )


def calls_seen(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] if log.exists() else []


async def test_an_mcp_tool_refuses_bad_arguments_before_the_server_is_asked(tmp_path: Path) -> None:
    """Attack: an invented parameter and a wrong type sent to an MCP tool (`pay.out`, offered as
    `pay_out`); before, the invented one reached the server and the wrong type came back as the
    server's own failure instead of a field-naming refusal."""
    pytest.importorskip("mcp")
    log = tmp_path / "calls.jsonl"
    model = ScriptedModel(
        [
            call("pay_out", {"account": "a1", "amount": 5, "memo": "extra"}),
            call("pay_out", {"account": "a1", "amount": "lots"}),
            call("pay_out", {"account": "a1", "amount": "7"}),
            reply("done"),
        ]
    )
    async with demo(log) as server:
        result = await Agent(model=model, tools=server.tools).run("pay")
    first, second, third = result.tool_calls
    assert first.error == "bad_arguments" and "'memo' is not a parameter of pay_out" in first.content
    assert second.error == "bad_arguments" and "field 'amount': expected integer" in second.content
    assert third.ok, third.content
    assert calls_seen(log) == [{"tool": "pay.out", "arguments": {"account": "a1", "amount": 7}}]


LISTING_SERVER = """
import json, os
import anyio
from mcp import types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

TOOLS = json.loads(os.environ["LISTED_TOOLS"])


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[types.Tool(**tool) for tool in TOOLS])


async def call_tool(ctx, params):
    with open(os.environ["CALL_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"tool": params.name, "arguments": params.arguments}) + "\\n")
    text = json.dumps(params.arguments, sort_keys=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def main():
    server = Server("listing", on_list_tools=list_tools, on_call_tool=call_tool)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


anyio.run(main)
"""


def listing_server(tmp_path: Path, tools: list[dict[str, Any]]) -> Any:
    """A real MCP server (the SDK's low-level server, over stdio) that lists `tools` as given, with
    whatever schemas they have, and echoes every call's arguments."""
    from hermes_core.tools.mcp import MCPConnection

    script = tmp_path / "listing_server.py"
    script.write_text(LISTING_SERVER, encoding="utf-8")
    env = {"LISTED_TOOLS": json.dumps(tools), "CALL_LOG": str(tmp_path / "calls.jsonl")}
    return MCPConnection("listing", command=sys.executable, args=[str(script)], env=env)


async def test_an_mcp_tool_with_dataset_types_is_normalised_and_coerced(tmp_path: Path) -> None:
    """Attack: an MCP server lists a tool written the BFCL way (`"float"`, `"bool"`, a dotted name;
    the SDK itself insists on a top-level `"object"`); before, the model was offered the
    non-standard schema and "2.5" and "yes" reached the server as strings."""
    pytest.importorskip("mcp")
    tools = [
        {
            "name": "price.quote",
            "description": "Quote a price.",
            "input_schema": {
                "type": "object",
                "properties": {"amount": {"type": "float"}, "express": {"type": "bool"}},
                "required": ["amount"],
            },
        }
    ]
    model = ScriptedModel([call("price_quote", {"amount": "2.5", "express": "yes"}), reply("done")])
    async with listing_server(tmp_path, tools) as server:
        result = await Agent(model=model, tools=server.tools).run("quote")
    outcome = result.tool_calls[0]
    assert outcome.ok, outcome.content
    assert json.loads(outcome.content) == {"amount": 2.5, "express": True}
    offered = model.calls[0].tools[0]["function"]
    assert offered["name"] == "price_quote" and offered["parameters"]["type"] == "object"
    assert offered["parameters"]["properties"]["amount"] == {"type": "number"}


async def test_an_mcp_server_with_an_invalid_schema_fails_start_up_and_twins_are_told_apart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Attack: a server lists a tool whose schema is not JSON Schema, or two tools that would reach
    the model under one name (`a.b`, `a_b`); before, both were offered as they came. The invalid
    schema stops start-up; the twins (the operator cannot rename a server's tools) are both offered,
    the second under a suffix, with a WARNING naming both (tools/mcp.py `_unique_names`)."""
    pytest.importorskip("mcp")
    from hermes_core.config import ConfigError
    from hermes_core.tools.mcp import MCPToolset

    broken = [{"name": "bad", "description": "x", "input_schema": {"type": "object", "required": "a"}}]
    registry = ToolRegistry()
    async with MCPToolset([listing_server(tmp_path, broken)]) as toolset:
        with pytest.raises(ConfigError, match="tool 'bad'.*'/required'"):
            await toolset.start(registry)
    assert registry.names == []

    twins = [
        {"name": "a.b", "description": "x", "input_schema": {"type": "object"}},
        {"name": "a_b", "description": "x", "input_schema": {"type": "object"}},
    ]
    registry = ToolRegistry()
    async with MCPToolset([listing_server(tmp_path, twins)]) as toolset:
        await toolset.start(registry)
    assert sorted(registry.names) == ["a_b", "a_b_2"]
    assert any("'a.b' and 'a_b'" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
