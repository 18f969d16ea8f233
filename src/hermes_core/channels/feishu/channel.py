"""The Feishu/Lark bot channel: events in (HTTP callback or long connection), replies out.

Both inbound paths end in the same two steps — verify, then `gateway.accept` (a durable write) —
and only then acknowledge, so an acknowledged event is never lost, and the acknowledgement never
waits for the model.

Approvals (tasks/pending.py) go out as a card with Approve / Reject buttons. A click arrives as a
`card.action.trigger` event (HTTP callback or long connection), verified like every other event,
or as a legacy card 1.0 callback (events.py turns it into the same event); the gateway takes the
decision (only the task's starter or an admin), the task runs on, and the answer to the click
carries the decided card (no buttons, who decided what, by name): `on_event` returns it, as the
HTTP response or inside the long connection's ACK. A refused click (someone else, too late)
changes nothing and gets an error toast the same way.

Replies stream: with `stream` on (`feishu.stream`, the default) each turn gets a card at once —
once the conversation's earlier replies are delivered, so what the user sees keeps the order of
the conversation through any platform fault — whose text is typed out as the model writes and as
tools run, and the reply is written into it. Through CardKit (cardkit.py, the default) or, when
CardKit is off or the platform refuses it, by patching a card message (stream.py). The card is
stored with the message, so a run after a crash writes into the same card.

Groups (docs/feishu.md): one history per topic by default (`group_session`: per chat, topic or
member; events.py `conversation_of`), the sender named to the model, replies kept in their topic.
A recall (`im.message.recalled_v1`) withdraws a message whose turn has not started; the bot removed
from a group (`im.chat.member.bot.deleted_v1`) is noted so nothing more is sent there, and added
(`…added_v1`) it greets the group once. Each is noted durably before the ack (`on_chat_event`).

Start-up never waits for the platform (a Feishu or network outage must not crash `serve`, or
systemd would restart-loop it): the bot's profile is fetched once, and on failure again in the
background with capped, jittered backoff, while the channel reports itself `degraded`
(/healthz, doctor). Mention detection needs the bot's own open_id, so a message event that
depends on it (a group message, or one with mentions) is held until the open_id is known: written
to a JSON-lines file in the data folder before it is acknowledged, and accepted from there, in
arrival order, once the profile arrives (also after a restart). Nothing acknowledged is lost.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ...kernel.messages import JSON
from ...kernel.replies import Language, detect_language, fixed_reply
from ..base import Channel, read_body
from ..media import Fetched
from ..seam import InboundMessage, OutboundMessage, TurnWatcher
from .events import (
    CHAT_EVENTS,
    MAX_BODY,
    FeishuEventVerifier,
    GroupSession,
    Ignored,
    chat_event,
    inbound_from_event,
    speaker_label,
)
from .formatting import approval_card

if TYPE_CHECKING:
    from aiohttp import web

    from ...kernel.approvals import Pending
    from ..seam import Inbox as Gateway  # what a channel may ask of the gateway
    from ..streaming import TurnProgress
    from .api import FeishuAPI
    from .cardkit import CardKitStream
    from .longconn import FeishuLongConnection
    from .stream import CardStream

log = logging.getLogger("hermes_core.feishu")


class FeishuChannel(Channel):
    name = "feishu"

    def __init__(
        self,
        gateway: Gateway,
        *,
        app_id: str,
        app_secret: str,
        verification_token: str | None = None,
        encrypt_key: str | None = None,
        base_url: str = "https://open.feishu.cn",
        mode: Literal["webhook", "longconn"] = "webhook",
        api: FeishuAPI | None = None,
        hold_file: Path | None = None,
        retry_base: float = 1.0,
        retry_cap: float = 60.0,
        stream: bool = True,
        stream_interval: float | None = None,
        card_streaming: Literal["cardkit", "patch"] = "cardkit",
        group_session: GroupSession = "topic",
        greeting: str | None = None,
    ) -> None:
        from .api import FeishuAPI

        self.gateway = gateway
        self.mode = mode
        self.app_id, self._app_secret, self.base_url = app_id, app_secret, base_url
        self.verifier = FeishuEventVerifier(verification_token, encrypt_key)
        self.api = api or FeishuAPI(app_id, app_secret, base_url=base_url)
        self.bot_open_id: str | None = None  # set once the held events (if any) are accepted
        self._resolved_open_id: str | None = None
        self._longconn: FeishuLongConnection | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._held = HeldEvents(hold_file)
        self._hold_lock = asyncio.Lock()
        self._retry = Backoff(retry_base, retry_cap)
        self._problems: dict[str, Problem] = {}
        self._wake = asyncio.Event()
        self._last_attempt = 0.0  # monotonic time of the last bot-info attempt
        self._starter: asyncio.Task[None] | None = None
        self.stream = stream  # replies as cards patched while the turn runs (stream.py)
        self.stream_interval = stream_interval  # seconds between updates of one card (None: the default)
        self.card_streaming = card_streaming  # "patch" after the platform refused CardKit (cardkit.py)
        self._streams: dict[int, CardStream | CardKitStream] = {}  # by inbox row, while its turn runs
        self.group_session: GroupSession = group_session  # one history per group, topic or member
        self.greeting = greeting if greeting is not None else "\n".join(GREETING.values())

    async def start(self) -> None:
        """Try the platform once; whatever fails is retried in the background, never raised."""
        if not await self._fetch_bot_info():
            log.warning("feishu: serving without the bot's profile; retrying in the background")
        self._starter = asyncio.create_task(self._bring_up(), name="feishu-start")

    async def _bring_up(self) -> None:
        """Resolve the bot's profile (retrying), accept the held events, then connect (longconn)."""
        try:
            await self._bring_up_steps()
        except asyncio.CancelledError:
            raise
        except Exception:  # e.g. shutting down while releasing: the events stay held for next time
            log.exception("feishu: start-up in the background stopped")

    async def _bring_up_steps(self) -> None:
        while self._resolved_open_id is None:
            await self._pause(self._retry.next())
            await self._fetch_bot_info()
        while not self.gateway.accepting:  # the gateway starts accepting right after its channels
            await asyncio.sleep(0.05)
        await self._release_held()
        if self.mode == "longconn":
            await self._connect_longconn()

    async def _fetch_bot_info(self) -> bool:
        from .api import FeishuError

        self._last_attempt = time.monotonic()
        try:
            bot = await self.api.bot_info(once=True)
        except FeishuError as exc:
            self._report("bot_info", f"cannot fetch the bot's profile from {self.base_url}: {exc}")
            return False
        open_id = bot.get("open_id")
        if not isinstance(open_id, str) or not open_id:
            self._report("bot_info", "the bot's profile has no open_id: is the bot capability enabled?")
            return False
        self._resolved_open_id = open_id
        self._retry.reset()
        self._problems.pop("bot_info", None)
        log.info("feishu bot %s (%s) ready in %s mode", bot.get("app_name"), open_id, self.mode)
        if not self._held.count():
            self.bot_open_id = open_id  # nothing held: mention detection can start right away
        return True

    async def _connect_longconn(self) -> None:
        from .longconn import FeishuLongConnection

        while self._longconn is None:
            connection = FeishuLongConnection(
                self.app_id, self._app_secret, self.on_event, domain=self.base_url
            )
            self._report("longconn", "connecting the long connection")
            try:
                await connection.start()
            except Exception as exc:  # bad credentials or an outage: both retried, neither crashes serve
                self._report("longconn", f"long connection failed: {exc}")
                await self._pause(self._retry.next())
                continue
            self._longconn = connection
            self._retry.reset()
            self._problems.pop("longconn", None)

    async def _pause(self, seconds: float) -> None:
        """Sleep for the backoff, or less when an event that needs the bot's profile arrives."""
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass

    def _report(self, what: str, detail: str) -> None:
        problem = self._problems.get(what)
        if problem is None or problem.detail != detail:
            log.warning("feishu degraded: %s", detail)
        since = problem.since if problem else time.time()
        self._problems[what] = Problem(detail, since, (problem.attempts if problem else 0) + 1)

    def degraded(self) -> list[dict[str, JSON]]:
        """What does not work yet, for /healthz: empty when the channel is fully up."""
        held = self._held.count()
        problems = dict(self._problems)
        link = self._longconn
        if link is not None and not link.connected:  # up once, now reconnecting, or given up
            since = link.down_since or time.time()
            problems["longconn"] = Problem(_link_down(link), since, link.failed_attempts)
        if held and not problems:  # the profile arrived; the held events are being accepted
            problems["held_events"] = Problem(f"{held} held event(s) being accepted", time.time(), 0)
        return [
            {"component": f"feishu.{what}", "detail": problem.detail, "since": round(problem.since, 3),
             "attempts": problem.attempts, "retry_in_s": round(self._retry.due_in(), 1), "held_events": held}
            for what, problem in problems.items()
        ]  # fmt: skip

    def routes(self) -> list[web.RouteDef]:
        from aiohttp import web

        return [web.post("/feishu/events", self.handle_callback)]

    async def handle_callback(self, request: web.Request) -> web.Response:
        from aiohttp import web

        body = await read_body(request, MAX_BODY)
        if body is None:
            return web.json_response({"error": "request body too large"}, status=413)
        check = self.verifier.check(request.headers, body)
        if not check.accepted:
            log.warning("feishu callback rejected (%d): %s", check.status, check.body.get("error"))
            return web.json_response(check.body, status=check.status)
        if check.envelope is not None:
            if not self.gateway.accepting:
                return web.json_response({"error": "shutting down"}, status=503)  # Feishu pushes again later
            answer = await self.on_event(check.envelope)
            if answer is not None:
                return web.json_response(answer)
        return web.json_response(check.body)

    async def on_event(self, envelope: dict[str, JSON]) -> dict[str, JSON] | None:
        """Persist a verified event (both modes). Returns once it is durable: then it may be acked.
        A card click returns the callback's answer (a toast)."""
        if _event_type(envelope) == "card.action.trigger":
            return await self.on_card_action(envelope)
        if _event_type(envelope) in CHAT_EVENTS:
            await self.on_chat_event(envelope)
            return None
        if self.bot_open_id is None and needs_bot_id(envelope):
            async with self._hold_lock:
                if self.bot_open_id is None:  # still unknown: keep it durably until it is known
                    await asyncio.to_thread(self._held.add, envelope)
                    held = self._held.count()
                    log.info("feishu: event held until the bot's open_id is known (%d held)", held)
                    if time.monotonic() - self._last_attempt >= self._retry.base:
                        self._wake.set()  # try the platform again now (at most once per base delay)
                    return None
        message = inbound_from_event(envelope, self.bot_open_id, self.group_session)
        if isinstance(message, Ignored):
            log.debug("feishu event ignored: %s", message.reason)
            return None
        await self.gateway.accept(message)
        return None

    async def _release_held(self) -> None:
        """Accept the held events in arrival order with the now known open_id, then stop holding."""
        async with self._hold_lock:
            open_id = self._resolved_open_id
            for envelope in self._held.load():
                message = inbound_from_event(envelope, open_id, self.group_session)
                if isinstance(message, Ignored):
                    log.debug("feishu held event ignored: %s", message.reason)
                else:
                    await self.gateway.accept(message)
                await asyncio.to_thread(self._held.drop_first)
            self.bot_open_id = open_id
        log.info("feishu: every held event accepted")

    async def on_chat_event(self, envelope: dict[str, JSON]) -> None:
        """A recall or a change of membership, noted durably before the ack (docs/feishu.md): a
        message recalled before its turn started is not answered (a reply already sent stays); a
        chat the bot was removed from gets nothing more until the bot is added again, and an
        addition is greeted once (the greeting is an inbox message: deduplicated by event id)."""
        event = chat_event(envelope)
        if isinstance(event, Ignored):
            log.debug("feishu event ignored: %s", event.reason)
            return
        store = self.gateway.store
        if event.kind == "recalled":
            withdrawn = await store.withdraw(self.name, event.message_id, f"feishu:{event.chat_id}")
            log.info("feishu: message %s recalled; %s", event.message_id,
                     "not answered" if withdrawn else "its turn had started, its reply stays")  # fmt: skip
            return
        await store.set_chat_left(self.name, event.chat_id, event.kind == "bot_removed", event.at)
        log.info("feishu: the bot was %s chat %s by %s", "removed from" if event.kind == "bot_removed"
                 else "added to", event.chat_id, event.operator or "?")  # fmt: skip
        if event.kind == "bot_added" and self.greeting:
            greeting = InboundMessage(
                channel=self.name, conversation=f"feishu:{event.chat_id}", sender=event.operator,
                text=self.greeting, message_id=f"bot_added:{event.event_id or event.chat_id}",
                kind="greeting", event_id=event.event_id, chat_id=event.chat_id, chat_type="group",
            )  # fmt: skip
            await self.gateway.accept(greeting)

    async def speaker_label(self, message: InboundMessage) -> str:
        """Who speaks in a group turn, named when the contact API says (seam.py `SpeakerNames`;
        `FeishuAPI.user_name` caches each member's name, or its absence, so a group turn costs at
        most one lookup per member per hour and a bot without the scope answers with ids)."""
        if not message.speaker or not message.sender:
            return message.speaker
        name = await self.api.user_name(message.sender, timeout=SPEAKER_NAME_TIMEOUT)
        return speaker_label(message.sender, name or "")

    async def on_card_action(self, envelope: dict[str, JSON]) -> dict[str, JSON]:
        """An Approve / Reject click: decide, answer with a toast and the decided card.

        The decided card (buttons gone, the decision line naming the decider) rides in the answer,
        `{"toast": …, "card": {"type": "raw", "data": <card>}}` (the card-callback page,
        open.feishu.cn/document/uAjLw4CM/ukzMukzMukzM/feishu-cards/card-callback-communication;
        "立即更新卡片" on the handle-card-callbacks page), so the clicker sees it at once, and since
        the card is shared (`config.update_multi`: an update is visible to everyone who received
        it) the whole chat does; no PATCH is needed. A legacy card 1.0 callback, whose answer has another
        shape, gets the toast and the card is patched in the background as before."""
        from ...kernel.approvals import DecisionRefused

        event = envelope.get("event") or {}
        operator = (event.get("operator") or {}).get("open_id")
        value = (event.get("action") or {}).get("value") or {}
        card_message = (event.get("context") or {}).get("open_message_id")
        approval_id, decision = value.get("approval_id"), value.get("decision")
        if not (isinstance(operator, str) and isinstance(approval_id, str) and decision in DECISIONS):
            return _toast("error", "approval_unknown", "zh")
        try:
            pending, _ = await self.gateway.decide(approval_id, operator, self.name, decision == "approve")
        except DecisionRefused as refused:
            log.warning("feishu: %s may not decide %s: %s", operator, approval_id, refused.reason)
            return _toast("error", refused.reason, _language(refused.pending))
        language = _language(pending)
        name = await self.api.user_name(operator)
        # the card shows the name (no tag of its own gets in); without one, an <at id=…></at> tag,
        # which card markdown renders as the person (the rich-text component page)
        shown = name.replace("<", "‹").replace(">", "›") if name else f"<at id={operator}></at>"
        line = fixed_reply(f"approval_{pending.status}", language).format(tool=pending.tool, by=shown)
        card = decided_card(pending, line)
        toast = _toast("success", f"approval_{pending.status}", language, tool=pending.tool,
                       by=name or YOU[language])  # fmt: skip
        if (envelope.get("header") or {}).get("legacy_card"):
            if isinstance(card_message, str) and card_message:
                self._spawn(self._show_decision(card_message, card))
            return toast
        return {**toast, "card": {"type": "raw", "data": card}}

    async def _show_decision(self, card_message: str, card: dict[str, Any]) -> None:
        try:
            await self.api.patch_card(card_message, card)
        except Exception as exc:  # the decision stands; only its display is stale
            log.warning("feishu: could not update the approval card %s: %s", card_message, exc)

    def watch(self, message: InboundMessage) -> TurnWatcher | None:
        """A streaming card for this turn, opened once the conversation's earlier replies are
        delivered; None when replies do not stream."""
        from ...kernel.redaction import default_redactor
        from .cardkit import UPDATE_INTERVAL, CardKitStream, Target
        from .stream import PATCH_INTERVAL, CardStream, PatchPacer

        if not self.stream or message.id is None or not (message.chat_id or message.reply_to):
            return None

        def patched(progress: TurnProgress | None = None) -> CardStream:
            pacer = PatchPacer(self.stream_interval if self.stream_interval is not None else PATCH_INTERVAL)
            return CardStream(self.api, self.gateway.store, message, redactor=default_redactor(), pacer=pacer,
                              progress=progress)  # fmt: skip

        stream: CardStream | CardKitStream
        if self.card_streaming == "cardkit":
            pacer = PatchPacer(self.stream_interval if self.stream_interval is not None else UPDATE_INTERVAL)
            stream = CardKitStream(self.api, self.gateway.store, Target.of(message),
                                   redactor=default_redactor(), pacer=pacer, fallback=patched)  # fmt: skip
        else:
            stream = patched()
        earlier = self._streams.pop(message.id, None)
        if earlier is not None:  # the same message run again in this process: one card still
            self._spawn(earlier.close())
        self._streams[message.id] = stream
        stream.start(after=lambda: self.gateway.delivered(message.conversation))
        return stream.progress

    async def send(self, message: OutboundMessage) -> str | None:
        from .api import FeishuError

        if message.chat_id and await self.gateway.store.chat_left(self.name, message.chat_id):
            raise FeishuError(f"the bot was removed from chat {message.chat_id}: not sent (resend it "
                              "once the bot is added back)", permanent=True)  # fmt: skip
        if message.index == 0 and message.inbound_id is not None:
            card_id = await self._streamed_into(message)
            if card_id is not None:
                return card_id
        return await self.api.send(message)

    async def fetch_attachment(
        self, message: InboundMessage, attachment: dict[str, Any], limit: int, timeout: float
    ) -> Fetched:
        """A picture or file of `message`, from the message resource API (channels/media.py
        `AttachmentSource`; the download itself: resources.py)."""
        from .resources import download_resource

        kind = "image" if attachment.get("kind") == "image" else "file"  # audio and video: "file"
        key = str(attachment.get("key") or "")
        holder = str(attachment.get("message_id") or message.message_id)  # a quoted message's own
        return await download_resource(self.api, holder, key, kind, limit=limit, timeout=timeout)

    async def read_references(self, message: InboundMessage, timeout: float) -> InboundMessage:
        """The quoted message and forwarded chat logs of `message`, read now (channels/media.py
        `ReferenceReader`; the reading itself: references.py)."""
        from .references import read_references

        return await read_references(self.api, message, timeout, self.bot_open_id)

    async def _streamed_into(self, message: OutboundMessage) -> str | None:
        """Write the reply into its streaming card, if it has one; None: send it the usual way."""
        from .api import FeishuError
        from .cardkit import CardKitStream, resume
        from .stream import CardStream

        assert message.inbound_id is not None
        stream = self._streams.pop(message.inbound_id, None)
        try:
            if isinstance(stream, CardKitStream):
                card = await stream.close()
                if stream.refused:  # CardKit itself refused: this and later turns patch card messages
                    self._refuse_cardkit()
                if card is not None:
                    if card.message_id is None:  # its message's send failed: sent now (or found)
                        await stream.open()
                    return await stream.finish(message)
                stream = stream.replacement
            if isinstance(stream, CardStream):
                return await self._patched_into(message, stream)
            if stream is None:  # a retry, or the next process: a card stored by an earlier run
                found = await resume(self.api, self.gateway.store, message)
                if found is not None:
                    return found
            return await self._patched_into(message, stream)
        except FeishuError as exc:
            if not exc.permanent:
                raise  # the outbox tries again; the card is found in the store then
            log.warning("feishu: the streaming card of inbox row %s cannot take the reply (%s); "
                        "sending it anew", message.inbound_id, exc)  # fmt: skip
            return None

    async def _patched_into(self, message: OutboundMessage, stream: CardStream | None) -> str | None:
        """Patch the reply into its card message (stream.py), if it has one."""
        from .stream import final_cards, finish_card, stored_card

        assert message.inbound_id is not None
        card_id = await stream.close() if stream is not None else None
        uuid = stream.uuid if stream is not None and not stream.refused else None
        if card_id is None:
            card_id, unconfirmed = stored_card(await self.gateway.store.stream_of(message.inbound_id))
            if stream is None:  # a retry, or another process: the card's uuid, if it was ever sent
                uuid = unconfirmed
        if card_id is None and uuid is not None:
            # the card's send failed, or its process died, but it may have reached the platform:
            # the same uuid finds it (or makes it now)
            card_id = await self.api.send_card(final_cards(message)[0], chat_id=message.chat_id,
                                               reply_to=message.reply_to, uuid=uuid,
                                               in_thread=message.thread_id is not None)  # fmt: skip
            await self.gateway.store.keep_stream(message.inbound_id, self.name, card_id)
        if card_id is None:
            return None
        return await finish_card(self.api, card_id, message, stream.pacer if stream else None)

    def _refuse_cardkit(self) -> None:
        if self.card_streaming == "cardkit":
            log.warning("feishu: CardKit refused (does the app have the cardkit:card:write scope?); "
                        "replies stream by patching card messages from now on")  # fmt: skip
            self.card_streaming = "patch"

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop(self) -> None:
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:  # turns cut by the stop: their cards are finished by the next run
            self._spawn(stream.close())
        if self._starter is not None:
            self._starter.cancel()
            await asyncio.gather(self._starter, return_exceptions=True)
            self._starter = None
        if self._background:
            await asyncio.wait(self._background, timeout=5)
        if self._longconn is not None:
            await self._longconn.stop()
            self._longconn = None
        await self.api.aclose()


DECISIONS = ("approve", "reject")
# The channel's own fixed texts, in both languages (the rest: kernel/replies.py)
GREETING: dict[Language, str] = {"zh": "大家好！有问题请 @我。", "en": "Hello! @mention me with a question."}
YOU: dict[Language, str] = {"zh": "你", "en": "you"}  # {by} in the clicker's own toast, when no name is known
SPEAKER_NAME_TIMEOUT = 2.0  # seconds for a member's name at turn time


class Problem:
    """One thing the channel cannot do yet: what, since when, after how many attempts."""

    def __init__(self, detail: str, since: float, attempts: int) -> None:
        self.detail, self.since, self.attempts = detail, since, attempts


class Backoff:
    """Exponential backoff with full jitter, capped: many bots restarting after one outage spread out."""

    def __init__(self, base: float, cap: float) -> None:
        self.base, self.cap = base, cap
        self.failures = 0
        self._due = 0.0

    def next(self) -> float:
        self.failures += 1
        delay = random.uniform(self.base / 2, min(self.cap, self.base * 2 ** (self.failures - 1)))
        self._due = time.monotonic() + delay
        return delay

    def reset(self) -> None:
        self.failures, self._due = 0, 0.0

    def due_in(self) -> float:
        return max(0.0, self._due - time.monotonic())


class HeldEvents:
    """Events waiting for the bot's open_id, one JSON line each (redacted), fsynced before the ack.

    Without a file (a channel built without a data folder) they are held in memory only."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._events: list[dict[str, JSON]] = self._read() if path is not None else []

    def _read(self) -> list[dict[str, JSON]]:
        assert self.path is not None
        if not self.path.exists():
            return []
        events = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:  # a line cut by a crash mid-write was never acknowledged
                log.warning("feishu: skipping a torn line in %s", self.path)
        return events

    def count(self) -> int:
        return len(self._events)

    def load(self) -> list[dict[str, JSON]]:
        return list(self._events)

    def add(self, envelope: dict[str, Any]) -> None:
        from ...kernel.redaction import redact_data

        envelope = redact_data(envelope)  # stored like the inbox stores it: pasted secrets redacted
        self._events.append(envelope)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as file:
                file.write(json.dumps(envelope, ensure_ascii=False) + "\n")
                file.flush()
                os.fsync(file.fileno())

    def drop_first(self) -> None:
        self._events.pop(0)
        if self.path is None:
            return
        if not self._events:
            self.path.unlink(missing_ok=True)
            return
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in self._events), "utf-8")
        os.replace(temporary, self.path)


def needs_bot_id(envelope: dict[str, JSON]) -> bool:
    """Does turning this event into a message depend on the bot's own open_id (mention detection)?"""
    if _event_type(envelope) != "im.message.receive_v1":
        return False
    message = (envelope.get("event") or {}).get("message") or {}
    return (message.get("chat_type") or "p2p") != "p2p" or bool(message.get("mentions"))


def _link_down(link: FeishuLongConnection) -> str:
    """What /healthz says of a long connection that is not up."""
    if link.gave_up:
        return (f"the long connection gave up reconnecting ({link.gave_up}): no event arrives until "
                "serve is restarted")  # fmt: skip
    return f"the long connection is down; reconnecting ({link.failed_attempts} attempt(s) failed so far)"


def _event_type(envelope: dict[str, JSON]) -> str | None:
    header = envelope.get("header") or {}
    return header.get("event_type") or (envelope.get("event") or {}).get("type")


def _language(pending: Pending | None) -> Language:
    return detect_language(((pending.resume or {}).get("text", "") if pending else "") or "中")


def decided_card(pending: Pending, line: str) -> dict[str, Any]:
    """The approval card once decided: the request as it was asked, `line` instead of the buttons."""
    return approval_card(pending.summary(), _language(pending), line)


def _toast(kind: str, key: str, language: Language, **fields: str) -> dict[str, JSON]:
    return {"toast": {"type": kind, "content": fixed_reply(key, language).format(**fields)}}
