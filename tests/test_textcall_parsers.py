"""Text tool calls: every format, the <think> rules and each ambiguity decision, as one table.

`CASES` rows are `(format, case, text, expected)`: `format` is the parser expected to find the calls
(or `think` / `decision` for rows about the rules), so a formats × cases table can be printed from
it. docs/text-tool-calls.md explains each decision; its examples run here too.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_core.kernel.messages import ToolCall
from hermes_core.textcalls import PARSERS, ParsedText, Tag, TagParser, parse_text_calls, register_parser
from hermes_core.textcalls.parsers import FoundCall, literal_tag, parse_selected, select_parsers

DOC = Path(__file__).resolve().parents[1] / "docs" / "text-tool-calls.md"


class Expected(NamedTuple):
    content: str
    calls: list[tuple[str, str]] = []  # (name, arguments text exactly as returned)
    reasoning: str | None = None


W = '{"name": "get_weather", "arguments": {"city": "北京"}}'  # a Hermes call, reused below
WEATHER = ("get_weather", '{"city": "北京"}')
ADD = ("add", '{"a": 1, "b": 2}')

CASES: list[tuple[str, str, str, Expected]] = [
    # ── 1. Hermes / Qwen2.5 ──────────────────────────────────────────────────────────────────────
    ("hermes", "single", f"<tool_call>\n{W}\n</tool_call>", Expected("", [WEATHER])),
    (
        "hermes",
        "several with prose around",
        f'Let me check.\n<tool_call>\n{W}\n</tool_call>\n<tool_call>\n{{"name": "add", "arguments": '
        '{"a": 1, "b": 2}}\n</tool_call>\nOne moment.',
        Expected("Let me check.\nOne moment.", [WEATHER, ADD]),
    ),
    ("hermes", "unclosed at end", f"Checking.\n<tool_call>\n{W}", Expected("Checking.", [WEATHER])),
    (
        "hermes",
        "unclosed and cut mid-JSON (repaired)",
        '<tool_call>{"name": "search", "arguments": {"q": "北',
        Expected("", [("search", '{"q": "北"}')]),
    ),
    (
        "hermes",
        "arguments as a JSON string",
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>',
        Expected("", [ADD]),
    ),
    (
        "hermes",
        "single-quoted Python dict",
        "<tool_call>{'name': 'add', 'arguments': {'a': 1, 'b': 2}}</tool_call>",
        Expected("", [ADD]),
    ),
    (
        "hermes",
        "CJK kept unescaped",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "\\u5317\\u4eac"}}</tool_call>',
        Expected("", [WEATHER]),
    ),
    (
        "hermes",
        "parameters alias, no arguments key",
        '<tool_call>{"name": "add", "parameters": {"a": 1, "b": 2}}</tool_call> <tool_call>{"name": "now"}'
        "</tool_call>",
        Expected("", [ADD, ("now", "{}")]),
    ),
    (
        "hermes",
        "list in one block",
        f'<tool_call>[{W}, {{"name": "add", "arguments": {{"a": 1, "b": 2}}}}]</tool_call>',
        Expected("", [WEATHER, ADD]),
    ),
    (
        "hermes",
        "trailing comma and extra brace (repaired)",
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2,}}}</tool_call>',
        Expected("", [ADD]),
    ),
    (
        "hermes",
        "fenced payload inside the tag",
        f"<tool_call>\n```json\n{W}\n```\n</tool_call>",
        Expected("", [WEATHER]),
    ),
    (
        "hermes",
        "malformed next to valid stays visible",
        f"A <tool_call>I will call the weather tool</tool_call> B <tool_call>{W}</tool_call> C",
        Expected("A <tool_call>I will call the weather tool</tool_call> B C", [WEATHER]),
    ),
    (
        "hermes",
        "object without a name stays visible",
        '<tool_call>{"tool": "x", "arguments": {}}</tool_call>',
        Expected('<tool_call>{"tool": "x", "arguments": {}}</tool_call>'),
    ),
    (
        "hermes",
        "unknown name still returned",
        '<tool_call>{"name": "launch_rocket", "arguments": {}}</tool_call>',
        Expected("", [("launch_rocket", "{}")]),
    ),
    (
        "hermes",
        "unrecoverable arguments passed through",
        '<tool_call>{"name": "add", "arguments": "one and two"}</tool_call>',
        Expected("", [("add", "one and two")]),
    ),
    (
        "hermes",
        "OpenAI wire shape",
        '<tool_call>{"type": "function", "function": {"name": "add", '
        '"arguments": "{\\"a\\": 1, \\"b\\": 2}"}}</tool_call>',
        Expected("", [ADD]),
    ),
    # ── 2. Wrappers seen from local models ───────────────────────────────────────────────────────
    (
        "function_tag",
        "function=name",
        'Sure. <function=get_weather>{"city": "北京"}</function>',
        Expected("Sure.", [WEATHER]),
    ),
    (
        "function_tag",
        'function name="…"',
        '<function name="get_weather">{"city": "北京"}</function>\n<function name=\'add\'>{"a": 1, "b": 2}'
        "</function>",
        Expected("", [WEATHER, ADD]),
    ),
    ("function_tag", "empty object", "<function=now>{}</function>", Expected("", [("now", "{}")])),
    (
        "function_tag",
        "unclosed at end",
        'Running.\n<function=get_weather>{"city": "北京"}',
        Expected("Running.", [WEATHER]),
    ),
    (
        "function_tag",
        "body not an object stays visible",
        "<function=get_weather>Beijing</function>",
        Expected("<function=get_weather>Beijing</function>"),
    ),
    ("tool_tags", "tool", f"<tool>{W}</tool>", Expected("", [WEATHER])),
    (
        "tool_tags",
        "tools holding a list",
        f'<tools>[{W}, {{"name": "add", "parameters": {{"a": 1, "b": 2}}}}]</tools>',
        Expected("", [WEATHER, ADD]),
    ),
    ("tool_tags", "function_call", f"Ok <function_call>{W}</function_call>", Expected("Ok", [WEATHER])),
    (
        "tool_tags",
        "malformed next to valid",
        f"<tool>oops</tool>\n<tool>{W}</tool>",
        Expected("<tool>oops</tool>", [WEATHER]),
    ),
    ("json", "fenced json", f"```json\n{W}\n```", Expected("", [WEATHER])),
    (
        "json",
        "plain fence holding a list",
        f'```\n[{W}, {{"name": "add", "arguments": {{"a": 1, "b": 2}}}}]\n```',
        Expected("", [WEATHER, ADD]),
    ),
    ("json", "bare object", f"  {W}\n", Expected("", [WEATHER])),
    ("json", "fence cut off at the end", f"```json\n{W}", Expected("", [WEATHER])),
    # ── 3. Llama 3.1 JSON, Mistral, pythonic, Qwen3-Coder ────────────────────────────────────────
    (
        "json",
        "llama 3.1 parameters",
        '{"name": "get_weather", "parameters": {"city": "北京"}}',
        Expected("", [WEATHER]),
    ),
    (
        "json",
        "llama 3.1 several separated by ;",
        '{"name": "get_weather", "parameters": {"city": "北京"}}; '
        '{"name": "add", "parameters": {"a": 1, "b": 2}}',
        Expected("", [WEATHER, ADD]),
    ),
    (
        "json",
        "llama 3.1 single quotes",
        "{'name': 'add', 'parameters': {'a': 1, 'b': 2}}",
        Expected("", [ADD]),
    ),
    (
        "mistral",
        "json list",
        f'[TOOL_CALLS][{W}, {{"name": "add", "arguments": {{"a": 1, "b": 2}}, "id": "abc123XYZ"}}]',
        Expected("", [WEATHER, ADD]),
    ),
    (
        "mistral",
        "name[ARGS] form, several",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "北京"}[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}',
        Expected("", [WEATHER, ADD]),
    ),
    (
        "mistral",
        "prose before the token",
        'I will look it up.[TOOL_CALLS]get_weather[ARGS]{"city": "北京"}',
        Expected("I will look it up.", [WEATHER]),
    ),
    (
        "mistral",
        "cut off mid-JSON (repaired)",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "北京"',
        Expected("", [WEATHER]),
    ),
    ("mistral", "a bare token is removed (it was shown to the user)", "[TOOL_CALLS]", Expected("")),
    (
        "mistral",
        "unreadable text after the token is shown without it",
        "Hi [TOOL_CALLS] oops",
        Expected("Hi oops"),
    ),
    (
        "pythonic",
        "llama 3.2 list",
        '[get_weather(city="北京"), add(a=1, b=2)]',
        Expected("", [WEATHER, ADD]),
    ),
    ("pythonic", "no arguments", "[now()]", Expected("", [("now", "{}")])),
    (
        "pythonic",
        "literals of every kind",
        "[f(x=None, y=True, z=[1, 2.5], w={'k': 'v'})]",
        Expected("", [("f", '{"x": null, "y": true, "z": [1, 2.5], "w": {"k": "v"}}')]),
    ),
    (
        "pythonic",
        "non-literal value: the call keeps the model's text for the kernel to refuse (never evaluated)",
        "[get_weather(city=input())]",
        Expected("", [("get_weather", "city=input()")]),
    ),
    (
        "pythonic",
        "positional argument is not a call",
        '[get_weather("北京")]',
        Expected('[get_weather("北京")]'),
    ),
    (
        "qwen3_coder",
        "xml parameters",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n北京\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n</function>\n</tool_call>",
        Expected("", [("get_weather", '{"city": "北京", "days": 3}')]),
    ),
    (
        "qwen3_coder",
        "value types and multi-line text",
        "<tool_call>\n<function=f>\n<parameter=on>\ntrue\n</parameter>\n<parameter=opts>\n"
        '{"a": [1]}\n</parameter>\n<parameter=word>\nnull\n</parameter>\n<parameter=text>\n\nline 1\n'
        "line 2\n\n</parameter>\n</function>\n</tool_call>",
        Expected("", [("f", '{"on": true, "opts": {"a": [1]}, "word": "null", "text": "line 1\\nline 2"}')]),
    ),
    (
        "qwen3_coder",
        "several with prose",
        "Two calls.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n北京\n</parameter>\n</function>\n"
        "</tool_call>\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n"
        "</parameter>\n</function>\n</tool_call>",
        Expected("Two calls.", [WEATHER, ADD]),
    ),
    (
        "qwen3_coder",
        "bare function tag",
        "<function=get_weather>\n<parameter=city>\n北京\n</parameter>\n</function>",
        Expected("", [WEATHER]),
    ),
    (
        "qwen3_coder",
        "no parameters",
        "<tool_call>\n<function=now>\n</function>\n</tool_call>",
        Expected("", [("now", "{}")]),
    ),
    (
        "qwen3_coder",
        "cut off at the end",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n北京",
        Expected("", [WEATHER]),
    ),
    # ── 4. <think> ───────────────────────────────────────────────────────────────────────────────
    (
        "think",
        "block removed, reasoning returned",
        "<think>\nThe user wants weather.\n</think>\n\nIt is sunny.",
        Expected("It is sunny.", reasoning="The user wants weather."),
    ),
    (
        "think",
        "calls inside think are not parsed",
        f"<think>Maybe <tool_call>{W}</tool_call>?</think>No call needed.",
        Expected("No call needed.", reasoning=f"Maybe <tool_call>{W}</tool_call>?"),
    ),
    (
        "think",
        "call after think is parsed",
        f"<think>Need the weather.</think>\n<tool_call>{W}</tool_call>",
        Expected("", [WEATHER], "Need the weather."),
    ),
    (
        "think",
        "unclosed at start runs to the end",
        "<think>Still thinking…",
        Expected("", reasoning="Still thinking…"),
    ),
    (
        "think",
        "stray </think>: everything before is reasoning",
        f"The template opened it.</think>\n\nHere.<tool_call>{W}</tool_call>",
        Expected("Here.", [WEATHER], "The template opened it."),
    ),
    (
        "think",
        "several blocks joined",
        "<think>one</think>A <think>two</think>B",
        Expected("A B", reasoning="one\n\ntwo"),
    ),
    ("think", "empty block gives no reasoning", "<think>\n\n</think>\n\nHi.", Expected("Hi.")),
    # ── 6. Ambiguity decisions ───────────────────────────────────────────────────────────────────
    ("decision", "bare JSON after prose is not a call", f"For example: {W}", Expected(f"For example: {W}")),
    (
        "decision",
        "fenced JSON after prose is not a call",
        f"Call it like this:\n```json\n{W}\n```",
        Expected(f"Call it like this:\n```json\n{W}\n```"),
    ),
    (
        "decision",
        "fenced JSON followed by prose is not a call",
        f"```json\n{W}\n```\nThat is the format.",
        Expected(f"```json\n{W}\n```\nThat is the format."),
    ),
    (
        "decision",
        "a JSON call followed by prose is a call, and the prose is shown (Llama 3 goes on talking)",
        f"{W}\nThat is how a call looks.",
        Expected("That is how a call looks.", [WEATHER]),
    ),
    (
        "decision",
        "pythonic after prose is not a call",
        "Try [get_weather(city='北京')]",
        Expected("Try [get_weather(city='北京')]"),
    ),
    (
        "decision",
        "JSON data with a name is not a call",
        '{"name": "Alice", "age": 30}',
        Expected('{"name": "Alice", "age": 30}'),
    ),
    (
        "decision",
        "bare object with extra keys is not a call",
        '{"name": "add", "arguments": {}, "note": "x"}',
        Expected('{"name": "add", "arguments": {}, "note": "x"}'),
    ),
    (
        "decision",
        "tag-wrapped calls count anywhere, even in a fence",
        f"Here:\n```xml\n<tool_call>{W}</tool_call>\n```",
        Expected("Here:\n```xml\n```", [WEATHER]),
    ),
    (
        "decision",
        "a name that is not a tool name is not a call",
        '<tool_call>{"name": "look up the weather", "arguments": {}}</tool_call>',
        Expected('<tool_call>{"name": "look up the weather", "arguments": {}}</tool_call>'),
    ),
    (
        "decision",
        "unclosed opening tag that holds no call stays visible",
        "Use the `<tool_call>` tag to call tools.",
        Expected("Use the `<tool_call>` tag to call tools."),
    ),
    (
        "decision",
        "text after a Mistral call list is not shown",
        f"[TOOL_CALLS][{W}] Waiting for the result.",
        Expected("", [WEATHER]),
    ),
    (
        "decision",
        "whitespace around removed calls collapses to the longer side",
        f"Checking both.\n\n<tool_call>{W}</tool_call>\n<tool_call>{W}</tool_call>\n\nDone.",
        Expected("Checking both.\n\nDone.", [WEATHER, WEATHER]),
    ),
    # ── Bugs found against the serving stacks' tests: one row each ──────────────────────────────
    (
        "hermes",
        "broken JSON whose repair gives array arguments is no call",
        '<tool_call>{"name": "f" "arguments" [1, 2]}</tool_call>',
        Expected('<tool_call>{"name": "f" "arguments" [1, 2]}</tool_call>'),
    ),
    (
        "decision",
        "prose inside the tag is no call, even around braces json-repair would turn into a call",
        "<tool_call>I'll use the get_weather tool: {name: get_weather}</tool_call>",
        Expected("<tool_call>I'll use the get_weather tool: {name: get_weather}</tool_call>"),
    ),
    (
        "decision",
        "prose around a JSON object inside the tag is no call",
        '<tool_call>Sure, {"name": "get_weather"} it is</tool_call>',
        Expected('<tool_call>Sure, {"name": "get_weather"} it is</tool_call>'),
    ),
    (
        "hermes",
        "one junk entry in a list keeps the valid calls",
        f'<tool_call>[{W}, 5, "junk"]</tool_call>',
        Expected("", [WEATHER]),
    ),
    (
        "pythonic",
        "one bad call keeps its valid neighbour",
        '[get_weather(city="北京"), add(a=b)]',
        Expected("", [WEATHER, ("add", "a=b")]),
    ),
    (
        "hermes",
        "1e999 stays its own text, never Infinity",
        '<tool_call>{"name": "f", "arguments": {"x": 1e999}}</tool_call>',
        Expected("", [("f", '{"x": "1e999"}')]),
    ),
    (
        "qwen3_coder",
        "indented values and a misspelled closing tag",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n    北京\n    </paramter>\n"
        "</function>\n</tool_call>",
        Expected("", [WEATHER]),
    ),
    (
        "json",
        "a JSON call followed by prose",
        '{"name": "get_weather", "parameters": {"city": "北京"}} Would you like more?',
        Expected("Would you like more?", [WEATHER]),
    ),
    (
        "decision",
        "a markdown link is no call",
        "[docs](https://x.y) say so.",
        Expected("[docs](https://x.y) say so."),
    ),
    # ── Llama call tokens ────────────────────────────────────────────────────────────────────────
    (
        "llama_tokens",
        "<|python_tag|> with Llama 3.1 JSON",
        'Sure.<|python_tag|>{"name": "get_weather", "parameters": {"city": "北京"}}<|eom_id|>',
        Expected("Sure.", [WEATHER]),
    ),
    (
        "llama_tokens",
        "<|python_start|> with a Llama 4 pythonic list",
        '<|python_start|>[get_weather(city="北京"), add(a=1, b=2)]<|python_end|>',
        Expected("", [WEATHER, ADD]),
    ),
    # ── llama.cpp's generic wrappers ────────────────────────────────────────────────────────────
    ("tool_tags", "<response>", f"<response>{W}</response>", Expected("", [WEATHER])),
    ("tool_tags", "<json>", f"<json>{W}</json>", Expected("", [WEATHER])),
    ("tool_tags", "<xml>", f"<xml>{W}</xml>", Expected("", [WEATHER])),
    (
        "decision",
        "<json> around data that is no call stays visible",
        '<json>{"a": 1}</json>',
        Expected('<json>{"a": 1}</json>'),
    ),
    (
        "decision",
        "<response> around data with a name is no call (the generic wrappers need arguments)",
        '<response>{"name": "Alice"}</response>',
        Expected('{"name": "Alice"}'),
    ),
    (
        "tool_tags",
        "<response> without a call is the reply, shown without the tags (IBM Granite)",
        "<think>hm</think><response>Hello, world!</response>",
        Expected("Hello, world!", reasoning="hm"),
    ),
    ("tool_tags", "<tool_calls> (Apriel)", f"<tool_calls>[{W}]</tool_calls>", Expected("", [WEATHER])),
    ("tool_tags", "<TOOLCALL> (Nemotron)", f"<TOOLCALL>[{W}]</TOOLCALL>", Expected("", [WEATHER])),
    (
        "decision",
        "<xml> around markup that is no call stays visible",
        "<xml><a>1</a></xml>",
        Expected("<xml><a>1</a></xml>"),
    ),
    # ── GLM-4.5/4.6/4.7 ─────────────────────────────────────────────────────────────────────────
    (
        "glm",
        "GLM-4.5 key/value tags",
        "Checking.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n</tool_call>",
        Expected("Checking.", [WEATHER]),
    ),
    (
        "glm",
        "GLM-4.7 without newlines, typed values",
        "<tool_call>add<arg_key>a</arg_key><arg_value>1</arg_value><arg_key>b</arg_key><arg_value>2</arg_value></tool_call>",
        Expected("", [ADD]),
    ),
    ("glm", "no arguments", "<tool_call>now\n</tool_call>", Expected("", [("now", "{}")])),
    # ── Kimi-K2 ──────────────────────────────────────────────────────────────────────────────────
    (
        "kimi_k2",
        "section with two calls, one with a malformed id",
        "Checking. <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "北京"}<|tool_call_end|><|tool_call_begin|>functions.bad.1'
        "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
        Expected("Checking.", [WEATHER]),
    ),
    # ── DeepSeek ─────────────────────────────────────────────────────────────────────────────────
    (
        "deepseek",
        "V3 with a fenced payload",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "北京"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        Expected("", [WEATHER]),
    ),
    (
        "deepseek",
        "V3.1 with the name first",
        'Ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 1, "b": 2}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        Expected("Ok", [ADD]),
    ),
    # ── gpt-oss (harmony) ───────────────────────────────────────────────────────────────────────
    (
        "harmony",
        "analysis, a call and a final message",
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city": "北京"}<|call|>'
        "<|start|>assistant<|channel|>final<|message|>Checking.<|return|>",
        Expected("Checking.", [WEATHER], "Need the weather."),
    ),
    (
        "harmony",
        "recipient in the role header, the role in the prompt",
        ' to=functions.add<|channel|>commentary <|constrain|>json<|message|>{"a": 1, "b": 2}<|call|>',
        Expected("", [ADD]),
    ),
    (
        "harmony",
        "a commentary preamble is visible, its end token removed",
        "<|channel|>commentary<|message|>Let me add.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.add <|constrain|>json<|message|>{"a": 1, "b": 2}<|call|>',
        Expected("Let me add.", [ADD]),
    ),
    (
        "harmony",
        "a call on the analysis channel is a call",
        '<|channel|>analysis to=functions.add <|constrain|>json<|message|>{"a": 1, "b": 2}',
        Expected("", [ADD]),
    ),
    (
        "harmony",
        "prose that says to= is prose",
        "Set it to=5 or go to Paris.",
        Expected("Set it to=5 or go to Paris."),
    ),
    (
        "harmony",
        "recipient before the channel",
        '<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{"a": 1, "b": 2}<|call|>',
        Expected("", [ADD]),
    ),
    # ── XML-style families of newer models (xmlcalls.py) ──────────────────────────────────────────
    (
        "minimax_m2",
        "two invokes in one block, prose before",
        'Checking.\n<minimax:tool_call>\n<invoke name="get_weather">\n'
        '<parameter name="city">北京</parameter>\n</invoke>\n<invoke name="add">'
        '<parameter name="a">1</parameter><parameter name="b">2</parameter></invoke>\n</minimax:tool_call>',
        Expected("Checking.", [WEATHER, ADD]),
    ),
    (
        "minimax_m2",
        "prose inside the block is no call",
        "<minimax:tool_call>I would call it</minimax:tool_call>",
        Expected("<minimax:tool_call>I would call it</minimax:tool_call>"),
    ),
    (
        "step3",
        "header, two calls, separator token",
        "<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>"
        '<steptml:invoke name="get_weather"><steptml:parameter name="city">北京</steptml:parameter>'
        "</steptml:invoke><｜tool_call_end｜><｜tool_sep｜><｜tool_call_begin｜>"
        '<steptml:invoke name="add"><steptml:parameter name="a">1</steptml:parameter>'
        '<steptml:parameter name="b">2</steptml:parameter></steptml:invoke>'
        "<｜tool_call_end｜><｜tool_calls_end｜>",
        Expected("", [WEATHER, ADD]),
    ),
    (
        "seed_oss",
        "reasoning in seed:think, call after it",
        "<seed:think>The user wants <seed:tool_call>x</seed:tool_call> weather.</seed:think>\n"
        "<seed:tool_call>\n<function=get_weather>\n<parameter=city>北京</parameter>\n</function>\n</seed:tool_call>",
        Expected("", [WEATHER], "The user wants <seed:tool_call>x</seed:tool_call> weather."),
    ),
    (
        "deepseek_dsml",
        "string=true is text, string=false JSON",
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="add">\n'
        '<｜DSML｜parameter name="a" string="false">1</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="b" string="true">2</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        Expected("", [("add", '{"a": 1, "b": "2"}')]),
    ),
    (
        "longcat",
        "JSON in its own tag",
        f"Ok <longcat_tool_call>{W}</longcat_tool_call>",
        Expected("Ok", [WEATHER]),
    ),
    (
        "olmo3",
        "one call per line, JSON words, a bad line dropped",
        "<function_calls>get_weather(city='北京')\nadd(a=1, b=2)\nnote(done=true, x=null)\nbad(x=b'z')"
        "</function_calls>",
        Expected("", [WEATHER, ADD, ("note", '{"done": true, "x": null}')]),
    ),
    # ── token formats of newer small models (textcalls/tokens.py) ────────────────────────────────
    ("lfm2", "pythonic list", "<|tool_call_start|>[add(a=1, b=2)]<|tool_call_end|>", Expected("", [ADD])),
    (
        "functiongemma",
        "template syntax",
        "Ok <start_function_call>call:add{a:1,b:2}<end_function_call>",
        Expected("Ok", [ADD]),
    ),
    (
        "gemma4",
        "string escapes and a thought",
        "<|channel>thought\nAdd.<channel|><|tool_call>call:add{a:1,b:2}<tool_call|>",
        Expected("", [ADD], "Add."),
    ),
    (
        "granite",
        "list to the end",
        '<|tool_call|>[{"name": "add", "arguments": {"a": 1, "b": 2}}]',
        Expected("", [ADD]),
    ),
    (
        "internlm2",
        "plugin call",
        '<|action_start|><|plugin|>\n{"name": "add", "parameters": {"a": 1, "b": 2}}<|action_end|>',
        Expected("", [ADD]),
    ),
    (
        "phi4_mini",
        "functools list",
        'functools[{"name": "add", "arguments": {"a": 1, "b": 2}}]',
        Expected("", [ADD]),
    ),
    (
        "apertus",
        "name-keyed objects",
        '<|tools_prefix|>[{"add": {"a": 1, "b": 2}}]<|tools_suffix|>',
        Expected("", [ADD]),
    ),
    ("decision", "plain text is only trimmed", "  Hello,\n\n  world.  \n", Expected("Hello,\n\n  world.")),
]


@pytest.mark.parametrize(
    ("fmt", "case", "text", "expected"), CASES, ids=[f"{f}: {c}" for f, c, _, _ in CASES]
)
def test_case(fmt: str, case: str, text: str, expected: Expected) -> None:
    parsed = parse_text_calls(text)
    assert parsed.content == expected.content
    assert [(call.name, call.arguments) for call in parsed.calls] == expected.calls
    assert parsed.reasoning == expected.reasoning
    if fmt in PARSERS:
        assert {call.format for call in parsed.calls} <= {fmt}


def test_every_format_has_cases() -> None:
    assert set(PARSERS) <= {fmt for fmt, *_ in CASES}


def test_span_is_the_block_in_the_think_stripped_text() -> None:
    visible = f"Before <tool_call>{W}</tool_call> after"
    start, end = parse_text_calls("<think>hm</think>" + visible).calls[0].span
    assert visible[start:end] == f"<tool_call>{W}</tool_call>"


def test_tool_calls_have_ids_that_depend_only_on_order() -> None:
    parsed = parse_text_calls(f"<tool_call>{W}</tool_call><tool_call>{W}</tool_call>")
    assert parsed.tool_calls() == [
        ToolCall("textcall_0", "get_weather", '{"city": "北京"}'),
        ToolCall("textcall_1", "get_weather", '{"city": "北京"}'),
    ]
    assert [call.id for call in parsed.tool_calls("turn3")] == ["turn3_0", "turn3_1"]


def test_think_open_can_be_stated() -> None:
    text = f"Reasoning.</think>Answer <tool_call>{W}</tool_call>"
    assert parse_text_calls(text, think_open=True) == parse_text_calls(text)
    told_closed = parse_text_calls(text, think_open=False)  # a stray </think> is text (Ollama, llama.cpp)
    assert (told_closed.content, told_closed.reasoning) == ("Reasoning.</think>Answer", None)
    assert parse_text_calls("Only reasoning, cut off", think_open=True) == ParsedText(
        "", [], "Only reasoning, cut off"
    )


def test_formats_select_parsers() -> None:
    text = f'<tool_call>{W}</tool_call> <function=add>{{"a": 1, "b": 2}}</function>'
    assert [c.name for c in parse_text_calls(text, ["hermes"]).calls] == ["get_weather"]
    only_function = parse_text_calls(text, ["function_tag"])
    assert only_function.content == f"<tool_call>{W}</tool_call>"
    assert [c.name for c in only_function.calls] == ["add"]
    assert parse_text_calls(W, ["hermes"]).calls == []  # whole-message JSON is the "json" format
    with pytest.raises(ValueError, match="unknown"):
        parse_text_calls(text, ["hermes", "nope"])


def test_each_parser_finds_its_own_format() -> None:
    assert [c.name for c in PARSERS["hermes"].find(f"x <tool_call>{W}</tool_call>")] == ["get_weather"]
    assert PARSERS["hermes"].find('[TOOL_CALLS][{"name": "a", "arguments": {}}]') == []
    assert [c.format for c in PARSERS["pythonic"].find("[now()]")] == ["pythonic"]


class CallTagParser(TagParser):
    """A made-up format for the test: `<call name="x">{json}</call>`."""

    name = "call_tag"
    tags = (
        Tag(
            start="<call",
            opener=re.compile(r'<call name="(?P<name>\w+)">'),
            partial=re.compile(r'<(c(a(l(l( (n(a(m(e(=("\w*"?)?)?)?)?)?)?)?)?)?)?)?'),
            closer="</call>",
        ),
    )

    def read_block(self, opening: re.Match[str], body: str) -> list[FoundCall] | None:
        return [(opening["name"], json.loads(body or "{}"))]


def test_register_parser_adds_a_format() -> None:
    register_parser("call_tag", CallTagParser())
    try:
        parsed = parse_text_calls('Hi <call name="add">{"a": 1, "b": 2}</call>')
        assert (parsed.content, parsed.calls[0].name, parsed.calls[0].format) == ("Hi", "add", "call_tag")
        assert list(PARSERS)[-1] == "call_tag"  # tried after the built-in formats
    finally:
        del PARSERS["call_tag"]
    assert parse_text_calls('<call name="add">{}</call>').calls == []


def test_literal_tags_hold_every_proper_prefix() -> None:
    tag = literal_tag("<x>", "</x>")
    assert [bool(tag.partial.fullmatch(t)) for t in ("<", "<x", "<x>", "x")] == [True, True, False, False]


def test_valid_calls_do_not_import_json_repair() -> None:
    code = (
        "import sys\n"
        "from hermes_core.textcalls import parse_text_calls\n"
        f"assert parse_text_calls({f'<tool_call>{W}</tool_call> [now()]'!r}).calls\n"
        "assert parse_text_calls('[get_weather(city=1)]').calls\n"
        "assert 'json_repair' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_doc_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), {})


# ── Properties ───────────────────────────────────────────────────────────────────────────────────

fragments = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<think>", "</think>", "[TOOL_CALLS]", "```", "{", "}", "[", "]", "<", W]
    + ['"name"', ":", ",", "北京", " ", "\n", "hello", "<function=f>", "</function>", "(x=1)", "'"]
)
NO_TAGS = st.characters(exclude_characters="<")  # a "<think>" inside an argument would be cut out
texts = st.one_of(st.text(max_size=80), st.lists(fragments, max_size=12).map("".join))


@settings(max_examples=300, deadline=None)
@given(texts, st.sampled_from([None, True, False]))
def test_never_raises_and_fast_path_agrees(text: str, think_open: bool | None) -> None:
    parsed = parse_text_calls(text, think_open=think_open)
    assert parsed == parse_selected(text, select_parsers(), think_open)
    assert parsed.content == parsed.content.strip()
    for call in parsed.calls:
        assert call.name and 0 <= call.span[0] < call.span[1]


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(NO_TAGS, max_size=8)))
def test_arguments_survive_as_normalised_json(arguments: dict[str, Any]) -> None:
    text = "<tool_call>" + json.dumps({"name": "f", "arguments": arguments}) + "</tool_call>"
    (call,) = parse_text_calls(text).calls
    assert call.arguments == json.dumps(arguments, ensure_ascii=False)


def test_a_stray_closing_think_tag_is_text() -> None:
    """A `</think>` that closes nothing is kept as text, whole and streamed, as Ollama's thinking
    parser (ollama/ollama thinking/parser.go: reasoning only from an opening tag at the start) and
    llama.cpp's `try_parse_reasoning` (common/chat-parser.cpp: only when forced open or opened at
    the start) keep it; a template that opens thinking (`think_open=True`) makes the first one a closer."""
    from hermes_core.textcalls import StreamingTextCallParser

    reply = "Use </think> to end a thought.</think> Done."
    parsed = parse_text_calls(reply, think_open=False)
    assert (parsed.content, parsed.reasoning) == (reply, None)
    stream = StreamingTextCallParser()
    shown = "".join(stream.feed(reply[i : i + 3]).text for i in range(0, len(reply), 3)) + stream.flush().text
    assert shown == reply
    opened = parse_text_calls(reply, think_open=True)
    assert (opened.content, opened.reasoning) == ("to end a thought.</think> Done.", "Use")
