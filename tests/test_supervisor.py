"""Supervisor and expert agents (P4): delegation over priority queues, max_depth, per-agent limits."""

from __future__ import annotations

import asyncio
import json
from itertools import pairwise
from typing import Any

from hermes_core import Agent
from hermes_core.kernel.messages import Message, ModelResponse
from hermes_core.kernel.tools.permissions import Caller
from hermes_core.models.openai_compat import OpenAICompatClient
from hermes_core.models.settings import ModelSettings
from hermes_core.team import BATCH, Delegation, Expert, Supervisor
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_openai import FakeOpenAIServer
from waiting import eventually

BATCH_CALLER = Caller("nightly-report", interactive=False)
PERSON = Caller("u1")


def delegating_to(expert: str) -> ScriptedModel:
    """A model that delegates its task to `expert`, then answers with what came back."""

    def step(messages: list[Message], tools: Any) -> ModelResponse:
        last = messages[-1]
        if last["role"] == "tool":
            answer = json.loads(last["content"])
            return reply(answer.get("error") or answer["reply"])
        return call("delegate", {"expert": expert, "task": last["content"]})

    return ScriptedModel(step)


async def test_supervisor_delegates_in_parallel_and_summarises_the_answers() -> None:
    started: list[str] = []
    both_started = asyncio.Event()

    def expert_model(answer: str) -> ScriptedModel:
        async def step(messages: list[Message], tools: Any) -> ModelResponse:
            started.append(answer)
            if len(started) == 2:
                both_started.set()
            await asyncio.wait_for(both_started.wait(), 5)  # passes only if the experts run concurrently
            return reply(answer)

        return ScriptedModel(step)

    def summarise(messages: list[Message], tools: Any) -> ModelResponse:
        answers = [json.loads(m["content"])["reply"] for m in messages if m["role"] == "tool"]
        return reply("Summary: " + " / ".join(answers))

    lead_model = ScriptedModel(
        [
            call(
                "delegate",
                {"expert": "brand_a", "task": "Sales of brand A in 2024?"},
                ("delegate", {"expert": "brand_b", "task": "Sales of brand B in 2024?"}),
            ),
            summarise,
        ]
    )
    model_a, model_b = expert_model("A sold 120k units"), expert_model("B sold 95k units")
    team = Supervisor(
        Agent(model=lead_model, system_prompt="You coordinate analysts."),
        [
            Expert("brand_a", Agent(model=model_a, system_prompt="You analyse brand A."), "brand A data"),
            Expert("brand_b", Agent(model=model_b, system_prompt="You analyse brand B."), "brand B data"),
        ],
    )
    async with team:
        result = await team.run("Compare brand A and brand B", caller=PERSON)

    assert result.ok and result.reply == "Summary: A sold 120k units / B sold 95k units"
    offered = lead_model.calls[0].tools or []
    assert [t["function"]["name"] for t in offered] == ["delegate"]
    assert offered[0]["function"]["parameters"]["properties"]["expert"]["enum"] == [
        "supervisor",
        "brand_a",
        "brand_b",
    ]
    assert model_a.calls[0].messages == [
        {"role": "system", "content": "You analyse brand A."},
        {"role": "user", "content": "Sales of brand A in 2024?"},
    ]
    assert model_a.calls[0].tools is None  # an expert delegates only when told it may
    assert set(team.usage) == {"supervisor", "brand_a", "brand_b"}
    assert team.usage["supervisor"].total_tokens == 30 and team.usage["brand_a"].total_tokens == 15


async def test_interactive_work_is_served_before_queued_batch_work() -> None:
    served: list[str] = []
    first_started, release_first = asyncio.Event(), asyncio.Event()

    async def work(messages: list[Message], tools: Any) -> ModelResponse:
        task = messages[-1]["content"]
        served.append(task)
        if task == "batch-0":  # keeps the expert's only worker busy while the queue fills
            first_started.set()
            await release_first.wait()
        return reply(f"did {task}")

    team = Supervisor(
        Agent(model=delegating_to("worker"), system_prompt="You route work."),
        [Expert("worker", Agent(model=ScriptedModel(work), system_prompt="You work."), concurrency=1)],
        concurrency=8,
    )
    runs: list[asyncio.Task[Any]] = []

    async def send(message: str, caller: Caller) -> None:
        queued = team.pending("worker")
        runs.append(asyncio.create_task(team.run(message, caller=caller)))
        await eventually(lambda: team.pending("worker") == queued + 1)

    async with team:
        runs.append(asyncio.create_task(team.run("batch-0", caller=BATCH_CALLER)))
        await asyncio.wait_for(first_started.wait(), 5)
        for n in (1, 2, 3):
            await send(f"batch-{n}", BATCH_CALLER)
        for n in (0, 1):
            await send(f"interactive-{n}", PERSON)
        release_first.set()
        results = await asyncio.wait_for(asyncio.gather(*runs), 10)

    assert served == ["batch-0", "interactive-0", "interactive-1", "batch-1", "batch-2", "batch-3"]
    assert [r.reply for r in results][-2:] == ["did interactive-0", "did interactive-1"]


async def test_each_expert_runs_at_most_its_concurrency_at_once() -> None:
    active, most = 0, 0

    async def work(messages: list[Message], tools: Any) -> ModelResponse:
        nonlocal active, most
        active += 1
        most = max(most, active)
        await asyncio.sleep(0.05)  # work that takes a moment: calls overlap if the limit lets them
        active -= 1
        return reply("ok")

    worker = Agent(model=ScriptedModel(work), system_prompt="You work.")
    team = Supervisor(Agent(model=ScriptedModel([])), [Expert("worker", worker, concurrency=2)])
    async with team:
        jobs = [team.submit(Delegation("worker", f"job {n}", max_depth=1, priority=BATCH)) for n in range(6)]
        results = await asyncio.wait_for(asyncio.gather(*jobs), 10)
    assert [r.reply for r in results] == ["ok"] * 6
    assert most == 2


async def test_per_agent_rate_limits_measured_at_the_model_server() -> None:
    async with FakeOpenAIServer(latency=0.05) as fake:
        # a model name: the team gives the limit to the agent's own OpenAI-compatible client
        alpha = Agent(model="model-alpha", base_url=fake.base_url, api_key="sk-test")
        # a client object: the team wraps it in SpacedModel
        settings = ModelSettings(model="model-beta", base_url=fake.base_url, api_key="sk-test")
        beta = Agent(model=OpenAICompatClient(settings))
        team = Supervisor(
            Agent(model=ScriptedModel([])),
            [
                Expert("alpha", alpha, concurrency=3, requests_per_second=5),
                Expert("beta", beta, concurrency=3, requests_per_second=2.5),
            ],
        )
        async with team:
            jobs = [
                team.submit(Delegation(name, f"task {n}", max_depth=1))
                for n in range(4)
                for name in ("alpha", "beta")
            ]
            results = await asyncio.wait_for(asyncio.gather(*jobs), 20)

    assert all(r.ok for r in results)
    arrivals = {
        model: sorted(r.received_at for r in fake.requests if r.model == model)
        for model in ("model-alpha", "model-beta")
    }
    gaps = {model: [b - a for a, b in pairwise(times)] for model, times in arrivals.items()}
    assert len(arrivals["model-alpha"]) == len(arrivals["model-beta"]) == 4
    assert min(gaps["model-alpha"]) >= 0.15, gaps  # 5 per second: 0.2 s apart, minus scheduling noise
    assert min(gaps["model-beta"]) >= 0.3, gaps  # 2.5 per second: 0.4 s apart


async def test_max_depth_ends_experts_that_delegate_back_and_forth() -> None:
    lead_model, expert_model = delegating_to("analyst"), delegating_to("supervisor")
    team = Supervisor(
        Agent(model=lead_model, system_prompt="You coordinate."),
        [Expert("analyst", Agent(model=expert_model, system_prompt="You analyse."), can_delegate=True)],
        concurrency=1,  # every member has a single place: waiting runs must give theirs back
        max_depth=3,
    )
    async with team:
        result = await asyncio.wait_for(team.run("Is the report ready?", caller=PERSON), 10)

    assert result.ok
    runs = [sum(c.messages[-1]["role"] == "user" for c in m.calls) for m in (lead_model, expert_model)]
    assert runs == [2, 2]  # supervisor → analyst → supervisor → analyst, whose delegation is refused
    assert result.reply == (
        "cannot delegate to supervisor: max_depth reached "
        "(supervisor → analyst → supervisor → analyst → supervisor). "
        "Do this part yourself or answer with what you have."
    )


async def test_the_team_runs_copies_with_every_tool_and_leaves_the_originals_alone() -> None:
    def late(x: int) -> int:
        """A tool registered after the agent was built."""
        return x

    analyst_model = ScriptedModel([reply("ok")])
    analyst = Agent(model=analyst_model, system_prompt="You analyse.")
    analyst.register_tool(late)
    lead = Agent(model=ScriptedModel([]), system_prompt="You coordinate.")
    team = Supervisor(lead, [Expert("analyst", analyst, can_delegate=True, requests_per_second=100)])
    async with team:
        await team.submit(Delegation("analyst", "look", max_depth=1))

    assert [t["function"]["name"] for t in analyst_model.calls[0].tools or []] == ["late", "delegate"]
    assert (lead.registry.names, analyst.registry.names) == ([], ["late"])
