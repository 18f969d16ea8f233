"""The cost of reading tool calls out of a 4 KB reply, streamed and not (µs per reply), and how
many of the serving stacks' own parser-test cases each format gets right.

For scale, the same run times `json.loads` of a 4 KB JSON document: the floor any reply pays. The
corpus part reads tests/data/textcalls/ (the same rows and rules as tests/test_textcall_corpus.py):
per format, the cases, the passes, the rows left out as a listed policy, and the parse time per case.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from collections import defaultdict
from pathlib import Path

from _common import format_table

from hermes_core.textcalls import StreamingTextCallParser, parse_text_calls

PROSE = "The quarterly report covers sales in East China, budgets and the plan for next year. " * 50
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "北京", "days": 3}}\n</tool_call>\n'
REPLIES = {
    "4 KB prose, no calls": PROSE[:4096],
    "4 KB prose with < [ {, no calls": ("See <b>[1]</b> and {x}. " + PROSE)[:4096],
    "4 KB with 3 Hermes calls": (PROSE[:1300] + CALL) * 3,
    "4 KB with <think> and 1 call": "<think>" + PROSE[:2000] + "</think>" + PROSE[:1900] + CALL,
}


def per_call(function: object, number: int) -> float:
    timer = timeit.Timer(function)  # type: ignore[arg-type]
    return min(timer.repeat(repeat=5, number=number)) / number


def stream(text: str, size: int = 8) -> None:
    parser = StreamingTextCallParser()
    for start in range(0, len(text), size):
        parser.feed(text[start : start + size])
    parser.flush()


def run(number: int = 2000) -> dict:
    document = json.dumps({"rows": [{"id": i, "text": "x" * 30} for i in range(80)]})[:4096]
    document = document[: document.rfind("},") + 1] + "]}"
    floor = per_call(lambda: json.loads(document), number)
    rows = []
    figures: dict[str, float] = {"json.loads 4 KB": floor * 1e6}
    for name, text in REPLIES.items():
        parse = per_call(lambda text=text: parse_text_calls(text), number)
        streamed = per_call(lambda text=text: stream(text), max(1, number // 20))
        figures[name] = parse * 1e6
        rows.append(
            {
                "reply": f"{name} ({len(text.encode())} B)",
                "parse": f"{parse * 1e6:.1f} µs",
                "streamed in 8-char pieces": f"{streamed * 1e6:.0f} µs",
                "parse / json.loads": f"{parse / floor:.1f}",
            }
        )
    figures["rows_table"] = rows  # type: ignore[assignment]
    return figures


def corpus_rows(number: int = 200) -> list[dict]:
    """Per format: the corpus cases, passes, policy rows, and µs per parse (whole and streamed)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import test_textcall_corpus as corpus  # the rows and the comparison rules of the test

    policies = corpus.listed_policies()
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in corpus.CORPUS:
        groups[row["format"]].append(row)
    rows = []
    for name, cases in sorted(groups.items()):
        counted = [row for row in cases if row.get("policy") not in policies]
        passed = sum(corpus.mismatch(row) is None for row in counted)
        texts = [row["input"] for row in cases]
        parse = per_call(lambda texts=texts: [parse_text_calls(text) for text in texts], number) / len(texts)
        streamed = per_call(lambda texts=texts: [stream(text) for text in texts], max(1, number // 10)) / len(
            texts
        )
        rows.append(
            {
                "format": name,
                "cases": str(len(counted)),
                "pass": str(passed),
                "rate": f"{passed / len(counted):.1%}" if counted else "-",
                "policy": str(len(cases) - len(counted)),
                "parse": f"{parse * 1e6:.1f} µs",
                "streamed": f"{streamed * 1e6:.0f} µs",
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2000)
    figures = run(parser.parse_args().number)
    print(f"json.loads of a 4 KB JSON document: {figures['json.loads 4 KB']:.1f} µs")
    print(
        format_table(
            figures["rows_table"], ("reply", "parse", "streamed in 8-char pieces", "parse / json.loads")
        )
    )
    print("\nThe serving stacks' parser-test cases (tests/data/textcalls/), per format:")
    rows = corpus_rows(max(1, parser.parse_args().number // 10))
    print(format_table(rows, ("format", "cases", "pass", "rate", "policy", "parse", "streamed")))


if __name__ == "__main__":
    main()
