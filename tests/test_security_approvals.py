"""Attacks on approval binding, tool-call ids, the journal's replay and `allowed_models`, end to end.

Each test drives a real gateway on 127.0.0.1 through its webhook channel (the request, then the
approval decisions), with an agent whose model is the fake OpenAI-compatible server over HTTP:
the real client, its retries and fallbacks, the loop, the journal and the approval store.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway_harness import post, serving
from hermes_core import Agent, tool
from hermes_core.config import GatewayConfig, PermissionsConfig, Settings
from hermes_core.gateway.server import build_gateway
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

RAN: list[str] = []  # every real run of a tool below, in order


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


@tool(confirm=True)
def refund(order: str) -> str:
    """Refund an order (every refund needs a person's approval).

    Args:
        order: the order id
    """
    RAN.append(f"refund {order}")
    return f"refunded {order}"


@tool(level=2)
def transfer(to: str, amount: float) -> str:
    """Transfer money (irreversible).

    Args:
        to: the account
        amount: the amount in euros
    """
    RAN.append(f"transfer {to} {amount:g}")
    return "transferred"


@tool(level=0)
def lookup(order: str) -> dict[str, str]:
    """Look an order up.

    Args:
        order: the order id
    """
    RAN.append(f"lookup {order}")
    return {"order": order, "status": f"status of {order}"}


@tool(level=0, allowed_models=("big-trusted",))
def customer_records(query: str) -> str:
    """Search the customer records (only the trusted model may).

    Args:
        query: what to look for
    """
    RAN.append(f"records {query}")
    return "alice: card 4111"


@tool(level=0)
def weather(city: str) -> str:
    """Today's weather.

    Args:
        city: the city
    """
    RAN.append(f"weather {city}")
    return "sunny"


@asynccontextmanager
async def gateway_for(tmp_path: Path, fake: FakeOpenAIServer, **agent: Any) -> AsyncIterator[str]:
    """A gateway with the webhook channel whose agent calls the fake endpoint; yields its URL."""
    settings = Settings(gateway=GatewayConfig(data_dir=str(tmp_path)),
                        permissions=PermissionsConfig(admins=["webhook:boss"]))  # fmt: skip
    policy = Policy.from_lists(admins=["webhook:boss"], allow_irreversible=["transfer"])
    built = Agent(base_url=fake.base_url, max_retries=0, retry_base_delay=0.01, permissions=policy,
                  tools=[refund, transfer, lookup, customer_records, weather], **agent)  # fmt: skip
    gateway, routes = build_gateway(settings, built)
    async with serving(gateway, routes) as url:
        yield url
    await gateway.runner.aclose()  # type: ignore[attr-defined]


async def ask(url: str, message: str) -> dict[str, Any]:
    status, answer = await post(f"{url}/webhook", {"message": message, "user_id": "alice"})
    assert status == 200, answer
    return answer


async def approve(url: str, approval: dict[str, Any]) -> dict[str, Any]:
    decision = {"user_id": "boss", "decision": "approve"}  # an admin: whoever else may decide, they may
    status, answer = await post(f"{url}/webhook/approvals/{approval['id']}", decision)
    assert status == 200 and answer["status"] == "approved", answer
    return answer


def asked_for(answer: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The tool and arguments of the approval an answer asks for."""
    approval = answer["approval"]
    assert isinstance(approval, dict), answer
    return approval["tool"], approval["arguments"]


def tool_results(request: Any) -> list[str]:
    return [str(m.get("content")) for m in request.messages if m.get("role") == "tool"]


def call_ids(request: Any) -> list[str]:
    assistant = [m for m in request.messages if m.get("role") == "assistant"]
    return [call["id"] for message in assistant for call in message.get("tool_calls") or []]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_approval_does_not_carry_over_to_later_calls_when_the_endpoint_omits_call_ids(
    tmp_path: Path, stream: bool
) -> None:
    """Attack 1: the endpoint sends tool calls without ids (some local servers and proxies do), so
    every turn's first call used to be named `call_0`. Once `refund A-1` was approved under that id,
    the next turns' `refund B-999` and the level-2 `transfer` found "their" approval and ran without
    anyone approving them. Each must wait for its own approval; the ids differ from turn to turn."""
    async with FakeOpenAIServer() as fake:
        fake.omit_call_ids = True
        fake.script(
            FakeReply.tool_call("refund", {"order": "A-1"}),
            FakeReply.tool_call("refund", {"order": "B-999"}),
            FakeReply.tool_call("transfer", {"to": "mallory", "amount": 5000}),
            FakeReply.text("All done."),
        )
        async with gateway_for(tmp_path, fake, model="m", stream=stream) as url:
            first = await ask(url, "refund order A-1")
            assert asked_for(first) == ("refund", {"order": "A-1"}) and RAN == []

            second = await approve(url, first["approval"])
            assert RAN == ["refund A-1"]  # the approved call, and nothing else
            assert asked_for(second) == ("refund", {"order": "B-999"})
            assert second["approval"]["id"] != first["approval"]["id"]

            third = await approve(url, second["approval"])
            assert RAN == ["refund A-1", "refund B-999"]
            assert asked_for(third) == ("transfer", {"to": "mallory", "amount": 5000})

            done = await approve(url, third["approval"])
        ids = call_ids(fake.requests[-1])
    assert done["reply"] == "All done." and RAN == ["refund A-1", "refund B-999", "transfer mallory 5000"]
    assert len(ids) == 3 and len(set(ids)) == 3 and all(ids)


async def test_a_model_that_reuses_an_approved_call_id_is_refused(tmp_path: Path) -> None:
    """Attack 1, second form: the model itself names its later calls with the id of the approved
    one (`call_same` for `refund A-1`, then for `refund B-999` and `transfer`), which used to make
    them run under that approval. A repeated id is refused: the model is told, the call never runs,
    and no approval is asked for it either."""
    async with FakeOpenAIServer() as fake:
        same = {"call_ids": ["call_same"]}
        fake.script(
            FakeReply.tool_call("refund", {"order": "A-1"}, **same),
            FakeReply.tool_call("refund", {"order": "B-999"}, **same),
            FakeReply.tool_call("transfer", {"to": "mallory", "amount": 5000}, **same),
            FakeReply.text("I could not do the rest."),
        )
        async with gateway_for(tmp_path, fake, model="m") as url:
            first = await ask(url, "refund order A-1")
            assert asked_for(first) == ("refund", {"order": "A-1"})
            done = await approve(url, first["approval"])
        results = tool_results(fake.requests[-1])
    assert RAN == ["refund A-1"]
    assert done["reply"] == "I could not do the rest." and not isinstance(done.get("approval"), dict)
    assert results[0] == "refunded A-1"
    assert all("already used in this task" in result for result in results[1:]) and len(results) == 3


async def test_a_resumed_task_gets_each_turns_own_results_when_two_turns_reuse_a_call_id(
    tmp_path: Path,
) -> None:
    """Attack 2: the journal kept results by call id alone. Two turns that both call `c1` (a
    lookup of A-1, then of B-2) and a pause for approval: when the approved task was run again
    from its journal, turn 1's call got turn 2's result (B-2's status stood in for A-1's), and the
    model went on with a wrong picture. Each turn must get its own result back, and the second use
    of `c1` is refused rather than run."""
    async with FakeOpenAIServer() as fake:
        fake.script(
            FakeReply.tool_call("lookup", {"order": "A-1"}, call_ids=["c1"]),
            FakeReply.tool_call("lookup", {"order": "B-2"}, call_ids=["c1"]),
            FakeReply.tool_call("refund", {"order": "A-1"}, call_ids=["c2"]),
            FakeReply.text("Refunded A-1."),
        )
        async with gateway_for(tmp_path, fake, model="m") as url:
            paused = await ask(url, "check A-1 and B-2, then refund A-1")
            assert asked_for(paused) == ("refund", {"order": "A-1"})
            before = tool_results(fake.requests[-1])
            done = await approve(url, paused["approval"])
        after = tool_results(fake.requests[-1])
    assert done["reply"] == "Refunded A-1." and len(fake.requests) == 4  # the journal answered turns 1-3
    assert json.loads(after[0]) == {"order": "A-1", "status": "status of A-1"}  # turn 1's own result
    assert after[:2] == before  # replayed exactly as they were first given to the model
    assert "already used in this task" in after[1] and after[2] == "refunded A-1"
    assert RAN == ["lookup A-1", "refund A-1"]


async def test_a_fallback_model_is_neither_offered_nor_allowed_a_tool_limited_to_the_primary(
    tmp_path: Path,
) -> None:
    """Attack 3: `customer_records` is allowed only for `big-trusted`. The primary answers 503, the
    fallback `small-untrusted` answers, and calls it. The permission used to be checked against the
    configured primary, so the call ran, and the tool was offered in the fallback's request too.
    Now the request to the fallback offers only its own tools, and its call is refused."""
    async with FakeOpenAIServer() as fake:
        fake.unavailable = {"big-trusted"}
        fake.script_for(
            "small-untrusted",
            FakeReply.tool_call("customer_records", {"query": "cards"}),
            FakeReply.text("I may not search the records."),
        )
        models = {"model": "big-trusted", "fallback_models": ["small-untrusted"]}
        async with gateway_for(tmp_path, fake, **models) as url:
            done = await ask(url, "find alice's card")
        primary, fallback = fake.requests[0], fake.requests[1]
        offered = [[t["function"]["name"] for t in request.tools] for request in (primary, fallback)]
        refusal = tool_results(fake.requests[-1])
    assert RAN == [] and done["reply"] == "I may not search the records."
    assert "you do not have permission to call customer_records with this model" in refusal[0]
    assert primary.model == "big-trusted" and fallback.model == "small-untrusted"
    assert "customer_records" in offered[0] and "customer_records" not in offered[1]
    assert "weather" in offered[1]  # the fallback keeps the tools it may use
