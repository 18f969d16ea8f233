"""The XML-style call families (textcalls/xmlcalls.py) and values typed by the tool's schema.

Where the cases come from: the formats as the model cards' chat templates and the serving stacks'
parsers write them — vLLM `vllm/tool_parsers/{minimax_m2,step3,seed_oss,deepseekv32,longcat,olmo3}_
tool_parser.py` and their tests in `tests/tool_parsers/` (Apache-2.0); the schema rules from the
same tests (`TestAnyOfNullableParam`, `TestStep3ParameterWhitespace`, DSML `string="true|false"`)
and SGLang's `test_glm47_moe_detector.py`. The serving stacks' own cases are rows of the corpus
(tests/data/textcalls/), run by tests/test_textcall_corpus.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from hermes_core.textcalls import StreamingTextCallParser, parse_text_calls

# One call of add(a=2, b=3) as each family writes it.
FAMILIES = {
    "minimax_m2": '<minimax:tool_call>\n<invoke name="add">\n<parameter name="a">2</parameter>\n'
    '<parameter name="b">3</parameter>\n</invoke>\n</minimax:tool_call>',
    "step3": '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="add">'
    '<steptml:parameter name="a">2</steptml:parameter><steptml:parameter name="b">3</steptml:parameter>'
    "</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>",
    "seed_oss": "<seed:tool_call>\n<function=add>\n<parameter=a>2</parameter>\n<parameter=b>3</parameter>\n"
    "</function>\n</seed:tool_call>",
    "deepseek_dsml": '<｜DSML｜function_calls>\n<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" '
    'string="false">2</｜DSML｜parameter>\n<｜DSML｜parameter name="b" string="false">3</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
    "longcat": '<longcat_tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</longcat_tool_call>',
    "olmo3": "<function_calls>add(a=2, b=3)</function_calls>",
}
MARKUP = ("<", ">", "｜", "invoke", "parameter", "function", "tool_call", "DSML")


def _stream(text: str, size: int = 1, **options: Any) -> tuple[str, list[Any], StreamingTextCallParser]:
    parser = StreamingTextCallParser(**options)
    shown, calls = [], []
    for i in range(0, len(text), size):
        update = parser.feed(text[i : i + size])
        shown.append(update.text)
        calls += update.calls
    last = parser.flush()
    return "".join(shown) + last.text, calls + last.calls, parser


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_whole_and_streamed_character_by_character(family: str) -> None:
    """Attack: the family's markup shown as text (the issue: 14 of 151 cases, markup to the user).
    Whole and in 1-character pieces the call is found, by its own parser, the prose around it is
    all that is shown, and the stream agrees with the whole parse."""
    reply = f"Adding 北京 numbers.\n{FAMILIES[family]}\nDone."
    parsed = parse_text_calls(reply)
    assert [(c.name, c.arguments, c.format) for c in parsed.calls] == [("add", '{"a": 2, "b": 3}', family)]
    assert parsed.content == "Adding 北京 numbers.\nDone."
    shown, calls, parser = _stream(reply)
    assert shown == parsed.content and calls == parsed.calls and parser.finish() == parsed


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_call_is_handed_over_only_when_its_block_closes(family: str) -> None:
    """Attack: a call cut off by the token limit runs half-written. At every cut of the block, no
    piece hands over a call and no piece shows markup; the whole reply is the only place a cut
    block can still count (decision 4), and the wrapper keeps its `length` (kernel/guards.py)."""
    block = FAMILIES[family]
    closer_at = block.rfind("</") if not block.endswith("｜>") else block.rfind("<｜")
    for cut in range(1, closer_at):
        parser = StreamingTextCallParser()
        released = [parser.feed(ch) for ch in "Ok " + block[:cut]]
        assert not any(update.calls for update in released), (family, cut)
        shown = "".join(update.text for update in released)
        assert shown == "Ok"[: len(shown)], (family, cut, shown)


def test_seed_names_as_attributes() -> None:
    """The hosted Doubao Seed models (Volcengine's OpenAI-compatible endpoint, as its clients record
    the replies) name the function and its parameters in attributes, with DSML's `string`
    attribute; the block must still be a call and never shown."""
    reply = (
        'Clicking.<seed:tool_call><function name="click"><parameter name="point" string="true">'
        "<point>500 500</point></parameter></function></seed:tool_call>"
    )
    parsed = parse_text_calls(reply)
    assert parsed.content == "Clicking."
    assert [(c.name, c.arguments) for c in parsed.calls] == [("click", '{"point": "<point>500 500</point>"}')]


@pytest.mark.parametrize("family", sorted(FAMILIES))
async def test_each_family_completes_a_task_over_http(family: str) -> None:
    """Attack: a model served without its tool parser writes its family's markup. Over HTTP to the
    fake OpenAI-compatible server, streamed and not, the tool runs once and no markup is shown."""
    from hermes_core import Agent, tool
    from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest

    def model(request: RecordedRequest) -> FakeReply:
        last = request.messages[-1]
        if last["role"] == "tool" or "<tool_response>" in str(last.get("content")):
            return FakeReply.text("The sum is 5.")
        return FakeReply.text(f"Let me add them.\n{FAMILIES[family]}")

    ran: list[tuple[int, int]] = []

    @tool(name="add")
    def add_numbers(a: int, b: int) -> int:
        """Add two integers."""
        ran.append((a, b))
        return a + b

    for stream in (False, True):
        ran.clear()
        async with FakeOpenAIServer(handler=model) as fake:
            agent = Agent(model="local", base_url=fake.base_url, tools=[add_numbers], stream=stream)
            pieces: list[str] = []
            result = await agent.run("2+3?", on_text=pieces.append)
            await agent.aclose()
        assert ran == [(2, 3)] and result.reply == "The sum is 5.", (stream, result.reply)
        shown = "".join(pieces) + "".join(
            str(m.get("content") or "") for m in result.messages if m["role"] == "assistant"
        )
        assert not any(marker in shown for marker in MARKUP), (stream, shown)


async def test_a_cut_off_call_never_runs_over_http() -> None:
    """Attack: the token limit cuts a MiniMax call after its first parameter; the reply ends with
    `finish_reason: "length"`. The half-written call must not run (the model is told it was cut)."""
    from hermes_core import Agent, tool
    from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

    ran: list[str] = []

    @tool
    def delete_file(path: str, confirm: bool) -> str:
        """Delete a file."""
        ran.append(path)
        return "deleted"

    cut = '<minimax:tool_call><invoke name="delete_file"><parameter name="path">/tmp/x</parameter>'
    replies = [FakeReply.text(cut, finish_reason="length"), FakeReply.text("Stopped.")]
    async with FakeOpenAIServer(
        handler=lambda request: replies.pop(0) if replies else FakeReply.text("ok")
    ) as fake:
        agent = Agent(model="local", base_url=fake.base_url, tools=[delete_file])
        await agent.run("delete /tmp/x")
        await agent.aclose()
    assert ran == []


# ── Values typed by the offered tool's schema ────────────────────────────────────────────────────


def _tool(name: str, **properties: Any) -> dict[str, Any]:
    schema = {"type": "object", "properties": properties}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


TOOLS = [
    _tool(
        "save",
        code={"type": "string"},
        flag={"type": "string"},
        count={"type": "integer"},
        ratio={"type": "number"},
        on={"type": "boolean"},
        tags={"type": "array"},
        meta={"type": "object"},
        nick={"anyOf": [{"type": "string"}, {"type": "null"}]},
        free={},
    )
]
VALUES = {"code": "1", "flag": "true", "count": " 42 ", "ratio": "2.5", "on": "false",
          "tags": "['a', 'b']", "meta": '{"k": 1}', "nick": "null", "free": "7", "extra": "8"}  # fmt: skip
TYPED = {"code": "1", "flag": "true", "count": 42, "ratio": 2.5, "on": False,
         "tags": ["a", "b"], "meta": {"k": 1}, "nick": None, "free": 7, "extra": 8}  # fmt: skip


def written(head: str, parameter: str, tail: str) -> str:
    """`save` with VALUES: `head`, each value as `parameter` ({k}: its name, {v}: its text), `tail`."""
    return head + "".join(parameter.format(k=k, v=v) for k, v in VALUES.items()) + tail


WRITTEN = {  # `save` with VALUES in each format that writes values as text
    "qwen3_coder": written(
        "<tool_call><function=save>", "<parameter={k}>{v}</parameter>", "</function></tool_call>"
    ),
    "glm": written("<tool_call>save", "<arg_key>{k}</arg_key><arg_value>{v}</arg_value>", "</tool_call>"),
    "minimax_m2": written(
        '<minimax:tool_call><invoke name="save">',
        '<parameter name="{k}">{v}</parameter>',
        "</invoke></minimax:tool_call>",
    ),
    "step3": written(
        '<｜tool_calls_begin｜><｜tool_call_begin｜><steptml:invoke name="save">',
        '<steptml:parameter name="{k}">{v}</steptml:parameter>',
        "</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>",
    ),
    "seed_oss": written(
        "<seed:tool_call><function=save>", "<parameter={k}>{v}</parameter>", "</function></seed:tool_call>"
    ),
    "deepseek_dsml": written(
        '<｜DSML｜function_calls><｜DSML｜invoke name="save">',
        '<｜DSML｜parameter name="{k}" string="true">{v}</｜DSML｜parameter>',
        "</｜DSML｜invoke></｜DSML｜function_calls>",
    ),
}


@pytest.mark.parametrize("family", sorted(WRITTEN))
def test_values_are_typed_by_the_schema(family: str) -> None:
    """Attack: a string parameter whose value reads `1` or `true` reached the tool as a number or a
    boolean (the issue: two upstream cases typed "1" by the schema). With the request's tools, each
    declared type decides, as in vLLM's and SGLang's parsers: `string` stays text, `integer`,
    `number`, `boolean`, `array` (a Python literal too), `object` and `null` in `anyOf` are decoded;
    a parameter the schema leaves untyped or does not list keeps the guess (DSML's `string="true"`
    says text). Whole and streamed."""
    import json

    parsed = parse_text_calls(WRITTEN[family], tools=TOOLS)
    guessed = {"free": "7", "extra": "8"} if family == "deepseek_dsml" else {}
    assert json.loads(parsed.calls[0].arguments) == TYPED | guessed
    _, calls, _ = _stream(WRITTEN[family], size=3, tools=TOOLS)
    assert calls == parsed.calls and [c.arguments for c in calls] == [parsed.calls[0].arguments]


def test_without_the_schema_values_are_guessed() -> None:
    """No tools (or a tool that is not offered): today's guess, so `1` is a number."""
    for tools in (None, [_tool("other", code={"type": "string"})]):
        parsed = parse_text_calls(WRITTEN["minimax_m2"], tools=tools)
        assert parsed.calls[0].arguments.startswith('{"code": 1, "flag": true, "count": 42')


def test_a_string_keeps_its_whitespace_where_the_value_is_inline() -> None:
    """vLLM `TestStep3ParameterWhitespace`: the value sits inline between the tags, so a string's
    leading and trailing whitespace is data (exact-match edit tools need it); numbers and booleans
    around whitespace are still decoded."""
    import json

    tools = [_tool("edit_file", old_string={"type": "string"}, indent={"type": "integer"},
                   enabled={"type": "boolean"})]  # fmt: skip
    for value in ("    if x:", "return 1\n", "hello ", "hello\u00a0"):
        reply = (
            "<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>edit_file\n"
            '<steptml:invoke name="edit_file">'
            f'<steptml:parameter name="old_string">{value}</steptml:parameter>'
            '<steptml:parameter name="indent"> 4 </steptml:parameter>'
            '<steptml:parameter name="enabled"> true </steptml:parameter>'
            "</steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>"
        )
        arguments = json.loads(parse_text_calls(reply, tools=tools).calls[0].arguments)
        assert arguments == {"old_string": value, "indent": 4, "enabled": True}


async def test_a_string_parameter_reaches_the_tool_as_a_string_over_http() -> None:
    """Attack: a postcode `01234`-style string written `1` reached a `str` parameter as the number 1,
    so the kernel refused the call. Over HTTP, streamed and not, the tool gets the text `"1"`."""
    from hermes_core import Agent, tool
    from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest

    call = (
        '<minimax:tool_call><invoke name="lookup"><parameter name="code">1</parameter>'
        "</invoke></minimax:tool_call>"
    )

    def model(request: RecordedRequest) -> FakeReply:
        last = request.messages[-1]
        answered = last["role"] == "tool" or "<tool_response>" in str(last.get("content"))
        return FakeReply.text("Found." if answered else call)

    got: list[object] = []

    @tool
    def lookup(code: str) -> str:
        """Look a code up."""
        got.append(code)
        return "a code"

    for stream in (False, True):
        got.clear()
        async with FakeOpenAIServer(handler=model) as fake:
            agent = Agent(model="local", base_url=fake.base_url, tools=[lookup], stream=stream)
            result = await agent.run("look up 1")
            await agent.aclose()
        assert got == ["1"] and result.reply == "Found.", (stream, got, result.reply)


# ── Linear time ──────────────────────────────────────────────────────────────────────────────────

MEGABYTE = 1_000_000
WORST = {  # per family: a 1 MB reply built to make a careless scan quadratic
    "minimax_m2": "<minimax:tool_call>" + '<invoke name="f"><parameter name="a">' + " " * MEGABYTE,
    "minimax_m2 unclosed parameters": '<minimax:tool_call><invoke name="f">'
    + '<parameter name="a">x' * (MEGABYTE // 21),
    "minimax_m2 unclosed invokes": "<minimax:tool_call>" + '<invoke name="f">' * (MEGABYTE // 17),
    "seed_oss unclosed parameters": "<seed:tool_call><function=f>" + "<parameter=a>x" * (MEGABYTE // 14),
    "step3": "<｜tool_calls_begin｜>" + "function<｜tool_sep｜>" * (MEGABYTE // 20),
    "step3 gap": "<｜tool_calls_begin｜>function" + " " * MEGABYTE + '?<steptml:invoke name="f">',
    "seed_oss": "<seed:tool_call><function=f><parameter=a>" + "\n" * MEGABYTE,
    "seed think": "<seed:think>" + "<seed:thi" * (MEGABYTE // 9),
    "deepseek_dsml": '<｜DSML｜function_calls><｜DSML｜invoke name="' + "a" * MEGABYTE,
    "dsml attributes": '<｜DSML｜function_calls><｜DSML｜invoke name="f"><｜DSML｜parameter '
    + "name=x " * (MEGABYTE // 7),
    "longcat": "<longcat_tool_call>" + "[" * MEGABYTE,
    "olmo3": "<function_calls>" + "f(a=" * (MEGABYTE // 4),
    "olmo3 lines": "<function_calls>" + "f(a=1)\n" * (MEGABYTE // 7),
}


@pytest.mark.parametrize("case", sorted(WORST))
def test_a_megabyte_worst_case_parses_in_linear_time(case: str) -> None:
    """Attack: model output is attacker-influenced (prompt injection); a padded value or a run of
    partial markers must not stall a worker. Whole, and streamed in 64 KB pieces, each 1 MB worst
    case parses well under a second (the issue's bound is 100 ms per format on a quiet machine;
    this shared test machine gets ten times that)."""
    text = WORST[case]
    started = time.perf_counter()
    parse_text_calls(text)
    whole = time.perf_counter() - started
    started = time.perf_counter()
    _stream(text, size=65_536)
    streamed = time.perf_counter() - started
    assert whole < 1.0 and streamed < 1.0, (case, whole, streamed)
