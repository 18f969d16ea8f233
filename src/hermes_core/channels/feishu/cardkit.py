"""Streamed replies through CardKit: one card entity per turn whose text is typed out as the model
writes (FEISHU.md §6 option B, §11; the platform's "流式更新卡片" guide,
open.feishu.cn/document/cardkit-v1/streaming-updates-openapi-overview).

One turn, step by step:

1. The turn starts (`FeishuChannel.watch`): once the conversation's earlier replies are delivered
   (so what the user sees keeps the conversation's order), a card entity is made
   (`POST cardkit/v1/cards`, a JSON 2.0 card with `streaming_mode` on and a markdown element
   `reply`) and its id is stored with the inbox row; then the entity is sent as the reply to the
   user's message, under a uuid derived from the task (§6: sent again within an hour, the same
   message comes back), and the message id is stored beside it.
2. While the turn runs, each change of the `TurnProgress` (text, tool steps as short status lines)
   marks the card stale; the update loop sends the whole text so far to the element
   (`PUT …/elements/reply/content`): what extends the text shown before is typed out by the client.
   Updates are paced at `UPDATE_INTERVAL` (the platform allows 10 per second per card entity) and
   counted under their own API's app budget (ratelimit.py), never under the budget of replies.
   An update is tried once: refused or failed, the next change tries again.
3. The reply arrives from the outbox (`FeishuChannel.send`): the loop stops after any update in
   flight, the element gets the reply's text, and streaming is closed
   (`PATCH …/settings`, `streaming_mode: false`, the reply's first line as the chat list's summary);
   an approval replaces the whole card (`PUT cardkit/v1/cards/:card_id`) with its buttons. A reply
   longer than one card goes on in cards of its own, each with its part's uuid.

`sequence`: every operation on a card entity carries one, strictly increasing, a 32-bit integer
(1 … 2³¹−1). A process restarted after a crash cannot know the last one used, and a wall-clock
scheme in milliseconds does not fit 31 bits. So each run that takes a card up (the first, or the
next process after a crash) first stores a new *epoch* with the card, durably, and numbers its
operations `epoch · 2²⁰ + n`: a later run always numbers above an earlier one, with room for 2,047
runs of a turn and a million operations each. A retry of one operation sends the same sequence and
uuid (the platform's idempotency key), so a retry never counts as a second operation.

Streaming closes itself 10 minutes after it was (re)opened (200850, then 300309): an update that
finds it closed opens it again (`settings`, `streaming_mode: true`) and is sent again; the final
text, refused the same way, replaces the whole card instead, which needs no streaming mode.

After a kill -9 mid-stream the message runs again from the inbox: step 1 finds the stored card id,
takes a new epoch and goes on updating the same card (sending its message first if the crash came
between the entity and its message: the uuid finds the one that may have been sent); if the crash
came after the turn was done, the outbox's reply finishes the stored card the same way. The user
sees one card with the complete reply. Why not `id_convert` (message id → card id): the card id is
stored before its message is sent, so every record that names a message names its card too.

Fallback: when the platform refuses CardKit itself (the app lacks `cardkit:card:write`, or the
entity cannot be made) the turn streams by patching an ordinary card message instead (stream.py,
the `replacement` stream, fed by the same progress), and the channel keeps to that for its later
turns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...kernel.redaction import Redactor
from ...kernel.replies import Language, detect_language, fixed_reply
from ..seam import InboundMessage, OutboundMessage, Records
from ..streaming import TurnProgress
from .api import SEQUENCE_STALE, STREAMING_CLOSED, FeishuError, card_reference, part_uuid
from .formatting import REPLY_ELEMENT, markdown_card, streaming_card
from .stream import CardStream, PatchPacer, final_cards, shown_progress, stream_uuid

if TYPE_CHECKING:
    from .api import FeishuAPI

log = logging.getLogger("hermes_core.feishu")

UPDATE_INTERVAL = 0.12  # seconds between updates of one card: ~8/s, under the platform's 10 per entity
PREFIX = "cardkit:"  # a stored CardKit stream: cardkit:<card_id>:<epoch>:<uuid>:<message_id or nothing>
EPOCH_BITS = 20
MAX_EPOCH = (2**31 - 1) >> EPOCH_BITS  # 2,047 runs of one turn
SUMMARY_CHARS = 60


@dataclass
class StoredCard:
    """A CardKit stream as stored with its inbox row."""

    card_id: str
    epoch: int
    uuid: str  # of the message that shows the card: sent again, the same message comes back
    message_id: str | None = None

    def __str__(self) -> str:
        return f"{PREFIX}{self.card_id}:{self.epoch}:{self.uuid}:{self.message_id or ''}"

    @classmethod
    def parse(cls, stored: str | None) -> StoredCard | None:
        if stored is None or not stored.startswith(PREFIX):
            return None
        fields = stored[len(PREFIX) :].split(":")
        if len(fields) != 4 or not (fields[0] and fields[1].isdigit() and fields[2]):
            return None
        return cls(fields[0], int(fields[1]), fields[2], fields[3] or None)


class Exhausted(Exception):
    """The card has been taken up too many times (`MAX_EPOCH`): the reply goes out anew."""


class CardKitStream:
    """One turn's streaming card entity: opened once the conversation is ready for it, typed into
    while the turn runs, finished with the reply (`finish`)."""

    def __init__(
        self,
        api: FeishuAPI,
        records: Records,
        reply_to: Target,
        *,
        redactor: Redactor | None = None,
        pacer: PatchPacer | None = None,
        progress: TurnProgress | None = None,
        fallback: Callable[[TurnProgress], CardStream] | None = None,
    ) -> None:
        self.api, self.records, self.target = api, records, reply_to
        self.fallback = fallback  # the patched card message this turn streams into if CardKit is refused
        self.replacement: CardStream | None = None
        self.progress = progress or TurnProgress(redactor)
        self.progress.listen(lambda event: self._stale.set())
        self.pacer = pacer or PatchPacer(UPDATE_INTERVAL)
        self.language = reply_to.language
        self.uuid = reply_to.uuid
        self.card: StoredCard | None = None
        self.refused = False  # the platform refused CardKit itself: stream another way (stream.py)
        self._n = 0
        self._stale = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def start(self, after: Callable[[], Awaitable[None]] | None = None) -> None:
        """Open the card once `after` (the conversation's earlier replies delivered) is done."""
        self._task = asyncio.create_task(self._run(after), name=f"feishu-cardkit:{self.target.inbound_id}")

    async def close(self) -> StoredCard | None:
        """Stop updating (an update in flight is let finish); the card, if one was opened. A card
        still waiting for its turn is not opened at all."""
        self._closing = True
        self._stale.set()
        if self._task is not None:
            if self.card is None:
                self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        return self.card

    async def _run(self, after: Callable[[], Awaitable[None]] | None) -> None:
        if after is not None:
            await after()
        try:
            await self.open()
        except Exhausted:
            return
        except FeishuError as exc:
            self.refused = exc.permanent and self.card is None
            log.warning("feishu: no streaming card for inbox row %s (%s)", self.target.inbound_id, exc)
            if self.refused and self.fallback is not None:  # this turn streams the other way
                self.replacement = self.fallback(self.progress)
                self.replacement.start()
            return
        while self.card is not None and not self._closing:
            await self._stale.wait()
            self._stale.clear()
            if self._closing:
                return
            await self.pacer.wait()
            if self._closing:
                return
            await self._update()

    async def open(self) -> StoredCard:
        """The card: taken up from the store under a new epoch, or made, stored and sent now."""
        target = self.target
        stored = StoredCard.parse(await self.records.stream_of(target.inbound_id))
        if stored is None:
            card_id = await self.api.create_card(streaming_card(self._markdown(), self._summary()))
            stored = StoredCard(card_id, 0, self.uuid)
        if stored.epoch >= MAX_EPOCH:
            raise Exhausted(f"card {stored.card_id} was taken up {stored.epoch} times")
        self.card = StoredCard(stored.card_id, stored.epoch + 1, stored.uuid, stored.message_id)
        self._n = 0
        await self.records.keep_stream(target.inbound_id, "feishu", str(self.card))  # before any operation
        if self.card.message_id is None:  # the entity is sent once; the uuid finds an earlier send
            self.card.message_id = await self.api.send_card(
                card_reference(self.card.card_id), chat_id=target.chat_id, reply_to=target.reply_to,
                uuid=self.card.uuid, in_thread=target.in_thread,
            )  # fmt: skip
            await self.records.keep_stream(target.inbound_id, "feishu", str(self.card))
        self._stale.set()  # show where this run is at once
        return self.card

    def sequence(self) -> int:
        assert self.card is not None
        self._n += 1
        return (self.card.epoch << EPOCH_BITS) | self._n

    async def _update(self) -> None:
        """One progress update, tried once; a closed stream is opened again first."""
        assert self.card is not None
        try:
            await self._typed(self._markdown(), patient=False)
        except FeishuError as exc:
            log.info("feishu: streaming card %s not updated this time: %s", self.card.card_id, exc)
            if exc.permanent and exc.code not in STREAMING_CLOSED and exc.code != SEQUENCE_STALE:
                self._closing = True  # the entity is gone: the reply is sent anew
        except Exception:
            log.exception("feishu: streaming card %s not updated", self.card.card_id)

    async def _typed(self, text: str, *, patient: bool = True) -> None:
        """`text` into the card's element; streaming re-opened once if the platform closed it."""
        assert self.card is not None
        card_id = self.card.card_id
        try:
            await self.api.stream_text(card_id, REPLY_ELEMENT, text, self.sequence(), patient=patient)
        except FeishuError as exc:
            if exc.code not in STREAMING_CLOSED:
                raise
            await self.api.card_settings(card_id, {"streaming_mode": True}, self.sequence())
            await self.api.stream_text(card_id, REPLY_ELEMENT, text, self.sequence(), patient=patient)

    async def finish(self, reply: OutboundMessage) -> str:
        """The whole reply into the card, streaming closed; parts that do not fit follow as cards of
        their own. Returns the card's message id."""
        assert self.card is not None and self.card.message_id is not None
        cards = final_cards(reply)
        await self.pacer.wait()
        if reply.approval is None and len(cards) == 1:
            await self._final_text(_text_of(cards[0]))
            await self._close(_text_of(cards[0]))
        else:  # buttons, or more than one card: the whole first card replaces the streaming one
            await self._close(reply.text)
            await self.api.update_card(self.card.card_id, cards[0], self.sequence())
        for index, card in enumerate(cards[1:], start=1):
            await self.api.send_card(card, chat_id=reply.chat_id, reply_to=reply.reply_to,
                                     uuid=part_uuid(reply.uuid, index),
                                     in_thread=reply.thread_id is not None)  # fmt: skip
        return self.card.message_id

    async def _close(self, text: str) -> None:
        """End streaming. Refused for good (the platform closed it already, the entity gone), it is
        no reason to send the reply again: the card holds it, and streaming ends by itself."""
        assert self.card is not None
        try:
            await self.api.card_settings(self.card.card_id, _closed(text), self.sequence())
        except FeishuError as exc:
            if not exc.permanent:
                raise
            log.info("feishu: streaming of card %s not closed: %s", self.card.card_id, exc)

    async def _final_text(self, text: str) -> None:
        assert self.card is not None
        try:
            await self._typed(text)
        except FeishuError as exc:
            if exc.code not in STREAMING_CLOSED:
                raise
            await self.api.update_card(self.card.card_id, markdown_card(text), self.sequence())

    def _markdown(self) -> str:
        return shown_progress(self.progress, self.language)

    def _summary(self) -> str:
        return fixed_reply("stream_thinking", self.language)


@dataclass(frozen=True)
class Target:
    """Where a turn's streaming card goes: the inbox row it answers, its chat and message."""

    inbound_id: int
    chat_id: str | None
    reply_to: str | None
    uuid: str  # of the card's message: the same on every run of the task
    language: Language
    in_thread: bool = False  # the message answered is in a topic: the card stays there

    @classmethod
    def of(cls, message: InboundMessage) -> Target:
        assert message.id is not None
        return cls(message.id, message.chat_id, message.reply_to, stream_uuid(message),
                   detect_language(message.text), message.thread_id is not None)  # fmt: skip


async def resume(api: FeishuAPI, records: Records, reply: OutboundMessage) -> str | None:
    """Finish the stored CardKit card of `reply` in a process that has no stream for it (a retry,
    or the next process after a crash); None when none is stored for it."""
    assert reply.inbound_id is not None
    stored = StoredCard.parse(await records.stream_of(reply.inbound_id))
    if stored is None:
        return None
    language = detect_language(reply.text)
    target = Target(
        reply.inbound_id, reply.chat_id, reply.reply_to, stored.uuid, language, reply.thread_id is not None
    )
    stream = CardKitStream(api, records, target)
    await stream.open()
    return await stream.finish(reply)


def _text_of(card: dict[str, Any]) -> str:
    return str(card["body"]["elements"][0]["content"])


def _closed(text: str) -> dict[str, Any]:
    """Settings that end streaming, with the reply's first line as the chat list's summary."""
    line = next((line.strip("#>*-` ") for line in text.splitlines() if line.strip("#>*-` ")), "")
    summary = line if len(line) <= SUMMARY_CHARS else line[: SUMMARY_CHARS - 1] + "…"
    return {"streaming_mode": False, "summary": {"content": summary}}


__all__ = ["UPDATE_INTERVAL", "CardKitStream", "StoredCard", "Target", "resume"]
