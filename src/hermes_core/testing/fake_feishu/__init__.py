"""A fake Feishu/Lark platform: open API, webhook event pusher and long connection, on 127.0.0.1.

It implements FEISHU.md §10 ("what a faithful local fake must implement") over real HTTP and
WebSocket, so a bot's token cache, retries, throttling, webhook decryption and long-connection
client are exercised as against the real platform, with no network::

    from hermes_core.testing.fake_feishu import FakeFeishu

    async with FakeFeishu(encrypt_key="k", time_scale=0.001) as feishu:
        ...  # point the bot at feishu.base_url (its Feishu domain)
        feishu.deliver(feishu.user_message("hi", mention_bot=True), bot_webhook_url)
        await feishu.drain(5)
        assert feishu.messages_in("oc_chat1")[-1].text == "hello"

From synchronous code: ``feishu = FakeFeishu().start_in_thread()`` … ``feishu.stop()``; the async
methods (``push``, ``drain``, ``ws_deliver`` …) may then be awaited from any event loop.

The pieces, one module each:

- ``api.py``: tokens, bot info, send / reply / patch / edit, message resources, validation,
  throttling (§4–§7);
- ``cards.py``: JSON 2.0 card rules, CardKit card entities and streaming, what a card shows (§6, §11);
- ``pusher.py``: webhook pushes, the §3 retry schedule, duplicates, ``drain`` (§1–§3);
- ``ws.py``: the long-connection endpoint, frames, pings and ACKs (§8);
- this module: the server's lifecycle, its routes, and the events fake users cause (§1, §4):
  messages, messages in topics, recalls, the bot added to or removed from a group.

Time: the §3 retry delays (15 s, 5 min, 1 h, 6 h) are multiplied by ``time_scale``; the ack
deadlines (``ack_timeout`` 3 s, ``challenge_timeout`` 1 s) are real seconds, settable.
``advance_time(s)`` moves the API clock (token expiry, uuid window) without waiting.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

from ...kernel.messages import JSON
from .._thread import serve_in_thread
from .api import OpenApi, Patch, RecordedCall, SentMessage, plain_text
from .cards import CardKit, rendered
from .pusher import RETRY_DELAYS, PushAttempt, PushResult, redelivery
from .ws import LongConnectionPusher

__all__ = [
    "RETRY_DELAYS",
    "FakeFeishu",
    "Patch",
    "PushAttempt",
    "PushResult",
    "RecordedCall",
    "SentMessage",
    "plain_text",
    "rendered",
]

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
MESSAGES_PATH = "/open-apis/im/v1/messages"
CARDS_PATH = "/open-apis/cardkit/v1/cards"


class FakeFeishu(CardKit, OpenApi, LongConnectionPusher):
    """One self-built app on a fake Feishu: its open API, its event subscriptions, its users.

    Records: ``sent`` (the bot's messages), ``patches``, ``requests`` (every API call),
    ``tokens_issued``, ``push_log`` (every delivery attempt, webhook and WS), ``ws_acks``.
    """

    def __init__(
        self,
        *,
        app_id: str = "cli_fake",
        app_secret: str = "fake-secret",
        verification_token: str = "fake-vt",
        encrypt_key: str | None = None,
        bot_open_id: str = "ou_bot",
        bot_name: str = "hermes-bot",
        time_scale: float = 1.0,
        token_ttl: float = 7200.0,
        tenant_key: str = "tenant_fake",
        seed: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.app_id, self.app_secret = app_id, app_secret
        self.verification_token, self.encrypt_key = verification_token, encrypt_key
        self.bot_open_id, self.bot_name, self.tenant_key = bot_open_id, bot_name, tenant_key
        self.time_scale, self.token_ttl = time_scale, token_ttl
        self.host, self.port = host, port
        self.rng = random.Random(seed)
        self._init_api()
        self._init_cards()
        self._init_pusher()
        self._init_ws()
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """The bot's Feishu domain, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://{self.host}:{self.port}"

    # -- lifecycle ---------------------------------------------------------------------------

    def _app(self) -> web.Application:
        """Every route of the fake, in one table."""
        route = self._route
        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post(TOKEN_PATH, route("auth.tenant_access_token", self._token, authed=False))
        app.router.add_get("/open-apis/bot/v3/info", route("bot.info", self._bot_info))
        contact = route("contact.user.get", self._contact_user)
        app.router.add_get("/open-apis/contact/v3/users/{user_id}", contact)
        app.router.add_post(MESSAGES_PATH, route("im.message.create", self._create))
        app.router.add_post(MESSAGES_PATH + "/{message_id}/reply", route("im.message.reply", self._reply))
        app.router.add_patch(MESSAGES_PATH + "/{message_id}", route("im.message.patch", self._patch))
        app.router.add_put(MESSAGES_PATH + "/{message_id}", route("im.message.update", self._edit))
        app.router.add_get(MESSAGES_PATH + "/{message_id}/resources/{file_key}", self._resource)
        app.router.add_post(CARDS_PATH, route("cardkit.card.create", self._card_create))
        card = CARDS_PATH + "/{card_id}"
        convert = route("cardkit.card.id_convert", self._card_id_convert)
        app.router.add_post(CARDS_PATH + "/id_convert", convert)
        app.router.add_put(card, route("cardkit.card.update", self._card_update))
        app.router.add_patch(card + "/settings", route("cardkit.card.settings", self._card_settings))
        app.router.add_put(CARDS_PATH + "/{card_id}/elements/{element_id}/content",
                           route("cardkit.card_element.content", self._card_content))  # fmt: skip
        app.router.add_get(MESSAGES_PATH + "/{message_id}", route("im.message.get", self._get_message))
        app.router.add_post("/callback/ws/endpoint", route("ws.endpoint", self._ws_endpoint, authed=False))
        app.router.add_get("/ws", self._ws)
        return app

    async def start(self) -> FakeFeishu:
        """Start listening in the running event loop; ``port`` is then the real port."""
        runner = web.AppRunner(self._app(), access_log=None, handler_cancellation=True, shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port, backlog=2048).start()
        self._runner = runner
        self.port = runner.addresses[0][1]
        self._loop = asyncio.get_running_loop()
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self

    async def aclose(self) -> None:
        """Cancel every delivery and retry timer, drop the long connections, stop the server."""
        await self._cancel_deliveries()
        await self._close_connections()
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        self._loop = None
        self._client_joined = None

    def start_in_thread(self, timeout: float = 10.0) -> FakeFeishu:
        """Serve from a daemon thread with its own event loop; returns once listening."""
        _, self._thread = serve_in_thread(self.start, self.aclose, "fake-feishu", timeout)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a fake started with ``start_in_thread()`` (cancelling every retry timer)."""
        if self._thread is None:
            if self._runner is not None:
                raise RuntimeError("the fake runs in an event loop: use `await feishu.aclose()`")
            return
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout)
        self._thread = None

    async def __aenter__(self) -> FakeFeishu:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> FakeFeishu:
        return self.start_in_thread()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- what users do (events) --------------------------------------------------------------

    def event(
        self, event_type: str, event: dict[str, JSON], *, event_id: str | None = None
    ) -> dict[str, JSON]:
        """A v2 envelope (§1) around ``event``: fresh ``event_id``, ms ``create_time``, the VT as token."""
        header = {
            "event_id": event_id or uuid.uuid4().hex, "token": self.verification_token,
            "create_time": _millis(), "event_type": event_type, "tenant_key": self.tenant_key,
            "app_id": self.app_id,
        }  # fmt: skip
        return {"schema": "2.0", "header": header, "event": event}

    def user_message(
        self,
        text: str = "",
        *,
        chat_id: str = "oc_chat1",
        chat_type: str = "p2p",
        sender: str = "ou_user1",
        mention_bot: bool = False,
        mentions: Sequence[str] = (),
        message_type: str = "text",
        content: dict[str, JSON] | None = None,
        event_id: str | None = None,
        message_id: str | None = None,
        reply_to: str | None = None,
        thread_id: str | None = None,
    ) -> dict[str, JSON]:
        """An ``im.message.receive_v1`` envelope (§4) for a message ``sender`` writes in ``chat_id``.

        Mentions (the bot first when ``mention_bot``, then ``mentions`` open_ids) get keys
        ``@_user_1``, ``@_user_2`` …, which are put in front of the text (``"@_user_1 hi"``) or as
        ``at`` nodes of a post. ``content`` (a dict) overrides the generated content; on the wire it
        is always a JSON string. ``reply_to`` makes it a reply (``parent_id``/``root_id``), in its
        parent's topic if it has one; ``thread_id`` puts it in that topic (``"omt_…"``, as the
        receive event carries it: open.feishu.cn/document/server-docs/im-v1/message/events/receive;
        see ``topic_message``). The message is remembered, so the bot can reply to it.
        """
        people = ([(self.bot_open_id, self.bot_name)] if mention_bot else []) + [
            (m, _name(m)) for m in mentions
        ]
        wire_mentions = [
            {"key": f"@_user_{n}", "id": {"union_id": _union_id(open_id), "open_id": open_id},
             "name": name, "tenant_key": self.tenant_key}
            for n, (open_id, name) in enumerate(people, 1)
        ]  # fmt: skip
        if content is None:
            content = _content_with_mentions(message_type, text, wire_mentions)
        message_id = message_id or "om_" + uuid.uuid4().hex
        now = _millis()
        message: dict[str, JSON] = {
            "message_id": message_id, "create_time": now, "update_time": now, "chat_id": chat_id,
            "chat_type": chat_type, "message_type": message_type,
            "content": json.dumps(content, ensure_ascii=False),
        }  # fmt: skip
        record = SentMessage(
            message_id, chat_id, message_type, content, plain_text(message_type, content),
            sender=sender, created_at=time.time(), mentions=wire_mentions,
        )  # fmt: skip
        if reply_to is not None:
            parent = self._messages.get(reply_to)
            record.reply_to, record.root_id = reply_to, (parent.root_id if parent else None) or reply_to
            record.thread_id = parent.thread_id if parent else None
            message.update(parent_id=record.reply_to, root_id=record.root_id)
        if thread_id is not None:
            record.thread_id = thread_id
        if record.thread_id:
            message["thread_id"] = record.thread_id
        if wire_mentions:
            message["mentions"] = wire_mentions
        self._remember_inbound(record, chat_type)
        self.users.setdefault(sender, _name(sender))
        event_sender = {
            "sender_id": {"union_id": _union_id(sender), "open_id": sender},
            "sender_type": "user", "tenant_key": self.tenant_key,
        }  # fmt: skip
        return self.event(
            "im.message.receive_v1", {"sender": event_sender, "message": message}, event_id=event_id
        )

    def image_message(
        self,
        data: bytes,
        *,
        content_type: str = "image/png",
        chunked: bool = False,
        delay: float = 0.0,
        **message: Any,
    ) -> dict[str, Any]:
        """A picture ``sender`` sends (msg_type ``image``); its bytes are held as the message's resource."""
        key = "img_v3_" + uuid.uuid4().hex[:24]
        envelope = self.user_message(message_type="image", content={"image_key": key}, **message)
        self.add_resource(_message_id(envelope), key, data, content_type=content_type, chunked=chunked,
                          delay=delay)  # fmt: skip
        return envelope

    def file_message(
        self,
        data: bytes,
        file_name: str,
        *,
        content_type: str = "application/octet-stream",
        chunked: bool = False,
        delay: float = 0.0,
        **message: Any,
    ) -> dict[str, Any]:
        """A file ``sender`` sends (msg_type ``file``, ``{"file_key", "file_name"}``), held likewise."""
        key = "file_v3_" + uuid.uuid4().hex[:24]
        content = {"file_key": key, "file_name": file_name}
        envelope = self.user_message(message_type="file", content=content, **message)
        self.add_resource(_message_id(envelope), key, data, kind="file", content_type=content_type,
                          file_name=file_name, chunked=chunked, delay=delay)  # fmt: skip
        return envelope

    def post_message(self, text: str, images: Sequence[bytes], **message: Any) -> dict[str, Any]:
        """A rich-text message: ``text``, then one ``img`` node per picture, each held as a resource."""
        keys = ["img_v3_" + uuid.uuid4().hex[:24] for _ in images]
        paragraph: list[dict[str, Any]] = [{"tag": "text", "text": text, "style": []}]
        paragraph += [{"tag": "img", "image_key": key, "width": 640, "height": 480} for key in keys]
        envelope = self.user_message(
            message_type="post", content={"title": "", "content": [paragraph]}, **message
        )
        for key, data in zip(keys, images, strict=True):
            self.add_resource(_message_id(envelope), key, data)
        return envelope

    # -- every other type a person can send (FEISHU.md §4, "content per type") ----------------

    def audio_message(self, data: bytes, *, duration: int = 3000, **message: Any) -> dict[str, Any]:
        """A voice message (``audio``: ``{"file_key", "duration"}``, ms); downloaded with type=file."""
        key = "file_v3_" + uuid.uuid4().hex[:24]
        content = {"file_key": key, "duration": duration}
        envelope = self.user_message(message_type="audio", content=content, **message)
        self.add_resource(_message_id(envelope), key, data, kind="file", content_type="audio/ogg")
        return envelope

    def video_message(
        self, data: bytes, *, file_name: str = "video.mp4", duration: int = 5000, **message: Any
    ) -> dict[str, Any]:
        """A video (``media``: ``{"file_key", "image_key", "file_name", "duration"}``), held likewise."""
        key = "file_v3_" + uuid.uuid4().hex[:24]
        content = {"file_key": key, "image_key": "img_v3_" + uuid.uuid4().hex[:24], "file_name": file_name,
                   "duration": duration}  # fmt: skip
        envelope = self.user_message(message_type="media", content=content, **message)
        self.add_resource(_message_id(envelope), key, data, kind="file", content_type="video/mp4",
                          file_name=file_name)  # fmt: skip
        return envelope

    def sticker_message(self, **message: Any) -> dict[str, Any]:
        """A sticker (``{"file_key"}``): the resource API does not serve stickers (FEISHU.md §11)."""
        content = {"file_key": "file_v3_" + uuid.uuid4().hex[:24]}
        return self.user_message(message_type="sticker", content=content, **message)

    def card_message(
        self, title: str, paragraphs: Sequence[Sequence[dict[str, JSON]]], **message: Any
    ) -> dict[str, Any]:
        """A card as a bot receives it: the simplified ``{"title", "elements": [[node, …], …]}``."""
        content = {"title": title, "elements": [list(paragraph) for paragraph in paragraphs]}
        return self.user_message(message_type="interactive", content=content, **message)

    def shared_chat_message(self, shared_chat: str, **message: Any) -> dict[str, Any]:
        """A group chat shared as a card (``share_chat``: ``{"chat_id"}``)."""
        return self.user_message(message_type="share_chat", content={"chat_id": shared_chat}, **message)

    def shared_user_message(self, shared_user: str, **message: Any) -> dict[str, Any]:
        """A contact shared as a card (``share_user``: ``{"user_id"}``)."""
        return self.user_message(message_type="share_user", content={"user_id": shared_user}, **message)

    def forward_message(self, log: Sequence[dict[str, Any]], **message: Any) -> dict[str, Any]:
        """A merge_forward (``{"content": "Merged and Forwarded Message"}``) carrying ``log``: each
        entry ``{"sender", "text"}``, ``{"sender", "message_type", "content"}`` (an ``image`` one
        may add ``"data"``: held as its resource, which the API then refuses with 234043) or
        ``{"sender", "forward": [entries]}`` for a forward inside it. The messages are read back
        through ``GET /open-apis/im/v1/messages/:message_id``."""
        content = {"content": "Merged and Forwarded Message"}
        envelope = self.user_message(message_type="merge_forward", content=content, **message)
        self._hold_forwarded(_message_id(envelope), log, time.time() - 3600)
        return envelope

    def _hold_forwarded(self, forward_id: str, log: Sequence[dict[str, Any]], start: float) -> None:
        for number, entry in enumerate(log):
            kind = "merge_forward" if "forward" in entry else entry.get("message_type", "text")
            content = entry.get("content") or (
                {"content": "Merged and Forwarded Message"}
                if "forward" in entry
                else {"text": entry.get("text", "")}
            )
            inner = SentMessage(
                "om_" + uuid.uuid4().hex, "oc_elsewhere", kind, content, plain_text(kind, content),
                sender=entry.get("sender", "ou_user2"), created_at=start + number * 60,
                upper_message_id=forward_id,
            )  # fmt: skip
            self._messages[inner.message_id] = inner
            if "data" in entry and kind == "image":
                self.add_resource(inner.message_id, str(content["image_key"]), entry["data"])
            if "forward" in entry:
                self._hold_forwarded(inner.message_id, entry["forward"], start + number * 60)

    def card_action(
        self, open_id: str, message_id: str, value: dict[str, JSON], *, tag: str = "button"
    ) -> dict[str, JSON]:
        """A ``card.action.trigger`` envelope: ``open_id`` clicked a component of card ``message_id``.

        **UNCONFIRMED** (not in FEISHU.md): the layout follows the public card-callback docs —
        ``event.operator``, ``event.action.{value, tag}``, ``event.context.{open_message_id,
        open_chat_id}``, ``event.token``.
        """
        known = self._messages.get(message_id)
        self.users.setdefault(open_id, _name(open_id))
        event = {
            "operator": {"tenant_key": self.tenant_key, "open_id": open_id, "union_id": _union_id(open_id)},
            "token": "c-" + uuid.uuid4().hex,
            "action": {"value": value, "tag": tag},
            "host": "im_message",
            "context": {"open_message_id": message_id, "open_chat_id": known.chat_id if known else ""},
        }
        return self.event("card.action.trigger", event)

    def topic_message(self, text: str, *, root: str, **message: Any) -> dict[str, JSON]:
        """A message written inside the topic of message ``root`` (a reply in the topic, started
        on ``root`` if it had none): ``root_id``/``parent_id`` and ``thread_id`` set, as the topics
        overview describes them (open.feishu.cn/document/server-docs/im-v1/message/thread-introduction).
        """
        parent = self._messages[root]
        if parent.thread_id is None:
            parent.thread_id = "omt_" + uuid.uuid4().hex[:12]
        return self.user_message(text, chat_id=parent.chat_id, chat_type="group", reply_to=root,
                                 thread_id=parent.thread_id, **message)  # fmt: skip

    def recalled(self, message_id: str, *, recall_type: str = "message_owner") -> dict[str, JSON]:
        """The sender recalls ``message_id``: it is marked recalled (a reply to it → 230011) and the
        ``im.message.recalled_v1`` envelope is returned. The event's fields (``message_id``,
        ``chat_id``, ``recall_time`` in ms as a string, ``recall_type``) are the recalled-event
        page's (open.feishu.cn/document/server-docs/im-v1/message/events/recalled) and the SDK's
        ``P2ImMessageRecalledV1Data``; ``recall_type`` values other than "message_owner" are
        **UNCONFIRMED**."""
        self.recall(message_id)
        event = {"message_id": message_id, "chat_id": self._messages[message_id].chat_id,
                 "recall_time": _millis(), "recall_type": recall_type}  # fmt: skip
        return self.event("im.message.recalled_v1", event)

    def bot_added(
        self, chat_id: str, *, operator: str = "ou_user1", name: str = "Team chat"
    ) -> dict[str, JSON]:
        """``operator`` adds the bot to group ``chat_id`` (sends there work again): the
        ``im.chat.member.bot.added_v1`` envelope (open.feishu.cn/document/server-docs/group/
        chat-member/event/added-2; the SDK's ``P2ImChatMemberBotAddedV1Data``: ``chat_id``,
        ``operator_id``, ``external``, ``operator_tenant_key``, ``name``, ``i18n_names``)."""
        self.chats_without_bot.discard(chat_id)
        return self.event("im.chat.member.bot.added_v1", self._membership(chat_id, operator, name))

    def bot_removed(
        self, chat_id: str, *, operator: str = "ou_user1", name: str = "Team chat"
    ) -> dict[str, JSON]:
        """``operator`` removes the bot from ``chat_id`` (sends there → 230002): the
        ``im.chat.member.bot.deleted_v1`` envelope (…/chat-member/event/deleted-2), shaped as
        ``bot_added``'s."""
        self.chats_without_bot.add(chat_id)
        return self.event("im.chat.member.bot.deleted_v1", self._membership(chat_id, operator, name))

    def _membership(self, chat_id: str, operator: str, name: str) -> dict[str, JSON]:
        operator_id = {"union_id": _union_id(operator), "open_id": operator}
        return {"chat_id": chat_id, "operator_id": operator_id, "external": False,
                "operator_tenant_key": self.tenant_key, "name": name,
                "i18n_names": {"zh_cn": name, "en_us": name}}  # fmt: skip

    def redelivery_of(self, envelope: dict[str, JSON], *, new_event_id: bool) -> dict[str, JSON]:
        """The same message again: same ``event_id``, or a new one (same ``message_id``) (§3)."""
        return redelivery(envelope, new_event_id=new_event_id)


def _content_with_mentions(message_type: str, text: str, mentions: list[dict[str, JSON]]) -> dict[str, JSON]:
    """Received content (§4): text with the mention keys in front, or a post with ``at`` nodes."""
    if message_type == "text":
        keys = " ".join(mention["key"] for mention in mentions)
        return {"text": f"{keys} {text}" if keys else text}
    if message_type == "post":
        nodes: list[dict[str, JSON]] = [
            {"tag": "at", "user_id": mention["key"], "user_name": mention["name"]} for mention in mentions
        ]
        nodes.append({"tag": "text", "text": f" {text}" if mentions else text, "style": []})
        return {"title": "", "content": [nodes]}
    raise ValueError(f"message_type {message_type!r} needs content=")


def _message_id(envelope: dict[str, Any]) -> str:
    return str(envelope["event"]["message"]["message_id"])


def _union_id(open_id: str) -> str:
    return "on_" + open_id.removeprefix("ou_")


def _name(open_id: str) -> str:
    return "User " + open_id.removeprefix("ou_")


def _millis() -> str:
    return str(int(time.time() * 1000))
