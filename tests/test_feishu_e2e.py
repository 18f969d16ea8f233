"""The Feishu bot end to end: the fake open platform pushes events, the gateway answers through it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gateway_harness import feishu_gateway, idle
from hermes_core.gateway.messages import InboundMessage
from hermes_core.testing.fake_feishu import FakeFeishu
from waiting import eventually

Runner = Callable[[InboundMessage], Awaitable[list[str]]]
ENCRYPT_KEY = "e2e-encrypt-key"


async def echo(message: InboundMessage) -> list[str]:
    return [f"echo: {message.text}"]


@pytest.mark.parametrize("mode", ["webhook", "longconn"])
async def test_group_mention_and_one_to_one_each_get_one_threaded_reply(tmp_path: Path, mode: str) -> None:
    async with FakeFeishu(encrypt_key=ENCRYPT_KEY, time_scale=0.001) as feishu:
        async with feishu_gateway(tmp_path, feishu, mode=mode) as (gateway, url):
            group = feishu.user_message(
                "今天天气如何", chat_id="oc_group", chat_type="group", mention_bot=True
            )
            unmentioned = feishu.user_message("chatter", chat_id="oc_group", chat_type="group")
            direct = feishu.user_message("hello bot", chat_id="oc_p2p", sender="ou_alice")
            for envelope in (group, unmentioned, direct):
                if mode == "webhook":
                    assert (await feishu.push(envelope, url)).ok
                else:
                    await feishu.ws_deliver(envelope)
            await eventually(lambda: len(feishu.sent) >= 2)
            await feishu.drain()  # every event delivered and acknowledged
            await eventually(lambda: idle(gateway))  # and handled: nothing else may arrive
    by_chat = {message.chat_id: message for message in feishu.sent}
    assert len(feishu.sent) == 2
    assert by_chat["oc_group"].text == "echo: 今天天气如何"
    assert by_chat["oc_group"].reply_to == group["event"]["message"]["message_id"]
    assert by_chat["oc_p2p"].text == "echo: hello bot"
    assert by_chat["oc_p2p"].reply_to == direct["event"]["message"]["message_id"]


@pytest.mark.slow
async def test_300_messages_with_every_push_duplicated_get_exactly_300_replies_in_order(
    tmp_path: Path,
) -> None:
    async with FakeFeishu(time_scale=0.001) as feishu:
        async with feishu_gateway(tmp_path, feishu) as (gateway, url):
            chats = [f"oc_{n}" for n in range(30)]

            async def one_chat(chat: str) -> None:
                for i in range(10):
                    envelope = feishu.user_message(
                        f"{chat} #{i}", chat_id=chat, sender=f"ou_{chat}", chat_type="group", mention_bot=True
                    )
                    assert (await feishu.push(envelope, url)).ok
                    assert (await feishu.push(envelope, url)).ok  # same event_id again
                    assert (await feishu.push(feishu.redelivery_of(envelope, new_event_id=True), url)).ok

            await asyncio.gather(*(one_chat(chat) for chat in chats))
            await eventually(lambda: len(feishu.sent) >= 300, timeout=60)
            await eventually(lambda: idle(gateway))
    assert len(feishu.sent) == 300
    for chat in chats:
        assert [m.text for m in feishu.messages_in(chat)] == [f"echo: {chat} #{i}" for i in range(10)]


async def test_ack_deadline_holds_while_the_model_takes_10_seconds(tmp_path: Path) -> None:
    started_turns: list[str] = []

    async def slow_model(message: InboundMessage) -> list[str]:
        started_turns.append(message.text)
        await asyncio.sleep(10)  # a model that takes 10 s: the behaviour under test
        return ["late answer"]

    async with FakeFeishu() as feishu:
        async with feishu_gateway(tmp_path, feishu, slow_model) as (gateway, url):
            results = [await feishu.push(feishu.user_message(f"q{i}", chat_id="oc_1"), url) for i in range(5)]
            await eventually(lambda: bool(started_turns))
            counts = await gateway.store.counts()  # type: ignore[attr-defined]
            gateway.accepting = False
    assert all(result.ok and result.elapsed < 1.0 for result in results), [r.elapsed for r in results]
    assert counts["inbox_pending"] == 5  # acknowledged = durable, although no turn has finished


async def test_forged_replayed_malformed_and_oversized_requests_are_refused(tmp_path: Path) -> None:
    async with FakeFeishu(encrypt_key=ENCRYPT_KEY) as feishu:
        async with feishu_gateway(tmp_path, feishu) as (gateway, url):
            message = feishu.user_message("do something", chat_id="oc_1")
            attempts = {
                "bad signature": await feishu.push(message, url, bad_signature=True),
                "unsigned": await feishu.push(message, url, sign=False),
                "stale": await feishu.push(message, url, timestamp=str(int(time.time()) - 3 * 86400)),
                "plaintext wrong token": await feishu.push(message, url, encrypt=False, token="forged"),
            }
            import aiohttp

            async with aiohttp.ClientSession() as session:
                for name, body in {
                    "malformed": b"{not json",
                    "oversized": b"{" + b" " * (2 * 1024 * 1024) + b"}",
                }.items():
                    async with session.post(url, data=body) as response:
                        attempts[name] = response.status  # type: ignore[assignment]
            counts = await gateway.store.counts()  # type: ignore[attr-defined]
            pending = await gateway.store.pending_inbound()
    statuses = {name: (a if isinstance(a, int) else a.status) for name, a in attempts.items()}
    assert all(status is not None and 400 <= status < 500 for status in statuses.values()), statuses
    assert counts["inbox_pending"] == 0 and pending == [] and feishu.sent == []


@pytest.mark.slow
async def test_throttling_storms_deliver_every_reply_in_order(tmp_path: Path) -> None:
    async with FakeFeishu(time_scale=0.001) as feishu:
        feishu.set_limits(chat_qps=5)
        feishu.fail_next(6, code=99991400, reset=0.2)
        async with feishu_gateway(tmp_path, feishu) as (_, url):
            for i in range(20):
                if i == 10:
                    feishu.fail_next(4, code=230020)
                envelope = feishu.user_message(f"m{i}", chat_id=f"oc_{i % 2}", sender=f"ou_{i % 2}")
                assert (await feishu.push(envelope, url)).ok
            await eventually(lambda: len(feishu.sent) >= 20, timeout=60)
    for chat in ("oc_0", "oc_1"):
        texts = [m.text for m in feishu.messages_in(chat)]
        assert texts == [f"echo: m{i}" for i in range(20) if f"oc_{i % 2}" == chat]
    codes = [call.code for call in feishu.requests if "messages" in call.path]
    assert 99991400 in codes and 230020 in codes


async def test_non_text_message_is_answered_politely_without_running_the_agent(tmp_path: Path) -> None:
    """A sticker (nothing can read it: the resource API does not serve stickers, FEISHU.md §11) gets
    the fixed reply; a voice message without a transcription endpoint gets its own polite reply."""
    from hermes_core import Agent
    from hermes_core.gateway.runner import AgentRunner
    from hermes_core.testing import ScriptedModel

    model = ScriptedModel([])  # any model call would fail the turn
    async with FakeFeishu() as feishu:
        async with feishu_gateway(tmp_path, feishu, AgentRunner(Agent(model=model))) as (_, url):
            assert (await feishu.push(feishu.sticker_message(chat_id="oc_1"), url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            assert (await feishu.push(feishu.audio_message(b"OggS" + bytes(64), chat_id="oc_1"), url)).ok
            await eventually(lambda: len(feishu.sent) == 2)
    assert "读不了这种消息" in feishu.sent[0].text and "cannot read this kind" in feishu.sent[0].text
    assert "转不了文字" in feishu.sent[1].text and "no speech-to-text service" in feishu.sent[1].text
    assert model.calls == []
