"""Feishu replies as a user sees them: JSON 2.0 cards that render, typed out through CardKit.

Through the real gateway `serve` builds, the fake Feishu platform (testing/fake_feishu/cards.py:
CardKit card entities, their `sequence` rules, 10 operations a second per entity, streaming closed
10 minutes after it was opened, the JSON 2.0 rules, each API's own budget) and the fake model
streaming its reply. The pages followed, each named in the test that follows it:

- "富文本（Markdown）组件" (the rich-text component): headings, quotes, tables and inline code
  render only in JSON 2.0 cards (FEISHU.md §11); at most 5 tables per card (230099 / 11310);
- "流式更新卡片" (open.feishu.cn/document/cardkit-v1/streaming-updates-openapi-overview): create
  the entity with `streaming_mode`, send it as `{"type": "card", "data": {"card_id"}}`, type the
  whole text into the markdown element, close streaming through the settings at the end; text
  that extends what was shown is typed out; streaming closes itself 10 minutes after it opened;
- "流式更新文本" (…/cardkit-v1/card-element/content): `sequence` strictly increasing;
- the frequency-control page: each API has its own 50/s and 1,000/min per app.
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

from gateway_harness import idle, serving
from hermes_core import Agent
from hermes_core.channels.feishu.formatting import MAX_TABLES, count_tables, format_reply, markdown_card
from hermes_core.channels.feishu.ratelimit import SendLimiter
from hermes_core.config import FeishuConfig, GatewayConfig, Settings
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.server import build_gateway
from hermes_core.kernel.replies import REPLIES
from hermes_core.testing.fake_feishu import FakeFeishu, rendered
from hermes_core.testing.fake_feishu.api import SentMessage
from hermes_core.testing.fake_feishu.cards import render_markdown
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from virtual_clock import VirtualClock
from waiting import eventually

ANSWER = (
    "Here is what I found about the weather in Hangzhou this week. Monday and Tuesday stay dry "
    "with a light breeze from the east; on Wednesday clouds move in from the sea, and by Thursday "
    "afternoon there is steady rain that lasts into Friday morning. The weekend clears up again."
)
MARKDOWN = (
    "## Hangzhou this week\n\n"
    "> Take an umbrella midweek.\n\n"
    "| day | weather |\n| --- | --- |\n| Monday | dry |\n| Thursday | rain |\n\n"
    "Run `forecast --city hangzhou` for the details, or see **the bureau's page**."
)
RAW_MARKUP = ("##", "| --- |", "> ", "`")


@asynccontextmanager
async def gateway_for(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch,
    *, retry_base: float | None = None, **feishu_options: Any,
) -> AsyncIterator[tuple[Gateway, str]]:  # fmt: skip
    monkeypatch.setenv("FEISHU_APP_SECRET", feishu.app_secret)
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", feishu.verification_token)
    settings = Settings(
        gateway=GatewayConfig(data_dir=str(tmp_path)),
        feishu=FeishuConfig(app_id=feishu.app_id, base_url=feishu.base_url, **feishu_options),
    )
    agent = Agent(model="fake-model", base_url=fake.base_url, api_key="sk-test", tools=[])
    gateway, routes = build_gateway(settings, agent)
    if retry_base is not None:  # seconds before the Feishu client's first retry (1 s by default)
        gateway.channels["feishu"].api.retry_base_delay = retry_base  # type: ignore[attr-defined]
    try:
        async with serving(gateway, routes) as url:
            yield gateway, f"{url}/feishu/events"
    finally:
        await gateway.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()


def calls(feishu: FakeFeishu, method: str, part: str) -> list[Any]:
    return [r for r in feishu.requests if r.method == method and part in r.path]


# --- cards that render ---------------------------------------------------------------------


async def test_a_markdown_reply_is_a_json_2_card_that_renders_its_headings_tables_quotes_and_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rich-text component page: in JSON 1.0 the user would read `##`, `| --- |`, `>` and
    backticks; the reply goes out as JSON 2.0, where each renders. Not streamed (one message)."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(MARKDOWN))
        async with gateway_for(tmp_path, feishu, fake, monkeypatch, stream=False) as (gateway, url):
            assert (await feishu.push(feishu.user_message("weather?", chat_id="oc_p2p"), url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
    [card] = feishu.sent
    assert card.msg_type == "interactive" and card.content["schema"] == "2.0"
    shown = rendered(card.content)
    assert "Hangzhou this week" in shown and "Thursday  rain" in shown and "forecast --city" in shown
    assert not [markup for markup in RAW_MARKUP if markup in shown]
    # the same text in a JSON 1.0 card shows the raw markup: what users saw before
    old = render_markdown(MARKDOWN, version2=False)
    assert all(markup in old for markup in RAW_MARKUP)


async def test_the_streamed_card_ends_rendering_the_markdown_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(MARKDOWN, chunk_delay=0.01))
        async with gateway_for(tmp_path, feishu, fake, monkeypatch) as (gateway, url):
            assert (await feishu.push(feishu.user_message("weather?", chat_id="oc_p2p"), url)).ok
            await eventually(lambda: len(feishu.sent) == 1 and feishu.sent[0].text == MARKDOWN)
            await eventually(lambda: not next(iter(feishu.cards.values())).streaming)
    shown = rendered(feishu.sent[0].content)
    assert "Hangzhou this week" in shown and not [markup for markup in RAW_MARKUP if markup in shown]


def test_more_tables_than_a_card_takes_go_on_in_the_next_card() -> None:
    """The rich-text component: at most 5 tables in one JSON 2.0 card (FEISHU.md §11)."""
    tables = "\n\n".join(f"Table {n}\n\n| a | b |\n| --- | --- |\n| {n} | x |" for n in range(12))
    parts = format_reply(tables)
    counts = [count_tables(json.loads(part.content)["body"]["elements"][0]["content"]) for part in parts]
    assert counts == [MAX_TABLES, MAX_TABLES, 2]
    text = "\n\n".join(json.loads(p.content)["body"]["elements"][0]["content"].strip() for p in parts)
    assert text == tables  # nothing lost or doubled at the cuts


async def test_the_fake_refuses_what_the_platform_refuses_in_a_json_2_card(tmp_path: Path) -> None:
    """The fake holds our cards to the documented rules, so a card it takes is one the platform
    takes: a sixth table (230099, sub-code 11310), a JSON 1.0 `action` container in a 2.0 card,
    a repeated element_id (300301 on CardKit)."""
    from hermes_core.channels.feishu.api import FeishuAPI, FeishuError

    async with (
        FakeFeishu() as feishu,
        FeishuAPI(feishu.app_id, feishu.app_secret, base_url=feishu.base_url) as api,
    ):
        six = "\n\n".join("| a |\n| --- |\n| 1 |" for _ in range(6))
        with pytest.raises(FeishuError) as refused:
            await api.send_card(markdown_card(six), chat_id="oc_1", reply_to=None, uuid="u-six")
        assert refused.value.code == 230099 and "11310" in str(refused.value)
        old_style = {"schema": "2.0", "body": {"elements": [{"tag": "action", "actions": []}]}}
        with pytest.raises(FeishuError) as refused:
            await api.send_card(old_style, chat_id="oc_1", reply_to=None, uuid="u-action")
        assert refused.value.code == 230099
        doubled = {
            "schema": "2.0",
            "body": {
                "elements": [
                    {"tag": "markdown", "content": "a", "element_id": "x"},
                    {"tag": "markdown", "content": "b", "element_id": "x"},
                ]
            },
        }
        with pytest.raises(FeishuError) as refused:
            await api.create_card(doubled)
        assert refused.value.code == 300301
        card_id = await api.create_card(markdown_card("hi"))
        await api.send_card({"type": "card", "data": {"card_id": card_id}}, chat_id="oc_1", reply_to=None,
                            uuid="u-1")  # fmt: skip
        with pytest.raises(FeishuError) as refused:  # an entity is sent once
            await api.send_card({"type": "card", "data": {"card_id": card_id}}, chat_id="oc_1", reply_to=None,
                                uuid="u-2")  # fmt: skip
        assert refused.value.code == 230099
        await api.update_card(card_id, markdown_card("one"), 5)
        await api.update_card(card_id, markdown_card("one"), 5)  # a retry (same uuid): done once
        with pytest.raises(FeishuError) as refused:  # the sequence must increase
            await api.update_card(card_id, markdown_card("two"), 4)
        assert refused.value.code == 300317
    assert not [m for m in feishu.sent if m.text in ("a\nb", "two")]


# --- typewriter streaming through CardKit ---------------------------------------------------


async def test_the_reply_is_typed_out_into_one_card_entity_and_streaming_is_closed_at_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "流式更新卡片": one entity, sent once as the reply to the user's message; each update
    carries the whole text so far and extends the one before (typed out, not re-drawn); at most 10
    operations a second on the entity; `sequence` strictly increasing; at the end streaming is
    closed and the chat list's summary is the reply's first line, not "[生成中...]"."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(ANSWER, chunk_delay=0.02))
        async with gateway_for(tmp_path, feishu, fake, monkeypatch) as (gateway, url):
            ask = feishu.user_message("What's the weather in Hangzhou this week?", chat_id="oc_p2p")
            pushed = time.monotonic()
            assert (await feishu.push(ask, url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            first_visible = time.monotonic() - pushed
            card = feishu.sent[0]
            await eventually(lambda: card.text == ANSWER and not next(iter(feishu.cards.values())).streaming)
            await eventually(lambda: idle(gateway))
    assert len(feishu.sent) == 1 and first_visible < 1.0
    [entity] = feishu.cards.values()
    assert entity.message_id == card.message_id and card.reply_to == ask["event"]["message"]["message_id"]
    assert card.versions[0] == REPLIES["stream_thinking"]["en"]
    typed = [r.body["content"] for r in calls(feishu, "PUT", "/content")]
    growing = [text for text in typed if text != REPLIES["stream_thinking"]["en"]]
    assert len(growing) >= 3 and growing[-1] == ANSWER
    assert all(later.startswith(earlier) for earlier, later in zip(growing, growing[1:], strict=False))
    sequences = [sequence for _, sequence, _ in entity.operations]
    assert sequences == sorted(set(sequences)) and 0 < max(sequences) < 2**31
    times = [at for _, _, at in entity.operations]
    assert max(sum(1 for t in times if s <= t < s + 1.0) for s in times) <= 10
    settings = [json.loads(r.body["settings"]) for r in calls(feishu, "PATCH", "/settings")]
    assert settings[-1]["config"]["streaming_mode"] is False
    assert settings[-1]["config"]["summary"]["content"].startswith("Here is what I found")
    assert not [r for r in feishu.requests if r.code not in (0, None)]  # nothing refused
    assert not calls(feishu, "PATCH", "/im/v1/messages/")  # no full-card patches


async def test_streaming_closed_by_the_platform_after_ten_minutes_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "流式更新卡片": streaming closes itself 10 minutes after it was opened (200850, then 300309).
    A turn that outlives it opens it again and goes on; the card still ends with the reply."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(ANSWER, chunk_delay=0.03))
        async with gateway_for(tmp_path, feishu, fake, monkeypatch) as (gateway, url):
            assert (await feishu.push(feishu.user_message("weather?", chat_id="oc_p2p"), url)).ok
            await eventually(lambda: len(feishu.sent) == 1 and ANSWER[:30] in feishu.sent[0].text)
            feishu.advance_time(601)  # eleven minutes later on the platform's clock
            await eventually(
                lambda: feishu.sent[0].text == ANSWER and not next(iter(feishu.cards.values())).streaming
            )
    assert [r.code for r in feishu.requests if r.code == 200850] == [200850]
    reopened = [json.loads(r.body["settings"])["config"] for r in calls(feishu, "PATCH", "/settings")]
    assert reopened[0] == {"streaming_mode": True} and reopened[-1]["streaming_mode"] is False
    assert len(feishu.sent) == 1


async def test_a_refused_cardkit_falls_back_to_patching_a_card_message_for_this_and_later_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An app without the `cardkit:card:write` scope: the platform refuses the entity (99991672,
    the generic error-code page's "scope not granted"). The turn still streams, by patching a card
    message; the next turn goes that way at once, without asking CardKit again."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(
            FakeReply.text(ANSWER, chunk_delay=0.01), FakeReply.text("Sunny all week.", chunk_delay=0.01)
        )
        feishu.fail_next(1, code=99991672, paths=("cardkit/v1/cards",))
        async with gateway_for(tmp_path, feishu, fake, monkeypatch) as (gateway, url):
            assert (await feishu.push(feishu.user_message("weather?", chat_id="oc_a"), url)).ok
            await eventually(lambda: len(feishu.sent) == 1 and feishu.sent[0].text == ANSWER)
            assert (await feishu.push(feishu.user_message("and next week?", chat_id="oc_a"), url)).ok
            await eventually(lambda: len(feishu.sent) == 2 and feishu.sent[1].text == "Sunny all week.")
    assert len(calls(feishu, "POST", "cardkit/v1/cards")) == 1  # asked once, refused, not again
    for card in feishu.sent:
        assert card.msg_type == "interactive"
        assert [p.text for p in feishu.patches if p.message_id == card.message_id][-1] == card.text


# --- what the user sees keeps the conversation's order -----------------------------------------


async def test_a_platform_fault_on_a_streaming_card_does_not_reorder_the_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three questions in a row; a brief platform fault (503) meets the first turn's card message
    five times, so its send is given up once and the reply's send tries again from the outbox. The
    client's lock on the chat covers one call, not the pause between the outbox's tries: before,
    the next turns' cards were sent in that pause and the first answer showed up last (o1, o2, o0).
    Each turn's card now waits for the replies before it in the conversation."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(*(FakeReply.text(f"answer {n}", chunk_delay=0.01) for n in range(3)))
        questions = [feishu.user_message(f"question {n}", chat_id="oc_q") for n in range(3)]
        first = questions[0]["event"]["message"]["message_id"]
        feishu.fail_next(5, code=1, status=503, paths=(f"{first}/reply",))
        async with gateway_for(tmp_path, feishu, fake, monkeypatch, retry_base=0.05) as (gateway, url):
            for question in questions:
                assert (await feishu.push(question, url)).ok
            await eventually(lambda: [m.text for m in feishu.sent] == ["answer 0", "answer 1", "answer 2"],
                           timeout=20)  # fmt: skip
            await eventually(lambda: idle(gateway))
    assert [m.text for m in feishu.sent] == ["answer 0", "answer 1", "answer 2"]
    assert len([r for r in feishu.requests if r.status == 503]) == 5


# --- each API's own budget --------------------------------------------------------------------


async def test_streaming_updates_never_make_a_reply_wait_each_api_has_its_own_budget() -> None:
    """The frequency-control page: limits are per API, per app. 1,000 card updates queued at once
    (a minute's budget of the element-content API) leave a reply to go at once."""
    clock = VirtualClock()
    limiter = SendLimiter(clock=clock, sleep=clock.sleep)
    done: dict[str, float] = {}

    async def updates() -> None:
        for _ in range(1000):
            async with limiter.slot(None, api="cardkit.card_element.content"):
                pass
        done["updates"] = clock.now

    async def reply() -> None:
        await clock.sleep(1.0)
        async with limiter.slot("oc_1", api="im.message.reply"):
            done["reply"] = clock.now

    await clock.run(asyncio.gather(updates(), reply()))
    assert done["reply"] == 1.0  # not a moment's wait
    assert done["updates"] > 30  # the updates themselves are paced under their API's limits


def test_a_sent_card_is_rendered_as_the_user_reads_it() -> None:
    """The renderer itself, against the rich-text page's list: what 2.0 shows and 1.0 does not."""
    message = SentMessage(
        "om_1", "oc_1", "interactive", markdown_card("# Title\n\n`x` and > not a quote"), ""
    )
    assert rendered(message.content) == "Title\n\nx and > not a quote"


async def test_a_close_the_platform_refuses_leaves_the_finished_card_and_sends_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply is in the card, but closing streaming is refused for good (300309: the platform
    closed it already). That is no failure of the reply: no second message is sent with it."""
    async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
        fake.script(FakeReply.text(ANSWER, chunk_delay=0.01))
        feishu.fail_next(1, code=300309, paths=("/settings",))
        async with gateway_for(tmp_path, feishu, fake, monkeypatch) as (gateway, url):
            assert (await feishu.push(feishu.user_message("weather?", chat_id="oc_p2p"), url)).ok
            await eventually(lambda: any(r.code == 300309 for r in feishu.requests))
            await eventually(lambda: idle(gateway))
    assert [m.text for m in feishu.sent] == [ANSWER]
