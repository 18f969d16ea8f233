"""Real tool definitions written by others, their gold calls, and calls perturbed from them.

The corpus (tests/data/tool_corpus/, sources and licences in its README.md): a few hundred
function definitions of the Berkeley Function Calling Leaderboard (simple, multiple, parallel)
with their gold calls, and the tools of the MCP reference servers (git, fetch, time). Every
definition is declared as a dict-style tool and every call goes through `ToolRegistry.execute`,
as a model's call does. From each gold call, deterministic perturbations:

- stringified: one numeric/boolean value (or the numbers of an array) written as strings —
  must be accepted and reach the handler as the gold value;
- wrong type, enum violation, missing required field, invented parameter — must be refused,
  with an error that names the field.

`measure()` returns the rates; `python benchmarks/bench_schema_validation.py` prints them too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hermes_core.kernel.messages import ToolCall
from hermes_core.kernel.tools.schema import wire_name
from hermes_core.tools import ToolRegistry

CORPUS = Path(__file__).parent / "data" / "tool_corpus"
FILES = ("bfcl_calls.jsonl", "mcp_reference_tools.jsonl")
INVENTED = "unexpected_parameter"


def load_corpus() -> list[dict[str, Any]]:
    rows = []
    for name in FILES:
        for line in (CORPUS / name).read_text(encoding="utf-8").splitlines():
            rows.append(json.loads(line))
    return rows


def same(value: Any, gold: Any) -> bool:
    """Equal as JSON values, a boolean never standing for a number."""
    if isinstance(gold, bool) or isinstance(value, bool):
        return value is gold
    if isinstance(gold, (int, float)) and isinstance(value, (int, float)):
        return value == gold
    if isinstance(gold, list):
        return isinstance(value, list) and len(value) == len(gold) and all(map(same, value, gold))
    if isinstance(gold, dict):
        return (
            isinstance(value, dict)
            and value.keys() == gold.keys()
            and all(same(value[k], gold[k]) for k in gold)
        )
    return bool(value == gold)


def stringified(value: Any) -> Any:
    """The value as a model that quotes everything writes it; None when it has no such form."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    ):
        return [json.dumps(v) for v in value]
    return None


def wrong_type(kind: Any) -> Any:
    """A value of another JSON type than `kind`, that no lax rule converts."""
    return {"string": {"text": "x"}, "integer": "not-a-number", "number": "not-a-number", "boolean": "maybe",
            "array": "not-a-list", "object": "not-an-object"}.get(kind)  # fmt: skip


def perturbations(row: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any], Any]]:
    """(kind, field, arguments, expected gold arguments or None for a refusal)."""
    gold = row["gold"]
    schema = row["function"]["parameters"]
    properties = schema.get("properties", {})
    for field, value in gold.items():
        text = stringified(value)
        if text is not None:
            yield "stringified", field, {**gold, field: text}, gold
        kind = properties.get(field, {}).get("type")
        kind = {"dict": "object", "float": "number", "tuple": "array", "list": "array"}.get(kind, kind)
        bad = wrong_type(kind)
        if bad is not None:
            yield "wrong_type", field, {**gold, field: bad}, None
        enum = properties.get(field, {}).get("enum")
        if enum:
            yield "enum_violation", field, {**gold, field: "__not_one_of_them__"}, None
    for field in schema.get("required", []):
        if field in gold:
            yield "missing_required", field, {k: v for k, v in gold.items() if k != field}, None
    if schema.get("additionalProperties") is not True:
        yield "extra_property", INVENTED, {**gold, INVENTED: 1}, None


async def measure() -> dict[str, dict[str, Any]]:
    """Run the corpus; per kind: calls, successes (accepted as gold / refused naming the field),
    and the failures (for a readable assertion)."""
    results: dict[str, dict[str, Any]] = {}

    def count(kind: str, ok: bool, what: str) -> None:
        entry = results.setdefault(kind, {"calls": 0, "ok": 0, "failures": []})
        entry["calls"] += 1
        entry["ok"] += ok
        if not ok and len(entry["failures"]) < 10:
            entry["failures"].append(what)

    for index, row in enumerate(load_corpus()):
        registry, seen = ToolRegistry(), []
        record = seen.append
        function = row["function"]
        registry.add(
            {
                "description": function.get("description") or function["name"],
                "parameters": function["parameters"],
                "handler": lambda record=record, **kw: record(kw) or "ok",
            },
            name=function["name"],
        )
        name = wire_name(function["name"])
        cases = [("gold", "", row["gold"], row["gold"]), *perturbations(row)]
        for number, (kind, field, arguments, expected) in enumerate(cases):
            seen.clear()
            call = ToolCall(f"c{index}_{number}", name, json.dumps(arguments))
            outcome = await registry.execute(call)
            if expected is not None:
                ok = outcome.ok and len(seen) == 1 and same(seen[0], expected)
                count(kind, ok, f"{row['id']} {field}: {outcome.content[:200]} {seen}")
            else:
                refused = not outcome.ok and outcome.error == "bad_arguments"
                useful = refused and f"'{field}'" in json.loads(outcome.content)["error"]
                count(kind, useful, f"{row['id']} {field}: {outcome.content[:200]}")
    return results


def rate(entry: dict[str, Any]) -> float:
    return entry["ok"] / entry["calls"] if entry["calls"] else 1.0


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'calls':<18} {'n':>6} {'as wanted':>10}"]
    lines += [f"{kind:<18} {e['calls']:>6} {rate(e):>9.1%}" for kind, e in results.items()]
    return "\n".join(lines)


def test_corpus_is_declared_and_checked_as_wanted() -> None:
    """Attack: every definition of the corpus (BFCL data and MCP reference servers: non-standard
    types, dotted names, underscore parameters) declared, and its gold and perturbed calls made:
    gold calls accepted >= 99.5 %, stringified values coerced >= 99 %, invalid calls refused
    naming the field >= 99 %. Before, declaring the corpus failed on its dotted names, and no
    perturbed call was coerced or refused."""
    results = asyncio.run(measure())
    print("\n" + table(results))
    invalid = ("wrong_type", "enum_violation", "missing_required", "extra_property")
    refused = sum(results[k]["ok"] for k in invalid if k in results)
    refusals = sum(results[k]["calls"] for k in invalid if k in results)
    assert len(load_corpus()) >= 300
    assert rate(results["gold"]) >= 0.995, results["gold"]["failures"]
    assert rate(results["stringified"]) >= 0.99, results["stringified"]["failures"]
    assert refusals and refused / refusals >= 0.99, [results[k]["failures"] for k in invalid if k in results]
