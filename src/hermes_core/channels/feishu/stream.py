"""Streamed replies in Feishu, the fallback way: one card message per turn, patched as the model writes.

Replies stream through CardKit (cardkit.py: a card entity whose text is typed out). This module is
the way taken when CardKit is off (`feishu.card_streaming: patch`) or refused by the platform (the
app lacks `cardkit:card:write`): the full-card patch of a message (FEISHU.md §6, option A: `PATCH
/open-apis/im/v1/messages/:message_id`) of the same JSON 2.0 cards every other reply uses. No
typewriter: the text arrives in jumps. Its cost: every patch carries the whole card, and the
platform allows 5 patches per second per message (§6, §7: more is refused with HTTP 400, code
230020). So the card is patched at most once per `PATCH_INTERVAL` (0.25 s: 4 a second, room for
network jitter under the 5), and text that arrives in between is folded into the next patch.
This module also holds what both ways share: the pacer, the stream's uuid, the final cards.

One turn, step by step:

1. The turn starts (`FeishuChannel.watch`): once the conversation's earlier replies are delivered,
   a card saying "thinking…" is sent as the reply to the user's message. Its request uuid comes
   from the task and the message, so sending it again within an hour returns the same card (§6);
   its message_id is stored with the inbox row
   (`Records.keep_stream`) as soon as it is known — and its uuid before it is sent, so a process
   killed between the platform making the card and the store learning its id still finds it by
   that uuid instead of sending the reply a second time. The card appears within a second.
2. While the turn runs, each change of the `TurnProgress` (text, a tool step: `⏳ running search…`,
   then `✓ search`) marks the card stale; the patch loop sends the latest state, no sooner than
   `PatchPacer` allows (its clock is injected for tests). Such a patch is tried once: refused
   ("wait", 230020) or failed, it is dropped and the next change tries again, so the reply
   never waits behind a progress patch that waits out a rate limit.
3. The reply arrives from the outbox (`FeishuChannel.send`): the loop stops after any patch in
   flight (an older state must not land after the last one) and the card is patched to the whole
   reply — the approval card when the task waits for one; for a failed task the apology and the
   `stream_interrupted` line, never the half-written text. A reply longer than one card (30 KB)
   fills the card and goes on in ordinary messages, each with its part's uuid.

After a crash (kill -9 of serve) mid-stream the message is run again from the inbox: step 1 finds
the stored card and writes into it, and step 3 patches it to the complete reply; if the crash came
after the turn had finished, the outbox sends the reply again and step 3 finds the card in the
store (or, stored only by its uuid, asks the platform for it under that uuid). Either way the
user sees one card with the complete reply, nothing else.

Fallback to one ordinary message: `feishu.stream: false`, or a card the platform refuses (a
permanent error). A card send that failed otherwise (timeouts) may have reached the platform
anyway, so the reply then goes out as a card under the stream's uuid — the platform hands back the
card it has, if any — and is patched to the reply: still one message.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ...kernel.redaction import Redactor
from ...kernel.replies import Language, detect_language, fixed_reply
from ..seam import InboundMessage, OutboundMessage, Records, task_id_of
from ..streaming import TurnProgress
from .api import FeishuError, part_uuid
from .formatting import approval_card, card_chunks, markdown_card
from .ratelimit import Clock, Sleep

if TYPE_CHECKING:
    from .api import FeishuAPI

log = logging.getLogger("hermes_core.feishu")

PATCH_INTERVAL = 0.25  # seconds between patches of one card: 4/s, under the platform's 5 per message


class PatchPacer:
    """At most one patch per `interval` seconds: `wait()` returns when the next one may go."""

    def __init__(self, interval: float = PATCH_INTERVAL, *, clock: Clock = time.monotonic,
                 sleep: Sleep = asyncio.sleep) -> None:  # fmt: skip
        self.interval, self._clock, self._sleep = interval, clock, sleep
        self._next = -math.inf

    async def wait(self) -> None:
        now = self._clock()
        if self._next > now:
            await self._sleep(self._next - now)
        self._next = max(now, self._next) + self.interval


UNCONFIRMED = "uuid:"  # a stored stream whose card's id is not known yet: the prefix, then its uuid


def stored_card(stored: str | None) -> tuple[str | None, str | None]:
    """What the store holds for a streamed reply, as (card message_id, request uuid to find it)."""
    if stored is not None and stored.startswith(UNCONFIRMED):
        return None, stored[len(UNCONFIRMED) :]
    if stored is not None and stored.startswith("cardkit:"):  # a card entity (cardkit.py), not a message
        return None, None
    return stored, None


def stream_uuid(message: InboundMessage) -> str:
    """The request uuid of a message's streaming card: the same on every run of its task."""
    key = f"{task_id_of(message)}|{message.message_id}|stream".encode()
    return "s" + hashlib.sha256(key).hexdigest()[:39]


def shown_progress(progress: TurnProgress, language: Language) -> str:
    """A turn so far as a streaming card shows it; past one card's size (30 KB) its beginning, which
    the reply's first part holds too (the rest follows in messages of its own)."""
    pieces = card_chunks(progress.markdown(language))
    return pieces[0] if len(pieces) == 1 else pieces[0].rstrip() + " …"


def final_cards(reply: OutboundMessage) -> list[dict[str, Any]]:
    """The card(s) the reply fills: the first is patched into the streaming card, the rest sent."""
    if reply.approval is not None:
        return [approval_card(reply.approval, detect_language(reply.text))]
    text = reply.text
    if reply.error is not None:  # the task failed: its apology, and a line saying the reply stopped
        text = f"{text}\n\n{fixed_reply('stream_interrupted', detect_language(text))}"
    return [markdown_card(chunk) for chunk in card_chunks(text)]


class CardStream:
    """One turn's streaming card: opened at once, patched while the turn runs, closed for the reply."""

    def __init__(
        self,
        api: FeishuAPI,
        records: Records,
        message: InboundMessage,
        *,
        redactor: Redactor | None = None,
        pacer: PatchPacer | None = None,
        progress: TurnProgress | None = None,
    ) -> None:
        assert message.id is not None
        self.api, self.records, self.message = api, records, message
        self.progress = progress or TurnProgress(redactor)
        self.progress.listen(lambda event: self._stale.set())
        self.pacer = pacer or PatchPacer()
        self.language = detect_language(message.text)
        self.uuid = stream_uuid(message)
        self.card_id: str | None = None
        self.refused = False  # the platform refused the card for good: send the reply the usual way
        self._ready = asyncio.Event()
        self._stale = asyncio.Event()
        self._closing = False
        self._opening = False  # past waiting for its turn: the card is being (or was) sent
        self._task: asyncio.Task[None] | None = None

    def start(self, after: Callable[[], Awaitable[None]] | None = None) -> None:
        """Open the card once `after` (the conversation's earlier replies delivered) is done."""
        self._task = asyncio.create_task(self._run(after), name=f"feishu-stream:{self.message.id}")

    async def close(self) -> str | None:
        """Stop patching (a patch in flight is let finish); the card's message_id, if it has one.
        A card still waiting for its turn is not sent at all."""
        if not self._opening and self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._ready.set()
        await self._ready.wait()
        self._closing = True
        self._stale.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        return self.card_id

    async def _run(self, after: Callable[[], Awaitable[None]] | None = None) -> None:
        if after is not None:
            await after()
        self._opening = True
        try:
            await self._open()
        finally:
            self._ready.set()
        while self.card_id is not None and not self._closing:
            await self._stale.wait()
            self._stale.clear()
            if self._closing:
                return
            await self.pacer.wait()
            if self._closing:
                return
            try:  # one attempt: a later change (or the reply) patches again
                await self.api.patch_card(self.card_id, self._card(), patient=False)
            except FeishuError as exc:
                log.info("feishu: streaming card %s not updated this time: %s", self.card_id, exc)
                if exc.permanent:
                    return
            except Exception:
                log.exception("feishu: streaming card %s not updated", self.card_id)

    async def _open(self) -> None:
        """The card: stored by an earlier run of this message, or sent now and stored."""
        assert self.message.id is not None
        known = await self.records.stream_of(self.message.id)
        if known is not None and not known.startswith(UNCONFIRMED):
            self.card_id = known
            self._stale.set()  # show where this run is at once
            return
        if known is None:  # the uuid first: the platform may make the card and the process die
            await self.records.keep_stream(self.message.id, "feishu", UNCONFIRMED + self.uuid)
        try:
            self.card_id = await self.api.send_card(
                self._card(),
                chat_id=self.message.chat_id,
                reply_to=self.message.reply_to,
                uuid=self.uuid,
                in_thread=self.message.thread_id is not None,
            )
        except FeishuError as exc:
            self.refused = exc.permanent
            log.warning("feishu: no streaming card for message %s (%s): the reply is sent whole",
                        self.message.message_id, exc)  # fmt: skip
            return
        await self.records.keep_stream(self.message.id, "feishu", self.card_id)

    def _card(self) -> dict[str, Any]:
        return markdown_card(shown_progress(self.progress, self.language))


async def finish_card(
    api: FeishuAPI, card_id: str, reply: OutboundMessage, pacer: PatchPacer | None = None
) -> str:
    """Patch the streaming card `card_id` to the whole `reply`; parts that do not fit follow as
    cards of their own. Returns the card's message_id."""
    cards = final_cards(reply)
    if pacer is not None:
        await pacer.wait()
    await api.patch_card(card_id, cards[0])
    for index, card in enumerate(cards[1:], start=1):
        await api.send_card(card, chat_id=reply.chat_id, reply_to=reply.reply_to,
                            uuid=part_uuid(reply.uuid, index),
                            in_thread=reply.thread_id is not None)  # fmt: skip
    return card_id


__all__ = ["PATCH_INTERVAL", "CardStream", "PatchPacer", "final_cards", "finish_card", "stream_uuid"]
