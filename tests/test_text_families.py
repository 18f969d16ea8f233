"""The family of text tool calls: `tool_mode: auto` recognises it from the model's first call written
as text and keeps it; `model.tool_format` pins it; docs/providers.md says which family each preset's
default model writes. Over HTTP against the fake OpenAI-compatible server.

The replies are the formats as their model cards and chat templates write them (the same cases as
tests/test_text_tools.py); the explanation the model writes later is the kind of answer a user
asks for ("what does a call look like?"), which a parser reading every family takes for a call.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hermes_core import Agent, tool
from hermes_core.config import ConfigError, load_settings
from hermes_core.models.families import FAMILIES, family_of_model
from hermes_core.models.providers import PROVIDERS
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from hermes_core.textcalls.parsers import PARSERS

ROOT = Path(__file__).resolve().parents[1]

QWEN3_CODER = (
    "<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n"
    "</function>\n</tool_call>"
)
GLM = (
    "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n<arg_key>b</arg_key>\n"
    "<arg_value>3</arg_value>\n</tool_call>"
)
# An answer that explains the JSON call format: the `json` family reads a message that starts
# with such an object as a call (Llama 3.1 writes its calls that way).
EXPLAINED = '{"name": "add", "arguments": {"a": 40, "b": 2}} is how a call to add looks.'


def conversation(first_call: str):  # type: ignore[no-untyped-def]
    """First question: a call in `first_call`, then the answer. Second question: `EXPLAINED`."""

    def handler(request: RecordedRequest) -> FakeReply:
        last = str(request.messages[-1].get("content"))
        if "<tool_response>" in last or request.messages[-1]["role"] == "tool":
            return FakeReply.text("The sum is 5.")
        if "look" in last:
            return FakeReply.text(EXPLAINED)
        return FakeReply.text(f"Let me add them.\n{first_call}")

    return handler


def adder(ran: list[tuple[int, int]]):  # type: ignore[no-untyped-def]
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        ran.append((a, b))
        return a + b

    return add


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("first", [QWEN3_CODER, GLM], ids=["qwen3_coder", "glm"])
async def test_auto_keeps_the_family_it_recognised(
    first: str, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """After a Qwen3-Coder (or GLM) call, a later answer that explains JSON calls is shown as it is,
    not run: only the recognised family (and the Hermes format of text mode) is read."""
    ran: list[tuple[int, int]] = []
    caplog.set_level(logging.WARNING, "hermes_core.model")
    async with FakeOpenAIServer(handler=conversation(first)) as fake:
        agent = Agent(model="local", base_url=fake.base_url, tools=[adder(ran)], stream=stream)
        shown: list[str] = []
        first_run = await agent.run("2+3?")
        second = await agent.run("What does a call look like?", on_text=shown.append)
        await agent.aclose()
    assert first_run.reply == "The sum is 5." and ran == [(2, 3)]
    assert second.reply == EXPLAINED and ran == [(2, 3)], second  # not taken for add(40, 2)
    if stream:
        assert "".join(shown) == EXPLAINED
    family = "qwen3_coder" if first is QWEN3_CODER else "glm"
    assert f"its tool calls are read as {FAMILIES[family]} (`{family}`) from now on" in caplog.text


async def test_without_a_recognised_family_every_format_is_read() -> None:
    """The counterpart: before any call was seen, the same answer is read as a JSON call (which is
    what a Llama 3.1 served without a tool parser needs)."""
    ran: list[tuple[int, int]] = []
    async with FakeOpenAIServer(handler=conversation(QWEN3_CODER)) as fake:
        agent = Agent(model="local", base_url=fake.base_url, tools=[adder(ran)], max_turns=2)
        await agent.run("What does a call look like?")
        await agent.aclose()
    assert ran[:1] == [(40, 2)]


@pytest.mark.parametrize("pinned", ["glm", "qwen3_coder"])
async def test_a_pinned_family_reads_only_that_family(pinned: str) -> None:
    """`model.tool_format: glm` against a model that writes Qwen3-Coder XML: not read as a call (the
    markup is the reply, as with a server whose tool parser is the wrong one); pinned right, it runs."""
    ran: list[tuple[int, int]] = []
    async with FakeOpenAIServer(handler=conversation(QWEN3_CODER)) as fake:
        agent = Agent(model="local", base_url=fake.base_url, tools=[adder(ran)], tool_format=pinned)
        result = await agent.run("2+3?")
        await agent.aclose()
    if pinned == "qwen3_coder":
        assert ran == [(2, 3)] and result.reply == "The sum is 5."
    else:
        assert ran == [] and "<function=add>" in result.reply


def test_an_unknown_family_is_refused_by_the_configuration(tmp_path: Path) -> None:
    path = tmp_path / "hermes.yaml"
    path.write_text("model:\n  tool_format: qwen4\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown tool-call family 'qwen4'"):
        load_settings(path)


def test_every_parser_is_a_named_family() -> None:
    assert list(FAMILIES) == list(PARSERS)


@pytest.mark.parametrize(
    ("model", "family"),
    [  # names as the model cards and vLLM's tool-calling page write them
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3_coder"),
        ("Qwen/Qwen2.5-7B-Instruct", "hermes"),
        ("NousResearch/Hermes-3-Llama-3.1-8B", "hermes"),
        ("zai-org/GLM-4.5-Air", "glm"),
        ("moonshotai/Kimi-K2-Instruct", "kimi_k2"),
        ("deepseek-ai/DeepSeek-V3.2-Exp", "deepseek_dsml"),
        ("deepseek-ai/DeepSeek-V3.1", "deepseek"),
        ("openai/gpt-oss-20b", "harmony"),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "pythonic"),
        ("meta-llama/Llama-3.1-8B-Instruct", "json"),
        ("mistralai/Mistral-Small-3.2-24B-Instruct-2506", "mistral"),
        ("MiniMaxAI/MiniMax-M2", "minimax_m2"),
        ("ByteDance-Seed/Seed-OSS-36B-Instruct", "seed_oss"),
        ("internlm/internlm2_5-7b-chat", "internlm2"),
        ("microsoft/Phi-4-mini-instruct", "phi4_mini"),
        ("gpt-4.1-mini", None),
        ("default", None),
    ],
)
def test_family_of_a_model_name(model: str, family: str | None) -> None:
    assert family_of_model(model) == family


def test_providers_page_says_each_presets_family() -> None:
    """docs/providers.md's preset table agrees with `family_of_model` for each preset's default model."""
    page = (ROOT / "docs" / "providers.md").read_text(encoding="utf-8")
    section = page[page.index("## Tool-call families per preset") :]
    rows = {
        cells[0].strip("` "): cells
        for line in section.splitlines()
        if line.startswith("| `")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert set(rows) == {p.name for p in PROVIDERS}
    for provider in PROVIDERS:
        model, family = rows[provider.name][1].strip("` "), rows[provider.name][2]
        assert model == (provider.model or "—"), provider.name
        expected = family_of_model(provider.model)
        # the family named first; "none" for an endpoint that always parses, "the …'s" for a server
        assert family.startswith(f"`{expected}`" if expected else ("none:", "the ")), (provider.name, family)
