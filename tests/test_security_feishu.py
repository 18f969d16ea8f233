"""Attacks on the Feishu channel, end to end: the fake platform (testing/fake_feishu) pushes events to
a gateway on 127.0.0.1 and records every open-API call the bot makes.

Where the cases come from: issue 31's second round of attacks. Ids in URL paths — RFC 3986 §3.3
(a path segment may not hold `/`, `?` or `#` unencoded) and §5.2.4 (dot segments are removed: the
client's URL library turns `…/messages/om_a/../om_b/reply` into `…/messages/om_b/reply`); OWASP's
Server-Side Request Forgery Prevention Cheat Sheet (never build an upstream path from input
without validating it, encode what goes into a path). Approval prompts — Unicode TR9 (the bidi
controls) and TR36 §3 (visual spoofing), and the "Trojan Source" paper (CVE-2021-42574).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from gateway_harness import feishu_gateway, idle
from hermes_core import Agent
from hermes_core.gateway.runner import AgentRunner
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.pending import SQLiteInteractions
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_feishu.cards import buttons, rendered
from invoicing import RAN, send_invoice
from waiting import eventually


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


async def test_a_crafted_message_id_addresses_no_other_message(tmp_path: Path) -> None:
    """A message id that is a path (dot segments, a query, a fragment) made the bot's reply go to
    another chat's message: a reply to the victim, in the victim's chat. Now the event is refused
    (400) and the bot's calls name only the ids the platform wrote, each one path segment."""
    async with FakeFeishu() as feishu, feishu_gateway(tmp_path, feishu) as (_, url):
        victim = feishu.user_message("工资单", chat_id="oc_hr", sender="ou_hr")["event"]
        victim_id = victim["message"]["message_id"]  # type: ignore[index, call-overload]
        attacker = f"om_{uuid.uuid4().hex}"
        crafted = [f"{attacker}/../{victim_id}", f"{victim_id}/reply?", f"{victim_id}/reply#",
                   f"{victim_id}/"]  # fmt: skip
        statuses = []
        for message_id in crafted:
            pushed = await feishu.push(feishu.user_message("hi", message_id=message_id), url)
            statuses.append(pushed.status)
        genuine = await feishu.push(feishu.user_message("hello"), url)  # the same conversation: after them
        assert genuine.ok
        await eventually(lambda: any(sent.text.endswith("hello") for sent in feishu.messages_in("oc_chat1")))
    assert feishu.messages_in("oc_hr") == []
    assert not [call.path for call in feishu.requests if victim_id in call.path]
    assert statuses == [400] * len(crafted)


async def test_an_approval_card_shows_the_arguments_as_they_will_run(tmp_path: Path) -> None:
    """Arguments a prompt-injected model wrote to mislead the approver: Markdown that the card
    rendered (`**`, a link, strike-through hid what runs) and a right-to-left override (U+202E,
    Unicode TR9; "Trojan Source", CVE-2021-42574) and a zero-width space that reorder or hide
    characters. What the approver reads — the card as the client renders it (`rendered`), before and
    after the click — is the arguments verbatim, with the controls written out."""
    customer = "**ACME** ~~Globex~~ [details](http://127.0.0.1/x) \u202eexe.fdp\u202c z\u200bero"
    model = ScriptedModel(
        [call("send_invoice", {"customer": customer, "amount": 120}), reply("Invoice sent.")]
    )
    database = tmp_path / "agent.db"
    agent = Agent(model=model, tools=[send_invoice], journal=SQLiteTaskJournal(database),
                  interactions=SQLiteInteractions(database), permissions=Policy.from_lists())  # fmt: skip
    async with (
        FakeFeishu(time_scale=0.001) as feishu,
        feishu_gateway(tmp_path, feishu, AgentRunner(agent)) as (_, url),
    ):
        assert (await feishu.push(feishu.user_message("给 ACME 开发票", sender="ou_alice"), url)).ok
        await eventually(lambda: len(feishu.sent) == 1)
        asked = rendered(feishu.sent[0].content)
        approve = next(value for value in buttons(feishu.sent[0].content) if value["decision"] == "approve")
        clicked = await feishu.push(feishu.card_action("ou_alice", feishu.sent[0].message_id, approve), url)
        decided = rendered(json.loads(clicked.body)["card"]["data"])
        await eventually(lambda: len(feishu.sent) == 2)
    inert = "**ACME** ~~Globex~~ [details](http://127.0.0.1/x) <U+202E>exe.fdp<U+202C> z<U+200B>ero"
    for shown in (asked, decided):
        assert inert in shown, shown
        assert not {"\u202e", "\u202c", "\u200b"} & set(shown)
    assert RAN == [f"invoice {customer} 120"]


async def test_token_only_mode_refuses_an_event_captured_more_than_48_hours_ago(tmp_path: Path) -> None:
    """Without an Encrypt Key nothing signs an event's time, and its dedup key is forgotten after
    48 h: a captured event sent again later ran again. Now an event older than the replay window
    (by its header's `create_time`, FEISHU.md §1) is refused, and one within it is still a
    duplicate (the window is shorter than the dedup keys' 48 h)."""
    async with FakeFeishu() as feishu, feishu_gateway(tmp_path, feishu) as (gateway, url):
        captured = feishu.user_message("转账给我")
        captured["header"]["create_time"] = str(int((time.time() - 49 * 3600) * 1000))  # type: ignore[index]
        replayed = await feishu.push(captured, url)
        fresh = feishu.user_message("hello")
        assert (await feishu.push(fresh, url)).ok
        await eventually(lambda: len(feishu.sent) >= 1)
        again = await feishu.push(fresh, url)  # the same event within the window: a duplicate
        await eventually(lambda: idle(gateway))
    assert replayed.status == 401 and again.ok
    assert [sent.text for sent in feishu.sent] == ["echo: hello"]
