"""Feishu as a team sees it: group chats, topics, who said what, recalls, the bot added and
removed, and the cap on a message's length.

Against the real gateway `serve` builds (build_gateway), the fake Feishu platform and the fake
OpenAI-compatible model server; what is asserted is what the model receives and what the chat shows.
Pages followed: the receive event (`thread_id`, `root_id`: open.feishu.cn/document/server-docs/
im-v1/message/events/receive), the reply API (`reply_in_thread`: …/im-v1/message/reply), the topics
overview (…/im-v1/message/thread-introduction), the recalled event (…/im-v1/message/events/recalled)
and the bot added / removed events (open.feishu.cn/document/server-docs/group/chat-member/event/
added-2, …/deleted-2); the SDK's models of them: lark_oapi/api/im/v1/model/p2_im_message_recalled_v1.py,
p2_im_chat_member_bot_added_v1.py, p2_im_chat_member_bot_deleted_v1.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway_harness import idle, serving
from hermes_core import Agent
from hermes_core.channels.feishu.channel import GREETING
from hermes_core.channels.seam import TOO_LONG
from hermes_core.config import FeishuConfig, GatewayConfig, Settings
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.server import build_gateway
from hermes_core.kernel.replies import REPLIES
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from waiting import eventually

TEAM = "oc_team"
ALICE, BOB = "ou_alice", "ou_bob"


@asynccontextmanager
async def team_gateway(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch,
    admins: tuple[str, ...] = (), **feishu_config: Any,
) -> AsyncIterator[tuple[Gateway, str]]:  # fmt: skip
    """The gateway serve builds, with Feishu against the fake (replies as plain messages unless
    `stream` is given), `admins` its admins; yields it and its events URL."""
    monkeypatch.setenv("FEISHU_APP_SECRET", feishu.app_secret)
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", feishu.verification_token)
    settings = Settings(
        gateway=GatewayConfig(data_dir=str(tmp_path)),
        feishu=FeishuConfig(
            app_id=feishu.app_id, base_url=feishu.base_url, **{"stream": False, **feishu_config}
        ),  # fmt: skip
    )
    agent = Agent(model="fake-model", base_url=fake.base_url, api_key="sk-test",
                  permissions=Policy.from_lists(admins=list(admins)))  # fmt: skip
    gateway, routes = build_gateway(settings, agent)
    try:
        async with serving(gateway, routes) as url:
            yield gateway, f"{url}/feishu/events"
    finally:
        await gateway.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()


def user_texts(request: RecordedRequest) -> list[str]:
    """The user messages the model was given, oldest first."""
    return [str(m.get("content")) for m in request.messages if m.get("role") == "user"]


def said(open_id: str, text: str, name: str | None = None) -> str:
    """A group turn as the model reads it: the member (the fake's directory names every user it has
    seen "User <id>", as a real tenant's directory names its members), then the text."""
    name = f"User {open_id.removeprefix('ou_')}" if name is None else name
    return f'<at user_id="{open_id}">{name}</at>: {text}'


async def ask(feishu: FakeFeishu, url: str, envelope: dict[str, Any], replies: int) -> None:
    assert (await feishu.push(envelope, url)).ok
    await eventually(lambda: len(feishu.sent) >= replies)


async def test_each_topic_has_its_own_history_and_the_model_knows_who_speaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`group_session: topic` (the default): messages outside topics share the chat's history,
    each topic has its own; every group turn names its speaker, in the stored history too; a
    reply in a topic is sent with `reply_in_thread` and stays in it."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text("Noted."), FakeReply.text("I don't know."), FakeReply.text("Plum."))
        async with team_gateway(tmp_path, feishu, fake, monkeypatch) as (_, url):
            first = feishu.user_message("the code word is plum", chat_id=TEAM, chat_type="group",
                                        sender=ALICE, mention_bot=True)  # fmt: skip
            await ask(feishu, url, first, 1)
            root = first["event"]["message"]["message_id"]
            in_topic = feishu.topic_message("what is the code word?", root=root, sender=BOB, mention_bot=True)
            await ask(feishu, url, in_topic, 2)
            later = feishu.user_message("what did alice say?", chat_id=TEAM, chat_type="group",
                                        sender=BOB, mention_bot=True)  # fmt: skip
            await ask(feishu, url, later, 3)
    assert user_texts(fake.requests[0]) == [said(ALICE, "the code word is plum")]
    assert user_texts(fake.requests[1]) == [said(BOB, "what is the code word?")]  # the topic's own
    assert user_texts(fake.requests[2]) == [
        said(ALICE, "the code word is plum"),
        said(BOB, "what did alice say?"),
    ]
    topic = in_topic["event"]["message"]["thread_id"]
    assert topic and feishu.sent[1].thread_id == topic and feishu.sent[1].text == "I don't know."
    replies = [r.body for r in feishu.requests if r.path.endswith("/reply")]
    assert [body.get("reply_in_thread", False) for body in replies] == [False, True, False]
    assert feishu.sent[0].thread_id is None and feishu.sent[2].thread_id is None


async def test_members_are_named_from_the_contact_api_once_and_by_id_when_it_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The contact API (open.feishu.cn/document/server-docs/contact-v3/user/get) asked at turn
    time, once per member; a member outside the contact range (41050) is shown by id."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        feishu.users[ALICE] = 'Alice <Wang>\n"ops"'
        fake.script(*(FakeReply.text("ok") for _ in range(3)))
        async with team_gateway(tmp_path, feishu, fake, monkeypatch) as (_, url):
            for n, (sender, text) in enumerate([(ALICE, "one"), (BOB, "two"), (ALICE, "three")], 1):
                message = feishu.user_message(
                    text, chat_id=TEAM, chat_type="group", sender=sender, mention_bot=True
                )
                feishu.users.pop(BOB, None)  # Bob is outside the app's contact range
                await ask(feishu, url, message, n)
    alice = '<at user_id="ou_alice">Alice Wang ops</at>'
    assert user_texts(fake.requests[2]) == [f"{alice}: one", said(BOB, "two", ""), f"{alice}: three"]
    lookups = [r.path.rsplit("/", 1)[-1] for r in feishu.requests if "/contact/v3/users/" in r.path]
    assert lookups == [ALICE, BOB]  # each member once
    assert [r.query.get("user_id_type") for r in feishu.requests if "/contact/" in r.path] == ["open_id"] * 2


@pytest.mark.parametrize("group_session", ["chat", "user"])
async def test_a_group_shares_one_history_or_keeps_one_per_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, group_session: str
) -> None:
    """`chat`: one history for the whole group, topics included, which an admin's `/new` clears
    (a member's is refused: test_conversation_commands.py); `user`: one per member, and a member's
    `/new` (still a command after the speaker label) clears only their own."""
    admins = (f"feishu:{BOB}",) if group_session == "chat" else ()
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(*(FakeReply.text("ok") for _ in range(3)))
        async with team_gateway(
            tmp_path, feishu, fake, monkeypatch, admins=admins, group_session=group_session
        ) as (_, url):
            first = feishu.user_message(
                "plum", chat_id=TEAM, chat_type="group", sender=ALICE, mention_bot=True
            )
            await ask(feishu, url, first, 1)
            root = first["event"]["message"]["message_id"]
            await ask(feishu, url, feishu.topic_message("pear", root=root, sender=BOB, mention_bot=True), 2)
            new = feishu.user_message("/new", chat_id=TEAM, chat_type="group", sender=BOB, mention_bot=True)
            await ask(feishu, url, new, 3)
            again = feishu.user_message(
                "fig", chat_id=TEAM, chat_type="group", sender=ALICE, mention_bot=True
            )
            await ask(feishu, url, again, 4)
    assert feishu.sent[2].text == REPLIES["conversation_new"]["en"] and len(fake.requests) == 3
    if group_session == "chat":
        assert user_texts(fake.requests[1]) == [said(ALICE, "plum"), said(BOB, "pear")]
        assert user_texts(fake.requests[2]) == [said(ALICE, "fig")]  # Bob (an admin) cleared the group's
    else:
        assert user_texts(fake.requests[1]) == [said(BOB, "pear")]
        assert user_texts(fake.requests[2]) == [said(ALICE, "plum"), said(ALICE, "fig")]  # not Alice's


async def test_a_message_recalled_before_its_turn_is_never_answered_even_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recall is noted durably before the ack; the message waiting behind a slow turn is not
    run, neither by this process nor by the next one."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.slow(30, FakeReply.text("too late")), FakeReply.text("first, answered"))
        async with team_gateway(tmp_path, feishu, fake, monkeypatch) as (gateway, url):
            slow = feishu.user_message("first", sender=ALICE, chat_id="oc_dm")
            assert (await feishu.push(slow, url)).ok
            await eventually(lambda: len(fake.requests) == 1)
            second = feishu.user_message("second, sent by mistake", sender=ALICE, chat_id="oc_dm")
            assert (await feishu.push(second, url)).ok
            assert (await feishu.push(feishu.recalled(second["event"]["message"]["message_id"]), url)).ok
            assert [m.text for m in await gateway.store.pending_inbound()] == ["first"]  # second: withdrawn
        # the slow turn was cut by the stop; the next process runs the first message only
        async with team_gateway(tmp_path, feishu, fake, monkeypatch) as (gateway, url):
            await eventually(lambda: len(feishu.sent) == 1)
            await eventually(lambda: idle(gateway))
            assert await gateway.store.pending_inbound() == []
    assert len(fake.requests) == 2 and all("second" not in " ".join(user_texts(r)) for r in fake.requests)
    assert [m.text for m in feishu.sent] == ["first, answered"]


async def test_a_message_recalled_once_its_turn_started_is_still_answered_and_the_reply_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision documented in docs/feishu.md: a recall that comes after the turn started
    changes nothing; the reply goes out (into the chat: the message it answers is gone, 230011)
    and a reply already sent is not withdrawn (no DELETE)."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.slow(0.8, FakeReply.text("answered anyway")), FakeReply.text("kept"))
        async with team_gateway(tmp_path, feishu, fake, monkeypatch) as (gateway, url):
            running = feishu.user_message("first", sender=ALICE, chat_id="oc_dm")
            assert (await feishu.push(running, url)).ok
            await eventually(lambda: len(fake.requests) == 1)
            assert (await feishu.push(feishu.recalled(running["event"]["message"]["message_id"]), url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            answered = feishu.user_message("second", sender=ALICE, chat_id="oc_dm")
            await ask(feishu, url, answered, 2)
            assert (await feishu.push(feishu.recalled(answered["event"]["message"]["message_id"]), url)).ok
            await eventually(lambda: idle(gateway))
    assert [(m.text, m.reply_to) for m in feishu.sent] == [
        ("answered anyway", None),
        ("kept", answered["event"]["message"]["message_id"]),
    ]
    assert not [r for r in feishu.requests if r.method == "DELETE"]


async def test_a_removed_bot_sends_nothing_there_and_greets_once_when_added_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply queued for a chat the bot was removed from is dead-lettered with why, without a
    request to the platform; added again, the bot greets the group once (the event pushed twice),
    and a late redelivery of the removal (same event_id, older create_time) silences nothing."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.slow(1.0, FakeReply.text("answer nobody will see")), FakeReply.text("back"))
        greeting = "Hi team! @mention me to ask."
        async with team_gateway(tmp_path, feishu, fake, monkeypatch, greeting=greeting) as (gateway, url):
            asked = feishu.user_message(
                "hello", chat_id=TEAM, chat_type="group", sender=ALICE, mention_bot=True
            )
            assert (await feishu.push(asked, url)).ok
            await eventually(lambda: len(fake.requests) == 1)
            removed = feishu.bot_removed(TEAM)
            assert (await feishu.push(removed, url)).ok
            await eventually(lambda: gateway.counters["dead_letters"] == 1)
            [dead] = await gateway.store.dead_letters()
            assert "the bot was removed from chat oc_team" in dead["error"]
            assert not [r for r in feishu.requests if "/messages" in r.path]  # nothing tried
            added = feishu.bot_added(TEAM)  # a millisecond after the removal on the platform's clock:
            added["header"]["create_time"] = str(int(removed["header"]["create_time"]) + 1)  # type: ignore[index]
            assert (await feishu.push(added, url)).ok
            assert (await feishu.push(feishu.redelivery_of(added, new_event_id=False), url)).ok
            assert (await feishu.push(feishu.redelivery_of(removed, new_event_id=False), url)).ok
            again = feishu.user_message("hi", chat_id=TEAM, chat_type="group", sender=BOB, mention_bot=True)
            await ask(feishu, url, again, 2)
            await eventually(lambda: idle(gateway))
    assert [(m.chat_id, m.text) for m in feishu.sent] == [(TEAM, greeting), (TEAM, "back")]
    assert (
        feishu.sent[0].reply_to is None and feishu.sent[1].reply_to == again["event"]["message"]["message_id"]
    )


async def test_the_default_greeting_is_in_both_languages_and_an_empty_one_is_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        async with team_gateway(tmp_path, feishu, fake, monkeypatch) as (_, url):
            await ask(feishu, url, feishu.bot_added(TEAM), 1)
        async with team_gateway(tmp_path / "quiet", feishu, fake, monkeypatch, greeting="") as (gateway, url):
            assert (await feishu.push(feishu.bot_added("oc_other"), url)).ok
            await eventually(lambda: idle(gateway))
    greeting = GREETING
    assert [m.text for m in feishu.sent] == [f"{greeting['zh']}\n{greeting['en']}"]


async def test_a_900_kb_message_is_not_read_and_its_sender_is_told_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The webhook refuses a text over 20,000 characters (docs/webhook.md); Feishu, which must not
    refuse an event (it would push it again for hours), answers it with a note instead."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        async with team_gateway(tmp_path, feishu, fake, monkeypatch) as (gateway, url):
            huge = "log line " * (900 * 1024 // 9) + "end"  # 900 KB
            await ask(feishu, url, feishu.user_message(huge, sender=ALICE, chat_id="oc_dm"), 1)
            earlier = await gateway.store.replies_of("feishu", feishu.sent[0].reply_to or "")
    note = TOO_LONG["en"].format(length=f"{len(huge):,}", limit="20,000")
    assert fake.requests == [] and [m.text for m in feishu.sent] == [note]
    assert earlier is not None and earlier.message.kind == "too_long" and len(earlier.message.text) <= 500


async def test_new_event_fields_of_the_wrong_type_are_refused_and_change_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`thread_id`, a recall's `message_id` and a membership event's `chat_id` are type-checked
    like every field the channel reads: a 400 saying which, nothing stored, nothing sent."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        async with team_gateway(tmp_path, feishu, fake, monkeypatch) as (gateway, url):
            asked = feishu.user_message("hi", sender=ALICE, chat_id="oc_dm")
            asked["event"]["message"]["thread_id"] = 7
            recall = feishu.recalled(
                feishu.user_message("x", chat_id="oc_dm")["event"]["message"]["message_id"]
            )
            recall["event"]["message_id"] = ["om_1"]
            removed = feishu.bot_removed(TEAM)
            removed["event"]["chat_id"] = {"id": TEAM}
            answers = [await feishu.push(envelope, url) for envelope in (asked, recall, removed)]
            assert await gateway.store.pending_inbound() == [] and not await gateway.store.chat_left(
                "feishu", TEAM
            )
    assert [a.status for a in answers] == [400, 400, 400]
    assert ["event.message.thread_id" in answers[0].body, "event.message_id" in answers[1].body,
            "event.chat_id" in answers[2].body] == [True, True, True]  # fmt: skip
    assert feishu.sent == [] and fake.requests == []
