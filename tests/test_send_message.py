"""`send_message` end to end (gateway/outgoing.py): through the gateway, its outbox and the fake
Feishu open platform, with a scripted model.

Cases from the issue (admin-only, level 2 unless a job an admin made, through the durable outbox)
and from the Feishu send-message API reference the fake implements: `receive_id_type` chat_id for
a chat, open_id for a user, and a repeated request `uuid` within an hour creating nothing new — the
platform's own idempotency, which a retry after a lost answer relies on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web

from gateway_harness import feishu_gateway, idle, post, serving
from hermes_core import Agent
from hermes_core.config import GatewayConfig, PermissionsConfig, Settings, WebhookConfig
from hermes_core.gateway.messages import InboundMessage
from hermes_core.gateway.outgoing import send_message
from hermes_core.gateway.runner import AgentRunner
from hermes_core.gateway.server import build_gateway
from hermes_core.kernel.messages import ToolCall
from hermes_core.kernel.tools import ToolContext, ToolRegistry
from hermes_core.kernel.tools.permissions import Caller, Policy
from hermes_core.schedule.tools import CURRENT_MESSAGE
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.pending import SQLiteInteractions
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_feishu import FakeFeishu
from waiting import eventually

POLICY = Policy.from_lists(admins=["feishu:ou_boss"], allow_irreversible=["send_message"])
POST = "站会改到 10:00 / stand-up moved to 10:00"


def agent_for(tmp_path: Path, model: ScriptedModel) -> tuple[Agent, SQLiteInteractions]:
    database = tmp_path / "agent.db"
    interactions = SQLiteInteractions(database)
    agent = Agent(model=model, tools=[send_message], journal=SQLiteTaskJournal(database),
                  interactions=interactions, permissions=POLICY)  # fmt: skip
    return agent, interactions


async def test_an_admin_makes_the_bot_post_in_another_chat_once_approved(tmp_path: Path) -> None:
    """Level 2: the call waits for the admin's approval; approved, the post goes into the target
    chat (a chat_id) and the reply into the admin's own chat — each once."""
    model = ScriptedModel([call("send_message", {"target": "oc_team", "text": POST}), reply("Posted.")])
    agent, interactions = agent_for(tmp_path, model)
    async with FakeFeishu(time_scale=0.001) as feishu:
        async with feishu_gateway(tmp_path, feishu, AgentRunner(agent)) as (gateway, url):
            ask = feishu.user_message("tell the team stand-up is at 10", chat_id="oc_boss", sender="ou_boss")
            assert (await feishu.push(ask, url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            assert "send_message" in feishu.sent[0].text and feishu.messages_in("oc_team") == []
            (pending,) = await interactions.list()
            await gateway.decide(pending.id, "ou_boss", "feishu", True)
            await eventually(lambda: len(feishu.messages_in("oc_team")) == 1 and len(feishu.sent) == 3)
            await eventually(lambda: idle(gateway))
    (posted,) = feishu.messages_in("oc_team")
    assert posted.text == POST and posted.receive_id_type == "chat_id" and posted.reply_to is None
    assert [m.text for m in feishu.messages_in("oc_boss")][-1] == "Posted."
    assert len(feishu.sent) == 3


async def test_a_member_is_refused_and_nothing_is_posted(tmp_path: Path) -> None:
    """Admin-only: a member's model is not offered the tool, and a call it makes anyway is refused."""
    model = ScriptedModel([call("send_message", {"target": "oc_team", "text": "spam"}), reply("I cannot.")])
    agent, _ = agent_for(tmp_path, model)
    async with FakeFeishu(time_scale=0.001) as feishu:
        async with feishu_gateway(tmp_path, feishu, AgentRunner(agent)) as (gateway, url):
            ask = feishu.user_message("post spam to the team", chat_id="oc_intern", sender="ou_intern")
            assert (await feishu.push(ask, url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            await eventually(lambda: idle(gateway))
    assert [m.text for m in feishu.sent] == ["I cannot."] and feishu.messages_in("oc_team") == []
    assert "send_message" not in [t["function"]["name"] for t in model.calls[0].tools or []]  # not offered
    assert "requires the admin role" in str(model.calls[1].messages[-1]["content"])


async def test_a_job_an_admin_made_posts_to_a_user_once_across_retries(tmp_path: Path) -> None:
    """A scheduled fire whose creator was an admin carries the approval; the post to a user (an
    open_id) and the job's reply are each sent once although the platform's first answers are lost
    (the retry reuses the request uuid). A job a member made still needs a person."""
    post = call("send_message", {"target": "ou_alice", "text": POST})
    model = ScriptedModel([post, reply("Done."), call("send_message", {"target": "ou_alice", "text": POST})])
    agent, interactions = agent_for(tmp_path, model)
    async with FakeFeishu(time_scale=0.001) as feishu:
        async with feishu_gateway(tmp_path, feishu, AgentRunner(agent)) as (gateway, _):
            feishu.lose_answers(2)
            await gateway.store.accept(fire("by-admin", "admin"))
            gateway.enqueue((await gateway.store.pending_inbound())[0])
            await eventually(lambda: len(feishu.sent) == 2, timeout=30)
            await eventually(lambda: idle(gateway))
            assert await interactions.list() == []
            await gateway.store.accept(fire("by-member", "member"))
            gateway.enqueue((await gateway.store.pending_inbound())[0])
            await eventually(lambda: len(feishu.sent) == 3)
            (pending,) = await interactions.list()
            assert pending.tool == "send_message"
    creates = [
        r for r in feishu.requests if r.path.endswith("/messages") and r.body.get("receive_id") == "ou_alice"
    ]
    assert len(creates) >= 2 and creates[0].status == 504 and len({r.body["uuid"] for r in creates}) == 1
    to_alice = [m for m in feishu.sent if m.receive_id == "ou_alice"]
    assert [(m.text, m.receive_id_type) for m in to_alice] == [(POST, "open_id")]
    assert [m.text for m in feishu.messages_in("oc_boss")][0] == "Done."


def fire(job: str, creator_role: str) -> InboundMessage:
    """A scheduled job's fire as the scheduler stores it (gateway/schedules.py, schedule/jobs.py)."""
    return InboundMessage(
        channel="feishu", conversation="feishu:oc_boss", sender="ou_boss", text="post the digest",
        message_id=f"job:{job}@1", kind="scheduled", chat_id="oc_boss", chat_type="p2p",
        extra={"job": job, "fire_at": 1.0, "creator_role": creator_role},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("channel", "target", "refusal"),
    [("feishu", "team chat", "is not a Feishu chat_id"), ("webhook", "oc_team", "a callback URL"),
     ("terminal", "x", "cannot post on the terminal channel")],
)  # fmt: skip
async def test_targets_the_channel_cannot_reach_are_refused(channel: str, target: str, refusal: str) -> None:
    """A target the message's channel has no way to reach is an error result, never a queued post."""
    message = InboundMessage(
        channel=channel, conversation=f"{channel}:u", sender="u", text="", message_id="m"
    )
    admin = Caller("ou_boss", "admin", channel, preapproved=("send_message",))
    arguments = json.dumps({"target": target, "text": "hi"})
    token = CURRENT_MESSAGE.set(message)
    try:
        outcome = await ToolRegistry([send_message], POLICY).execute(
            ToolCall("c1", "send_message", arguments), context=ToolContext("c1", "send_message", caller=admin)
        )
    finally:
        CURRENT_MESSAGE.reset(token)
    assert not outcome.ok and refusal in outcome.content


async def test_on_the_webhook_a_post_goes_to_an_allowed_callback_url(tmp_path: Path) -> None:
    """The webhook channel reaches nobody but a callback URL of `webhook.callback_hosts`
    (channels/webhook.py): the post is delivered there, signed and with its idempotency key, once the
    admin approved the call (the webhook approvals API)."""
    received: list[tuple[dict[str, object], str]] = []

    async def notify(request: web.Request) -> web.Response:
        received.append((await request.json(), request.headers.get("Idempotency-Key", "")))
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/notify", notify)
    site = web.AppRunner(app)
    await site.setup()
    await web.TCPSite(site, "127.0.0.1", 0).start()
    target = f"http://127.0.0.1:{site.addresses[0][1]}/notify"
    settings = Settings(
        gateway=GatewayConfig(data_dir=str(tmp_path)),
        webhook=WebhookConfig(callback_hosts=["127.0.0.1"]),
        permissions=PermissionsConfig(admins=["webhook:boss"], allow_irreversible=["send_message"]),
    )
    model = ScriptedModel([call("send_message", {"target": target, "text": POST}), reply("Posted.")])
    agent = Agent(model=model, permissions=Policy.from_lists(["webhook:boss"], None, ["send_message"]))
    gateway, routes = build_gateway(settings, agent)
    try:
        async with serving(gateway, routes) as url:
            status, answer = await post(f"{url}/webhook", {"message": "tell the hook", "user_id": "boss"})
            assert status == 200 and answer["approval"]["tool"] == "send_message" and received == []
            decide = f"{url}/webhook/approvals/{answer['approval']['id']}"
            status, decided = await post(decide, {"user_id": "boss", "decision": "approve"})
            assert status == 200 and decided["reply"] == "Posted."
            await eventually(lambda: len(received) == 1)
    finally:
        await gateway.runner.aclose()  # type: ignore[attr-defined]
        await site.cleanup()
    ((body, key),) = received
    assert body["reply"] == POST and len(key) == 40
