"""Text tool calls are read in time linear in the reply's length, whole and streamed, in every format.

Model output is attacker-influenced (prompt injection), so a padded reply must not stall a worker.
The cases: for every registered parser (`PARSERS`, so a format added later is covered without a
line here), its shortest reply among the serving stacks' own parser tests (tests/data/textcalls/,
each row names its repository, file, commit and licence), padded with what makes parsers slow —
whitespace runs, runs of brackets, repeated openers and closers, partial markers — at every
boundary of its markup (after openers, between tags, inside values). The issue's measured case, a
Qwen3-Coder value of 100,000 spaces (15–22 s before), is pinned on its own, and hypothesis mixes
markers and whitespace at random.

Timing is judged by ratios of CPU time, not by seconds, so a slow or busy machine does not fail
them: each case is timed at two sizes (best of a few runs) and four times the text may cost at most
`GROWTH` times as much (4 is linear, 16 quadratic); `SLACK` absorbs a hiccup on the small ones. A case
is stopped by an alarm after `GUARD` seconds, so quadratic code fails instead of hanging the suite.
The per-format sweeps take minutes and are marked slow; the pinned cases and hypothesis are not.
"""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_core.textcalls import PARSERS, StreamingTextCallParser, parse_text_calls
from test_textcall_corpus import CORPUS

GROWTH = 8.0  # the most that 4× the text may cost: 4× is linear, 16× quadratic
SLACK = 0.02  # seconds: a scheduler hiccup on the smaller size
GUARD = 10.0  # seconds any one parse may take before the case fails
MARKUP = re.compile(r"<[|｜][^<>]{0,60}?[|｜]>|</?[\w:=\"' -]{1,40}>|\[[A-Z_]{2,20}\]")


def sample(name: str) -> str:
    """The shortest corpus reply that this format alone reads as a call."""
    for text in sorted((row["input"] for row in CORPUS if row["format"] == name), key=len):
        if parse_text_calls(text, [name]).calls:
            return text
    raise AssertionError(f"format {name!r} has no corpus row it parses: add one to tests/data/textcalls/")


def boundaries(text: str) -> list[int]:
    """Both ends of every markup token, and the middle of the text between them (inside values)."""
    points = {0, len(text)}
    for token in MARKUP.finditer(text):
        points |= {token.start(), token.end()}
    ordered = sorted(points)
    return sorted(points | {(a + b) // 2 for a, b in zip(ordered, ordered[1:], strict=False)})


def worst_cases(name: str) -> dict[str, Callable[[int], str]]:
    """Each case as a function of the padding's size in characters."""
    text = sample(name)
    cases: dict[str, Callable[[int], str]] = {}
    for at in boundaries(text):
        before, after = text[:at], text[at:]
        cases[f"spaces at {at}"] = lambda n, b=before, a=after: b + " " * n + a
        cases[f"newlines at {at}"] = lambda n, b=before, a=after: b + " \n" * (n // 2) + a
        cases[f"brackets at {at}"] = lambda n, b=before, a=after: b + "[{" * (n // 2) + a
    for marker in dict.fromkeys(token.group() for token in MARKUP.finditer(text)):
        cases[f"repeated {marker}"] = lambda n, t=text, m=marker: t + m * (n // len(m))
        cases[f"partial {marker}"] = lambda n, t=text, m=marker[:-1]: t + m * (n // len(m))
        cases[f"spaced {marker}"] = lambda n, m=marker + "  ": m * (n // len(m))
    return cases


@contextlib.contextmanager
def guard(seconds: float, what: str) -> Iterator[None]:
    """Fail a parse that runs longer than `seconds` (the regex engine checks for signals)."""

    def stop(signum: int, frame: object) -> None:
        raise TimeoutError(f"{what} took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def parse_whole(text: str) -> None:
    parse_text_calls(text)


def parse_streamed(text: str, size: int) -> None:
    parser = StreamingTextCallParser()
    for start in range(0, len(text), size):
        parser.feed(text[start : start + size])
    parser.flush()


def best_time(parse: Callable[[str], None], text: str, what: str, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        with guard(GUARD, what):
            started = time.process_time()  # CPU time: a busy machine's waits do not count
            parse(text)
            times.append(time.process_time() - started)
    return min(times)


def assert_linear(parse: Callable[[str], None], name: str, small: int, runs: int = 3) -> None:
    slow = []
    for label, case in worst_cases(name).items():
        what = f"{name}: {label}"
        little = best_time(parse, case(small), what, runs)
        big = best_time(parse, case(4 * small), what, runs)
        if big > GROWTH * little + SLACK:  # measured once more, best of three, before it counts: a
            little = best_time(parse, case(small), what, 3)  # collection or a busy neighbour can
            big = best_time(parse, case(4 * small), what, 3)  # land in one run
        if big > GROWTH * little + SLACK:
            slow.append(f"{label}: {little * 1e3:.1f} ms, 4× the text {big * 1e3:.1f} ms")
    assert not slow, f"{name} grows faster than linearly:\n" + "\n".join(slow)


@pytest.mark.slow  # minutes for all formats: CI runs them
@pytest.mark.parametrize("name", list(PARSERS))
def test_whole_replies_of_a_megabyte_parse_in_linear_time(name: str) -> None:
    """Every worst case at 256 KB and 1 MB, parsed whole."""
    assert_linear(parse_whole, name, 250_000)


@pytest.mark.slow  # minutes for all formats: CI runs them
@pytest.mark.parametrize("name", list(PARSERS))
def test_streamed_replies_parse_in_linear_time(name: str) -> None:
    """Every worst case streamed in 48-character pieces (what servers send), at 64 and 256 KB."""
    assert_linear(lambda text: parse_streamed(text, 48), name, 64_000, runs=1)


@pytest.mark.slow  # minutes for all formats: CI runs them
@pytest.mark.parametrize("name", list(PARSERS))
def test_streamed_one_character_at_a_time_parses_in_linear_time(name: str) -> None:
    """The smallest pieces a stream can have, at 8 and 32 KB."""
    assert_linear(lambda text: parse_streamed(text, 1), name, 8_000, runs=1)


def test_the_issue_case_a_qwen3_coder_value_of_100000_spaces() -> None:
    """The issue's measurement (15–22 s before; upstream vLLM's own test allows 2 s)."""
    for value in (" " * 100_000 + "x", "x" + " " * 100_000, "x" + " " * 100_000 + "</paramter>"):
        text = f"<tool_call>\n<function=f>\n<parameter=a>{value}</parameter>\n</function>\n</tool_call>"
        with guard(2.0, "a value of 100,000 spaces"):
            parsed = parse_text_calls(text)
        assert [(call.name, call.arguments) for call in parsed.calls] == [("f", '{"a": "x"}')]


def test_a_kimi_k2_call_padded_with_whitespace() -> None:
    """Kimi-K2's arguments were matched lazily before optional whitespace: quadratic in a run."""
    text = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
        + '{"a": 1,' + " " * 100_000 + '"b": 2}<|tool_call_end|><|tool_calls_section_end|>'
    )  # fmt: skip
    with guard(2.0, "a Kimi-K2 call with 100,000 spaces"):
        parsed = parse_text_calls(text)
    assert [(call.name, call.arguments) for call in parsed.calls] == [("f", '{"a": 1, "b": 2}')]


def test_broken_payloads_cost_a_bounded_amount() -> None:
    """json_repair takes up to a millisecond a character on nested brackets: a reply of thousands
    of broken blocks is read within the reply's budget for it, and a pile of brackets not at all."""
    block = "<tool_call>{" + "{{{{}}}}" * 30 + "</tool_call>\n"
    with guard(GUARD, "broken payloads"):
        started = time.process_time()
        parse_text_calls(block * 2_000)
        elapsed = time.process_time() - started
    one = best_time(parse_whole, block * 20, "20 broken payloads")
    assert elapsed < 100 * one + 1.0, (elapsed, one)


MARKERS = sorted(
    {tag.start for parser in PARSERS.values() for tag in getattr(parser, "tags", ())}
    | {"</tool_call>", "<parameter=", "</parameter>", "<arg_key>", "<arg_value>", "<think>", "</think>"}
    | {'{"name": "f", "arguments": ', "[f(", "```json\n", "[", "{", "]", "}", '"', "\\"}
)
PIECES = st.sampled_from(MARKERS) | st.sampled_from([" ", "\n", "  \n\t", "x", "北京", "1,"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(PIECES, st.integers(1, 2_000)), min_size=1, max_size=6))
def test_random_mixtures_of_markers_and_whitespace_stay_linear(runs: list[tuple[str, int]]) -> None:
    """Hypothesis builds replies from markers and whitespace, each repeated up to 2,000 times; the
    time per character of the reply and of the same reply 4× longer must stay within `GROWTH`."""
    text = "".join(piece * count for piece, count in runs)
    little = best_time(parse_whole, text, "a random reply")
    big = best_time(parse_whole, "".join(piece * count * 4 for piece, count in runs), "4× that reply")
    assert big <= GROWTH * little + SLACK, (little, big)


def test_message_formats_alone_scan_no_tags() -> None:
    """With only message formats chosen there is no tag to look for: the scan must end at once."""
    with guard(2.0, "a reply read by the message formats alone"):
        parsed = parse_text_calls("Plain text <b>[1]</b>", ["json", "pythonic"])
        stream = StreamingTextCallParser(["json"])
        stream.feed("Plain text <b>")
        shown = stream.flush()
    assert parsed.content == "Plain text <b>[1]</b>" and not shown.calls
