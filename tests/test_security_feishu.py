"""Attacks on the Feishu channel, end to end: the fake platform (testing/fake_feishu) pushes events to
a gateway on 127.0.0.1 and records every open-API call the bot makes.

Where the cases come from: issue 31's second round of attacks. Ids in URL paths — RFC 3986 §3.3
(a path segment may not hold `/`, `?` or `#` unencoded) and §5.2.4 (dot segments are removed: the
client's URL library turns `…/messages/om_a/../om_b/reply` into `…/messages/om_b/reply`); OWASP's
Server-Side Request Forgery Prevention Cheat Sheet (never build an upstream path from input
without validating it, encode what goes into a path).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from gateway_harness import feishu_gateway, wait_for
from hermes_core.testing.fake_feishu import FakeFeishu


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
        await wait_for(lambda: any(sent.text.endswith("hello") for sent in feishu.messages_in("oc_chat1")))
    assert feishu.messages_in("oc_hr") == []
    assert not [call.path for call in feishu.requests if victim_id in call.path]
    assert statuses == [400] * len(crafted)
