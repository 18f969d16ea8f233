"""Text tool calls measured against the serving stacks' own parser tests.

The corpus (tests/data/textcalls/, one JSON-lines file per source) holds the inputs and expected
outputs of the parser tests of vLLM and SGLang, transcribed as data (each row names its file, commit
and licence). Every row is parsed with `parse_text_calls` and compared with what the stack expects:
the calls (names, and arguments as JSON objects where the test checks them) and, where the test
checks them, the visible content and the reasoning (whitespace runs compared as one space: see
"Content tidying" in docs/text-tool-calls.md). A row where we differ on purpose names its policy;
it counts only if the policy is listed in docs/text-tool-calls.md, and it is left out of the pass
rate.
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
    parsed = parse_text_calls(row["input"], tools=row.get("tools"))  # the tools its test offers
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
    if "reasoning" in row and parsed.reasoning != row["reasoning"]:
        return f"reasoning {parsed.reasoning!r} != {row['reasoning']!r}"
    return None


CORPUS = load_corpus()


def test_corpus_rows_name_their_source() -> None:
    for row in CORPUS:
        assert row["repo"] and row["path"] and row["licence"] and row["format"], row["id"]
        assert row["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", row["commit"]), row["id"]


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


# ── The new formats end to end: a whole task over HTTP against the fake OpenAI-compatible server ──

NEW_FORMATS = {  # one call of add(a=2, b=3) as each format writes it (shapes from the corpus rows)
    "glm": "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n<arg_key>b</arg_key>\n"
    "<arg_value>3</arg_value>\n</tool_call>",
    "glm-4.7": "<tool_call>add<arg_key>a</arg_key><arg_value>2</arg_value><arg_key>b</arg_key>"
    "<arg_value>3</arg_value></tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>"
    '{"a": 2, "b": 3}<|tool_call_end|><|tool_calls_section_end|>',
    "deepseek-v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n"
    '{"a": 2, "b": 3}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    "deepseek-v3.1": '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{"a": 2, "b": 3}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "harmony": "<|channel|>analysis<|message|>Need to add.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3}<|call|>',
    "python_tag": '<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}',
    "python_start": "<|python_start|>[add(a=2, b=3)]<|python_end|>",
    "llama.cpp response": '<response>{"name": "add", "arguments": {"a": 2, "b": 3}}</response>',
    "lfm2": "<|tool_call_start|>[add(a=2, b=3)]<|tool_call_end|>",
    "functiongemma": "<start_function_call>call:add{a:2,b:3}<end_function_call>",
    "gemma4": "<|tool_call>call:add{a:2,b:3}<tool_call|>",
    "granite": '<|tool_call|>[{"name": "add", "arguments": {"a": 2, "b": 3}}]',
    "internlm2": '<|action_start|><|plugin|>\n{"name": "add", "parameters": {"a": 2, "b": 3}}<|action_end|>',
    "phi4_mini": 'functools[{"name": "add", "arguments": {"a": 2, "b": 3}}]',
    "apertus": '<|tools_prefix|>[{"add": {"a": 2, "b": 3}}]<|tools_suffix|>',
    "harmony role header": "<|start|>assistant to=functions.add<|channel|>commentary json<|message|>"
    '{"a": 2, "b": 3}<|call|>',
}
MARKUP = ("<", "|", "｜", "arg_key", "functions.", "[TOOL_CALLS]", "functools", "call:")


def _text_model(call_text: str) -> Any:
    """A model that never uses native tool_calls: it writes `call_text`, then reports the result."""
    from hermes_core.testing.fake_openai import FakeReply, RecordedRequest

    def handler(request: RecordedRequest) -> FakeReply:
        last = request.messages[-1]
        if last["role"] == "tool" or "<tool_response>" in str(last.get("content")):
            return FakeReply.text("The sum is 5.")
        return FakeReply.text(f"Let me add them.\n{call_text}")

    return handler


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", sorted(NEW_FORMATS))
async def test_new_format_completes_a_task_over_http(name: str, stream: bool) -> None:
    """Attack: a local model writes its call in a format the parsers did not know (GLM's raw markup
    reached the user; Kimi-K2, DeepSeek, gpt-oss and Llama's call tokens were not recognised). Over
    HTTP to the fake OpenAI-compatible server, the tool must run and no markup may be shown."""
    from hermes_core import Agent, tool

    ran: list[tuple[int, int]] = []

    @tool(name="add")
    def add_numbers(a: int, b: int) -> int:
        """Add two integers."""
        ran.append((a, b))
        return a + b

    from hermes_core.testing.fake_openai import FakeOpenAIServer

    async with FakeOpenAIServer(handler=_text_model(NEW_FORMATS[name])) as fake:
        agent = Agent(model="local", base_url=fake.base_url, tools=[add_numbers], stream=stream)
        pieces: list[str] = []
        result = await agent.run("2+3?", on_text=pieces.append)
        await agent.aclose()
    assert ran == [(2, 3)] and result.ok and result.reply == "The sum is 5."
    shown = "".join(pieces) + "".join(
        str(m.get("content") or "") for m in result.messages if m["role"] == "assistant"
    )
    assert not any(marker in shown for marker in MARKUP), shown


async def test_a_bare_mistral_token_is_not_shown_over_http() -> None:
    """Attack: a Mistral model ends its reply with a bare `[TOOL_CALLS]` (nothing readable after it);
    the token was shown to the user. Streamed over HTTP, neither the reply nor a piece may hold it."""
    from hermes_core import Agent, tool
    from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

    @tool
    def now() -> str:
        """The time."""
        return "noon"

    async with FakeOpenAIServer(handler=lambda request: FakeReply.text("Done.[TOOL_CALLS]")) as fake:
        agent = Agent(model="local", base_url=fake.base_url, tools=[now], stream=True)
        pieces: list[str] = []
        result = await agent.run("hi", on_text=pieces.append)
        await agent.aclose()
    assert result.reply == "Done." and "TOOL_CALLS" not in "".join(pieces)
