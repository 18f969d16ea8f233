"""The shortcuts of a turn's hot path give what the plain code gives (benchmarks/bench_overhead.py
measures what they save).

The oracles are written here independently of the kernel: the standard library's own
`json.JSONEncoder` for the kernel's JSON encoder, and a plain walk that redacts each string for
`Redactor.redact_data`'s lookup of whole messages. The inputs are generated with hypothesis.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_core import tool
from hermes_core.kernel.messages import Usage, json_encoder
from hermes_core.kernel.redaction import Redactor

SECRET = "hunter2-is-the-secret-9f8e7d"

# JSON-like values as a prompt holds them: strings (some with a secret or a credential shape in
# them), numbers, booleans, None, in dicts, lists and tuples.
texts = st.one_of(
    st.text(max_size=30),
    st.sampled_from([SECRET, f"the key is {SECRET}.", "token=abc123def456", "sk-" + "a1" * 12, "user"]),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), texts)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=12,
)


def walked(redactor: Redactor, value: Any) -> Any:
    """The reference: every string redacted, containers rebuilt (no caches, no shortcuts)."""
    if isinstance(value, str):
        return redactor.redact(value)
    if isinstance(value, dict):
        return {key: walked(redactor, item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [walked(redactor, item) for item in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same types all the way down (1 is not True, a tuple is not a list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


@settings(max_examples=300, deadline=None)
@given(values)
def test_redact_data_is_a_plain_walk_that_redacts_every_string(value: Any) -> None:
    redactor = Redactor([SECRET])
    for _ in range(2):  # the second time from the caches
        redacted = redactor.redact_data(value)
        assert same(redacted, walked(redactor, value))
        if same(redacted, value):
            assert redacted is value  # nothing to hide: not copied


def test_a_message_seen_clean_is_redacted_once_its_secret_is_known() -> None:
    """The cache of whole messages is the redactor's: a secret added at run time (a token fetched
    after the message was first sent) is hidden in the same message the next time."""
    redactor = Redactor()
    message = {"role": "tool", "tool_call_id": "call_1", "content": f"the word is {SECRET}"}
    assert redactor.redact_data([message])[0] is message
    redactor.add(SECRET)
    assert redactor.redact_data([message])[0]["content"] == "the word is [REDACTED]"
    assert message["content"] == f"the word is {SECRET}"  # the caller's message is not changed


def test_only_short_messages_are_kept_whole_in_the_cache() -> None:
    """The cache of whole messages holds at most what the cache of long texts does: a message of
    many characters (a pasted document) is redacted value by value and never kept whole."""
    redactor = Redactor([SECRET])
    cached = redactor._cached_changes
    short = {"role": "user", "content": "hello"}
    long = {"role": "user", "content": "x" * 20_000 + SECRET}
    assert redactor.redact_data([short])[0] is short and cached.cache_info().currsize == 1
    assert redactor.redact_data([long])[0]["content"].endswith("[REDACTED]")
    assert cached.cache_info().currsize == 1


def test_a_message_holding_none_or_a_number_is_looked_up_whole_too() -> None:
    """An assistant message without content (`None`) or a value that is a number is flat: it is
    kept whole like any short message, not walked value by value at every model call."""
    redactor = Redactor([SECRET])
    cached = redactor._cached_changes
    message = {"role": "assistant", "content": None, "index": 3}
    assert redactor.redact_data([message])[0] is message and cached.cache_info().currsize == 1
    assert redactor.redact_data([message])[0] is message and cached.cache_info().hits == 1
    assert redactor.redact_data([{"role": "user", "content": SECRET, "n": 1}])[0]["content"] == "[REDACTED]"


def test_equal_values_of_other_types_keep_their_types() -> None:
    """(1, text) and (True, text) are equal tuples: a message cached for one must not hand back
    the other's values."""
    redactor = Redactor([SECRET])
    first = redactor.redact_data({"n": 1, "content": SECRET})
    second = redactor.redact_data({"n": True, "content": SECRET})
    assert first == {"n": 1, "content": "[REDACTED]"} and type(first["n"]) is int
    assert second["n"] is True


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=15,
)


@settings(max_examples=300, deadline=None)
@given(json_values, st.booleans())
def test_the_kernel_json_encoder_writes_what_the_standard_library_writes(value: Any, sort_keys: bool) -> None:
    expected = json.JSONEncoder(ensure_ascii=False, sort_keys=sort_keys).encode(value)
    assert json_encoder(sort_keys=sort_keys)(value) == expected


def test_the_kernel_json_encoder_fails_as_the_standard_library_does() -> None:
    encode = json_encoder()
    circular: list[object] = []
    circular.append(circular)
    with pytest.raises(ValueError, match="Circular reference"):
        encode(circular)
    with pytest.raises(TypeError, match="not JSON serializable"):
        encode({"a": object()})
    assert encode(circular[:0]) == "[]"  # an encoder that failed is not left in a bad state
    assert json_encoder(default=lambda value: "converted")({"a": object()}) == '{"a": "converted"}'


def test_is_async_follows_a_replaced_handler() -> None:
    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    assert not ping.is_async

    async def aping() -> str:
        return "pong"

    ping.handler = aping
    assert ping.is_async


def test_usage_sums_with_nothing_are_the_other_side() -> None:
    used = Usage(3, 4, 7)
    assert used + Usage() is used and Usage() + used is used
    assert used + used == Usage(6, 8, 14)
