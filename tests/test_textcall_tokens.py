"""The special-token formats of newer small models (textcalls/tokens.py) and gpt-oss harmony.

The replies use the shapes the chat templates define, as the serving stacks' parser tests write
them: vLLM `tests/tool_parsers/test_{lfm2,functiongemma,granite,internlm2,phi4mini,apertus}_tool_parser.py`,
SGLang `test/registered/unit/function_call/test_{gptoss,lfm2,internlm}_detector.py`, llama.cpp
`tests/test-chat.cpp` (gpt-oss, FireFunction, Gemma 4); those cases themselves are corpus rows
(tests/data/textcalls/*_tokens.jsonl). Each reply is parsed whole and streamed one character at a
time: the stream agrees with the whole parse, hands a call over when its block closes, and never
shows a character of markup. A reply the token limit cut inside a call runs no tool, over HTTP
against the fake OpenAI-compatible server.
"""

from __future__ import annotations

from typing import Any

import pytest

from hermes_core.textcalls import StreamingTextCallParser, parse_text_calls

WEATHER = ("get_weather", '{"city": "北京", "days": 3}')

# family: a reply with text before and after one call of get_weather(city="北京", days=3)
REPLIES = {
    "lfm2": 'Checking 北京.<|tool_call_start|>[get_weather(city="北京", days=3)]<|tool_call_end|>\n'
    "One moment.",
    "functiongemma": "Checking 北京.<start_function_call>call:get_weather{city:<escape>北京<escape>,days:3}"
    "<end_function_call>\nOne moment.",
    "gemma4": "<|channel>thought\nNeed the weather.<channel|>Checking 北京.<|tool_call>call:get_weather"
    '{city:<|"|>北京<|"|>,days:3}<tool_call|>\nOne moment.',
    "internlm2": 'Checking 北京.<|action_start|><|plugin|>\n{"name": "get_weather", "parameters": '
    '{"city": "北京", "days": 3}}<|action_end|>\nOne moment.',
    "apertus": 'Checking 北京.<|tools_prefix|>[{"get_weather": {"city": "北京", "days": 3}}]'
    "<|tools_suffix|>\nOne moment.",
    "harmony": "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary"
    "<|message|>Checking 北京.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
    '<|constrain|>json<|message|>{"city": "北京", "days": 3}<|call|><|start|>assistant<|channel|>final'
    "<|message|>One moment.<|return|>",
}
# these run to the end of the message: text after the list is not shown (docs/text-tool-calls.md)
TO_THE_END = {
    "granite": 'Checking 北京.\n<|tool_call|>[{"name": "get_weather", "arguments": '
    '{"city": "北京", "days": 3}}]',
    "phi4_mini": 'Checking 北京.\nfunctools[{"name": "get_weather", "arguments": '
    '{"city": "北京", "days": 3}}]',
}
MARKUP = ("<", "|", "[", "{", "functools", "call:", "escape", "to=", "analysis", "commentary", "Need the")


def streamed(reply: str) -> tuple[list[str], list[Any], list[int], Any]:
    """Feed `reply` a character at a time: the texts shown, the calls, at which character each
    call arrived (len(reply) for flush()), and the whole parse."""
    parser = StreamingTextCallParser()
    shown, calls, arrived = [], [], []
    for at, char in enumerate(reply):
        update = parser.feed(char)
        shown.append(update.text)
        calls += update.calls
        arrived += [at] * len(update.calls)
    last = parser.flush()
    shown.append(last.text)
    calls += last.calls
    arrived += [len(reply)] * len(last.calls)
    return shown, calls, arrived, parser.finish()


@pytest.mark.parametrize("family", sorted(REPLIES))
def test_a_call_between_text_is_found_and_its_markup_removed(family: str) -> None:
    parsed = parse_text_calls(REPLIES[family])
    assert [(call.name, call.arguments, call.format) for call in parsed.calls] == [(*WEATHER, family)]
    assert parsed.content in ("Checking 北京.\nOne moment.", "Checking 北京.One moment.")


@pytest.mark.parametrize("family", sorted(TO_THE_END))
def test_a_call_list_to_the_end_of_the_message(family: str) -> None:
    parsed = parse_text_calls(TO_THE_END[family])
    assert [(call.name, call.arguments, call.format) for call in parsed.calls] == [(*WEATHER, family)]
    assert parsed.content == "Checking 北京."


@pytest.mark.parametrize("family", sorted({**REPLIES, **TO_THE_END}))
def test_streamed_a_character_at_a_time(family: str) -> None:
    """The stream agrees with the whole parse and never shows markup; a call whose block closes
    arrives as it closes, before the stream ends."""
    reply = {**REPLIES, **TO_THE_END}[family]
    shown, calls, arrived, parsed = streamed(reply)
    assert parsed == parse_text_calls(reply, think_open=False)
    assert "".join(shown) == parsed.content and calls == parsed.calls
    assert not any(marker in piece for piece in shown for marker in MARKUP), shown
    if family in REPLIES:
        assert arrived[0] < len(reply) - len("One moment.")


def test_harmony_analysis_is_reasoning_and_a_preamble_streams_before_its_message_ends() -> None:
    """llama.cpp's gpt-oss tests: `analysis` is reasoning; a `commentary` message without a
    recipient is shown as it comes (it was held until `<|end|>`)."""
    parsed = parse_text_calls(REPLIES["harmony"])
    assert parsed.reasoning == "Need the weather."
    parser = StreamingTextCallParser()
    header = "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>commentary<|message|>"
    assert parser.feed(header).text == ""
    assert parser.feed("Checking the weather ").text == "Checking the weather"
    assert parser.feed("in 北京").text == " in 北京"
    assert parser.finish().reasoning == "Hmm."


@pytest.mark.parametrize(
    ("reply", "calls"),
    [
        # the role header's recipient when the prompt ended with `<|start|>assistant` (llama.cpp)
        (' to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "北京"}', 1),
        (
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
            '{"city": "北京"}<|call|>',
            1,
        ),
        ("I went to=the shop and to Paris.", 0),
    ],
)
def test_harmony_recipient_in_the_role_header(reply: str, calls: int) -> None:
    parsed = parse_text_calls(reply)
    assert [call.name for call in parsed.calls] == ["get_weather"] * calls
    assert streamed(reply)[3] == parse_text_calls(reply, think_open=False)


def test_mistral_think_is_reasoning_even_around_a_call_token() -> None:
    """llama.cpp's Ministral-3 test "fake tool call marker in reasoning": a `[TOOL_CALLS]` inside
    `[THINK]` is part of the thought; only the call after `[/THINK]` runs."""
    reply = (
        '[THINK]Maybe [TOOL_CALLS]get_weather[ARGS]{"city": "x"}?[/THINK]'
        '[TOOL_CALLS]get_weather[ARGS]{"city": "北京", "days": 3}'
    )
    shown, calls, _, parsed = streamed(reply)
    assert [(call.name, call.arguments) for call in calls] == [WEATHER]
    assert parsed.reasoning == 'Maybe [TOOL_CALLS]get_weather[ARGS]{"city": "x"}?' and "".join(shown) == ""


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("", {}),
        ("city:<escape>a, b: {c}<escape>", {"city": "a, b: {c}"}),  # markup-like text inside an escape
        (
            "n:07,f:-2.5e3,ok:true,none:null,word:fast",
            {"n": 7, "f": -2500.0, "ok": True, "none": None, "word": "fast"},
        ),
        ("a:{b:[1,<escape>x<escape>,{c:false}]}", {"a": {"b": [1, "x", {"c": False}]}}),
        ("limit:<escape>10<escape>", {"limit": "10"}),  # escaped: a string, as the template writes strings
    ],
)
def test_functiongemma_argument_syntax(arguments: str, expected: dict[str, Any]) -> None:
    import json

    parsed = parse_text_calls(f"<start_function_call>call:f{{{arguments}}}<end_function_call>")
    assert [(call.name, json.loads(call.arguments)) for call in parsed.calls] == [("f", expected)]


@pytest.mark.parametrize(
    "reply",
    [
        "<start_function_call>call:f{a:" + "[" * 200 + "<end_function_call>",  # nested too deep
        "<start_function_call>call:f{a:[}]}<end_function_call>",
        "<start_function_call>not a call<end_function_call>",
        "<|tool_call_start|>[not python(]<|tool_call_end|>",
        '<|tools_prefix|>[{"get weather!": {}}, 3]<|tools_suffix|>',
    ],
)
def test_a_block_that_holds_no_call_stays_visible_and_never_raises(reply: str) -> None:
    """Decision 3: what the model wrote is shown rather than silently dropped; nothing raises."""
    parsed = parse_text_calls(reply)
    assert parsed.calls == [] and parsed.content == reply.strip()


def test_an_empty_lfm2_list_is_markup() -> None:
    """vLLM's test_empty_tool_call_block: `[]` means no call, and the tokens are never shown."""
    assert (
        parse_text_calls("Nothing to do.<|tool_call_start|>[ ]<|tool_call_end|>").content == "Nothing to do."
    )


def test_prose_that_mentions_functools_is_prose() -> None:
    text = "Use functools.partial, or functools [the module] docs."
    assert parse_text_calls(text).content == text and streamed(text)[3].content == text


CUT = {  # each family's call cut off by the token limit, mid-arguments
    "lfm2": "<|tool_call_start|>[add(a=2, b=",
    "functiongemma": "<start_function_call>call:add{a:2,b:",
    "gemma4": "<|tool_call>call:add{a:2,b:",
    "granite": '<|tool_call|>[{"name": "add", "arguments": {"a": 2, "b": ',
    "internlm2": '<|action_start|><|plugin|>{"name": "add", "parameters": {"a": 2, "b": ',
    "phi4_mini": 'functools[{"name": "add", "arguments": {"a": 2, "b": ',
    "apertus": '<|tools_prefix|>[{"add": {"a": 2, "b": ',
    "harmony": '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "b": ',
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("family", sorted(CUT))
async def test_a_call_cut_off_by_the_token_limit_never_runs(family: str, stream: bool) -> None:
    """Attack: the output limit cuts a call mid-arguments; a repaired half call must not run, and
    its markup must not reach the user. Over HTTP, streamed and not."""
    from hermes_core import Agent, tool
    from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

    ran: list[tuple[int, int]] = []

    @tool(name="add")
    def add_numbers(a: int, b: int) -> int:
        """Add two integers."""
        ran.append((a, b))
        return a + b

    async with FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(f"Adding.\n{CUT[family]}", finish_reason="length"))
        agent = Agent(model="local", base_url=fake.base_url, tools=[add_numbers], stream=stream)
        pieces: list[str] = []
        result = await agent.run("2+3?", on_text=pieces.append)
        await agent.aclose()
    assert ran == []
    shown = "".join(pieces) + str(result.reply)
    assert not any(marker in shown for marker in ("<|", "<start_function", "functools", "to=functions")), (
        shown
    )
