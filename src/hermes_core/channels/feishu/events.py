"""Feishu events in: verify a callback request, and turn a message event into an InboundMessage.

Verification follows FEISHU.md §1–§2 and the SDK's order (decrypt → url_verification answered →
token → signature), but every rejection is a 4xx, never the SDK's 500 that Feishu would retry for
hours. The same `inbound_from_event` serves the HTTP callback and the long connection (§8), whose
frames carry the same envelope.
"""

from __future__ import annotations

import hmac
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...gateway.messages import InboundMessage
from .crypto import DecryptionError, decrypt, signature_matches

MAX_BODY = 1024 * 1024
# Dedup keys are kept 48 h; a signed request older than this is refused outright, so a replay is
# caught either by the window or by dedup. (Whether Feishu re-signs its retries is unconfirmed, so
# the window must cover the whole ~7 h retry schedule.)
REPLAY_WINDOW = 24 * 3600.0


@dataclass
class EventCheck:
    status: int
    body: dict[str, Any]
    envelope: dict[str, Any] | None = None  # a verified event, to be persisted before the ack

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
            data = json.loads(body.decode("utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not an object")
            if "encrypt" in data:
                data = self._decrypt(data["encrypt"])
        except (UnicodeDecodeError, ValueError) as exc:
            return _reject(400, f"malformed request: {exc}")
        if data.get("type") == "url_verification":  # exempt from signatures (§1), not from the token
            if not self._token_ok(data.get("token")):
                return _reject(403, "invalid verification_token")
            return EventCheck(200, {"challenge": data.get("challenge")})
        if data.get("schema"):
            token = (data.get("header") or {}).get("token")
        elif data.get("uuid"):
            token = data.get("token")
        else:
            return _reject(400, "malformed request: neither a v2 (schema) nor a v1 (uuid) event")
        if self.encrypt_key is not None:
            problem = self._signature_problem(headers, body)
            if problem:
                return _reject(401, problem)
        if (token is not None or self.encrypt_key is None) and not self._token_ok(token):
            return _reject(403, "invalid verification_token")
        return EventCheck(200, {"msg": "success"}, data)

    def _decrypt(self, encrypted: Any) -> dict[str, Any]:
        if self.encrypt_key is None:
            raise ValueError("the event is encrypted but no Encrypt Key is configured")
        if not isinstance(encrypted, str):
            raise ValueError("'encrypt' must be a string")
        try:
            data = json.loads(decrypt(encrypted, self.encrypt_key))
        except DecryptionError as exc:
            raise ValueError(str(exc)) from None
        if not isinstance(data, dict):
            raise ValueError("decrypted event is not an object")
        return data

    def _token_ok(self, token: Any) -> bool:
        if self.verification_token is None:
            return self.encrypt_key is not None  # nothing to compare with: only signed requests pass
        return isinstance(token, str) and hmac.compare_digest(token, self.verification_token)

    def _signature_problem(self, headers: Mapping[str, str], body: bytes) -> str | None:
        assert self.encrypt_key is not None
        timestamp = headers.get("X-Lark-Request-Timestamp", "")
        nonce = headers.get("X-Lark-Request-Nonce", "")
        claimed = headers.get("X-Lark-Signature", "")
        if not (timestamp and nonce and claimed):
            return "missing signature headers"
        if not signature_matches(timestamp, nonce, self.encrypt_key, body, claimed):
            return "signature verification failed"
        try:
            age = abs(self.now() - float(timestamp))
        except ValueError:
            return "malformed X-Lark-Request-Timestamp"
        if age > self.replay_window:
            return "request timestamp outside the replay window"
        return None


def _reject(status: int, reason: str) -> EventCheck:
    return EventCheck(status, {"error": reason})


@dataclass
class Ignored:
    """An event that is acknowledged but not answered, and why (for the log)."""

    reason: str


def inbound_from_event(envelope: dict[str, Any], bot_open_id: str | None) -> InboundMessage | Ignored:
    """An `im.message.receive_v1` event as an InboundMessage; anything else is Ignored.

    One-to-one chats are always handled (session key: the sender's open_id); group messages only
    when the bot is @mentioned (session key: the chat). Mention keys are stripped from the text.
    """
    header = envelope.get("header") or {}
    event_type = header.get("event_type") or (envelope.get("event") or {}).get("type")
    if event_type != "im.message.receive_v1":
        return Ignored(f"event type {event_type!r} is not handled")
    event = envelope.get("event") or {}
    message, sender = event.get("message") or {}, event.get("sender") or {}
    open_id = ((sender.get("sender_id") or {}).get("open_id")) or ""
    message_id, chat_id = message.get("message_id"), message.get("chat_id")
    if not (isinstance(message_id, str) and message_id and isinstance(chat_id, str) and chat_id):
        return Ignored("message event without message_id or chat_id")
    if sender.get("sender_type") not in (None, "user"):
        return Ignored("message not sent by a user")
    chat_type = message.get("chat_type") or "p2p"
    mentions = [m for m in message.get("mentions") or [] if isinstance(m, dict)]
    if chat_type != "p2p":
        if bot_open_id is None:
            return Ignored("group message, but the bot's own open_id is unknown")
        if not any((m.get("id") or {}).get("open_id") == bot_open_id for m in mentions):
            return Ignored("group message that does not mention the bot")
    kind, text = _text_of(message, mentions, bot_open_id)
    return InboundMessage(
        channel="feishu",
        conversation=f"feishu:{open_id if chat_type == 'p2p' else chat_id}",
        sender=open_id,
        text=text,
        message_id=message_id,
        kind=kind,
        event_id=header.get("event_id") or envelope.get("uuid"),
        chat_id=chat_id,
        chat_type=chat_type,
        reply_to=message_id,
        extra={"message_type": message.get("message_type")},
    )


def _text_of(
    message: dict[str, Any], mentions: list[dict[str, Any]], bot_open_id: str | None
) -> tuple[str, str]:
    try:
        content = json.loads(message.get("content") or "{}")
    except ValueError:
        content = {}
    kind = message.get("message_type")
    if kind == "text" and isinstance(content, dict):
        return "text", strip_mentions(str(content.get("text") or ""), mentions, bot_open_id)
    if kind == "post" and isinstance(content, dict):
        return "text", strip_mentions(post_text(content), mentions, bot_open_id)
    return "non_text", ""


def strip_mentions(text: str, mentions: list[dict[str, Any]], bot_open_id: str | None) -> str:
    """Remove the bot's mention key; other users' keys become their names. `@_user_1` never
    matches inside `@_user_10`."""
    for mention in mentions:
        key = mention.get("key")
        if not isinstance(key, str) or not key:
            continue
        is_bot = (mention.get("id") or {}).get("open_id") == bot_open_id
        name = "" if is_bot else f"@{mention.get('name') or ''}"
        text = re.sub(re.escape(key) + r"(?!\d)", name.replace("\\", "\\\\"), text)
    text = re.sub(r"@_all(?!\w)", "", text)
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def post_text(content: dict[str, Any]) -> str:
    """The readable text of a rich-text (post) message, in any of the shapes Feishu sends."""
    body = content.get("post", content)
    if "content" not in body:  # {"zh_cn": {...}} locale wrapper
        body = next((value for value in body.values() if isinstance(value, dict)), {})
    lines = [str(body["title"])] if body.get("title") else []
    for paragraph in body.get("content") or []:
        parts = []
        for node in paragraph if isinstance(paragraph, list) else []:
            if isinstance(node, dict) and node.get("tag") in ("text", "a", "code_block", "md"):
                parts.append(str(node.get("text") or ""))
            elif isinstance(node, dict) and node.get("tag") == "at":
                parts.append(str(node.get("user_id") or ""))
        lines.append("".join(parts))
    return "\n".join(line for line in lines if line)
