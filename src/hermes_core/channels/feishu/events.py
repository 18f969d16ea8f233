"""Feishu events in: verify a callback request, and turn a message event into an InboundMessage.

Verification follows FEISHU.md §1–§2 and the SDK's order (decrypt → url_verification answered →
token → signature); every rejection is a 4xx saying why, never the SDK's 500. The platform
re-pushes any answer but 200 (a 4xx too) after 15 s, 5 min, 1 h and 6 h, which is harmless for a
forged request (refused each time); a verified event of a type the bot does not handle is answered
200 and dropped, so it is not pushed again. The same `inbound_from_event` serves the HTTP callback
and the long connection (§8), whose frames carry the same envelope.

Besides messages, `chat_event` reads the recall and the bot added / removed events (channel.py
acts on them); their fields are type-checked with the others in `_SHAPE`.

Card clicks come in two shapes. The current one (`card.action.trigger`, "callback configuration")
is a v2 event like any other. The legacy one (card 1.0, the "card request URL" of older apps)
has no envelope — `open_id`, `open_message_id`, `action.value`, a card `token` at the top — and is
signed with SHA-1 over timestamp + nonce + Verification Token + body, as the SDK's
`CardActionHandler` checks it. It is verified that way and turned into the same
`card.action.trigger` envelope, so both reach the one approval decision path.

Hostile bodies (docs/security.md): anything that is not a JSON object of the expected shape is a
400 with one line saying what is wrong — JSON too deeply nested, a number too long, a `header` that
is not an object, a field of the wrong type in an otherwise valid and verified event
(`envelope_problem`), an identifier with a lone surrogate, a message or chat id not shaped like the
platform's (`om_…`, `oc_…`: ids go into API paths). Nothing of such an event is stored, and
`inbound_from_event` itself never raises on any JSON value, so the long connection (which carries
no signature) can use it as it is.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ...kernel.messages import JSON
from ..base import json_object
from ..media import MAX_ATTACHMENTS, keyed
from ..seam import MAX_MESSAGE_CHARS, InboundMessage, has_surrogate
from .crypto import DecryptionError, decrypt, signature

MAX_BODY = 1024 * 1024
# Dedup keys are kept 48 h; a signed request older than this is refused outright, so a replay is
# caught either by the window or by dedup. (Whether Feishu re-signs its retries is unconfirmed, so
# the window must cover the whole ~7 h retry schedule.)
REPLAY_WINDOW = 24 * 3600.0
MAX_MENTIONS = 100  # mention keys replaced per message: bounds the work one event can cause
MAX_ID_CHARS = 100  # a message_id is "om_" and 32 hex digits
_ID = re.compile(r"^[A-Za-z0-9_\-]+$")
MAX_NAME = 64  # characters of a member's name shown to the model
TOO_LONG_KEPT = 500  # characters of an over-long text kept: enough to tell its language
GroupSession = Literal["chat", "topic", "user"]  # one history per group, per topic, per member
Signer = Callable[[str, str, str, bytes], str]  # (timestamp, nonce, secret, body) → hex signature


@dataclass
class EventCheck:
    status: int
    body: dict[str, JSON]
    envelope: dict[str, JSON] | None = None  # a verified event, to be persisted before the ack

    @property
    def accepted(self) -> bool:
        return self.status == 200


class FeishuEventVerifier:
    def __init__(
        self,
        verification_token: str | None,
        encrypt_key: str | None = None,
        *,
        replay_window: float = REPLAY_WINDOW,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.verification_token = verification_token or None
        self.encrypt_key = encrypt_key or None
        self.replay_window = replay_window
        self.now = now

    def check(self, headers: Mapping[str, str], body: bytes) -> EventCheck:
        if len(body) > MAX_BODY:
            return _reject(413, "request body too large")
        try:
            data = json_object(body)
            if "encrypt" in data:
                data = self._decrypt(data["encrypt"])
        except ValueError as exc:
            return _reject(400, f"malformed request: {exc}")
        if data.get("type") == "url_verification":  # exempt from signatures (§1), not from the token
            if not self._token_ok(data.get("token")):
                return _reject(403, "invalid verification_token")
            if not isinstance(data.get("challenge"), str):
                return _reject(400, "malformed request: 'challenge' must be a string")
            return EventCheck(200, {"challenge": data["challenge"]})
        if data.get("schema"):
            if not isinstance(data.get("header"), (dict, type(None))):
                return _reject(400, "malformed request: 'header' must be an object")
            token = (data.get("header") or {}).get("token")
        elif data.get("uuid"):
            token = data.get("token")
        elif is_legacy_card(data):
            return self._check_legacy_card(headers, body, data)
        else:
            return _reject(400, "malformed request: neither a v2 (schema) nor a v1 (uuid) event")
        if self.encrypt_key is not None:
            problem = self._signature_problem(headers, body)
            if problem:
                return _reject(401, problem)
        if (token is not None or self.encrypt_key is None) and not self._token_ok(token):
            return _reject(403, "invalid verification_token")
        if self.encrypt_key is None and self._is_stale(data):  # nothing signed its time: its own age
            return _reject(401, f"event older than {self.replay_window / 3600:g} h (a replay?)")
        problem = envelope_problem(data)
        if problem:
            return _reject(400, f"malformed event: {problem}")
        return EventCheck(200, {"msg": "success"}, data)

    def _is_stale(self, data: dict[str, JSON]) -> bool:
        """Token-only mode: is the event older than the replay window, by its own time (v2
        `header.create_time`, v1 `ts`)? Its dedup key is kept 48 h, longer than the window, so an
        event sent again is refused by one or the other. A request without a time is let through:
        whoever holds the token can write any time anyway (docs/feishu.md: use an Encrypt Key)."""
        header = data.get("header")
        stamp = header.get("create_time") if isinstance(header, dict) else data.get("ts")
        text = str(stamp) if isinstance(stamp, (str, int)) and not isinstance(stamp, bool) else ""
        try:
            seconds = float(text)
        except ValueError:
            return False
        seconds = seconds / 1000 if seconds > 1e11 else seconds  # milliseconds (v2) or seconds (v1)
        return self.now() - seconds > self.replay_window

    def _check_legacy_card(
        self, headers: Mapping[str, str], body: bytes, data: dict[str, JSON]
    ) -> EventCheck:
        """A card 1.0 callback: SHA-1 signature with the Verification Token, then the same shape
        checks as a `card.action.trigger` event, whose envelope it becomes."""
        if self.verification_token is None:
            return _reject(403, "legacy card callbacks are signed with the Verification Token, "
                                "and none is configured (FEISHU_VERIFICATION_TOKEN)")  # fmt: skip
        problem = self._timed_signature_problem(headers, body, self.verification_token, legacy_signature)
        if problem:
            return _reject(401, problem)
        problem = _shape_problem(data, _LEGACY_CARD_SHAPE, "") or _id_problem(data, _LEGACY_CARD_IDS)
        if problem:
            return _reject(400, f"malformed card callback: {problem}")
        return EventCheck(200, {"msg": "success"}, card_action_envelope(data))

    def _decrypt(self, encrypted: JSON) -> dict[str, JSON]:
        if self.encrypt_key is None:
            raise ValueError("the event is encrypted but no Encrypt Key is configured")
        if not isinstance(encrypted, str):
            raise ValueError("'encrypt' must be a string")
        try:
            return json_object(decrypt(encrypted, self.encrypt_key).encode("utf-8"))
        except DecryptionError as exc:
            raise ValueError(str(exc)) from None

    def _token_ok(self, token: JSON) -> bool:
        if self.verification_token is None:
            return self.encrypt_key is not None  # nothing to compare with: only signed requests pass
        return isinstance(token, str) and hmac.compare_digest(token, self.verification_token)

    def _signature_problem(self, headers: Mapping[str, str], body: bytes) -> str | None:
        assert self.encrypt_key is not None
        return self._timed_signature_problem(headers, body, self.encrypt_key, signature)

    def _timed_signature_problem(
        self, headers: Mapping[str, str], body: bytes, secret: str, sign: Signer
    ) -> str | None:
        """The X-Lark-* signature of `body` with `secret`, and its timestamp in the replay window."""
        timestamp = headers.get("X-Lark-Request-Timestamp", "")
        nonce = headers.get("X-Lark-Request-Nonce", "")
        claimed = headers.get("X-Lark-Signature", "")
        if not (timestamp and nonce and claimed):
            return "missing signature headers"
        if not (timestamp.isascii() and nonce.isascii() and claimed.isascii()):
            return "malformed signature headers"  # undecodable header bytes arrive as surrogates
        if not hmac.compare_digest(sign(timestamp, nonce, secret, body), claimed):
            return "signature verification failed"
        try:
            age = abs(self.now() - float(timestamp))
        except ValueError:
            return "malformed X-Lark-Request-Timestamp"
        if not age <= self.replay_window:  # also NaN
            return "request timestamp outside the replay window"
        return None


def legacy_signature(timestamp: str, nonce: str, verification_token: str, body: bytes) -> str:
    """A card 1.0 callback's `X-Lark-Signature`: hex SHA-1 of timestamp + nonce + token + body."""
    return hashlib.sha1((timestamp + nonce + verification_token).encode("utf-8") + body).hexdigest()


def is_legacy_card(data: dict[str, JSON]) -> bool:
    """Is this body a card 1.0 callback (no envelope; the clicker and the action at the top)?"""
    return "action" in data and ("open_id" in data or "open_message_id" in data)


_LEGACY_CARD_SHAPE: dict[str, type] = {
    "open_id": str, "user_id": str, "open_message_id": str, "open_chat_id": str, "tenant_key": str,
    "token": str, "action": dict, "action.tag": str, "action.value": dict,
    "action.value.approval_id": str, "action.value.decision": str,
}  # fmt: skip


def card_action_envelope(card: dict[str, JSON]) -> dict[str, JSON]:
    """A verified card 1.0 callback as the `card.action.trigger` envelope the channel handles."""
    action = _dict(card.get("action"))
    event = {
        "operator": {"open_id": card.get("open_id"), "user_id": card.get("user_id"),
                     "tenant_key": card.get("tenant_key")},
        "token": card.get("token"),
        "action": {"value": action.get("value"), "tag": action.get("tag")},
        "context": {"open_message_id": card.get("open_message_id"), "open_chat_id": card.get("open_chat_id")},
    }  # fmt: skip
    header = {"event_type": "card.action.trigger", "tenant_key": card.get("tenant_key"),
              "legacy_card": True}  # its answer has another shape: the channel patches the card  # fmt: skip
    return {"schema": "2.0", "header": header, "event": event}


def _reject(status: int, reason: str) -> EventCheck:
    return EventCheck(status, {"error": reason})


# The fields this module and the channel read, by path, and the type each must have when present
# (null counts as absent). Strings must also be free of lone surrogates: they are stored.
_SHAPE: dict[str, type] = {
    "header": dict, "header.event_id": str, "header.event_type": str, "header.token": str,
    "uuid": str, "token": str, "event": dict, "event.type": str,
    "event.sender": dict, "event.sender.sender_type": str, "event.sender.sender_id": dict,
    "event.sender.sender_id.open_id": str,
    "event.message": dict, "event.message.message_id": str, "event.message.chat_id": str,
    "event.message.chat_type": str, "event.message.message_type": str, "event.message.content": str,
    "event.message.mentions": list, "event.message.parent_id": str,
    "event.message.thread_id": str, "event.message.root_id": str,
    "event.message_id": str, "event.chat_id": str, "event.operator_id": dict,
    "event.operator_id.open_id": str,
    "event.operator": dict, "event.operator.open_id": str, "event.action": dict,
    "event.action.value": dict, "event.action.value.approval_id": str,
    "event.action.value.decision": str, "event.context": dict, "event.context.open_message_id": str,
}  # fmt: skip
# Ids that the channel puts into API paths (replies, card patches, downloads) or keys conversations
# by: each must look like the platform's — its prefix (om_ a message, oc_ a chat) and at most
# MAX_ID_CHARS letters, digits, `_` and `-` — so that a crafted one (`om_x/../om_y`) is a 400 here,
# not a request to another endpoint. The API client also quotes every id it sends. (An odd
# `parent_id` only loses its quote: `quoted` checks it where it is read.)
_PLATFORM_IDS: dict[str, str] = {
    "event.message.message_id": "om_", "event.message.chat_id": "oc_", "event.message_id": "om_",
    "event.chat_id": "oc_", "event.context.open_message_id": "om_", "event.context.open_chat_id": "oc_",
}  # fmt: skip
_LEGACY_CARD_IDS: dict[str, str] = {"open_message_id": "om_", "open_chat_id": "oc_"}
_MENTION_SHAPE: dict[str, type] = {"key": str, "name": str, "id": dict, "id.open_id": str}
_TYPE_NAMES: dict[type, str] = {dict: "an object", list: "an array", str: "a string"}


def envelope_problem(envelope: JSON) -> str | None:
    """What is wrong with the shape of an event envelope (one line), or None when it can be read."""
    if not isinstance(envelope, dict):
        return "the event is not a JSON object"
    problem = _shape_problem(envelope, _SHAPE, "") or _id_problem(envelope, _PLATFORM_IDS)
    if problem:
        return problem
    mentions = _at(envelope, "event.message.mentions") or []
    for index, mention in enumerate(mentions[:MAX_MENTIONS]):
        if not isinstance(mention, dict):
            return f"'event.message.mentions[{index}]' must be an object"
        problem = _shape_problem(mention, _MENTION_SHAPE, f"event.message.mentions[{index}].")
        if problem:
            return problem
    return None


def _shape_problem(data: dict[str, JSON], shape: dict[str, type], prefix: str) -> str | None:
    for path, kind in shape.items():
        value = _at(data, path)
        if value is None:
            continue
        if not isinstance(value, kind):
            return f"'{prefix}{path}' must be {_TYPE_NAMES[kind]}"
        if isinstance(value, str) and has_surrogate(value):
            return f"'{prefix}{path}' holds a lone surrogate (not valid Unicode)"
    return None


def _id_problem(data: dict[str, JSON], ids: dict[str, str]) -> str | None:
    for path, prefix in ids.items():
        value = _at(data, path)
        shaped = isinstance(value, str) and value.startswith(prefix) and len(value) <= MAX_ID_CHARS
        if isinstance(value, str) and value and not (shaped and _ID.match(value)):  # "" is absent
            return f"'{path}' is not a Feishu id ({prefix}… of letters, digits, _ and -)"
    return None


def _at(data: dict[str, JSON], path: str) -> JSON:
    """The value at a dotted path; None when a step is missing or not an object."""
    value: JSON = data
    for step in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(step)
    return value


def _dict(value: JSON) -> dict[str, JSON]:
    return value if isinstance(value, dict) else {}


def _list(value: JSON) -> list[JSON]:
    return value if isinstance(value, list) else []


def _str(value: JSON) -> str:
    return value if isinstance(value, str) else ""


@dataclass
class Ignored:
    """An event that is acknowledged but not answered, and why (for the log)."""

    reason: str


def inbound_from_event(
    envelope: dict[str, JSON], bot_open_id: str | None, group_session: GroupSession = "topic"
) -> InboundMessage | Ignored:
    """An `im.message.receive_v1` event as an InboundMessage; anything else is Ignored.

    One-to-one chats are always handled (session key: the sender's open_id); group messages only
    when the bot is @mentioned (session key: `conversation_of`), with the sender as the speaker the
    model reads. Mention keys are stripped from the text; a text over `MAX_MESSAGE_CHARS` is kept
    short and answered with a note (kind "too_long"), as the webhook refuses it.
    """
    problem = envelope_problem(envelope)
    if problem is not None:
        return Ignored(f"malformed event: {problem}")
    header, event = _dict(envelope.get("header")), _dict(envelope.get("event"))
    event_type = header.get("event_type") or event.get("type")
    if event_type != "im.message.receive_v1":
        return Ignored(f"event type {event_type!r} is not handled")
    message, sender = _dict(event.get("message")), _dict(event.get("sender"))
    open_id = _str(_dict(sender.get("sender_id")).get("open_id"))
    message_id, chat_id = message.get("message_id"), message.get("chat_id")
    if not (isinstance(message_id, str) and message_id and isinstance(chat_id, str) and chat_id):
        return Ignored("message event without message_id or chat_id")
    if sender.get("sender_type") not in (None, "user"):
        return Ignored("message not sent by a user")
    chat_type = _str(message.get("chat_type")) or "p2p"
    mentions = [m for m in _list(message.get("mentions"))[:MAX_MENTIONS] if isinstance(m, dict)]
    if chat_type != "p2p":
        if bot_open_id is None:
            return Ignored("group message, but the bot's own open_id is unknown")
        if not any(_dict(m.get("id")).get("open_id") == bot_open_id for m in mentions):
            return Ignored("group message that does not mention the bot")
    kind, text, attachments = _text_of(message, mentions, bot_open_id)
    attachments += quoted(message, kind)
    extra: dict[str, Any] = {"message_type": message.get("message_type")}
    if len(text) > MAX_MESSAGE_CHARS:  # not stored whole, not read: answered with a note
        kind, text, extra["length"] = "too_long", text[:TOO_LONG_KEPT], len(text)
    thread_id = _str(message.get("thread_id")) or None
    return InboundMessage(
        channel="feishu",
        conversation=conversation_of(chat_type, chat_id, open_id, thread_id, group_session),
        sender=open_id,
        text=text,
        message_id=message_id,
        kind=kind,
        event_id=_str(header.get("event_id")) or _str(envelope.get("uuid")) or None,
        chat_id=chat_id,
        chat_type=chat_type,
        reply_to=message_id,
        thread_id=thread_id,
        speaker=speaker_label(open_id) if chat_type != "p2p" and open_id else "",
        extra=extra,
        attachments=attachments,
    )


def conversation_of(
    chat_type: str, chat_id: str, open_id: str, thread_id: str | None, group_session: GroupSession
) -> str:
    """The session key: the sender in a one-to-one chat; in a group, per `group_session` (docs/
    feishu.md): the chat ("chat"), each topic, messages outside topics sharing the chat's
    ("topic"), or each member ("user")."""
    if chat_type == "p2p":
        return f"feishu:{open_id}"
    if group_session == "user":
        return f"feishu:{chat_id}:{open_id}"
    if group_session == "topic" and thread_id:
        return f"feishu:{chat_id}:{thread_id}"
    return f"feishu:{chat_id}"


def speaker_label(open_id: str, name: str = "") -> str:
    """How the model is told who speaks in a group: Feishu's own mention markup for the member,
    which the model can also write back to @mention them; the name when it is known (the event
    carries none: channel.py asks the contact API at turn time), cut and stripped of markup."""
    name = re.sub(r'[<>"\s]+', " ", name).strip()[:MAX_NAME]
    return f'<at user_id="{open_id}">{name}</at>'


@dataclass
class ChatEvent:
    """Not a message to answer: a recall (`im.message.recalled_v1`) or the bot added to / removed
    from a group (`im.chat.member.bot.added_v1` / `deleted_v1`)."""

    kind: str  # "recalled" | "bot_added" | "bot_removed"
    chat_id: str
    message_id: str = ""  # the recalled message
    operator: str = ""  # open_id of whoever added or removed the bot
    event_id: str | None = None
    at: float = 0.0  # the header's create_time (the platform's clock): orders membership changes


CHAT_EVENTS = {
    "im.message.recalled_v1": "recalled",
    "im.chat.member.bot.added_v1": "bot_added",
    "im.chat.member.bot.deleted_v1": "bot_removed",
}


def chat_event(envelope: dict[str, JSON]) -> ChatEvent | Ignored:
    """A recall or a membership event (the SDK's `P2ImMessageRecalledV1`,
    `P2ImChatMemberBotAddedV1`, `…DeletedV1` models: lark_oapi/api/im/v1/model/); Ignored when it
    is malformed or of another type. Never raises."""
    problem = envelope_problem(envelope)
    if problem is not None:
        return Ignored(f"malformed event: {problem}")
    header, event = _dict(envelope.get("header")), _dict(envelope.get("event"))
    kind = CHAT_EVENTS.get(_str(header.get("event_type") or event.get("type")))
    if kind is None:
        return Ignored("not a recall or a membership event")
    chat_id, message_id = _str(event.get("chat_id")), _str(event.get("message_id"))
    if not chat_id or (kind == "recalled" and not message_id):
        return Ignored(f"{kind} event without chat_id or message_id")
    operator = _str(_dict(event.get("operator_id")).get("open_id"))
    return ChatEvent(kind, chat_id, message_id, operator, _str(header.get("event_id")) or None,
                     _created_at(header.get("create_time")))  # fmt: skip


def _created_at(value: JSON) -> float:
    """An envelope's `create_time` (a string of digits; the pages disagree on its unit, FEISHU.md §1,
    but the platform uses one), or now in milliseconds when it is missing or not a number. Only
    ordering reads it, so an odd one is not a reason to refuse the event."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    return float(text) if text.isdigit() and len(text) <= 20 else time.time() * 1000


def _text_of(
    message: dict[str, Any], mentions: list[dict[str, Any]], bot_open_id: str | None
) -> tuple[str, str, list[dict[str, Any]]]:
    """The kind, text and attachments (channels/media.py) of a message, for every type a person can
    send (FEISHU.md §4; lark_oapi/channel/normalize/converters/*.py): text and post in full (a post's
    pictures and videos as attachments), image, file, audio and video (`media`) as attachments, a
    merge_forward as a reference read at turn time (references.py), cards, shared chats or contacts
    as a line of text. Stickers and unknown types are "non_text"."""
    from .content import card_text, shared_text

    try:
        content = json.loads(_str(message.get("content")) or "{}")
    except (ValueError, RecursionError):  # not JSON, nested too deeply, a number too long
        content = {}
    content = content if isinstance(content, dict) else {}
    kind = message.get("message_type")
    if kind == "text" and isinstance(content.get("text", ""), str):
        return "text", strip_mentions(content.get("text") or "", mentions, bot_open_id), []
    if kind == "post":
        return "text", strip_mentions(post_text(content), mentions, bot_open_id), post_images(content)
    if kind == "image":
        return "text", "", [keyed("image", content.get("image_key"))]
    if kind in ("file", "audio", "media"):
        what = {"media": "video"}.get(str(kind), str(kind))
        return "text", "", [keyed(what, content.get("file_key"), content.get("file_name"))]
    if kind == "merge_forward":
        forwarded = _str(message.get("message_id"))
        return "text", "", [{"kind": "forward", "message_id": forwarded}] if forwarded else []
    if kind == "interactive":
        return "text", card_text(content), []
    if kind in ("share_chat", "share_user"):
        return "text", shared_text(str(kind), content), []
    return "non_text", "", []


def quoted(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The reference to the message this one replies to (`parent_id`), read when the turn runs;
    none for a message that is itself unreadable, or for an id that is not one. Every message of a
    topic names the topic's first message as its parent: that one is a `topic_root`, which brings
    only what it holds (a picture, a file) into the turn, not its text again and again — as the
    vendor's channel layer does not count it as a reply (lark_oapi/channel/normalize/pipeline.py)."""
    parent = _str(message.get("parent_id"))
    if kind != "text" or not parent or len(parent) > MAX_ID_CHARS or not _ID.match(parent):
        return []
    in_topic_under_root = bool(message.get("thread_id")) and parent == _str(message.get("root_id"))
    return [{"kind": "quote", "message_id": parent, **({"topic_root": True} if in_topic_under_root else {})}]


def strip_mentions(text: str, mentions: list[dict[str, JSON]], bot_open_id: str | None) -> str:
    """Remove the bot's mention key; other users' keys become their names. `@_user_1` never
    matches inside `@_user_10`."""
    for mention in mentions:
        key = mention.get("key")
        if not isinstance(key, str) or not key:
            continue
        is_bot = _dict(mention.get("id")).get("open_id") == bot_open_id
        name = "" if is_bot else f"@{_str(mention.get('name'))}"
        text = re.sub(re.escape(key) + r"(?!\d)", name.replace("\\", "\\\\"), text)
    text = re.sub(r"@_all(?!\w)", "", text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def _post_body(content: dict[str, Any]) -> dict[str, Any]:
    body = _dict(content.get("post", content))
    if "content" not in body:  # {"zh_cn": {...}} locale wrapper
        body = next((value for value in body.values() if isinstance(value, dict)), {})
    return body


def post_images(content: dict[str, Any]) -> list[dict[str, Any]]:
    """The pictures (`img` nodes) and videos (`media` nodes) of a post, in order; more than
    `MAX_ATTACHMENTS` is refused."""
    found = [
        keyed("image", node.get("image_key"))
        if node.get("tag") == "img"
        else keyed("video", node.get("file_key"))
        for paragraph in _list(_post_body(content).get("content"))
        for node in _list(paragraph)
        if isinstance(node, dict) and node.get("tag") in ("img", "media")
    ]
    if len(found) > MAX_ATTACHMENTS:
        return [
            {"kind": "image", "problem": f"the message has more than {MAX_ATTACHMENTS} pictures or videos"}
        ]
    return found


def post_text(content: dict[str, Any]) -> str:
    """The readable text of a rich-text (post) message, in any of the shapes Feishu sends, every
    node kept (lark_oapi/channel/normalize/converters/post.py): links as `[text](href)`, code
    blocks fenced with their language, mentions (their keys, replaced by `strip_mentions`, or
    their names), emoji as `:TYPE:`, rules as `---`; pictures and videos are attachments."""
    from .content import post_node_text

    body = _post_body(content)
    title = body.get("title")
    lines = [title] if isinstance(title, str) and title else []
    for paragraph in _list(body.get("content")):
        line = "".join(post_node_text(node) for node in _list(paragraph) if isinstance(node, dict))
        lines.append(line.strip("\n"))  # a code block or a rule alone on its line
    return "\n".join(line for line in lines if line)
