"""Worst-case parse time of text tool calls, per format: 1 MB replies built to be slow, whole and
streamed, in ms, and the ratio to the same size of plain prose parsed the same way.

The cases are those of tests/test_textcall_linear.py (each format's shortest reply from the serving
stacks' parser tests, padded with whitespace runs, brackets, repeated and partial markers at every
boundary of its markup); the figure per format is its slowest case. Times are CPU time, best of
`--runs`. docs/text-tool-calls.md ("Linear time") has the bound these figures are read against.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from _common import format_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_textcall_linear as linear  # noqa: E402  # the cases and the timing of the test
from hermes_core.textcalls import PARSERS  # noqa: E402

PROSE = "The quarterly report covers sales in East China, budgets and the plan for next year. "


def slowest(parse: Callable[[str], None], name: str, size: int, runs: int) -> tuple[float, str]:
    return max(
        (linear.best_time(parse, case(size), f"{name}: {label}", runs), label)
        for label, case in linear.worst_cases(name).items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="characters of padding per case")
    parser.add_argument("--chunk", type=int, default=48, help="characters per streamed piece")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--formats", nargs="*", default=list(PARSERS))
    args = parser.parse_args()
    prose = (PROSE * (args.size // len(PROSE) + 1))[: args.size]

    def streamed(text: str) -> None:
        linear.parse_streamed(text, args.chunk)

    whole_floor = linear.best_time(linear.parse_whole, prose, "prose", args.runs)
    stream_floor = linear.best_time(streamed, prose, "prose", args.runs)
    print(f"plain prose, {args.size:,} characters: whole {whole_floor * 1e3:.1f} ms, "
          f"streamed in {args.chunk}-character pieces {stream_floor * 1e3:.1f} ms")  # fmt: skip
    rows = []
    for name in args.formats:
        whole, whole_case = slowest(linear.parse_whole, name, args.size, args.runs)
        stream, stream_case = slowest(streamed, name, args.size, 1)
        rows.append(
            {
                "format": name,
                "whole": f"{whole * 1e3:.1f} ms",
                "÷ prose": f"{whole / whole_floor:.0f}",
                "slowest whole case": whole_case,
                "streamed": f"{stream * 1e3:.0f} ms",
                "÷ prose streamed": f"{stream / stream_floor:.1f}",
                "slowest streamed case": stream_case,
            }
        )
    columns = ("format", "whole", "÷ prose", "slowest whole case", "streamed", "÷ prose streamed",
               "slowest streamed case")  # fmt: skip
    print(format_table(rows, columns))


if __name__ == "__main__":
    main()
