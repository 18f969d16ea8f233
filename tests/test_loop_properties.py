"""Property tests: whatever the model writes, the loop ends with a reply and never raises."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_core import Agent, tool
from hermes_core.kernel.messages import ModelResponse, ToolCall, Usage
from hermes_core.testing import ScriptedModel


@tool
def add(a: int, b: int = 0) -> int:
    """Add two integers."""
    return a + b


@tool
async def echo(text: str, times: int = 1) -> str:
    """Repeat a text."""
    return text * max(0, min(times, 5))


names = st.sampled_from(["add", "echo", "Add", "", "missing", "echo "]) | st.text(max_size=10)
arguments = st.one_of(
    st.text(max_size=60),
    st.dictionaries(
        st.sampled_from(["a", "b", "text", "times", "x"]), st.none() | st.integers() | st.text(max_size=8)
    ).map(json.dumps),
)
tool_calls = st.lists(
    st.builds(ToolCall, id=st.text(min_size=1, max_size=6), name=names, arguments=arguments), max_size=4
)
responses = st.builds(
    ModelResponse,
    content=st.none() | st.text(max_size=40),
    tool_calls=tool_calls,
    usage=st.builds(Usage, st.integers(0, 100), st.integers(0, 100), st.integers(0, 200)),
    finish_reason=st.none() | st.sampled_from(["stop", "tool_calls", "length", "garbage"]),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(responses, min_size=1, max_size=10), st.text(max_size=30))
async def test_arbitrary_model_output_never_crashes_the_loop(
    script: list[ModelResponse], message: str
) -> None:
    model = ScriptedModel(script + [ModelResponse(content="final")] * 10)
    result = await Agent(model=model, tools=[add, echo], max_turns=6).run(message)
    assert isinstance(result.reply, str) and result.reply
    assert result.stop_reason in {"completed", "max_turns", "max_tool_calls"}
    # every assistant tool call is answered by exactly one tool message with its id, in order
    messages = result.messages
    for i, message_ in enumerate(messages):
        for j, wire in enumerate(message_.get("tool_calls", [])):
            assert messages[i + 1 + j]["role"] == "tool" and messages[i + 1 + j]["tool_call_id"] == wire["id"]
