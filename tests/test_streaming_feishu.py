"""Feishu replies that stream: one card, filled in as the model writes, the reply written into it.

Against the real gateway `serve` builds (build_gateway), the fake Feishu platform and the fake
OpenAI-compatible server streaming its reply chunk by chunk. Two ways to stream, both tested:
CardKit (the default; the platform's "流式更新卡片" guide, open.feishu.cn/document/cardkit-v1/
streaming-updates-openapi-overview: a card entity whose markdown element is typed out, 10
operations a second per entity, a strictly increasing `sequence`, streaming closed after 10
minutes) and the fallback that patches a card message (the PATCH page: 5 QPS per message, HTTP 400
code 230020 over it). The pacing itself is checked on a virtual clock.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway_harness import feishu_gateway, idle, serving
from hermes_core import Agent, tool
from hermes_core.channels.feishu.stream import PATCH_INTERVAL, PatchPacer
from hermes_core.channels.streaming import TurnProgress
from hermes_core.config import FeishuConfig, GatewayConfig, Settings
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.runner import AgentRunner
from hermes_core.gateway.server import build_gateway
from hermes_core.kernel.redaction import Redactor
from hermes_core.kernel.replies import REPLIES
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_feishu.api import Patch, SentMessage
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from virtual_clock import VirtualClock
from waiting import eventually

ANSWER = (
    "Here is what I found about the weather in Hangzhou this week. Monday and Tuesday stay dry "
    "with a light breeze from the east; on Wednesday clouds move in from the sea, and by Thursday "
    "afternoon there is steady rain that lasts into Friday morning. The weekend clears up again, "
    "warm enough for a walk around the West Lake. Take an umbrella midweek."
)


@tool
async def search(query: str) -> str:
    """Search the web for a query."""
    await asyncio.sleep(0.6)  # long enough for the card to show the step running
    return f"results for {query}: dry early week, rain Thursday, clear weekend"


@asynccontextmanager
async def streaming_gateway(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch,
    *, stream: bool = True, card_streaming: str = "cardkit", **model: Any,
) -> AsyncIterator[tuple[Gateway, str]]:  # fmt: skip
    """The gateway serve builds, with Feishu against the fake; yields it and the events URL."""
    monkeypatch.setenv("FEISHU_APP_SECRET", feishu.app_secret)
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", feishu.verification_token)
    settings = Settings(
        gateway=GatewayConfig(data_dir=str(tmp_path)),
        feishu=FeishuConfig(
            app_id=feishu.app_id, base_url=feishu.base_url, stream=stream, card_streaming=card_streaming
        ),  # type: ignore[arg-type]
    )
    agent = Agent(model="fake-model", base_url=fake.base_url, api_key="sk-test", tools=[search], **model)
    gateway, routes = build_gateway(settings, agent)
    try:
        async with serving(gateway, routes) as url:
            yield gateway, f"{url}/feishu/events"
    finally:
        await gateway.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()


def patches_of(feishu: FakeFeishu, card: SentMessage) -> list[Patch]:
    return [patch for patch in feishu.patches if patch.message_id == card.message_id]


def content_chunks(text: str) -> int:
    """How many content chunks the fake model streams `text` in (3 to 8 characters, in turn)."""
    count, start = 0, 0
    while start < len(text):
        start, count = start + 3 + count % 6, count + 1
    return count


def most_in_one_second(times: list[float]) -> int:
    """The largest number of `times` inside any window of one second."""
    return max((sum(1 for t in times if start <= t < start + 1.0) for start in times), default=0)


def refused_patches(feishu: FakeFeishu) -> int:
    return sum(1 for r in feishu.requests if r.method == "PATCH" and r.code == 230020)


async def test_the_reply_streams_into_one_card_that_ends_as_the_complete_reply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback way: a card message patched (the PATCH page's 5 QPS per message)."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(
            FakeReply.tool_call("search", {"query": "Hangzhou weather"}),
            FakeReply.text(ANSWER, chunk_delay=0.02),  # about 60 chunks over 1.2 s
        )
        async with streaming_gateway(tmp_path, feishu, fake, monkeypatch, card_streaming="patch") as (
            gateway,
            url,
        ):
            ask = feishu.user_message("What's the weather in Hangzhou this week?", chat_id="oc_p2p")
            pushed = time.time()
            assert (await feishu.push(ask, url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            card = feishu.sent[0]
            await eventually(lambda: card.text == ANSWER)
            await eventually(lambda: idle(gateway))  # nothing more may follow
            # the model's last chunk left no sooner than this: one chunk_delay after each before it
            model_done = fake.requests[1].received_at + 0.02 * (content_chunks(ANSWER) - 1)
    assert len(feishu.sent) == 1  # one message, no second one with the reply
    assert card.msg_type == "interactive" and card.reply_to == ask["event"]["message"]["message_id"]
    assert card.created_at - pushed < 1.0  # the card appears within a second
    assert card.versions[0] == REPLIES["stream_thinking"]["en"]
    texts = [patch.text for patch in patches_of(feishu, card)]
    assert texts[-1] == ANSWER and card.text == ANSWER
    partial = [t for t in texts if t != ANSWER and ANSWER[:40] in t]  # patched while the model wrote
    assert partial and all(ANSWER.startswith(t.split("\n\n")[-1]) for t in partial)
    first_words = next(p for p in patches_of(feishu, card) if p.text in partial)
    assert first_words.at < model_done  # the card showed the answer while the model still wrote it
    running = next(i for i, t in enumerate(texts) if "⏳ running search…" in t)
    done = next(i for i, t in enumerate(texts) if "✓ search" in t)
    assert running < done and "⏳" not in texts[done]
    assert done < texts.index(partial[0])  # the step is shown before the answer's text
    assert most_in_one_second([p.at for p in patches_of(feishu, card)]) <= 5
    assert refused_patches(feishu) == 0  # paced under the limit, never refused


async def test_a_model_failing_mid_stream_ends_with_the_fixed_line_not_half_a_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    half = (
        "The forecast for Hangzhou says that Monday and Tuesday stay dry, that clouds move in on "
        "Wednesday, and that on Thursday afternoon the rain will"
    )  # cut here by the error

    def broken(request: Any) -> FakeReply:
        return FakeReply.text(half, chunk_delay=0.05, stream_error={"message": "upstream reset"})

    async with FakeFeishu() as feishu, FakeOpenAIServer(handler=broken) as fake:
        async with streaming_gateway(tmp_path, feishu, fake, monkeypatch, max_retries=0) as (gateway, url):
            ask = feishu.user_message("What's the weather in Hangzhou this week?", chat_id="oc_p2p")
            assert (await feishu.push(ask, url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            card = feishu.sent[0]
            apology = REPLIES["model_unavailable"]["en"]
            await eventually(lambda: apology in card.text)
            await eventually(lambda: idle(gateway))
    assert len(feishu.sent) == 1
    assert any(half[:20] in patch.text for patch in patches_of(feishu, card))  # it did stream first
    assert card.text == f"{apology}\n\n{REPLIES['stream_interrupted']['en']}"
    assert half[:20] not in card.text


async def test_stream_off_sends_one_ordinary_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text("Sunny all week.", chunk_delay=0.01))
        async with streaming_gateway(tmp_path, feishu, fake, monkeypatch, stream=False) as (gateway, url):
            assert (await feishu.push(feishu.user_message("weather?", chat_id="oc_p2p"), url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            await eventually(lambda: idle(gateway))
    assert [(m.msg_type, m.text) for m in feishu.sent] == [("text", "Sunny all week.")]
    assert feishu.patches == []


async def test_a_refused_card_falls_back_to_one_ordinary_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text("Sunny all week.", chunk_delay=0.01))
        feishu.fail_next(1, code=230099, paths=("/reply",))  # "Failed to create card content."
        async with streaming_gateway(tmp_path, feishu, fake, monkeypatch, card_streaming="patch") as (
            gateway,
            url,
        ):
            assert (await feishu.push(feishu.user_message("weather?", chat_id="oc_p2p"), url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            await eventually(lambda: idle(gateway))
    assert [(m.msg_type, m.text) for m in feishu.sent] == [("text", "Sunny all week.")]
    assert feishu.patches == []


async def test_the_pacer_lets_one_patch_through_per_interval_on_a_virtual_clock() -> None:
    clock = VirtualClock()
    pacer = PatchPacer(clock=clock, sleep=clock.sleep)
    sent: list[float] = []

    async def burst(n: int) -> None:
        for _ in range(n):
            await pacer.wait()
            sent.append(clock.now)

    await clock.run(burst(12))
    gaps = [b - a for a, b in zip(sent, sent[1:], strict=False)]
    assert sent[0] == 0.0 and min(gaps) >= PATCH_INTERVAL - 1e-9
    assert most_in_one_second(sent) <= 5
    clock.now += 10  # after a quiet spell the next patch goes at once
    before = clock.now
    await clock.run(burst(1))
    assert sent[-1] == before


def test_a_secret_split_across_streamed_pieces_never_reaches_the_card() -> None:
    """Attack: the model echoes a key the user pasted, a few characters at a time (as a stream
    arrives). No state of the card — nor any text delta — holds the key or its start."""
    secret = "sk-live-4f9a2c7e1b8d6035aa91c4e7f2b0d3c6"
    progress = TurnProgress(Redactor([secret]))
    deltas: list[str] = []
    progress.listen(lambda event: deltas.append(event.get("delta", "")))
    shown: list[str] = []
    text = f"Your key is {secret} and it works. " + "Here is the rest of the reply, long enough. " * 3
    for start in range(0, len(text), 5):
        progress.text(text[start : start + 5])
        shown.append(progress.markdown("en"))
    progress.tool_started("search", "call_1")  # closes the text: shown whole, redacted
    shown.append(progress.markdown("en"))
    for state in [*shown, "".join(deltas)]:
        assert secret[:12] not in state and secret[-12:] not in state
    assert "[REDACTED" in shown[-1] and "it works." in shown[-1]


def test_a_short_reply_streams_before_the_turn_ends() -> None:
    """Issue 29: the last 64 characters were held back, so a short reply ("好的，已经为你记下了。",
    most short Chinese answers) never streamed. Only what could still be a secret's start waits: a
    last word of printable ASCII (a key, `Bearer abc…`), never CJK text or a finished word."""
    progress = TurnProgress(Redactor(["sk-live-4f9a2c7e1b8d6035aa91c4e7f2b0d3c6"]))
    deltas: list[str] = []
    progress.listen(lambda event: deltas.append(event.get("delta", "")))
    for piece in ("好的，", "已经为你", "记下了。"):
        progress.text(piece)
    assert "".join(deltas) == progress.shown_text == "好的，已经为你记下了。"  # all of it, mid-turn
    progress.text(" Your key: sk-live-4f9a")  # a word that may still become a secret waits
    assert progress.shown_text == "好的，已经为你记下了。 Your key: "


@pytest.mark.slow  # several seconds of real time
async def test_a_reply_left_in_the_outbox_is_patched_into_the_stored_card_by_the_next_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn finished, but its card could not be patched before the process stopped (every
    patch refused): the next gateway on the same database sends the reply from the outbox into
    the card stored with the message — no second message, and the turn is not run again."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(ANSWER, delay=0.5, chunk_delay=0.005))
        async with streaming_gateway(tmp_path, feishu, fake, monkeypatch, card_streaming="patch") as (
            gateway,
            url,
        ):
            ask = feishu.user_message("What's the weather in Hangzhou this week?", chat_id="oc_p2p")
            assert (await feishu.push(ask, url)).ok
            await eventually(lambda: len(feishu.sent) == 1)  # the card, before the model answers
            # from now on, for 3 s, every patch of the card is answered 230020: the reply waits
            feishu.throttle_for(3.0, code=230020, paths=(f"messages/{feishu.sent[0].message_id}",))

            def final_refused() -> bool:
                return any(r.method == "PATCH" and r.code == 230020 and ANSWER in json.dumps(r.body,
                           ensure_ascii=False) for r in feishu.requests)  # fmt: skip

            await eventually(final_refused)
        card = feishu.sent[0]
        assert card.text == REPLIES["stream_thinking"]["en"] and feishu.patches == []
        async with streaming_gateway(tmp_path, feishu, fake, monkeypatch, card_streaming="patch") as (
            gateway,
            _,
        ):
            await eventually(lambda: card.text == ANSWER)  # once the storm is over
            await eventually(lambda: idle(gateway))
    assert [m.message_id for m in feishu.sent] == [card.message_id]
    assert len(fake.requests) == 1  # the turn had finished: only its reply was sent again


async def test_a_card_whose_answer_was_lost_is_found_again_by_its_uuid_not_sent_twice(tmp_path: Path) -> None:
    """The platform created the streaming card but every answer to it was lost (504s): the turn
    streams nothing, and the reply goes out as a card under the stream's uuid, which hands back
    the card the platform has; it is patched to the reply. Still one message."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text("Sunny all week, with a breeze from the east.", delay=0.3))
        agent = Agent(model="fake-model", base_url=fake.base_url, api_key="sk-test")
        feishu.lose_answers(4, paths=("/reply",))  # the card's send and its 3 retries: done, unanswered
        async with feishu_gateway(tmp_path, feishu, AgentRunner(agent), stream=True) as (gateway, url):
            assert (await feishu.push(feishu.user_message("weather?", chat_id="oc_p2p"), url)).ok
            await eventually(lambda: len(feishu.sent) == 1 and "Sunny" in feishu.sent[0].text)
            await eventually(lambda: idle(gateway))
        await agent.aclose()
    lost = [r for r in feishu.requests if r.path.endswith("/reply") and r.status == 504]
    assert len(lost) == 4 and len({r.body["uuid"] for r in lost}) == 1  # retried under one uuid
    assert [m.text for m in feishu.sent] == ["Sunny all week, with a breeze from the east."]
    assert (
        feishu.sent[0].msg_type == "interactive"
        and feishu.patches[-1].message_id == feishu.sent[0].message_id
    )


async def test_a_card_whose_id_never_came_back_is_found_by_its_stored_uuid_on_the_reply_s_retry(
    tmp_path: Path,
) -> None:
    """The platform made the streaming card, but neither its answer nor the answer to the reply's
    first send came back (504s): the outbox sends the reply again with no stream left in the
    process — as the next process does after a kill between the card's creation and its record
    (seen in the SIGKILL test, tests/test_feishu_crash.py). The uuid stored before the card was
    sent finds that card, and the reply is patched into it: one message, not a card and a text."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text("Sunny all week, with a breeze from the east.", delay=0.3))
        agent = Agent(model="fake-model", base_url=fake.base_url, api_key="sk-test")
        feishu.lose_answers(8, paths=("/reply",))  # the card (4 tries), then the reply's first send (4)
        async with feishu_gateway(tmp_path, feishu, AgentRunner(agent), stream=True) as (gateway, url):
            assert (await feishu.push(feishu.user_message("weather?", chat_id="oc_p2p"), url)).ok
            await eventually(lambda: "Sunny" in (feishu.sent[0].text if feishu.sent else ""), timeout=15)
            await eventually(lambda: idle(gateway))
            assert (await gateway.store.counts())["outbox_pending"] == 0
        await agent.aclose()
    lost = [r for r in feishu.requests if r.path.endswith("/reply") and r.status == 504]
    assert len(lost) == 8 and len({r.body["uuid"] for r in lost}) == 1  # one uuid throughout
    assert [m.text for m in feishu.sent] == ["Sunny all week, with a breeze from the east."]
    assert feishu.sent[0].msg_type == "interactive"


@pytest.mark.slow  # several seconds of real time
async def test_a_reply_longer_than_a_card_fills_the_card_and_goes_on_in_messages_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paragraphs = [f"Paragraph {i}: " + "the rain moves in from the sea on Thursday. " * 12 for i in range(80)]
    long_reply = "\n\n".join(paragraphs)  # about 44,000 characters: more than one 30 KB card
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(long_reply))
        async with streaming_gateway(tmp_path, feishu, fake, monkeypatch) as (gateway, url):
            ask = feishu.user_message("the long forecast, please", chat_id="oc_p2p")
            assert (await feishu.push(ask, url)).ok
            await eventually(lambda: len(feishu.sent) == 2 and "Paragraph 79" in feishu.sent[1].text)
            await eventually(lambda: idle(gateway))
    card, rest = feishu.sent
    assert "Paragraph 0:" in card.text and "Paragraph 79" not in card.text  # the card took the start
    assert rest.msg_type == "interactive" and rest.reply_to == ask["event"]["message"]["message_id"]
    assert (card.text + rest.text).replace("\n", "") == long_reply.replace("\n", "")
    assert not [r for r in feishu.requests if r.code == 230025]  # nothing was over the size limit
