"""Cost of checking one call's arguments: a typed tool (pydantic) vs a schema tool (kernel/tools/schema.py).

The same booking tool is declared twice: as a typed `@tool` function and as a dict entry with the
equivalent JSON Schema. Each is given the same two argument sets — already well typed, and
stringified ("5", "true", numbers in an array as strings) — through `bind_arguments`, the one
validation path `ToolRegistry.execute` takes. Figures are µs per call (median of rounds), with
the schema/typed ratio. If `fastjsonschema` is installed, its validation alone (no coercion) of
the well-typed arguments is timed too, beside jsonschema's alone: the figures behind the choice of
validator told in kernel/tools/schema.py. Then the tool corpus (tests/data/tool_corpus/) rates.

    python benchmarks/bench_schema_validation.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from _common import format_table, row

from hermes_core.kernel.tools.arguments import bind_arguments
from hermes_core.kernel.tools.declare import tool_from_entry
from hermes_core.tools import tool

TARGET_US = 200.0  # a schema tool's check, per call: small beside a model's turn


@tool
def book_typed(
    guests: int, budget: float, breakfast: bool, room: Literal["single", "double"], nights: list[int]
) -> str:
    """Book a room.

    Args:
        guests: how many.
        budget: at most.
        breakfast: with breakfast.
        room: the kind.
        nights: the nights.
    """
    return "ok"


SCHEMA = {
    "type": "object",
    "properties": {
        "guests": {"type": "integer"},
        "budget": {"type": "number"},
        "breakfast": {"type": "boolean"},
        "room": {"type": "string", "enum": ["single", "double"]},
        "nights": {"type": "array", "items": {"type": "integer"}},
    },
    "required": ["guests", "budget", "breakfast", "room", "nights"],
}
BOOK_SCHEMA = tool_from_entry(
    "book_schema", {"description": "Book a room.", "parameters": SCHEMA, "handler": print}
)
TYPED = {"guests": 2, "budget": 120.5, "breakfast": True, "room": "double", "nights": [1, 2, 3]}
STRINGIFIED = {
    "guests": "2",
    "budget": "120.5",
    "breakfast": "true",
    "room": "double",
    "nights": ["1", "2", "3"],
}


def per_call_us(function: Callable[[], Any], rounds: int, calls: int = 2000) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            function()
        samples.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(samples)


def validators_alone(rounds: int) -> list[dict[str, str]]:
    from jsonschema import Draft202012Validator

    checked = Draft202012Validator(SCHEMA)
    rows = [
        {
            "metric": "jsonschema validate only (typed args)",
            "hermes": f"{per_call_us(lambda: checked.is_valid(TYPED), rounds):.1f} µs",
        }
    ]
    try:
        import fastjsonschema
    except ImportError:
        rows.append({"metric": "fastjsonschema validate only", "hermes": "not installed"})
        return rows
    fast = fastjsonschema.compile(SCHEMA)
    rows.append(
        {
            "metric": "fastjsonschema validate only (typed args)",
            "hermes": f"{per_call_us(lambda: fast(TYPED), rounds):.1f} µs",
        }
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    rows = []
    for label, arguments in (("well typed", TYPED), ("stringified", STRINGIFIED)):
        typed = per_call_us(lambda a=arguments: bind_arguments(book_typed, dict(a)), rounds)
        schema = per_call_us(lambda a=arguments: bind_arguments(BOOK_SCHEMA, dict(a)), rounds)
        line = row(
            f"check one call, {label} (µs)",
            f"{schema:.1f} schema",
            f"{typed:.1f} typed",
            schema,
            TARGET_US,
            " µs",
        )
        line["ratio"] = f"{schema / typed:.2f}"
        rows.append(line)
    print(format_table(rows))
    print()
    print(format_table(validators_alone(rounds), columns=("metric", "hermes")))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_tool_corpus import measure, table

    print()
    print(table(asyncio.run(measure())))


if __name__ == "__main__":
    main()
