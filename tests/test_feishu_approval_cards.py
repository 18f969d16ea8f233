"""An approval card as the people in the chat see it once someone clicks: the decider by name, never
a raw `ou_…` id, and the buttons gone at once, because the decided card comes back in the answer to
the click itself (over HTTP and over the long connection) instead of a PATCH that lands later.

Sources: the card-callback page (open.feishu.cn/document/uAjLw4CM/ukzMukzMukzM/feishu-cards/
card-callback-communication: the answer `{"toast": …, "card": {"type": "raw", "data": <card>}}`,
which lark-oapi models as `P2CardActionTriggerResponse.card`, lark_oapi/event/callback/model/
p2_card_action_trigger.py); the contact API (open.feishu.cn/document/server-docs/contact-v3/user/get,
scope contact:user.base:readonly) for the name; the rich-text component page (open.feishu.cn/
document/uAjLw4CM/ukzMukzMukzM/feishu-cards/card-components/content-components/rich-text: `<at
id=…></at>` in a card's markdown shows the person) when no name can be had.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway_harness import feishu_gateway
from hermes_core import Agent
from hermes_core.gateway.runner import AgentRunner
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.pending import SQLiteInteractions
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_feishu.cards import buttons
from invoicing import RAN, send_invoice
from waiting import eventually


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


def invoice_agent(tmp_path: Path) -> Agent:
    model = ScriptedModel([call("send_invoice", {"customer": "ACME", "amount": 120}), reply("Invoice sent.")])
    database = tmp_path / "agent.db"
    return Agent(model=model, tools=[send_invoice], journal=SQLiteTaskJournal(database),
                 interactions=SQLiteInteractions(database),
                 permissions=Policy.from_lists(admins=["feishu:ou_boss"]))  # fmt: skip


def buttons_of(card: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {value["decision"]: value for value in buttons(card)}


def patch_calls(feishu: FakeFeishu) -> list[Any]:
    return [call for call in feishu.requests if call.method == "PATCH"]


async def test_the_click_answer_carries_the_decided_card_naming_the_decider(tmp_path: Path) -> None:
    """Webhook: Alice approves. The HTTP answer to her click holds the decided card (no buttons,
    "已批准 … Alice Chen"), the platform shows it to everyone at once, and no PATCH is made."""
    async with FakeFeishu(time_scale=0.001) as feishu:
        feishu.users["ou_alice"] = "Alice Chen"
        async with feishu_gateway(tmp_path, feishu, AgentRunner(invoice_agent(tmp_path))) as (_, url):
            ask = feishu.user_message("给 ACME 开 120 的发票", chat_id="oc_p2p", sender="ou_alice")
            assert (await feishu.push(ask, url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            card = feishu.sent[0]
            approve = buttons_of(card.content)["approve"]
            clicked = await feishu.push(feishu.card_action("ou_alice", card.message_id, approve), url)
            answer = json.loads(clicked.body)
            shown_at_once = feishu.messages_in("oc_p2p")[0].text  # right after the answer arrived
            await eventually(lambda: len(feishu.sent) == 2)
    assert answer["toast"] == {"type": "success", "content": "已批准：send_invoice（Alice Chen）"}
    assert answer["card"]["type"] == "raw" and buttons_of(answer["card"]["data"]) == {}
    assert "已批准：send_invoice（Alice Chen）" in shown_at_once and "ou_alice" not in shown_at_once
    assert buttons_of(feishu.messages_in("oc_p2p")[0].content) == {}
    assert patch_calls(feishu) == [] and RAN == ["invoice ACME 120"]


async def test_without_the_contact_scope_the_card_names_the_decider_with_an_at_tag(tmp_path: Path) -> None:
    """The app lacks contact:user.base:readonly (99991672): the card's decision line carries
    `<at id=ou_alice></at>` (the client renders the person's name), the clicker's own toast says
    "你", and the contact API is asked once per user, not once per click."""
    async with FakeFeishu(time_scale=0.001) as feishu:
        feishu.contact_forbidden = True
        async with feishu_gateway(tmp_path, feishu, AgentRunner(invoice_agent(tmp_path))) as (_, url):
            ask = feishu.user_message("给 ACME 开 120 的发票", chat_id="oc_p2p", sender="ou_alice")
            assert (await feishu.push(ask, url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            card = feishu.sent[0]
            approve = buttons_of(card.content)["approve"]
            answer = json.loads((await feishu.push(feishu.card_action("ou_alice", card.message_id, approve),
                                                   url)).body)  # fmt: skip
            await eventually(lambda: len(feishu.sent) == 2)
    markdown = json.dumps(answer["card"]["data"], ensure_ascii=False)
    assert "已批准：send_invoice（<at id=ou_alice></at>）" in markdown
    assert answer["toast"]["content"] == "已批准：send_invoice（你）"
    contact = [c for c in feishu.requests if "/contact/v3/users/" in c.path]
    assert [(c.path, c.query, c.code) for c in contact] == [
        ("/open-apis/contact/v3/users/ou_alice", {"user_id_type": "open_id"}, 99991672)
    ]


async def test_over_the_long_connection_the_ack_carries_the_decided_card(tmp_path: Path) -> None:
    """Long connection: the decided card travels back base64 in the ACK's `data` (FEISHU.md §11,
    lark_oapi/ws/client.py), the platform applies it, and no PATCH is made."""
    async with FakeFeishu(time_scale=0.001) as feishu:
        feishu.users["ou_alice"] = "Alice Chen"
        async with feishu_gateway(tmp_path, feishu, AgentRunner(invoice_agent(tmp_path)),
                                  mode="longconn") as (_, _url):  # fmt: skip
            await eventually(lambda: feishu.ws_clients == 1)
            await feishu.ws_deliver(feishu.user_message("给 ACME 开 120 的发票", chat_id="oc_p2p",
                                                        sender="ou_alice"))  # fmt: skip
            await eventually(lambda: len(feishu.sent) == 1)
            card = feishu.sent[0]
            await feishu.ws_deliver(feishu.card_action("ou_alice", card.message_id,
                                                       buttons_of(card.content)["approve"]))  # fmt: skip
            await eventually(lambda: len(feishu.sent) == 2 and len(feishu.patches) == 1)
    [acked] = [ack for ack in feishu.ws_acks if ack["answer"] is not None]
    assert acked["answer"]["card"]["type"] == "raw" and buttons_of(acked["answer"]["card"]["data"]) == {}
    [applied] = feishu.patches
    assert applied.method == "CALLBACK" and applied.message_id == card.message_id
    assert "已批准：send_invoice（Alice Chen）" in applied.text and patch_calls(feishu) == []


async def test_user_name_asks_the_contact_api_once_per_user_and_never_raises() -> None:
    """`FeishuAPI.user_name`: the name from `data.user.name` (the get-user page), cached; a user
    outside the app's contact range (41050) or a missing scope (99991672) is None, asked once."""
    from hermes_core.channels.feishu.api import FeishuAPI

    async with FakeFeishu() as feishu:
        feishu.users["ou_alice"] = "Alice Chen"
        async with FeishuAPI(feishu.app_id, feishu.app_secret, base_url=feishu.base_url) as api:
            names = [
                await api.user_name("ou_alice"),
                await api.user_name("ou_alice"),
                await api.user_name("ou_x"),
            ]
            feishu.contact_forbidden = True
            assert await api.user_name("ou_bob") is None and await api.user_name("ou_bob") is None
    assert names == ["Alice Chen", "Alice Chen", None]
    contact = [(c.path.rsplit("/", 1)[1], c.code) for c in feishu.requests if "/contact/" in c.path]
    assert contact == [("ou_alice", 0), ("ou_x", 41050), ("ou_bob", 99991672)]
