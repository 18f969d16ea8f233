"""Messages a message points at, read when its turn runs: the one it quotes (a reply's `parent_id`)
and the chat log a `merge_forward` carries (docs/feishu.md, "What the model reads").

Both come from one call, `GET /open-apis/im/v1/messages/:message_id` (api.py `get_message`): the
message and, for a merge_forward, every message inside it, nested forwards included, each naming
its forward in `upper_message_id`. The tree is rebuilt locally from that one answer, as the
vendor's channel layer does (lark_oapi/channel/normalize/merge_forward.py), bounded in depth,
count and size. Never at accept time: the event's ack must stay under 3 s (FEISHU.md §3).

A quoted message's picture, file, voice or video becomes an attachment of the turn that names the
quoted message (the resource API serves it only through the message that holds it). Those inside
a forwarded log cannot be downloaded at all (the resource API answers 234043), so the transcript
says what they were instead. Whatever cannot be read is said in the text; nothing here raises.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from ..media import MAX_ATTACHMENTS, REFERENCE_KINDS
from .events import MAX_MENTIONS, _text_of

if TYPE_CHECKING:
    from ..seam import InboundMessage
    from .api import FeishuAPI

log = logging.getLogger("hermes_core.feishu")

MAX_DEPTH = 3  # forwards inside forwards followed this deep
MAX_ITEMS = 200  # messages of one forwarded log written out
MAX_CHARS = 60_000  # characters of one quoted message or forwarded log
_WHAT = {"quote": "quoted message", "forward": "forwarded chat log"}
_HELD = {"image": "a picture", "file": "a file", "audio": "a voice message", "video": "a video"}


async def read_references(
    api: FeishuAPI, message: InboundMessage, timeout: float, bot_open_id: str | None = None
) -> InboundMessage:
    """`message` with its quote and forward references read (channels/media.py `ReferenceReader`);
    the bot's own @-mention is taken out of what they say, as out of the message itself."""
    texts: list[str] = []
    attachments: list[dict[str, Any]] = []
    for record in message.attachments:
        kind = record.get("kind")
        if kind not in REFERENCE_KINDS:
            attachments.append(record)
            continue
        message_id = str(record.get("message_id") or "")
        text, found = await _read_one(api, str(kind), message_id, timeout, bot_open_id)
        if record.get("topic_root") and not found:  # the topic's first message holds nothing to fetch:
            text = ""  # its text is not repeated at every message of the topic
        if text:
            texts.append(text)
        attachments += found
    if len(attachments) > MAX_ATTACHMENTS:
        attachments = [{"kind": "file", "problem": f"more than {MAX_ATTACHMENTS} attachments with the quote"}]
    text = "\n\n".join([*texts, message.text]).strip()
    return dataclasses.replace(message, text=text, attachments=attachments)


async def _read_one(
    api: FeishuAPI, kind: str, message_id: str, timeout: float, bot_open_id: str | None = None
) -> tuple[str, list[dict[str, Any]]]:
    from .api import FeishuError

    what = _WHAT[kind]
    try:
        items = await asyncio.wait_for(api.get_message(message_id), timeout)
    except (FeishuError, asyncio.TimeoutError) as exc:
        log.info("feishu: the %s %s could not be read: %s", what, message_id, exc)
        reason = "no answer in time" if isinstance(exc, asyncio.TimeoutError) else _refusal(exc)
        return f"[the {what} could not be read: {reason}]", []
    if not items:
        return f"[the {what} could not be read: Feishu returned no message]", []
    top = next((item for item in items if item.get("message_id") == message_id), items[0])
    if _type(top) == "merge_forward":
        return _transcript(items, message_id), []
    text, found = _item_text(top, bot_open_id)
    for attachment in found:
        if "key" in attachment:
            attachment["message_id"] = message_id  # the resource is served through the quoted message
    header = f"[{what} from {_sender(top)}, {_when(top)}]"
    return f"{header}\n{text[:MAX_CHARS]}\n[end of {what}]", found


def _transcript(items: list[dict[str, Any]], forward_id: str) -> str:
    """A forwarded chat log: each message's sender, time and text, nested forwards indented."""
    children: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for item in items:
        upper = item.get("upper_message_id")
        if isinstance(upper, str) and upper and item.get("message_id") != forward_id:
            children[upper].append(item)
    for siblings in children.values():
        siblings.sort(key=lambda item: _millis(item) or 0)
    lines: list[str] = []
    _write_level(children, forward_id, 0, lines, [MAX_ITEMS])
    body = "\n".join(lines)
    if len(body) > MAX_CHARS:
        body = body[:MAX_CHARS] + "\n… (cut here: the log is longer)"
    count = len(children.get(forward_id, []))
    return f"[forwarded chat log, {count} messages]\n{body}\n[end of forwarded chat log]"


def _write_level(
    children: dict[str, list[dict[str, Any]]], parent: str, depth: int, lines: list[str], budget: list[int]
) -> None:
    indent = "    " * depth
    for item in children.get(parent, []):
        if budget[0] <= 0:
            lines.append(f"{indent}… (more messages not shown)")
            return
        budget[0] -= 1
        lines.append(f"{indent}[{_when(item)}] {_sender(item)}:")
        if _type(item) == "merge_forward":
            if depth + 1 >= MAX_DEPTH:
                lines.append(f"{indent}    [a forwarded chat log, nested too deeply to show]")
            else:
                lines.append(f"{indent}    [forwarded chat log]")
                _write_level(children, str(item.get("message_id")), depth + 1, lines, budget)
            continue
        text, held = _item_text(item)
        notes = [f"[{_HELD.get(str(a.get('kind')), 'an attachment')}{_named(a)}: files inside a forwarded "
                 "message cannot be downloaded]" for a in held]  # fmt: skip
        for line in "\n".join(filter(None, [text, *notes])).splitlines() or ["[empty]"]:
            lines.append(f"{indent}    {line}")


def _item_text(item: dict[str, Any], bot_open_id: str | None = None) -> tuple[str, list[dict[str, Any]]]:
    """The text and attachment records of a message object from the API, read like an event's (the
    get page lists a mention's `id` as a string, the event as an object: both are read)."""
    body = item.get("body")
    content = body.get("content") if isinstance(body, dict) else None
    message = {"message_type": _type(item), "content": content if isinstance(content, str) else "{}"}
    listed = item.get("mentions")
    mentions = [
        {**m, "id": {"open_id": m["id"]}} if isinstance(m.get("id"), str) else m
        for m in (listed[:MAX_MENTIONS] if isinstance(listed, list) else []) if isinstance(m, dict)
    ]  # fmt: skip
    kind, text, attachments = _text_of(message, mentions, bot_open_id)
    if kind != "text":
        return f"[a message of type {_type(item) or 'unknown'}, which cannot be read]", []
    if item.get("deleted") is True:
        return "[this message was recalled]", []
    return text, [a for a in attachments if a.get("kind") not in REFERENCE_KINDS]


_READ_REFUSALS = {
    230001: "Feishu does not know that message",
    230002: "the bot is not in that chat",
    230027: "the app lacks the permission to read messages",
    230110: "the message was deleted",
}


def _refusal(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    meaning = _READ_REFUSALS.get(code) if isinstance(code, int) else None
    return meaning or f"Feishu refused (code {code})"


def _type(item: dict[str, Any]) -> str:
    kind = item.get("msg_type") or item.get("message_type")
    return kind if isinstance(kind, str) else ""


def _sender(item: dict[str, Any]) -> str:
    sender = item.get("sender")
    sender = sender if isinstance(sender, dict) else {}
    who = sender.get("id")
    who = who if isinstance(who, str) and who else "unknown"
    return f"the app {who}" if sender.get("sender_type") == "app" else who


def _millis(item: dict[str, Any]) -> int | None:
    try:
        return int(str(item.get("create_time")))
    except ValueError:
        return None


def _when(item: dict[str, Any]) -> str:
    millis = _millis(item)
    if millis is None or not 0 < millis < 10**14:
        return "time unknown"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(millis / 1000))


def _named(attachment: dict[str, Any]) -> str:
    name = attachment.get("name")
    return f" ({json.dumps(name, ensure_ascii=False)})" if isinstance(name, str) and name else ""


__all__ = ["read_references"]
