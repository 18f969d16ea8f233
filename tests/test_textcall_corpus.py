"""Text tool calls measured against the serving stacks' own parser tests.

The corpus (tests/data/textcalls/, one JSON-lines file per source) holds the inputs and expected
outputs of the parser tests of vLLM and SGLang, transcribed as data (each row names its file, commit
and licence). Every row is parsed with `parse_text_calls` and compared with what the stack expects:
the calls (names, and arguments as JSON objects where the test checks them) and, where the test
checks it, the visible content (whitespace runs compared as one space: see "Content tidying" in
docs/text-tool-calls.md). A row where we differ on purpose names its policy; it counts only if the
policy is listed in docs/text-tool-calls.md, and it is left out of the pass rate.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from hermes_core.textcalls import parse_text_calls

DATA = Path(__file__).resolve().parent / "data" / "textcalls"
DOC = Path(__file__).resolve().parents[1] / "docs" / "text-tool-calls.md"
GOAL = 0.97


def load_corpus() -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted(DATA.glob("*.jsonl"))
        for line in path.read_text("utf-8").splitlines()
    ]


def listed_policies() -> set[str]:
    """The policy keys of the doc's "Where we differ from the serving stacks" table."""
    section = (
        DOC.read_text("utf-8").split("## Where we differ from the serving stacks", 1)[1].split("\n## ", 1)[0]
    )
    return set(re.findall(r"^\| `([a-z-]+)` \|", section, re.MULTILINE))


def _tidy(text: str | None) -> str:
    return " ".join((text or "").split())


def mismatch(row: dict[str, Any]) -> str | None:
    """Why our parse differs from the stack's expected output; None if it agrees."""
    parsed = parse_text_calls(row["input"])
    got = [(call.name, call.arguments) for call in parsed.calls]
    if [name for name, _ in got] != [name for name, _ in row["calls"]]:
        return f"calls {got} != {row['calls']}"
    for (name, arguments), (_, expected) in zip(got, row["calls"], strict=True):
        if isinstance(expected, dict) and json.loads(arguments) != expected:
            return f"{name} arguments {arguments} != {expected}"
        if isinstance(expected, str) and arguments != expected:
            return f"{name} arguments {arguments!r} != {expected!r}"
    if "content" in row and _tidy(parsed.content) != _tidy(row["content"]):
        return f"content {parsed.content!r} != {row['content']!r}"
    return None


CORPUS = load_corpus()


def test_corpus_rows_name_their_source() -> None:
    for row in CORPUS:
        assert row["repo"] and row["path"] and row["licence"] and row["format"], row["id"]
        assert re.fullmatch(r"[0-9a-f]{40}", row["commit"]), row["id"]


def test_every_policy_row_is_listed_in_the_doc() -> None:
    """A row may differ from its stack on purpose only where the doc says so, with the reason."""
    unlisted = {row["policy"] for row in CORPUS if "policy" in row} - listed_policies()
    assert not unlisted, f"policies used by the corpus but not listed in the doc: {unlisted}"


def per_format() -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = defaultdict(lambda: {"cases": 0, "pass": 0, "policy": 0, "failed": []})
    policies = listed_policies()
    for row in CORPUS:
        entry = table[row["format"]]
        if row.get("policy") in policies:
            entry["policy"] += 1
            continue
        entry["cases"] += 1
        why = mismatch(row)
        if why is None:
            entry["pass"] += 1
        else:
            entry["failed"].append(f"{row['id']}: {why}")
    return dict(table)


def format_table(table: dict[str, dict[str, Any]]) -> str:
    lines = [f"{'format':<14} {'cases':>5} {'pass':>5} {'rate':>7} {'policy':>6}"]
    for name, entry in sorted(table.items()):
        rate = entry["pass"] / entry["cases"] if entry["cases"] else 1.0
        lines.append(f"{name:<14} {entry['cases']:>5} {entry['pass']:>5} {rate:>7.1%} {entry['policy']:>6}")
    return "\n".join(lines)


def test_pass_rate_per_format(capsys: pytest.CaptureFixture[str]) -> None:
    """The goal: at least 97% of each claimed format's cases agree with the stacks' expectations."""
    table = per_format()
    with capsys.disabled():
        print("\n" + format_table(table))
    for name, entry in table.items():
        rate = entry["pass"] / entry["cases"] if entry["cases"] else 1.0
        assert rate >= GOAL, f"{name}: {rate:.1%} < {GOAL:.0%}\n" + "\n".join(entry["failed"])
