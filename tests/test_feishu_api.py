"""Feishu sending: rate limiting (virtual clock), formatting and splitting, and the API client
spoken to over real HTTP against the fake Feishu platform."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
import uuid as uuidlib
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_core.channels.base import DeliveryError
from hermes_core.channels.feishu.api import FeishuAPI, part_uuid
from hermes_core.channels.feishu.formatting import (
    CARD_LIMIT,
    TEXT_LIMIT,
    encoded_size,
    format_reply,
    markdown_card,
    split_text,
    wants_card,
)
from hermes_core.channels.feishu.ratelimit import SendLimiter, TokenBucket
from hermes_core.gateway.messages import OutboundMessage
from hermes_core.testing.fake_feishu import FakeFeishu
from virtual_clock import VirtualClock

T = TypeVar("T")


def virtual_limiter(clock: VirtualClock, **limits: Any) -> SendLimiter:
    """A limiter on virtual time; the app-wide limits are out of the way unless given."""
    limits = {"rate_per_s": None, "app_per_s": 1e6, "app_per_min": 1e8, "margin": 0.0, **limits}
    return SendLimiter(clock=clock, sleep=clock.sleep, **limits)


def most_in_window(times: list[float], window: float) -> int:
    """The largest number of `times` inside any half-open window [t, t + window)."""
    times = sorted(times)
    return max((sum(1 for u in times[i:] if u < t + window - 1e-9) for i, t in enumerate(times)), default=0)


# --- ratelimit.py ---------------------------------------------------------------------------


async def test_token_bucket_bursts_then_paces() -> None:
    clock = VirtualClock()
    bucket = TokenBucket(10, burst=3, clock=clock, sleep=clock.sleep)

    async def acquire() -> float:
        await bucket.acquire()
        return clock.now

    times = await clock.run(*(acquire() for _ in range(7)))
    assert times == pytest.approx([0, 0, 0, 0.1, 0.2, 0.3, 0.4])


async def test_each_chat_is_paced_alone_and_the_steady_rate_caps_them_all() -> None:
    clock = VirtualClock()
    limiter = virtual_limiter(clock, chat_per_s=5)
    sent: dict[str, list[float]] = {"a": [], "b": []}

    async def send(chat: str) -> None:
        async with limiter.slot(chat):
            sent[chat].append(clock.now)

    await clock.run(*(send(chat) for chat in "abababab"))
    assert sent["a"] == pytest.approx([0, 0.2, 0.4, 0.6], abs=1e-3)
    assert sent["b"] == pytest.approx([0, 0.2, 0.4, 0.6], abs=1e-3)

    clock = VirtualClock()
    limiter = virtual_limiter(clock, chat_per_s=5, margin=0.1)  # 5 in any 1.1 s: a little slack for jitter
    sent = {"a": [], "b": []}
    await clock.run(*(send("a") for _ in range(4)))
    assert sent["a"] == pytest.approx([0, 0.22, 0.44, 0.66], abs=1e-3)

    clock = VirtualClock()
    limiter = virtual_limiter(clock, rate_per_s=5)
    sent = {chat: [] for chat in "abcdefghij"}
    await clock.run(*(send(chat) for chat in "abcdefghij"))
    all_times = sorted(t for times in sent.values() for t in times)
    assert all_times == pytest.approx([i * 0.2 for i in range(10)], abs=1e-3)


async def test_app_limits_hold_in_every_window() -> None:
    clock = VirtualClock()
    limiter = virtual_limiter(clock, app_per_s=10, app_per_min=100)
    times: list[float] = []

    async def send(chat: str) -> None:
        async with limiter.slot(chat):
            times.append(clock.now)

    await clock.run(*(send(f"chat{i}") for i in range(250)))
    assert most_in_window(times, 1.0) <= 10
    assert most_in_window(times, 60.0) <= 100
    assert times[9] == pytest.approx(0.9)  # the first burst goes at the per-second pace


async def test_pauses_hold_everyone_or_one_chat_even_when_announced_during_a_wait() -> None:
    clock = VirtualClock()
    limiter = virtual_limiter(clock)
    started: dict[str, float] = {}

    async def send(name: str, chat: str) -> None:
        async with limiter.slot(chat):
            started[name] = clock.now

    limiter.pause_chat("a", 3.0)
    await clock.run(send("a1", "a"), send("b1", "b"))
    assert started == {"a1": 3.0, "b1": 0.0}

    async def pause_soon() -> None:
        await clock.sleep(0.1)
        limiter.pause_until(clock.now + 2.0)

    await clock.run(send("c1", "c"), send("c2", "c"), pause_soon())
    assert started["c1"] == pytest.approx(3.0)
    assert started["c2"] == pytest.approx(5.1)  # its turn came at 3.2, but the pause from 3.1 held it


async def test_idle_chats_are_forgotten() -> None:
    clock = VirtualClock()
    limiter = virtual_limiter(clock, idle_after=60)

    async def send(chat: str) -> None:
        async with limiter.slot(chat):
            pass

    await clock.run(*(send(f"chat{i}") for i in range(1000)))
    assert limiter.tracked_chats() == 1000
    clock.now += 61
    await clock.run(send("new"))
    assert limiter.tracked_chats() == 1


# --- formatting.py --------------------------------------------------------------------------


def text_of(msg_type: str, content: dict[str, Any]) -> str:
    """The text of a text message, or the markdown of a card built by `markdown_card`."""
    return str(content["text"] if msg_type == "text" else content["body"]["elements"][0]["content"])


def markdown_of(content: str) -> str:
    card = json.loads(content)
    assert card["schema"] == "2.0" and card["config"]["update_multi"] is True
    [element] = card["body"]["elements"]
    assert element["tag"] == "markdown"
    return str(element["content"])


def test_plain_short_replies_are_text_and_structured_or_long_ones_are_cards() -> None:
    [part] = format_reply("你好！The answer is 42.")
    assert part.msg_type == "text"
    assert json.loads(part.content) == {"text": "你好！The answer is 42."}

    for text in [
        "Run:\n```bash\nls\n```",
        "# Title\nbody",
        "Steps:\n- one\n- two",
        "1. first\n2. second",
        "see [the docs](https://open.feishu.cn)",
        "this is **important**",
        "word " * 500,
    ]:
        assert wants_card(text), text
        [part] = format_reply(text)
        assert part.msg_type == "interactive"
        assert markdown_of(part.content) == text
    assert format_reply("  \n ") == []
    assert not wants_card("3 * 4 = 12, and a - b is fine")


def test_a_200kb_reply_is_split_in_order_on_paragraph_boundaries() -> None:
    lines = [f"Line {i}: " + "lorem ipsum dolor sit amet " * 7 for i in range(4)]
    paragraphs = [f"Paragraph {i}:\n" + "\n".join(lines) for i in range(280)]
    text = "\n\n".join(paragraphs)
    assert len(text.encode()) > 200_000
    parts = format_reply(text)
    assert len(parts) >= 7
    assert all(p.msg_type == "interactive" and encoded_size(p.content) <= CARD_LIMIT for p in parts)
    chunks = [markdown_of(p.content) for p in parts]
    assert "".join(chunks) == text
    assert all(chunk.endswith("\n\n") for chunk in chunks[:-1])

    text_parts = format_reply(text, "text")
    assert len(text_parts) == 2
    assert all(encoded_size(p.content) <= TEXT_LIMIT for p in text_parts)
    assert "".join(json.loads(p.content)["text"] for p in text_parts) == text


def test_long_chinese_text_splits_cleanly_at_punctuation() -> None:
    text = "飞书机器人的回复需要按字节限制分段，每一段都必须是完整的字符。" * 6000  # 540 KB, no newline
    for msg_type, limit in (("text", TEXT_LIMIT), ("interactive", CARD_LIMIT)):
        parts = format_reply(text, msg_type)
        assert all(encoded_size(p.content) <= limit for p in parts)
        chunks = [text_of(p.msg_type, json.loads(p.content)) for p in parts]
        assert "".join(chunks) == text
        assert all(chunk[-1] in "，。" for chunk in chunks), [c[-5:] for c in chunks]
        assert len(parts) <= len(text.encode()) // (limit * 0.9) + 1


def test_code_fences_are_closed_and_reopened_across_parts() -> None:
    code = "\n".join(f"    total += values[{i}]  # 累加" for i in range(4000))
    text = f"Here is the code:\n\n```python\n{code}\n```\n\nThat is all."
    parts = format_reply(text)
    assert len(parts) >= 3
    chunks = [markdown_of(p.content) for p in parts]
    for index, chunk in enumerate(chunks):
        assert encoded_size(parts[index].content) <= CARD_LIMIT
        fences = re.findall(r"^```.*$", chunk, re.MULTILINE)
        assert len(fences) % 2 == 0, f"part {index} leaves a fence open"
        if index > 0:
            assert chunk.startswith("```python\n")
    body_lines = [line for chunk in chunks for line in chunk.splitlines() if not line.startswith("```")]
    assert body_lines == [line for line in text.splitlines() if not line.startswith("```")]


def utf8_cost(text: str) -> int:
    return len(text.encode("utf-8"))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(st.characters(codec="utf-8"), max_size=400),
            st.just("\n"),
            st.just("\n\n"),
            st.just(" "),
        ),
        max_size=40,
    ),
    st.integers(64, 500),
)
def test_split_text_keeps_every_character_and_every_budget(pieces: list[str], budget: int) -> None:
    text = "".join(pieces).replace("```", "`").replace("~~~", "~")
    chunks = split_text(text, budget, utf8_cost)
    assert "".join(chunks) == text
    assert all(0 < utf8_cost(chunk) <= budget for chunk in chunks)


# --- api.py, against the fake platform --------------------------------------------------------

SECRET = "app-secret-never-logged-7f3a"


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu(app_id="cli_test_app", app_secret=SECRET) as fake:
        yield fake


def fast_api(feishu: FakeFeishu, **options: Any) -> FeishuAPI:
    """A client with short backoffs; unless a limiter is given, only the per-chat pacing applies."""
    options.setdefault("limiter", SendLimiter(rate_per_s=None, app_per_s=1000, app_per_min=1e6))
    options.setdefault("retry_base_delay", 0.02)
    return FeishuAPI("cli_test_app", SECRET, base_url=feishu.base_url, **options)


def fast_chats(feishu: FakeFeishu) -> SendLimiter:
    """Raise the per-chat limit on both sides, for tests about something else than pacing."""
    feishu.set_limits(chat_qps=50)
    return SendLimiter(rate_per_s=None, chat_per_s=40)


def outbound(text: str, chat_id: str = "oc_chat", *, reply_to: str | None = None) -> OutboundMessage:
    uuid = uuidlib.uuid4().hex
    return OutboundMessage("feishu", chat_id, text, uuid, chat_id=chat_id, reply_to=reply_to)


def user_message_id(feishu: FakeFeishu, chat_id: str = "oc_chat", text: str = "hi") -> str:
    envelope = feishu.user_message(text, chat_id=chat_id)
    return str(envelope["event"]["message"]["message_id"])


def calls_to(feishu: FakeFeishu, fragment: str) -> list[Any]:
    return [call for call in feishu.requests if fragment in call.path]


async def test_bot_info_returns_the_bot_object(feishu: FakeFeishu) -> None:
    async with fast_api(feishu) as api:
        bot = await api.bot_info()
    assert bot["open_id"] == feishu.bot_open_id
    assert "app_name" in bot


async def test_one_token_request_serves_50_concurrent_sends(feishu: FakeFeishu) -> None:
    feishu.set_limits(app_qps=1000, app_qpm=100_000)
    async with fast_api(feishu) as api:
        await asyncio.gather(*(api.send(outbound(f"hello {i}", f"oc_{i}")) for i in range(50)))
        await api.send(outbound("and once more", "oc_0"))
    assert len(calls_to(feishu, "tenant_access_token")) == 1
    assert len(feishu.tokens_issued) == 1
    assert len(feishu.sent) == 51


async def test_a_rejected_token_is_fetched_again_once_and_the_call_retried(feishu: FakeFeishu) -> None:
    async with fast_api(feishu) as api:
        await api.send(outbound("one"))
        feishu.expire_tokens()
        await api.send(outbound("two"))
        feishu.revoke(feishu.tokens_issued[-1])
        await asyncio.gather(*(api.send(outbound(f"three {i}", f"oc_{i}")) for i in range(5)))
    assert len(feishu.tokens_issued) == 3  # one per rejection, not one per concurrent caller
    assert [call.code for call in feishu.requests].count(99991663) >= 2
    assert len(feishu.sent) == 7


async def test_the_token_is_renewed_before_it_expires() -> None:
    async with FakeFeishu(app_id="cli_test_app", app_secret=SECRET, token_ttl=2) as feishu:
        clock = VirtualClock()  # the client's clock: 1.1 s pass without waiting for them
        async with fast_api(feishu, clock=clock) as api:
            await api.send(outbound("one"))  # a 2 s token: renewed half-way, after 1 s
            clock.now += 1.1
            await api.send(outbound("two"))
    assert len(feishu.tokens_issued) == 2
    assert all(call.code != 99991663 for call in feishu.requests)


async def test_a_wrong_secret_is_a_clear_permanent_error(
    feishu: FakeFeishu, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with FeishuAPI("cli_test_app", "wrong-secret-123", base_url=feishu.base_url) as api:
        with pytest.raises(DeliveryError) as caught:
            await api.bot_info()
    assert caught.value.permanent
    message = str(caught.value)
    assert "cli_test_app" in message and "app_secret" in message and "10014" in message
    assert "wrong-secret-123" not in message + caplog.text


async def test_replies_thread_under_the_trigger_and_other_sends_create(feishu: FakeFeishu) -> None:
    trigger = user_message_id(feishu)
    long_reply = "\n\n".join(f"Paragraph {i}. " + "abc " * 2000 for i in range(12))  # several parts
    async with fast_api(feishu, limiter=fast_chats(feishu)) as api:
        last = await api.send(outbound(long_reply, reply_to=trigger))
        await api.send(outbound("a new message"))
    *replies, created = feishu.messages_in("oc_chat")
    assert len(replies) > 1 and last == replies[-1].message_id
    assert all(message.reply_to == trigger for message in replies)
    assert created.reply_to is None and created.text == "a new message"
    assert calls_to(feishu, "messages")[-1].query == {"receive_id_type": "chat_id"}


async def test_a_recalled_reply_target_falls_back_to_the_chat(feishu: FakeFeishu) -> None:
    trigger = user_message_id(feishu)
    feishu.recall(trigger)
    async with fast_api(feishu) as api:
        message_id = await api.send(outbound("still delivered", reply_to=trigger))
    [message] = feishu.messages_in("oc_chat")
    assert message.message_id == message_id and message.reply_to is None
    assert [call.code for call in calls_to(feishu, "/reply")] == [230011]


async def test_text_or_card_and_the_card_can_be_patched(feishu: FakeFeishu) -> None:
    async with fast_api(feishu) as api:
        await api.send(outbound("just a short answer"))
        card_id = await api.send(outbound("Try:\n```python\nprint('hi')\n```"))
        await api.patch_card(card_id, markdown_card("approved ✅"))
    plain, card = feishu.messages_in("oc_chat")
    assert (plain.msg_type, plain.content) == ("text", {"text": "just a short answer"})
    assert card.msg_type == "interactive" and card.content["config"]["update_multi"] is True
    assert card.text == "approved ✅" and card.versions[0] == "Try:\n```python\nprint('hi')\n```"


async def test_a_200kb_reply_and_a_long_chinese_text_arrive_whole_and_in_order(feishu: FakeFeishu) -> None:
    english = "\n\n".join(f"Paragraph {i}: " + "lorem ipsum dolor sit amet " * 28 for i in range(280))
    chinese = "飞书机器人的回复需要按字节限制分段，每一段都必须是完整的字符。" * 4000
    async with fast_api(feishu, limiter=fast_chats(feishu)) as api:
        await api.send(outbound(english, "oc_en"))
        await api.send(outbound(chinese, "oc_zh"))
    for chat, text in (("oc_en", english), ("oc_zh", chinese)):
        messages = feishu.messages_in(chat)
        assert len(messages) > 3
        assert all(len(m.raw_content.encode()) <= CARD_LIMIT for m in messages)
        assert "".join(text_of(m.msg_type, m.content) for m in messages) == text
    assert all(call.code == 0 for call in feishu.requests)  # nothing was refused as too large


async def test_sending_the_same_message_twice_creates_each_part_once(feishu: FakeFeishu) -> None:
    trigger = user_message_id(feishu)
    message = outbound("\n\n".join("part of a long reply " * 900 for _ in range(4)), reply_to=trigger)
    async with fast_api(feishu, limiter=fast_chats(feishu)) as api:
        first = await api.send(message)
        second = await api.send(message)  # e.g. resent after a crash before the outbox was updated
    parts = feishu.messages_in("oc_chat")
    assert len(parts) > 1 and first == second == parts[-1].message_id
    assert len({m.uuid for m in parts}) == len(parts)
    assert all(m.uuid and len(m.uuid) <= 50 and m.uuid.startswith(message.uuid) for m in parts)
    assert part_uuid("x" * 80, 3) == part_uuid("x" * 80, 3) and len(part_uuid("x" * 80, 3)) == 50


async def test_a_throttling_storm_delivers_everything_in_order(feishu: FakeFeishu) -> None:
    feishu.set_limits(chat_qps=8)  # tighter than the client's 10/s per chat: the platform refuses some
    feishu.fail_next(4, code=99991400, reset=0.2)
    feishu.fail_next(6, code=230020)
    chats = [f"oc_storm_{n}" for n in range(5)]
    async with fast_api(feishu, limiter=SendLimiter(rate_per_s=None, chat_per_s=10)) as api:
        sends = [api.send(outbound(f"reply {i}", chat)) for i in range(10) for chat in chats]
        await asyncio.gather(*sends)
    for chat in chats:
        assert [m.text for m in feishu.messages_in(chat)] == [f"reply {i}" for i in range(10)]
    codes = [call.code for call in feishu.requests]
    assert codes.count(99991400) >= 4 and codes.count(230020) > 6  # injected, and the chats' own limit


@pytest.mark.parametrize("legacy_status_400", [False, True])
async def test_an_app_rate_limit_waits_for_the_reset(feishu: FakeFeishu, legacy_status_400: bool) -> None:
    feishu.set_limits(legacy_status_400=legacy_status_400)
    feishu.fail_next(1, code=99991400, reset=0.3)
    async with fast_api(feishu) as api:
        await api.send(outbound("after the wait"))
    refused, accepted = calls_to(feishu, "messages")
    assert (refused.status, refused.code) == (400 if legacy_status_400 else 429, 99991400)
    assert accepted.code == 0 and accepted.at - refused.at >= 0.3


async def test_sends_to_one_chat_never_exceed_its_rate(feishu: FakeFeishu) -> None:
    feishu.set_limits(chat_qps=10)
    limiter = SendLimiter(rate_per_s=None, chat_per_s=10)
    async with fast_api(feishu, limiter=limiter) as api:
        await asyncio.gather(*(api.send(outbound(f"n{i}")) for i in range(12)))
    calls = calls_to(feishu, "messages")
    assert [call.code for call in calls] == [0] * 12  # the platform never had to refuse one
    times = [call.at for call in calls]
    assert most_in_window(times, 0.95) <= 10
    assert times[-1] - times[0] >= 1.0  # 12 sends at 10/s: evenly spaced, not in bursts


async def test_refusals_are_permanent_and_outages_retryable(feishu: FakeFeishu) -> None:
    feishu.chats_without_bot.add("oc_elsewhere")
    async with fast_api(feishu, max_retries=2) as api:
        with pytest.raises(DeliveryError) as refused:
            await api.send(outbound("hello", "oc_elsewhere"))
        feishu.fail_next(1, code=230001)
        with pytest.raises(DeliveryError) as bad:
            await api.send(outbound("hello"))
        feishu.fail_next(5, code=1, status=500)
        with pytest.raises(DeliveryError) as outage:
            await api.send(outbound("hello"))
    assert refused.value.permanent and "code 230002: The bot can not be outside the group" in str(
        refused.value
    )
    assert bad.value.permanent and "230001" in str(bad.value)
    assert not outage.value.permanent and outage.value.retry_after is not None
    assert [call.status for call in feishu.requests[-3:]] == [500, 500, 500]  # 1 try + 2 retries


async def test_no_secret_or_token_in_logs_or_errors(
    feishu: FakeFeishu, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    errors: list[str] = []
    async with fast_api(feishu, max_retries=1, limiter=fast_chats(feishu)) as api:
        await api.send(outbound("hi"))
        feishu.expire_tokens()
        feishu.fail_next(1, code=99991400, reset=0.05)
        feishu.fail_next(1, code=230020)
        await api.send(outbound("again"))
        feishu.fail_next(3, code=1, status=503)
        feishu.chats_without_bot.add("oc_nope")
        for message in (outbound("x"), outbound("y", "oc_nope")):
            try:
                await api.send(message)
            except DeliveryError as exc:
                errors.append(repr(exc) + str(exc))
        errors.append(repr(api))
    assert len(errors) == 3 and caplog.text
    for secret in [SECRET, *feishu.tokens_issued]:
        assert secret not in caplog.text
        assert all(secret not in text for text in errors)


def test_importing_the_feishu_sending_modules_does_not_import_aiohttp() -> None:
    code = (
        "import sys; import hermes_core.channels.feishu.api, hermes_core.channels.feishu.formatting, "
        "hermes_core.channels.feishu.ratelimit; assert 'aiohttp' not in sys.modules, 'aiohttp imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
