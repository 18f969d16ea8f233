"""Replay the recorded OpenAI streams in tests/data and compare with what they must decode to.

The data is a copy under tests/data/ (see tests/data/README.md for its source and licence).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hermes_core.models.sse import StreamAssembler, parse_sse_lines

STREAMS = Path(__file__).resolve().parent / "data" / "openai_sse_streams"
MANIFEST = json.loads((STREAMS / "manifest.json").read_text(encoding="utf-8"))["files"]


def decode(path: Path) -> StreamAssembler:
    assembler = StreamAssembler()
    with path.open(encoding="utf-8") as lines:
        for payload in parse_sse_lines(lines):
            assembler.feed(json.loads(payload))
    return assembler


def test_manifest_lists_all_twelve_streams() -> None:
    assert len(MANIFEST) == 12
    assert {entry["file"] for entry in MANIFEST} == {path.name for path in STREAMS.glob("*.sse")}


@pytest.mark.parametrize("entry", MANIFEST, ids=lambda entry: entry["file"][:12])
def test_stream_decodes_to_manifest(entry: dict[str, Any]) -> None:
    assembler = decode(STREAMS / entry["file"])
    expected_by_index = entry["assembled_by_index_concat"]
    assert len(expected_by_index) == entry["n_choices"]
    for index, expected in expected_by_index.items():
        response = assembler.response(int(index))
        assert response.content == expected["content"]
        assert response.finish_reason == expected["finish_reason"]
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls]
        assert calls == expected["tool_calls"]
        assert response.model == "gpt-4o-2024-08-06"


@pytest.mark.parametrize("prefix", ["173417d55340", "569c877e6942"])
def test_refusal_streams_keep_the_refusal_text(prefix: str) -> None:
    (path,) = STREAMS.glob(prefix + "*.sse")
    response = decode(path).response()
    assert response.content is None
    assert response.refusal is not None and "sorry" in response.refusal
    assert response.text == response.refusal


def test_final_usage_chunk_is_read() -> None:
    for entry in MANIFEST:
        usage = decode(STREAMS / entry["file"]).usage
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 0


def test_parse_sse_lines_skips_noise_and_stops_at_done() -> None:
    lines = [
        ": keep-alive\n",
        "event: message\n",
        "id: 7\n",
        "\n",
        'data: {"a":1}\r\n',
        'data:{"b":2}',
        "data: [DONE]\n",
        'data: {"after":true}\n',
    ]
    assert list(parse_sse_lines(lines)) == ['{"a":1}', '{"b":2}']


@given(
    texts=st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=3),
    arguments=st.text(max_size=40),
    data=st.data(),
)
def test_interleaved_deltas_reassemble(texts: list[str], arguments: str, data: st.DataObject) -> None:
    """However a server slices text and arguments, and however it interleaves choices, the assembled
    response is the concatenation per choice index."""
    deltas: list[tuple[int, dict[str, Any]]] = []
    for index, text in enumerate(texts):
        cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=5)))
        bounds = [0, *cuts, len(text)]
        deltas += [(index, {"content": text[a:b]}) for a, b in itertools.pairwise(bounds) if b > a]
    deltas.append(
        (0, {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": ""}}]})
    )
    deltas += [(0, {"tool_calls": [{"index": 0, "function": {"arguments": ch}}]}) for ch in arguments]
    order = data.draw(st.permutations(range(len(deltas))))
    # Keep each choice's own pieces in order while shuffling how choices interleave.
    by_choice = {i: [d for c, d in deltas if c == i] for i in range(len(texts))}
    assembler = StreamAssembler()
    for position in order:
        index = deltas[position][0]
        delta = by_choice[index].pop(0)
        assembler.feed({"model": "m", "choices": [{"index": index, "delta": delta, "finish_reason": None}]})
    for index, text in enumerate(texts):
        assert assembler.response(index).content == text
    assert [(c.id, c.name, c.arguments) for c in assembler.response(0).tool_calls] == [
        ("call_1", "f", arguments or "{}")
    ]
