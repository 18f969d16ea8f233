"""The `web` channel: chat from the console, on the same path as every other channel.

    browser ──POST /console/api/chat──▶ WebChannel ──InboundMessage──▶ Gateway.accept ─▶ lanes ─▶ runner
       ▲                                   │ ▲                                                   │
       └── one JSON line per event ────────┘ └── Channel.send(OutboundMessage) ◀── outbox ◀──────┘
                                             └── streamed text: AgentRunner.on_text_for(task id)

The answer to the POST is a stream of JSON lines (`application/x-ndjson`), read by the page with
`fetch`: `accepted` (the task id), `text` (the reply so far, while the model writes it), then `reply`
(the reply as sent, with an approval request if the task paused for one). Like the webhook's
synchronous variant, the channel waits for the reply of the message it accepted; a browser that
left misses nothing durable: the turn runs on and its reply is marked sent.

Replies nobody waits for — a scheduled job's, a `send_message` post, the reply to a turn whose
browser left — go to the conversation's feed (`ConversationFeeds`): every chat page open on that
conversation listens to it as server-sent events (`GET /console/api/events`) and shows them as
they come. A page opened later reads the conversation's earlier messages from the session store
(console/history.py); the feed only carries what happens while it is open.

Streamed text is what the model writes, not yet the reply: it is redacted as a whole each time a
piece arrives (a secret split across two pieces is still found) and only what could still be the
start of a secret (its last word of printable ASCII) is held until more follows, so the start of a
secret is never shown before the end of it is known, and a short Chinese reply streams as it is
written (`channels.streaming.streamable`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from ..channels.base import Channel
from ..channels.seam import InboundMessage, OutboundMessage
from ..channels.streaming import streamable
from ..kernel.redaction import Redactor

log = logging.getLogger("hermes_core.console")

SENDER = "console"  # who chats from the console (its role is the one `permissions` gives this id)

Event = dict[str, Any]


class TextStreams:
    """Task id → where its streamed text goes, while a browser is waiting for that task."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self._open: dict[str, asyncio.Queue[Event]] = {}

    def open(self, task_id: str, queue: asyncio.Queue[Event]) -> None:
        self._open[task_id] = queue

    def close(self, task_id: str) -> None:
        self._open.pop(task_id, None)

    def on_text(self, task_id: str) -> Callable[[str], None] | None:
        """The `on_text` callback for one run of `task_id`, or None when nobody is watching it."""
        queue = self._open.get(task_id)
        if queue is None:
            return None
        written: list[str] = []
        shown = ""

        def on_text(piece: str) -> None:
            nonlocal shown
            written.append(piece)
            text = streamable(self.redactor, "".join(written))
            if text != shown:
                shown = text
                queue.put_nowait({"type": "text", "text": text})

        return on_text


class ConversationFeeds:
    """Conversation → the queues of the chat pages open on it: what they are sent, as it is sent."""

    def __init__(self) -> None:
        self._open: dict[str, set[asyncio.Queue[Event | None]]] = {}

    def listen(self, conversation: str) -> asyncio.Queue[Event | None]:
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        self._open.setdefault(conversation, set()).add(queue)
        return queue

    def leave(self, conversation: str, queue: asyncio.Queue[Event | None]) -> None:
        listeners = self._open.get(conversation, set())
        listeners.discard(queue)
        if not listeners:
            self._open.pop(conversation, None)

    def publish(self, conversation: str, event: Event) -> int:
        """Hand `event` to every page open on `conversation`; how many there were."""
        listeners = self._open.get(conversation, set())
        for queue in listeners:
            queue.put_nowait(event)
        return len(listeners)

    async def closing(self, app: web.Application) -> None:
        """`on_shutdown`: every open feed ends (None), so no response holds the server up."""
        for listeners in self._open.values():
            for queue in listeners:
                queue.put_nowait(None)


class WebChannel(Channel):
    name = "web"

    def __init__(self, redactor: Redactor, *, reply_timeout: float = 300.0) -> None:
        self.redactor = redactor
        self.reply_timeout = reply_timeout
        self.streams = TextStreams(redactor)
        self.feeds = ConversationFeeds()
        self._waiting: dict[int, asyncio.Queue[Event]] = {}

    def message(
        self, text: str, conversation: str, images: list[dict[str, Any]] | None = None
    ) -> InboundMessage:
        """A message typed in the console, in the console conversation `conversation`, with the
        pictures sent with it (checked attachment records: channels/media.py `inline_image`)."""
        return InboundMessage(
            channel=self.name,
            conversation=f"web:{conversation}",
            sender=SENDER,
            text=text,
            message_id=uuid.uuid4().hex,
            attachments=images or [],
        )

    async def converse(
        self,
        request: web.Request,
        task_id: str,
        accept: Callable[[], Awaitable[int | None]],
        head: Event,
    ) -> web.StreamResponse:
        """Stream one turn of `task_id` to the browser: listen for its text and its reply, `accept`
        the message that runs it (returns its inbox id), then relay events until the reply. The
        first event is `head` (what the page needs to know at once: the task id, its trace)."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self.streams.open(task_id, queue)  # before the turn can start: its first words are not missed
        response = web.StreamResponse(
            headers={"Content-Type": "application/x-ndjson; charset=utf-8", "X-Accel-Buffering": "no"}
        )
        inbound_id: int | None = None
        try:
            inbound_id = await accept()
            if inbound_id is None:
                return web.json_response({"error": "duplicate message"}, status=409)
            self._waiting[inbound_id] = queue
            await response.prepare(request)
            await _write(response, {"type": "accepted", **head})
            async for event in self._events(queue):
                await _write(response, event)
            await response.write_eof()
        except ConnectionResetError:  # the browser left; the turn goes on, its reply is kept as sent
            log.info("console: the browser stopped waiting for %s", task_id)
        finally:
            self.streams.close(task_id)
            if inbound_id is not None:
                self._waiting.pop(inbound_id, None)
        return response

    async def _events(self, queue: asyncio.Queue[Event]) -> AsyncIterator[Event]:
        """Text events (only the latest of those waiting) until the reply, or a timeout event."""
        deadline = asyncio.get_running_loop().time() + self.reply_timeout
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                event = await asyncio.wait_for(queue.get(), max(remaining, 0.001))
            except asyncio.TimeoutError:
                yield {"type": "timeout", "text": "The reply is taking long: see the task's trace."}
                return
            while event["type"] == "text" and not queue.empty():
                event = queue.get_nowait()  # the browser shows the text so far: skip stale versions
            yield event
            if event["type"] == "reply":
                return

    async def send(self, message: OutboundMessage) -> str | None:
        """The reply goes to the browser that waits for it, if it still does; anything else (a
        job's reply, a post, a second reply of the same turn) to the pages open on its conversation."""
        approval = approval_fields(message.approval) if message.approval is not None else None
        reply = self.redactor.redact_data({"type": "reply", "text": message.text, "approval": approval})
        queue = self._waiting.pop(message.inbound_id or -1, None)  # its first reply only
        if queue is not None:
            queue.put_nowait(reply)
        else:
            self.feeds.publish(message.conversation, {**reply, "type": "message"})
        return None


def approval_fields(approval: dict[str, Any]) -> dict[str, Any]:
    """What the page needs of an approval request (tasks/pending.Pending.summary())."""
    keys = ("id", "tool", "arguments", "requested_by", "status", "expires_at")
    return {key: approval.get(key) for key in keys}


async def _write(response: web.StreamResponse, event: Event) -> None:
    await response.write(json.dumps(event, ensure_ascii=False).encode() + b"\n")
