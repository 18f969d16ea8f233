"""The generic HTTP webhook (C2).

    POST /webhook  {"message": "…", "user_id": "u1"}   → 200 {"reply": "…", "ok": true, "message_id": …}
    POST /webhook  {"message": "…", "user_id": "u1", "callback_url": "https://…"}
                   → 202 at once; the reply is POSTed to callback_url

Optional fields: `message_id` (a client-chosen id: a resend with the same id is not run twice),
`conversation_id` (defaults to the user) and `images` (pictures as base64 or `data:image/…;base64,`
URLs, up to `media.max_image_mb` each and the 1 MiB body; links are refused, never fetched).

Streaming: with `"stream": true` the answer is Server-Sent Events (`text/event-stream`) while the
turn runs (channels/streaming.py says what is shown and how it is redacted):

    event: text    data: {"delta": "…"}                         the reply as the model writes it
    event: tool    data: {"name": "search", "id": "call_…", "status": "running" | "done" | "failed"}
    event: done    data: {"reply": "…", "ok": true, "message_id": …, "task_id": …}   the whole reply
    event: error   data: {"reply": "<apology>", "ok": false, "error": "model_unavailable", …}
    event: pending data: {"pending": true, "message_id": …, "task_id": …}   `reply_timeout` passed

The text deltas add up to the reply (its last characters come just before `done`: streamed text
is held back a little, so that no secret is shown before it is recognised); `done` (or `error`)
is the last event and carries the reply as stored: what counts. A retry of a
streamed message (same `message_id`, user and conversation) does not run it again: while it runs,
the retry is sent the text so far as one `text` event and follows the turn from there; once it has
finished, the stored reply comes as a `text` event and `done`. `stream` cannot be combined with
`callback_url`.

The answer (and the body POSTed to `callback_url`) has these fields:

    reply        the reply text; when the task failed, the polite apology
    ok           true, or false when the task failed (the model unavailable, a limit hit…)
    error        only when ok is false: why — model_unavailable, model_rejected, max_turns,
                 max_tool_calls, internal_error
    message_id   the request's message_id (the one given, or the one chosen for it)
    approval     only when the task waits for an approval (see below)
    duplicate    true when this message_id was accepted before: this is that message's reply
    accepted, pending   202 only: the reply is not ready (callback variant, or `reply_timeout`,
                 120 s, passed); ask again with the same message_id to get it
    conversation_id, reply_id, index    callback body only: the conversation as the client named
                 it, the reply's idempotency key (also the `Idempotency-Key` header), its number

Retries: a request cut short (a timeout, a dropped connection, a crash of the gateway) is sent
again with the same `message_id`, and the same user and conversation. It is not run again: while
the message still runs — after a crash it is run again from the inbox — the retry waits for its
reply, up to `reply_timeout`; once it has finished, the retry gets the stored reply (kept for 48 h).
On nodes that share one database (PostgreSQL) the turn may run on another node than the one a
request or its retry reached: the waiting node also reads the stored reply (every 0.5 s at most)
and answers with it as soon as the other node has stored it.
A retry of a callback request answers 202 (`duplicate`, `accepted`): the reply goes to the
callback. The same `message_id` from another user or conversation is answered `{"duplicate": true}`
with nothing of the other message.

A tool call that needs approval (tasks/pending.py) answers with the request and its id:

    → 200 {"reply": "I need your approval…", "approval": {"id": "ap_…", "tool": …, "arguments": …}}
    POST /webhook/approvals/ap_…  {"user_id": "u1", "decision": "approve" | "reject"}
                   → 200 {"status": "approved", "reply": "…"}  (the task's reply once it has run on)

Only the user who started the task, or an admin, may decide (403 otherwise); an expired or
already decided approval gives 409. The approval shows `arguments` as an object and `requested_by`
qualified by its channel (`webhook:u1`), as docs/webhook.md does. A decision anywhere (here, the
console, a Feishu card) or the expiry runs the task on as another message (channels/seam.py
`resumed_id`); a retry of the first message finds it, so a caller that did not decide learns the
outcome: the task's reply after the decision, or the next approval it asked for.

Who may call (docs/security.md):

- With a shared secret (HERMES_WEBHOOK_SECRET) every request must carry `X-Hermes-Timestamp` (Unix
  seconds, within 5 minutes) and `X-Hermes-Signature: sha256=<hex HMAC-SHA256(secret, timestamp +
  "." + raw body)>`; callbacks are signed the same way. The secret holder is a trusted backend: it
  names any user and any conversation. Each signed request is taken once: its signature (which
  covers the timestamp and the body) is kept in the gateway's database (`seen_nonces`) while the
  timestamp is fresh, and the same request again is a 409, before or after a restart. A client that
  retries signs afresh and keeps the `message_id`: the retry gets the message's reply (above).
- Without a secret, requests are answered only from this machine (a loopback peer, a loopback
  `Host`, no proxy headers, no browser `Origin`): anyone else could claim any user id. `serve`
  refuses to start on a non-loopback address without a secret unless `webhook.allow_unsigned: true`.
  An unsigned conversation belongs to its user: `conversation_id` is qualified by the user id, so
  naming another user's conversation opens a new one of your own.
- `callback_url` must be http(s), without `user@`, to a host of `webhook.callback_hosts` (exactly,
  and the port when the entry has one); redirects are not followed.

A body that is not a UTF-8 JSON object of that shape (nested too deeply, a number too long, a
field of the wrong type, an id with a lone surrogate) is a 400 naming what is wrong; a lone
surrogate in `message` becomes U+FFFD (channels/seam.py), so the message is stored and answered.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

from ..kernel.messages import JSON
from .base import Channel, DeliveryError, json_object, read_body
from .media import MAX_ATTACHMENTS, MediaLimits, inline_image
from .seam import (
    APPROVAL_ENDS,
    Earlier,
    InboundMessage,
    Inbox,
    OutboundMessage,
    TurnWatcher,
    has_surrogate,
    resumed_id,
    task_id_of,
)
from .seam import MAX_MESSAGE_CHARS as MAX_MESSAGE_CHARS  # one cap for every channel
from .streaming import ToolStep, TurnProgress

if TYPE_CHECKING:
    from aiohttp import ClientSession, web
    from yarl import URL

log = logging.getLogger("hermes_core.webhook")

MAX_BODY = 1024 * 1024
SIGNATURE_WINDOW = 300.0
STORED_REPLY_POLL = 0.5  # seconds at most between reads of a reply another node may store
NONCE_MEMORY = 2 * SIGNATURE_WINDOW + 60  # a timestamp is fresh from -window to +window (clock skew)
SECRET_ENV = "HERMES_WEBHOOK_SECRET"
_dumps = functools.partial(json.dumps, ensure_ascii=False)  # UTF-8 replies, not \u escapes
Event = dict[str, Any]


def sign(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def exposure_problem(host: str, secret: str | None, allow_unsigned: bool) -> str | None:
    """Why serving the webhook on `host` would let anyone act as any user; None when it would not."""
    from .base import is_loopback

    if secret or allow_unsigned or is_loopback(host):
        return None
    return (
        f"webhook: refusing to serve an unsigned webhook on {host}; set {SECRET_ENV} "
        "(or serve on 127.0.0.1, or set webhook.allow_unsigned: true, or webhook.enabled: false)"
    )


def conversation_key(user: str, conversation: str | None, *, signed: bool) -> str:
    """The session key. Signed: the conversation named (a trusted backend may name any). Unsigned:
    qualified by the user, `webhook:<user>:<conversation>`, the user's ':' and '%' escaped so that no
    other user id and conversation id make the same key."""
    if signed:
        return f"webhook:{conversation or user}"
    owner = user.replace("%", "%25").replace(":", "%3A")
    return f"webhook:{owner}" if conversation is None else f"webhook:{owner}:{conversation}"


@dataclass(frozen=True)
class CallbackHosts:
    """The hosts a reply may be POSTed to: `host` (any port) or `host:port`, matched exactly."""

    entries: frozenset[tuple[str, int | None]]

    @classmethod
    def of(cls, entries: Iterable[str]) -> CallbackHosts:
        from yarl import URL

        parsed = (URL(f"http://{entry}") for entry in entries)
        return cls(frozenset(((url.host or "").lower(), url.explicit_port) for url in parsed))

    def check(self, callback: str) -> URL:
        """The URL to POST to, parsed by the client's own parser; ValueError saying why not."""
        from yarl import URL

        if not self.entries:
            raise ValueError(
                "'callback_url' refused: no host is allowed; list them in webhook.callback_hosts"
            )
        try:
            url = URL(callback)
            port = url.port
        except (ValueError, TypeError):
            raise ValueError("'callback_url' is not a valid URL") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("'callback_url' must be an http(s) URL")
        if url.raw_user is not None or url.raw_password is not None:
            raise ValueError("'callback_url' must not carry a user name or password")
        host = url.host.lower()
        if (host, None) not in self.entries and (host, port) not in self.entries:
            raise ValueError(f"'callback_url' host {url.raw_authority} is not in webhook.callback_hosts")
        return url


class WebhookChannel(Channel):
    name = "webhook"

    def __init__(
        self,
        gateway: Inbox,
        *,
        secret: str | None = None,
        reply_timeout: float = 120.0,
        allow_unsigned: bool = False,
        callback_hosts: Iterable[str] = (),
        media: MediaLimits | None = None,
    ) -> None:
        self.gateway = gateway
        self.media = media or MediaLimits()  # the size of a picture in `images`
        self.secret = secret or None
        self.reply_timeout = reply_timeout
        self.allow_unsigned = allow_unsigned  # unsigned requests from anywhere, not only this machine
        self.callback_hosts = CallbackHosts.of(callback_hosts)
        self._waiting: dict[int, list[asyncio.Future[OutboundMessage]]] = {}  # by inbox row
        self._progress: dict[int, tuple[str, TurnProgress]] = {}  # streamed turns: inbox row → task
        self._listeners: dict[str, list[asyncio.Queue[Event]]] = {}  # streamed requests, by task id
        self._session: ClientSession | None = None

    def routes(self) -> list[web.RouteDef]:
        from aiohttp import web

        return [web.post("/webhook", self.handle), web.post("/webhook/approvals/{id}", self.handle_decision)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        verified = await self._verified_body(request)
        if not isinstance(verified, tuple):
            return verified
        body, signature = verified
        try:
            message = self._parse(body, signed=signature is not None)
        except ValueError as exc:
            return _error(400, str(exc))
        if not self.gateway.accepting:
            return _error(503, "shutting down, try again")
        if not await self._first_use(signature):
            return _replayed()
        if message.extra.get("stream"):
            return await self._streamed(request, message)
        inbound_id = await self.gateway.accept(message)
        if inbound_id is None:
            return await self._retried(message)
        if message.callback_url:
            return _json({"accepted": True, "message_id": message.message_id}, 202)
        return await self._reply_of(inbound_id, {"message_id": message.message_id}, message.message_id)

    async def handle_decision(self, request: web.Request) -> web.Response:
        """POST /webhook/approvals/{id}: approve or reject a pending call; answers with the reply of
        the task once it has run on (or 202 when the original request gave a callback_url)."""
        from ..kernel.approvals import DecisionRefused

        verified = await self._verified_body(request)
        if not isinstance(verified, tuple):
            return verified
        body, signature = verified
        try:
            data = _json_object(body)
            user, decision = data.get("user_id"), data.get("decision")
            if not _is_id(user) or decision not in ("approve", "reject"):
                raise ValueError
            if has_surrogate(request.match_info["id"]):
                return _error(404, "approval_unknown")
        except ValueError:
            return _error(400, "body must be JSON with 'user_id' and 'decision' ('approve' or 'reject')")
        if not self.gateway.accepting:
            return _error(503, "shutting down, try again")
        if not await self._first_use(signature):
            return _replayed()
        try:
            pending, inbound_id = await self.gateway.decide(
                request.match_info["id"], user, self.name, decision == "approve"
            )
        except DecisionRefused as refused:
            status = {"approval_unknown": 404, "approval_not_allowed": 403}.get(refused.reason, 409)
            return _error(status, refused.reason)
        answer = {"approval": pending.id, "status": pending.status}
        if inbound_id is None or (pending.resume or {}).get("callback_url"):
            return _json({**answer, "accepted": True}, 202)
        return await self._reply_of(inbound_id, answer)

    async def _streamed(self, request: web.Request, message: InboundMessage) -> web.StreamResponse:
        """A `"stream": true` request: accept it and answer with its turn's events."""
        task_id = task_id_of(message)
        queue = self._listen(task_id)  # before the turn can start: its first words are not missed
        try:
            inbound_id = await self.gateway.accept(message)
            if inbound_id is None:
                self._unlisten(task_id, queue)
                return await self._retried(message, request)
            waiter = self._wait(inbound_id)
            fields = {"message_id": message.message_id, "task_id": task_id}
            try:
                return await self._send_events(request, queue, waiter, fields)
            finally:
                self._unwait(inbound_id, waiter)
        finally:
            self._unlisten(task_id, queue)

    async def _send_events(
        self,
        request: web.Request,
        queue: asyncio.Queue[Event],
        waiter: asyncio.Future[OutboundMessage],
        fields: dict[str, Any],
    ) -> web.StreamResponse:
        """Relay the turn's events as SSE until its reply (`done` / `error`), or `pending` when it
        takes longer than `reply_timeout`. A client that leaves misses nothing durable."""
        response = _event_stream()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reply_timeout
        written: list[str] = []  # the text deltas sent

        async def write(event: Event) -> None:
            if event["type"] == "text":
                written.append(event["delta"])
            await _write_event(response, event)

        try:
            await response.prepare(request)
            while True:
                if waiter.done():
                    while not queue.empty():
                        await write(queue.get_nowait())
                    reply, shown = waiter.result(), "".join(written)
                    if reply.error is None and reply.text.startswith(shown) and reply.text != shown:
                        await write({"type": "text", "delta": reply.text[len(shown) :]})  # the held-back end
                    await _write_final(response, reply, fields)
                    break
                got = asyncio.ensure_future(queue.get())
                either: set[asyncio.Future[Any]] = {got, waiter}
                await asyncio.wait(either, timeout=max(deadline - loop.time(), 0),
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                if got.done():
                    await write(got.result())
                else:
                    got.cancel()
                    if not waiter.done():
                        await _write_event(response, {"type": "pending", **fields, "pending": True})
                        break
            await response.write_eof()
        except ConnectionResetError:  # the client left; the turn goes on, its reply is stored
            log.info("webhook: the client stopped reading the stream of %s", fields.get("task_id"))
        return response

    def watch(self, message: InboundMessage) -> TurnWatcher | None:
        """A streamed request's turn: its progress, relayed to every request listening to its task."""
        from ..kernel.redaction import default_redactor

        if not message.extra.get("stream") or message.id is None:
            return None
        task_id = task_id_of(message)
        progress = TurnProgress(default_redactor())
        progress.listen(lambda event: self._relay(task_id, event))
        self._progress[message.id] = (task_id, progress)
        return progress

    def _relay(self, task_id: str, event: Event) -> None:
        for queue in self._listeners.get(task_id, []):
            queue.put_nowait(event)

    def _listen(self, task_id: str) -> asyncio.Queue[Event]:
        """A queue for the events of `task_id`'s turn; a turn under way first sends what it has."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        running = next((p for t, p in self._progress.values() if t == task_id), None)
        if running is not None:
            if running.emitted:
                queue.put_nowait({"type": "text", "delta": running.emitted})
            for step in running.blocks:
                if isinstance(step, ToolStep):
                    queue.put_nowait({"type": "tool", "name": step.name, "id": step.call_id,
                                      "status": step.state})  # fmt: skip
        self._listeners.setdefault(task_id, []).append(queue)
        return queue

    def _unlisten(self, task_id: str, queue: asyncio.Queue[Event]) -> None:
        queues = self._listeners.get(task_id, [])
        if queue in queues:
            queues.remove(queue)
        if not queues:
            self._listeners.pop(task_id, None)

    async def _retried(
        self, message: InboundMessage, request: web.Request | None = None
    ) -> web.StreamResponse:
        """A `message_id` accepted before: the same caller asking again (its first request cut by a
        crash or a timeout) gets that message's reply, stored or, while it still runs, awaited.
        Another user's or conversation's message of that id is not theirs: nothing of it is shown."""
        fields: dict[str, JSON] = {"message_id": message.message_id, "duplicate": True}
        earlier = await self.gateway.store.replies_of(self.name, message.message_id)
        same = earlier is not None and (earlier.message.sender, earlier.message.conversation) == (
            message.sender,
            message.conversation,
        )
        if earlier is None or earlier.message.id is None or not same:
            return _json(fields)
        if earlier.message.callback_url:  # its reply is (or was) POSTed there
            return _json({**fields, "accepted": True}, 202)
        task_id = str(earlier.message.extra.get("task_id", ""))  # the same for the runs it resumes
        streamed = request is not None and message.extra.get("stream")
        queue = self._listen(task_id) if streamed else None  # the turn's events from now on
        try:
            while True:  # the message, then each run of its task that a settled approval started
                inbound_id = earlier.message.id
                assert inbound_id is not None
                waiter = self._wait(inbound_id)  # before reading again: a reply sent from now on reaches it
                try:
                    again = await self.gateway.store.replies_of(self.name, earlier.message.message_id)
                    later = await self._resumed(again) if again is not None and again.done else None
                    if later is not None:  # it asked for an approval, settled since: follow the task on
                        earlier = later
                        continue
                    if again is not None and again.done:
                        stored = next((reply for reply in again.replies if reply.index == 0), None)
                        if streamed and stored is not None:
                            assert request is not None
                            return await self._stored_events(request, stored, {**fields, "task_id": task_id})
                        return _json({**fields, **_reply_fields(stored)}) if stored else _json(fields)
                    if queue is not None:
                        assert request is not None
                        return await self._send_events(request, queue, waiter, {**fields, "task_id": task_id})
                    return await self._answer(inbound_id, waiter, fields, earlier.message.message_id)
                finally:
                    self._unwait(inbound_id, waiter)
        finally:
            if queue is not None:
                self._unlisten(task_id, queue)

    async def _resumed(self, earlier: Earlier) -> Earlier | None:
        """When `earlier`'s reply asked for an approval that has been settled since (from here, the
        console, a Feishu card, or by expiry), the message that ran its task on with the decision."""
        first = next((reply for reply in earlier.replies if reply.index == 0), None)
        if first is None or first.approval is None:
            return None
        for status in APPROVAL_ENDS:
            message_id = resumed_id(earlier.message.message_id, str(first.approval.get("id")), status)
            found = await self.gateway.store.replies_of(self.name, message_id)
            if found is not None and found.message.id is not None:
                return found
        return None

    async def _stored_events(
        self, request: web.Request, reply: OutboundMessage, fields: dict[str, Any]
    ) -> web.StreamResponse:
        """A finished streamed message asked for again: its stored reply, as the stream's events."""
        response = _event_stream()
        try:
            await response.prepare(request)
            await _write_event(response, {"type": "text", "delta": reply.text})
            await _write_final(response, reply, fields)
            await response.write_eof()
        except ConnectionResetError:
            pass
        return response

    async def _reply_of(
        self, inbound_id: int, fields: dict[str, JSON], message_id: str | None = None
    ) -> web.Response:
        """Wait for the first reply to inbox row `inbound_id`, just accepted here, and answer with
        it (202 if too slow). Its turn runs in this node's lane, unless it waits there for longer
        than a sweep period and another node's sweep takes it: the stored reply is read from then."""
        waiter = self._wait(inbound_id)
        try:
            sweep = getattr(self.gateway.store, "sweep_seconds", None) or 0.0
            return await self._answer(inbound_id, waiter, fields, message_id, read_after=sweep)
        finally:
            self._unwait(inbound_id, waiter)

    async def _answer(
        self,
        inbound_id: int,
        waiter: asyncio.Future[OutboundMessage],
        fields: dict[str, JSON],
        message_id: str | None = None,
        read_after: float = 0.05,
    ) -> web.Response:
        """The first reply to `inbound_id` as this node sends it (`waiter`), or — on a store that
        several nodes share, where another node may run the turn and send its reply — as stored
        once its turn is done (`message_id`'s row, read from `read_after` seconds on, again and
        again); 202 after `reply_timeout`."""
        shared = getattr(self.gateway.store, "sweep_seconds", None)  # other nodes share the store
        reading = self._stored_reply(message_id, read_after) if shared and message_id else None
        stored = asyncio.ensure_future(reading) if reading is not None else None
        either: set[asyncio.Future[Any]] = {waiter} if stored is None else {waiter, stored}
        try:
            await asyncio.wait(either, timeout=self.reply_timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if stored is not None:
                stored.cancel()
        if waiter.done() and not waiter.cancelled():
            return _json({**fields, **_reply_fields(waiter.result())})
        if stored is not None and stored.done() and not stored.cancelled():
            reply = stored.result()
            return _json({**fields, **_reply_fields(reply)}) if reply is not None else _json(fields)
        return _json({**fields, "accepted": True, "pending": True}, 202)

    async def _stored_reply(self, message_id: str, first: float) -> OutboundMessage | None:
        """The first reply to `message_id` once its turn is done, read from the store after `first`
        seconds, then again and again, every `STORED_REPLY_POLL` seconds at most (sooner at first);
        None when it was done without one."""
        await asyncio.sleep(first)
        delay = 0.05
        while True:
            try:
                earlier = await self.gateway.store.replies_of(self.name, message_id)
            except Exception as exc:  # the database away for a moment: read again at the next poll
                log.debug("webhook: reading the reply of %s failed: %s", message_id, exc)
                earlier = None
            if earlier is not None and earlier.done:
                return next((reply for reply in earlier.replies if reply.index == 0), None)
            await asyncio.sleep(delay)
            delay = min(delay * 2, STORED_REPLY_POLL)

    def _wait(self, inbound_id: int) -> asyncio.Future[OutboundMessage]:
        """A future the first reply to `inbound_id` is set on; one per waiting request."""
        waiter: asyncio.Future[OutboundMessage] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(inbound_id, []).append(waiter)
        return waiter

    def _unwait(self, inbound_id: int, waiter: asyncio.Future[OutboundMessage]) -> None:
        waiters = self._waiting.get(inbound_id, [])
        if waiter in waiters:
            waiters.remove(waiter)
        if not waiters:
            self._waiting.pop(inbound_id, None)

    async def _verified_body(self, request: web.Request) -> tuple[bytes, str | None] | web.Response:
        """The request's body and its verified signature (None when no secret is set), or the error
        answer: too large (413), not signed when it must be (401), unsigned from elsewhere (403)."""
        body = await read_body(request, MAX_BODY)
        if body is None:
            return _error(413, "body too large")
        if self.secret:
            signature = self._signature(request.headers, body)
            return (body, signature) if signature is not None else _error(401, "missing or invalid signature")
        if not self.allow_unsigned and not _from_this_machine(request):
            return _error(403, f"unsigned requests are answered only from this machine: set {SECRET_ENV}")
        return body, None

    def _signature(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """The request's signature when it is right and its timestamp fresh; None otherwise."""
        assert self.secret is not None
        timestamp = headers.get("X-Hermes-Timestamp", "")
        try:
            fresh = abs(time.time() - float(timestamp)) <= SIGNATURE_WINDOW
        except ValueError:
            return None
        claimed = headers.get("X-Hermes-Signature", "")
        if not (timestamp.isascii() and claimed.isascii()):  # undecodable header bytes: surrogates
            return None
        expected = sign(self.secret, timestamp, body)
        right = hmac.compare_digest(expected, claimed)
        return expected if fresh and right else None

    async def _first_use(self, signature: str | None) -> bool:
        """False when this signed request was taken before (a replay); unsigned ones are not tracked."""
        if signature is None:
            return True
        return await self.gateway.store.claim_nonce(self.name, signature, NONCE_MEMORY)

    def _parse(self, body: bytes, *, signed: bool) -> InboundMessage:
        data = _json_object(body)
        text, user = data.get("message", ""), data.get("user_id")
        images = self._images(data.get("images"))
        if not isinstance(text, str) or not (text.strip() or images):
            raise ValueError("'message' must be a non-empty string (it may be empty with 'images')")
        if len(text) > MAX_MESSAGE_CHARS:
            raise ValueError(f"'message' is longer than {MAX_MESSAGE_CHARS} characters")
        if not _is_id(user):
            raise ValueError("'user_id' must be a non-empty string of valid Unicode")
        callback = data.get("callback_url")
        if callback is not None:
            if not isinstance(callback, str) or has_surrogate(callback):
                raise ValueError("'callback_url' must be an http(s) URL")
            callback = str(self.callback_hosts.check(callback))
        stream = data.get("stream", False)
        if not isinstance(stream, bool):
            raise ValueError("'stream' must be true or false")
        if stream and callback is not None:
            raise ValueError("'stream' and 'callback_url' cannot be combined")
        message_id, conversation = data.get("message_id"), data.get("conversation_id")
        if not all(value is None or value == "" or _is_id(value) for value in (message_id, conversation)):
            raise ValueError("'message_id' and 'conversation_id' must be strings of valid Unicode")
        return InboundMessage(
            channel="webhook",
            conversation=conversation_key(user, conversation or None, signed=signed),
            sender=user,
            text=text,
            message_id=message_id or uuid.uuid4().hex,
            callback_url=callback,
            attachments=images,
            extra={"stream": True} if stream else {},
        )

    def _images(self, value: Any) -> list[dict[str, Any]]:
        """`images`: pictures as base64 or `data:` URLs, checked now (channels/media.py), never links."""
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > MAX_ATTACHMENTS:
            raise ValueError(f"'images' must be a list of at most {MAX_ATTACHMENTS} base64 pictures")
        return [inline_image(item, self.media) for item in value]

    def _client_conversation(self, key: str) -> str:
        """The conversation id as the client named it (without the user qualifying it)."""
        rest = key.removeprefix("webhook:")
        if self.secret:
            return rest
        owner, qualified, conversation = rest.partition(":")
        return conversation if qualified else owner.replace("%3A", ":").replace("%25", "%")

    async def send(self, message: OutboundMessage) -> str | None:
        if message.index == 0 and message.inbound_id is not None:
            self._progress.pop(message.inbound_id, None)  # the turn is over: its reply says the rest
        if not message.callback_url:  # synchronous request: the reply is the HTTP response
            for waiter in self._waiting.get(message.inbound_id or -1, []):
                if not waiter.done():
                    waiter.set_result(message)
            return None  # no waiter: the caller timed out or the process restarted; it may ask again
        return await self._post_callback(message)

    async def _post_callback(self, message: OutboundMessage) -> str | None:
        import aiohttp

        assert message.callback_url is not None
        try:  # checked again: the allowed hosts may have changed since the message was accepted
            url = self.callback_hosts.check(message.callback_url)
        except ValueError as exc:
            raise DeliveryError(f"callback refused: {exc}", permanent=True) from None
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        fields = {**_reply_fields(message), "message_id": message.message_id,
                  "conversation_id": self._client_conversation(message.conversation),
                  "reply_id": message.uuid, "index": message.index}  # fmt: skip
        body = json.dumps(fields, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json; charset=utf-8", "Idempotency-Key": message.uuid}
        if self.secret:
            timestamp = str(int(time.time()))
            headers.update(
                {"X-Hermes-Timestamp": timestamp, "X-Hermes-Signature": sign(self.secret, timestamp, body)}
            )
        try:  # a redirect is not followed: it could lead anywhere, an internal address included
            async with self._session.post(url, data=body, headers=headers, allow_redirects=False) as response:
                if response.status < 300:
                    return None
                transient = response.status == 429 or response.status >= 500
                raise DeliveryError(f"callback answered HTTP {response.status}", permanent=not transient)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise DeliveryError(f"callback failed: {type(exc).__name__}: {exc}") from exc

    async def stop(self) -> None:
        for waiters in self._waiting.values():
            for waiter in waiters:
                waiter.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None


def _json_object(body: bytes) -> dict[str, JSON]:
    """The body as a JSON object (channels/base.py `json_object`), its refusal said the webhook's way."""
    try:
        return json_object(body)
    except ValueError as exc:
        raise ValueError(f"body must be UTF-8 JSON: {exc}") from None


def _is_id(value: JSON) -> TypeGuard[str]:
    """A non-empty string that can be stored exactly (no lone surrogate)."""
    return isinstance(value, str) and bool(value) and not has_surrogate(value)


def _from_this_machine(request: web.Request) -> bool:
    """Sent from this machine to a loopback name, not through a proxy, and not by a browser: a page
    on any site can make a browser POST to 127.0.0.1, but the browser then says so in `Origin`."""
    from .base import is_local

    return is_local(request) and not any(name in request.headers for name in ("Origin", "Sec-Fetch-Site"))


def _reply_fields(reply: OutboundMessage) -> dict[str, JSON]:
    """`reply`, `ok` (false when the task failed: the reply is then the apology) and `error` (why),
    and the approval request when the task waits for one."""
    fields: dict[str, JSON] = {"reply": reply.text, "ok": reply.error is None}
    if reply.error is not None:
        fields["error"] = reply.error
    if reply.approval is not None:
        fields["approval"] = _approval_fields(reply.approval)
    return fields


def _event_stream() -> web.StreamResponse:
    from aiohttp import web

    return web.StreamResponse(headers={
        "Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",  # nginx: pass each event on at once
    })  # fmt: skip


async def _write_event(response: web.StreamResponse, event: Event) -> None:
    """One Server-Sent Event: its `type` is the event name, the rest its JSON data (one line)."""
    name = event["type"]
    data = {key: value for key, value in event.items() if key != "type"}
    await response.write(f"event: {name}\ndata: {_dumps(data)}\n\n".encode())


async def _write_final(response: web.StreamResponse, reply: OutboundMessage, fields: dict[str, Any]) -> None:
    """The last event: `done` with the whole reply, or `error` when the task failed."""
    kind = "done" if reply.error is None else "error"
    await _write_event(response, {"type": kind, **_reply_fields(reply), **fields})


def _approval_fields(approval: dict[str, Any]) -> dict[str, Any]:
    """The approval as docs/webhook.md shows it: `arguments` an object, as the tool reads them (the
    record keeps the model's text), and `requested_by` qualified by its channel (`webhook:u1`), as
    permissions name people."""
    from ..kernel.tools.arguments import ArgumentError, parse_arguments
    from ..kernel.tools.permissions import qualified

    keys = ("id", "tool", "arguments", "requested_by", "created_at", "expires_at", "status")
    fields = {key: approval.get(key) for key in keys}
    try:  # the registry's own reading: it asks for an approval only once it has read the arguments
        fields["arguments"] = parse_arguments(approval.get("arguments"))
    except ArgumentError:  # a record the registry did not write (another engine's, an older one)
        pass  # shown as stored rather than not at all
    channel, requester = approval.get("channel"), approval.get("requested_by")
    if channel and requester:
        fields["requested_by"] = qualified(str(channel), str(requester))
    return fields


def _replayed() -> web.Response:
    return _error(409, "this signed request was already received: sign each request afresh")


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def _json(data: dict[str, JSON], status: int = 200) -> web.Response:
    from aiohttp import web

    return web.json_response(data, status=status, dumps=_dumps)
