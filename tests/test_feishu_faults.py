"""Platform faults the bot must ride out: a reply target that no longer exists, and every way the
platform can refuse the tenant token. Real HTTP against the fake platform, the real gateway.

Sources: the reply API's error table (open.feishu.cn/document/server-docs/im-v1/message/reply:
230011 the message was recalled, 231003 it does not exist) and the generic error-code page
(open.feishu.cn/document/server-docs/api-call-guide/generic-error-code: 9999166x/7x, the token
codes; 99991672, a scope the app lacks).
"""

from __future__ import annotations

import uuid as uuidlib
from pathlib import Path

import pytest

from gateway_harness import feishu_gateway
from hermes_core.channels.feishu.api import TOKEN_CODES, FeishuAPI, FeishuError
from hermes_core.channels.feishu.ratelimit import SendLimiter
from hermes_core.channels.feishu.resources import download_resource
from hermes_core.gateway.messages import InboundMessage, OutboundMessage
from hermes_core.testing.fake_feishu import FakeFeishu
from waiting import eventually


def client(feishu: FakeFeishu) -> FeishuAPI:
    limiter = SendLimiter(rate_per_s=None, app_per_s=1000, app_per_min=1e6)
    return FeishuAPI(feishu.app_id, feishu.app_secret, base_url=feishu.base_url, limiter=limiter,
                     retry_base_delay=0.02)  # fmt: skip


def token_fetches(feishu: FakeFeishu) -> int:
    return sum(1 for call in feishu.requests if call.path.endswith("tenant_access_token/internal"))


async def test_a_reply_to_a_deleted_message_arrives_as_a_new_message_in_the_chat(tmp_path: Path) -> None:
    """The user's message is deleted while the model thinks: the reply API answers 231003 (the
    reply page's error table); the user still sees the answer, as a new message in the chat, and
    nothing is dead-lettered."""
    async with FakeFeishu() as feishu:

        async def answer_after_the_delete(message: InboundMessage) -> list[str]:
            feishu.delete(message.message_id)  # gone before the reply is sent
            return [f"echo: {message.text}"]

        async with feishu_gateway(tmp_path, feishu, answer_after_the_delete) as (gateway, url):
            ask = feishu.user_message("where did it go", chat_id="oc_group", chat_type="group",
                                      mention_bot=True)  # fmt: skip
            assert (await feishu.push(ask, url)).ok
            # the platform has the message before the gateway has recorded it as sent
            await eventually(lambda: len(feishu.sent) == 1 and gateway.replies_sent == 1)  # type: ignore[attr-defined]
            counts = await gateway.store.counts()  # type: ignore[attr-defined]
    [reply] = feishu.messages_in("oc_group")
    assert reply.text == "echo: where did it go" and reply.reply_to is None
    assert [call.code for call in feishu.requests if call.path.endswith("/reply")] == [231003]
    assert counts["dead_letters"] == 0 and counts["outbox_pending"] == 0


@pytest.mark.parametrize("code", sorted(TOKEN_CODES))
async def test_every_token_code_renews_the_token_once_and_the_send_goes_through(code: int) -> None:
    """Each token code of the generic error-code page: the token is fetched again, the call
    retried once, and the message is in the chat."""
    async with FakeFeishu() as feishu:
        feishu.fail_next(1, code=code)
        async with client(feishu) as api:
            await api.send(
                OutboundMessage("feishu", "oc_chat", "hello", uuidlib.uuid4().hex, chat_id="oc_chat")
            )
    assert [m.text for m in feishu.messages_in("oc_chat")] == ["hello"]
    assert token_fetches(feishu) == 2
    assert [call.code for call in feishu.requests if call.path == "/open-apis/im/v1/messages"] == [code, 0]


@pytest.mark.parametrize("code", sorted(TOKEN_CODES))
async def test_every_token_code_renews_the_token_for_a_download_too(code: int) -> None:
    """The message resource API (resources.py) renews on the same codes (one set for both)."""
    async with FakeFeishu() as feishu:
        envelope = feishu.image_message(b"\x89PNG picture")
        message = envelope["event"]["message"]
        key = message["content"].split('"')[3]
        feishu.fail_next(1, code=code, paths=("resources",))
        async with client(feishu) as api:
            fetched = await download_resource(api, message["message_id"], key, "image", limit=1 << 20,
                                              timeout=5)  # fmt: skip
    assert fetched.data == b"\x89PNG picture"
    assert token_fetches(feishu) == 2


async def test_a_missing_scope_is_refused_at_once_without_renewing_the_token() -> None:
    """99991672 (the app lacks a scope) is a configuration fault: a new token would not help, so
    the send is refused as permanent (dead-lettered by the outbox) after one call."""
    async with FakeFeishu() as feishu:
        feishu.fail_next(5, code=99991672)
        async with client(feishu) as api:
            with pytest.raises(FeishuError) as refused:
                await api.send(
                    OutboundMessage("feishu", "oc_chat", "hi", uuidlib.uuid4().hex, chat_id="oc_chat")
                )
    assert refused.value.permanent and refused.value.code == 99991672
    assert "the app lacks a scope" in str(refused.value)
    assert token_fetches(feishu) == 1
    assert sum(1 for call in feishu.requests if call.path == "/open-apis/im/v1/messages") == 1


@pytest.mark.parametrize(
    "event_type", ["im.message.reaction.created_v1", "application.bot.menu_v6", "p2p_chat_create"]
)
async def test_a_verified_event_of_a_type_not_handled_is_answered_200_so_it_is_not_pushed_again(
    tmp_path: Path, event_type: str
) -> None:
    """The platform re-pushes every push not answered HTTP 200 (4xx included) after 15 s, 5 min,
    1 h and 6 h (the event-subscription overview, open.feishu.cn/document/server-docs/
    event-subscription-guide/overview). An event the app subscribed to but the bot does not handle
    (a v2 type, or a v1 event with `uuid`) is answered 200 and dropped: nothing stored, nothing
    re-pushed; only forged or malformed requests get a 4xx."""
    async with FakeFeishu(encrypt_key="faults-key", time_scale=0.001) as feishu:
        async with feishu_gateway(tmp_path, feishu) as (gateway, url):
            if event_type == "p2p_chat_create":  # the v1 envelope (FEISHU.md §1)
                envelope = {
                    "ts": "1502199207.7171419", "uuid": uuidlib.uuid4().hex,
                    "token": feishu.verification_token, "type": "event_callback",
                    "event": {"type": event_type, "app_id": feishu.app_id},
                }  # fmt: skip
            else:
                envelope = feishu.event(event_type, {"operator": {"operator_id": {"open_id": "ou_user1"}}})
            feishu.deliver(envelope, url)
            await feishu.drain(10)
            counts = await gateway.store.counts()  # type: ignore[attr-defined]
    assert [(attempt.status, attempt.attempt) for attempt in feishu.push_log] == [(200, 0)]
    assert counts["inbox_pending"] == 0 and feishu.sent == []
