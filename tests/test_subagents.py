"""Sub-agents as a tool (P3): a child's own context, only its final answer back, bounded launches."""

from __future__ import annotations

import json
from typing import Any

from hermes_core import Agent, tool
from hermes_core.kernel.messages import Message, ModelResponse
from hermes_core.kernel.tools.permissions import Caller
from hermes_core.team import agent_launch
from hermes_core.testing import ScriptedModel, call, reply


@tool(level=0)
def lookup(city: str) -> dict[str, Any]:
    """Look up facts about a city."""
    return {"city": city, "population_m": 21.9, "note": "INTERMEDIATE-STEP-MARKER"}


@tool(level=1, required_role="admin")
def broadcast(text: str) -> str:
    """Send a message to every user of the company."""
    return "sent"


def launching(agent: str) -> ScriptedModel:
    """A model that always launches `agent` for its task, then answers with what came back."""

    def step(messages: list[Message], tools: Any) -> ModelResponse:
        last = messages[-1]
        if last["role"] == "tool":
            return reply(f"done: {last['content']}")
        return call("agent_launch", {"agent": agent, "task": f"part of: {last['content'][:40]}"})

    return ScriptedModel(step)


def refusals(model: ScriptedModel) -> list[str]:
    """The errors of the tool results any run of `model` read, in order."""
    results = [m["content"] for c in model.calls for m in c.messages[-1:] if m["role"] == "tool"]
    return [error for error in (json.loads(r).get("error") for r in results) if error]


def runs(model: ScriptedModel) -> int:
    """How many runs used `model`: each one starts with a call whose last message is the task."""
    return sum(1 for c in model.calls if c.messages[-1]["role"] == "user")


async def test_parent_context_holds_only_the_childs_final_answer() -> None:
    child_model = ScriptedModel([call("lookup", {"city": "北京"}), reply("北京人口约 2190 万")])
    research = Agent(model=child_model, system_prompt="You find facts about cities.", tools=[lookup])
    parent_model = ScriptedModel(
        [call("agent_launch", {"agent": "research", "task": "北京有多少人口？"}), reply("约 2190 万人")]
    )
    parent = Agent(model=parent_model, tools=[agent_launch({"research": research})])

    result = await parent.run("How many people live in Beijing? PARENT-ONLY-MARKER")

    assert result.ok and result.reply == "约 2190 万人"
    assert result.usage.total_tokens == 30 + 30  # its own two model calls, and the child's two
    seen = parent_model.calls[1].messages
    assert [m["role"] for m in seen] == ["system", "user", "assistant", "tool"]
    returned = json.loads(seen[-1]["content"])
    assert returned == {
        "agent": "research",
        "reply": "北京人口约 2190 万",
        "usage": {"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30},
        "model_calls": 2,
    }
    for history in (json.dumps(seen, ensure_ascii=False), json.dumps(result.messages, ensure_ascii=False)):
        assert "INTERMEDIATE-STEP-MARKER" not in history and "lookup" not in history
    # the child worked in its own context: its own prompt, the task, none of the parent's conversation
    child_first = child_model.calls[0].messages
    assert child_first == [
        {"role": "system", "content": "You find facts about cities."},
        {"role": "user", "content": "北京有多少人口？"},
    ]
    assert "INTERMEDIATE-STEP-MARKER" in child_model.calls[1].messages[-1]["content"]
    assert [t["function"]["name"] for t in child_model.calls[0].tools or []] == ["lookup"]


async def test_output_format_reaches_the_child_and_unknown_agents_are_named() -> None:
    child_model = ScriptedModel([reply("- a\n- b")])
    helper = Agent(model=child_model, system_prompt="You help.")
    launch = agent_launch({"helper": helper})
    assert launch.parameters["properties"]["agent"]["enum"] == ["helper"]
    parent_model = ScriptedModel(
        [
            call("agent_launch", {"agent": "helpr", "task": "list two letters"}),
            call("agent_launch", {"agent": "helper", "task": "list two letters", "output_format": "bullets"}),
            reply("ok"),
        ]
    )
    result = await Agent(model=parent_model, tools=[launch]).run("go")
    unknown, launched = result.tool_calls
    assert not unknown.ok and "unknown agent 'helpr'; choose one of: helper" in unknown.content
    assert launched.ok and json.loads(launched.content)["reply"] == "- a\n- b"
    assert child_model.calls[0].messages[-1]["content"] == "list two letters\n\nAnswer format: bullets"


async def test_depth_limit_stops_an_agent_that_keeps_launching_itself() -> None:
    model = launching("self")
    agent = Agent(model=model, system_prompt="You split work.")
    agent.register_tool(agent_launch({"self": agent}, max_depth=2))

    result = await agent.run("count the files")

    assert result.ok
    assert runs(model) == 3  # the task, a child, a grandchild: the grandchild's launch is refused
    assert refusals(model) == [
        "cannot launch self: depth limit 2 reached (launch chain: self → self). "
        "Do this part yourself or answer with what you have."
    ]


async def test_agents_launching_each_other_in_a_cycle_end_with_the_chain_named() -> None:
    model_a, model_b = launching("b"), launching("a")
    agent_a = Agent(model=model_a, system_prompt="You are A.")
    agent_b = Agent(model=model_b, system_prompt="You are B.")
    agent_a.register_tool(agent_launch({"b": agent_b}, max_depth=3))
    agent_b.register_tool(agent_launch({"a": agent_a}, max_depth=3))

    result = await agent_a.run("start")

    assert result.ok
    assert (runs(model_a), runs(model_b)) == (2, 2)  # A → b → a → b, whose launch of a is refused
    assert refusals(model_a) == []
    [refused] = refusals(model_b)
    assert refused.startswith("cannot launch a: depth limit 3 reached (launch chain: b → a → b)")


async def test_child_runs_per_task_are_budgeted_and_the_next_task_starts_afresh() -> None:
    child = Agent(model=ScriptedModel(lambda messages, tools: reply("ok")), system_prompt="You help.")
    launch = agent_launch({"helper": child}, max_children_per_task=2)
    three = call(
        "agent_launch",
        {"agent": "helper", "task": "one"},
        ("agent_launch", {"agent": "helper", "task": "two"}),
        ("agent_launch", {"agent": "helper", "task": "three"}),
    )
    again = call("agent_launch", {"agent": "helper", "task": "one"})
    parent_model = ScriptedModel([three, reply("finished"), again, reply("finished again")])
    parent = Agent(model=parent_model, tools=[launch])

    first = await parent.run("do three things")
    assert [o.ok for o in first.tool_calls] == [True, True, False]
    assert "already used its 2 child runs" in first.tool_calls[2].content
    second = await parent.run("one more")
    assert second.tool_calls[0].ok


async def test_budget_counts_every_launch_under_one_top_level_task() -> None:
    model = launching("self")
    agent = Agent(model=model, system_prompt="You split work.")
    agent.register_tool(agent_launch({"self": agent}, max_depth=10, max_children_per_task=2))

    await agent.run("count the files")

    assert runs(model) == 3  # the child and the grandchild use the budget; the next launch is refused
    assert refusals(model) == [
        "cannot launch self: this task already used its 2 child runs. Answer with the results you have."
    ]


async def test_child_runs_for_the_parents_caller_and_never_more() -> None:
    child_model = ScriptedModel(lambda messages, tools: reply("ok"))
    child = Agent(model=child_model, system_prompt="You announce things.", tools=[broadcast, lookup])
    parent_model = ScriptedModel(lambda messages, tools: launch_once(messages))
    parent = Agent(model=parent_model, tools=[agent_launch({"announcer": child})])

    await parent.run("announce lunch", caller=Caller("u1", role="member"))
    await parent.run("announce lunch", caller=Caller("boss", role="admin"))

    offered = [[t["function"]["name"] for t in c.tools or []] for c in child_model.calls]
    assert offered == [["lookup"], ["broadcast", "lookup"]]


def launch_once(messages: list[Message]) -> ModelResponse:
    if messages[-1]["role"] == "tool":
        return reply("done")
    return call("agent_launch", {"agent": "announcer", "task": "announce lunch"})
