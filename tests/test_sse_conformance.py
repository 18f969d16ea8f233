"""Replay the recorded OpenAI streams in tests/data and compare with what they must decode to.

The data is a copy under tests/data/ (see tests/data/README.md for its source and licence).
"""

from __future__ import annotations

import asyncio
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


# httpx-sse's line-decoder vectors (florimondmanca/httpx-sse, tests/test_decoders.py, class
# TestSSELineDecoder, commit 27c2fa9c66159ee9db214c03992f688279263c22, MIT): chunks as they
# arrive, and the lines the HTML standard's end-of-line rule (CRLF, CR, LF) makes of them.
LINE_VECTORS = [
    (["line1\r", "\nline2", "\n"], ["line1", "line2"]),  # test_trailing_cr_with_immediate_n
    (["line1\r", "\nline2\n"], ["line1", "line2"]),  # test_crlf_across_chunks
    (["text\r"], ["text"]),  # test_flush_with_trailing_cr
    (["line1\r\n", "line2\r", "line3\n"], ["line1", "line2", "line3"]),  # test_mixed_line_endings_incremental
    (["\r\n\r\n"], ["", ""]),  # test_alternating_cr_lf
    (["line1\r\rline2\n"], ["line1", "", "line2"]),  # test_consecutive_cr_handling
    (["\r", "\r"], ["", ""]),  # test_only_cr
    (list("line1\r\nline2"), ["line1", "line2"]),  # test_cr_lf_as_separate_chunks
    (["a\rb\nc\r\nd"], ["a", "b", "c", "d"]),  # test_mixed_endings_with_content
    (["first", " line\r", "\nsecond", " line\r\n", "third\rfo", "urth\n", "fifth"],
     ["first line", "second line", "third", "fourth", "fifth"]),  # test_complex_mixed_scenario
    (["data\u2028field\nline2\u2029end\n"], ["data\u2028field", "line2\u2029end"]),  # not line ends
]  # fmt: skip


@pytest.mark.parametrize(("chunks", "expected"), LINE_VECTORS)
def test_sse_lines_end_at_cr_lf_and_crlf(chunks: list[str], expected: list[str]) -> None:
    """Vectors from httpx-sse's line-decoder tests (above): lines end at CRLF, CR or LF (the HTML
    standard, server-sent events, "end-of-line"), a CRLF split across chunks ends one line."""
    from hermes_core.models.sse import SSELines

    lines = SSELines()
    got = [line for chunk in chunks for line in lines.feed(chunk.encode("utf-8"))] + lines.close()
    assert got == expected


async def _serve_chunks(chunks: list[bytes]) -> tuple[Any, str]:
    """A loopback server that writes one chat-completions stream in exactly these chunks."""
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
            await asyncio.sleep(0.005)  # each chunk its own read at the client
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1"


@pytest.mark.parametrize("ending", ["\r", "\r\n"])
async def test_a_recorded_stream_with_cr_or_split_crlf_line_ends_decodes(ending: str) -> None:
    """A recorded OpenAI tool-call stream (the manifest's first tool-call entry) sent with CR-only
    line ends, and with CRLF ends each split between two TCP writes (both legal server-sent events,
    HTML standard "end-of-line"). CR-only used to decode to nothing (one endless line) and the
    split CRLF is one line end, not two; each must decode to what the manifest says."""
    from hermes_core.models.openai_compat import OpenAICompatClient
    from hermes_core.models.settings import ModelSettings

    entry = next(e for e in MANIFEST if any(x["tool_calls"] for x in e["assembled_by_index_concat"].values()))
    text = (STREAMS / entry["file"]).read_text(encoding="utf-8").replace("\r\n", "\n")
    body = text.replace("\n", ending).encode("utf-8")
    chunks = body.split(b"\r")  # every chunk but the last ends where a CR was
    chunks = [chunk + b"\r" for chunk in chunks[:-1]] + [chunks[-1]]
    runner, base_url = await _serve_chunks(chunks)
    model = OpenAICompatClient(ModelSettings(model="m", base_url=base_url, stream=True, max_retries=0))
    try:
        response = await model.complete([{"role": "user", "content": "hi"}])
    finally:
        await model.aclose()
        await runner.cleanup()
    expected = entry["assembled_by_index_concat"]["0"]
    calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls]
    assert calls == expected["tool_calls"] and response.finish_reason == expected["finish_reason"]
