"""Streaming text tool calls: whatever the split, the stream agrees with the whole-reply parse.

Invariants, for any reply and any split into pieces:
  (a) finish() equals parse_text_calls(reply, think_open=…);
  (b) streamed texts + flush().text == content, and streamed calls + flush().calls == calls;
  (c) no streamed text holds any part of a call block or a think block.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_core.textcalls import ParsedText, StreamingTextCallParser, StreamUpdate, parse_text_calls

W = '{"name": "get_weather", "arguments": {"city": "北京"}}'

# One representative reply per format and rule. Where the visible text has no "<", "[" or "`" (CLEAN),
# any of those in a streamed piece would be part of a tag (invariant c).
REPLIES = {
    "hermes": f"Let me check.\n<tool_call>\n{W}\n</tool_call>\n<tool_call>{W}</tool_call>\nDone.",
    "hermes unclosed": f"Checking 北京.\n<tool_call>\n{W}",
    "hermes malformed next to valid": f"A <tool_call>oops</tool_call> B <tool_call>{W}</tool_call> C",
    "qwen3_coder": "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n北京\n</parameter>\n"
    "</function>\n</tool_call>\nWaiting.",
    "function_tag": 'Ok <function=get_weather>{"city": "北京"}</function> and '
    '<function name="add">{}</function>.',
    "tool_tags": f"One <tool>{W}</tool> two <tools>[{W}]</tools> three <function_call>{W}</function_call>.",
    "mistral": 'Looking.[TOOL_CALLS]get_weather[ARGS]{"city": "北京"}[TOOL_CALLS]add[ARGS]{"a": 1}',
    "json fenced": f"```json\n{W}\n```",
    "llama json": '{"name": "get_weather", "parameters": {"city": "北京"}};{"name": "now", "parameters": {}}',
    "pythonic": '[get_weather(city="北京"), add(a=1, b=2)]',
    "think": f"<think>Maybe <tool_call>{W}</tool_call>.</think>\n\nHello 世界 <tool_call>{W}</tool_call> bye",
    "think unclosed": "Visible first. <think>then thinking until the end",
    "prose with brackets": "Use a < b and x[0] and {braces} freely.",
    "fence then prose": f"```python\nprint(1)\n```\nThat prints 1. <tool_call>{W}</tool_call>",
    "glm": "Ok <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n"
    "</tool_call> done",
    "kimi_k2": "Ok <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
    '<|tool_call_argument_begin|>{"city": "北京"}<|tool_call_end|><|tool_calls_section_end|> done',
    "deepseek": 'Ok <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "北京"}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜> done",
    "harmony": "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city": "北京"}<|call|>'
    "<|start|>assistant<|channel|>final<|message|>Done 北京.<|return|>",
    "llama tokens": 'Ok <|python_tag|>{"name": "get_weather", "parameters": {"city": "北京"}}',
    "lfm2": 'Ok <|tool_call_start|>[get_weather(city="北京")]<|tool_call_end|> done',
    "functiongemma": "Ok <start_function_call>call:get_weather{city:<escape>北京<escape>}"
    "<end_function_call> done",
    "gemma4": '<|channel>thought\nHm.<channel|>Ok <|tool_call>call:get_weather{city:<|"|>北京<|"|>}'
    "<tool_call|> done<channel|>",
    "granite": f"Ok <|tool_call|>[{W}]",
    "internlm2": f"Ok <|action_start|><|plugin|>\n{W}<|action_end|> done",
    "phi4_mini": f"Ok functools[{W}]",
    "apertus": 'Ok <|tools_prefix|>[{"get_weather": {"city": "北京"}}]<|tools_suffix|> done',
    "harmony role header": " to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>"
    '{"city": "北京"}<|call|><|start|>assistant<|channel|>final<|message|>Done 北京.<|return|>',
    "mistral think": '[THINK]Maybe [TOOL_CALLS]x[/THINK]Ok[TOOL_CALLS]get_weather[ARGS]{"city": "北京"}',
    "json then prose": f"{W} Would you like more?",
    "markdown link": "[docs](https://x.y) say so.",
    "minimax_m2": 'Ok <minimax:tool_call><invoke name="get_weather"><parameter name="city">北京</parameter>'
    "</invoke></minimax:tool_call> done",
    "step3": "Ok <｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>"
    '<steptml:invoke name="get_weather"><steptml:parameter name="city">北京</steptml:parameter>'
    "</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜> done",
    "seed_oss": "<seed:think>Need it.</seed:think>Ok <seed:tool_call><function=get_weather>"
    "<parameter=city>北京</parameter></function></seed:tool_call> done",
    "deepseek_dsml": 'Ok <｜DSML｜function_calls><｜DSML｜invoke name="get_weather">'
    '<｜DSML｜parameter name="city" string="true">北京</｜DSML｜parameter>'
    "</｜DSML｜invoke></｜DSML｜function_calls> done",
    "longcat": f"Ok <longcat_tool_call>{W}</longcat_tool_call> done",
    "olmo3": "Ok <function_calls>get_weather(city='北京')\nnow()</function_calls> done",
}
MARKERS = ("<", "[", "`", "tool_call", "think", "function", "｜", "|")


Streamed = tuple[ParsedText, list[str], list[StreamUpdate]]


def stream(pieces: Sequence[str], think_open: bool = False) -> Streamed:
    parser = StreamingTextCallParser(think_open=think_open)
    updates = [parser.feed(piece) for piece in pieces]
    updates.append(parser.flush())
    return parser.finish(), [update.text for update in updates[:-1]], updates


def check(text: str, pieces: Sequence[str], think_open: bool = False) -> None:
    parsed, streamed, updates = stream(pieces, think_open)
    assert parsed == parse_text_calls(text, think_open=think_open)  # (a)
    assert "".join(update.text for update in updates) == parsed.content  # (b)
    assert [call for update in updates for call in update.calls] == parsed.calls


@pytest.mark.parametrize("name", REPLIES)
def test_every_single_split_and_every_character(name: str) -> None:
    text = REPLIES[name]
    for think_open in (False, True):
        check(text, list(text), think_open)
        for i in range(len(text) + 1):
            check(text, [text[:i], text[i:]], think_open)


CLEAN = [
    name for name, text in REPLIES.items() if not any(m in parse_text_calls(text).content for m in MARKERS)
]


def test_most_replies_have_clean_content() -> None:
    assert len(CLEAN) >= len(REPLIES) - 3  # the malformed block and the fences are visible on purpose


@pytest.mark.parametrize("name", CLEAN)
def test_no_streamed_piece_holds_part_of_a_tag(name: str) -> None:
    text = REPLIES[name]
    for pieces in [list(text), *([text[:i], text[i:]] for i in range(len(text) + 1))]:
        _, streamed, _ = stream(pieces)
        for piece in streamed:
            assert not any(marker in piece for marker in MARKERS), (pieces, piece)


def test_visible_text_streams_before_and_between_calls() -> None:
    parser = StreamingTextCallParser()
    assert parser.feed("Let me check") == StreamUpdate("Let me check")
    assert parser.feed(" the weather.\n<tool_") == StreamUpdate(" the weather.")  # "\n<tool_" held
    assert parser.feed("call>\n" + W[:20]) == StreamUpdate()  # inside the block
    closed = parser.feed(W[20:] + "\n</tool_call>")
    assert (closed.text, [call.name for call in closed.calls]) == ("", ["get_weather"])
    assert parser.feed("\nDone") == StreamUpdate("\nDone")
    assert parser.flush() == StreamUpdate()
    assert parser.finish().content == "Let me check the weather.\nDone"


def test_whole_message_candidates_are_held_until_they_cannot_be_calls() -> None:
    parser = StreamingTextCallParser()
    assert parser.feed("[get_weather(") == StreamUpdate()
    assert parser.feed('city="北京")]') == StreamUpdate()
    assert [call.name for call in parser.flush().calls] == ["get_weather"]

    parser = StreamingTextCallParser()
    assert parser.feed("```json\n{") == StreamUpdate()  # may still be a fenced JSON call
    assert parser.feed('"a": 1}\n```') == StreamUpdate()
    assert parser.feed("\nThat is data.") == StreamUpdate('```json\n{"a": 1}\n```\nThat is data.')


def test_replies_that_start_like_json_stream_once_they_cannot_be_calls() -> None:
    """Bug: a plain reply starting with `[` or `{` (a markdown link) was held to the end of the stream."""
    parser = StreamingTextCallParser()
    assert parser.feed("[doc") == StreamUpdate()  # `[doc(` would be a pythonic call
    assert parser.feed("s](https://x.y) say") == StreamUpdate("[docs](https://x.y) say")
    parser = StreamingTextCallParser()
    assert parser.feed("```python\nprint(1)\n```") == StreamUpdate("```python\nprint(1)\n```")
    parser = StreamingTextCallParser()
    assert parser.feed("{x} is a set.") == StreamUpdate("{x} is a set.")  # a last `t` may begin `to=`


def test_each_call_is_handed_over_when_its_block_closes() -> None:
    """Calls of the token formats arrive while streaming, not at the end."""
    for opening, call, closing in [
        (
            "<|tool_calls_section_begin|>",
            "<|tool_call_begin|>functions.now:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
            "<|tool_calls_section_end|>",
        ),
        (
            "<｜tool▁calls▁begin｜>",
            "<｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
            "<｜tool▁calls▁end｜>",
        ),
        ("", "<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}", "<|call|>"),
        ("", "<tool_call>now\n", "</tool_call>"),
        ("", "<|python_start|>[now()]", "<|python_end|>"),
    ]:
        parser = StreamingTextCallParser()
        assert parser.feed("Hi " + opening + call).calls == []
        update = parser.feed(closing + " more")
        assert [c.name for c in update.calls] == ["now"], opening + call


def test_mistral_calls_arrive_at_the_end() -> None:
    parser = StreamingTextCallParser()
    assert parser.feed('Looking.[TOOL_CALLS][{"name": "add", "arguments": {}}]') == StreamUpdate("Looking.")
    assert [call.name for call in parser.flush().calls] == ["add"]


def test_think_open_streams_reasoning_out_of_sight() -> None:
    parser = StreamingTextCallParser(think_open=True)
    assert parser.feed("the template opened this thought") == StreamUpdate()
    assert parser.feed("</think>\n\nAnswer.") == StreamUpdate("Answer.")
    assert parser.finish().reasoning == "the template opened this thought"


def test_formats_restrict_what_is_held() -> None:
    parser = StreamingTextCallParser(formats=["hermes"])
    assert parser.feed("{not held: no message format}") == StreamUpdate("{not held: no message format}")
    assert parser.feed(" <tool>x</tool>") == StreamUpdate(" <tool>x</tool>")


def test_the_stream_ends_once() -> None:
    parser = StreamingTextCallParser()
    assert parser.feed("[now()] Hi") == StreamUpdate()  # it may still be a pythonic list
    flushed = parser.flush()  # a call list, then prose
    assert (flushed.text, [call.name for call in flushed.calls]) == ("Hi", ["now"])
    assert parser.flush() == StreamUpdate()
    with pytest.raises(RuntimeError):
        parser.feed("more")


fragments = st.sampled_from(
    [
        *("<tool_call>", "</tool_call>", "<think>", "</think>", "[TOOL_CALLS]", "[ARGS]", "<tools>"),
        *("</tools>", "<tool>"),
        *("<function=f>", "<function name='g'>", "</function>", "<parameter=x>", "</parameter>"),
        *("```", "```json\n", "{", "}", "[", "]", "<", ";", ",", ":", '"name"', "f(x=1)", "'"),
        *(W, '{"name": "add", "parameters": {"a": 1}}', "[now()]", '"arguments": {}'),
        *(" ", "\n", "\n\n", "Hello", "世界", "北京", "prose.", "}}", "](u)", "<|python_tag|>"),
        *(
            "<arg_key>",
            "</arg_key>",
            "<arg_value>",
            "<|channel|>",
            "commentary to=functions.f",
            "<|message|>",
        ),
        *("<|call|>", "<|start|>assistant", "<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
        *("functions.f:0", "<|tool_call_argument_begin|>", "<｜tool▁calls▁begin｜>", "f<｜tool▁sep｜>"),
        *("<minimax:tool_call>", "</minimax:tool_call>", '<invoke name="f">', "</invoke>"),
        *('<parameter name="a">', "<seed:tool_call>", "</seed:tool_call>", "<seed:think>", "</seed:think>"),
        *("<｜DSML｜function_calls>", '<｜DSML｜invoke name="f">'),
        *("<｜tool_calls_begin｜>", "<｜tool_call_end｜>"),
        *('<steptml:invoke name="f">', "<longcat_tool_call>", "<function_calls>", "</function_calls>"),
        *("<|tool_call_start|>", "<|tool_call_end|>", "<start_function_call>", "call:f{", "<escape>"),
        *("<end_function_call>", "<|tool_call|>", "<|action_start|>", "<|plugin|>", "<|action_end|>"),
        *("functools", "<|tools_prefix|>", "<|tools_suffix|>", " to=functions.f", "[THINK]", "[/THINK]"),
        *("<|end|>", "<|return|>", "t", "f", "to", "func", "<|tool_call>", "<tool_call|>", '<|"|>'),
        *("<|channel>", "<channel|>", "thought\n"),
    ]
)
replies = st.lists(fragments, max_size=14).map("".join) | st.text(max_size=40)


@settings(max_examples=400, deadline=None)
@given(replies, st.data(), st.booleans())
def test_any_reply_any_split(text: str, data: st.DataObject, think_open: bool) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    check(text, pieces, think_open)


@settings(max_examples=100, deadline=None)
@given(
    replies,
    st.sets(
        st.sampled_from(
            ["hermes", "qwen3_coder", "function_tag", "json", "pythonic", "mistral", "harmony", "lfm2"]
            + ["functiongemma", "gemma4", "granite", "internlm2", "phi4_mini", "apertus"]
        )
    ),
)
def test_any_reply_any_formats_char_by_char(text: str, formats: set[str]) -> None:
    parser = StreamingTextCallParser(formats=sorted(formats))
    updates = [parser.feed(char) for char in text] + [parser.flush()]
    parsed = parser.finish()
    assert parsed == parse_text_calls(text, sorted(formats), think_open=False)
    assert "".join(update.text for update in updates) == parsed.content
    assert [call for update in updates for call in update.calls] == parsed.calls
