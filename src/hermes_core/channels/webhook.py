"""The generic HTTP webhook (C2).

    POST /webhook  {"message": "…", "user_id": "u1"}   → 200 {"reply": "…", "message_id": …}
    POST /webhook  {"message": "…", "user_id": "u1", "callback_url": "https://…"}
                   → 202 at once; the reply is POSTed to callback_url

Optional fields: `message_id` (a client-chosen id: a resend with the same id is not answered
twice) and `conversation_id` (defaults to the user).

A tool call that needs approval (tasks/pending.py) answers with the request and its id:

    → 200 {"reply": "I need your approval…", "approval": {"id": "ap_…", "tool": …, "arguments": …}}
    POST /webhook/approvals/ap_…  {"user_id": "u1", "decision": "approve" | "reject"}
                   → 200 {"status": "approved", "reply": "…"}  (the task's reply once it has run on)

Only the user who started the task, or an admin, may decide (403 otherwise); an expired or
already decided approval gives 409. With a shared secret (HERMES_WEBHOOK_SECRET)
every request must carry `X-Hermes-Timestamp` (Unix seconds, within 5 minutes) and
`X-Hermes-Signature: sha256=<hex HMAC-SHA256(secret, timestamp + "." + raw body)>`; callbacks are
signed the same way.
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
from typing import TYPE_CHECKING, Any

from ..gateway.messages import InboundMessage, OutboundMessage
from .base import Channel, DeliveryError, read_body

if TYPE_CHECKING:
    from aiohttp import ClientSession, web

    from ..gateway.dispatcher import Gateway

log = logging.getLogger("hermes_core.webhook")

MAX_BODY = 1024 * 1024
MAX_MESSAGE_CHARS = 20_000
SIGNATURE_WINDOW = 300.0
_dumps = functools.partial(json.dumps, ensure_ascii=False)  # UTF-8 replies, not \u escapes


def sign(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


class WebhookChannel(Channel):
    name = "webhook"

    def __init__(self, gateway: Gateway, *, secret: str | None = None, reply_timeout: float = 120.0) -> None:
        self.gateway = gateway
        self.secret = secret or None
        self.reply_timeout = reply_timeout
        self._waiting: dict[int, asyncio.Future[OutboundMessage]] = {}
        self._session: ClientSession | None = None

    def routes(self) -> list[web.RouteDef]:
        from aiohttp import web

        return [web.post("/webhook", self.handle), web.post("/webhook/approvals/{id}", self.handle_decision)]

    async def handle(self, request: web.Request) -> web.Response:
        body = await self._verified_body(request)
        if not isinstance(body, bytes):
            return body
        try:
            message = self._parse(body)
        except ValueError as exc:
            return _error(400, str(exc))
        if not self.gateway.accepting:
            return _error(503, "shutting down, try again")
        inbound_id = await self.gateway.accept(message)
        if inbound_id is None:
            return _json({"duplicate": True, "message_id": message.message_id})
        if message.callback_url:
            return _json({"accepted": True, "message_id": message.message_id}, 202)
        return await self._reply_of(inbound_id, {"message_id": message.message_id})

    async def handle_decision(self, request: web.Request) -> web.Response:
        """POST /webhook/approvals/{id}: approve or reject a pending call; answers with the reply of
        the task once it has run on (or 202 when the original request gave a callback_url)."""
        from ..tasks.pending import DecisionRefused

        body = await self._verified_body(request)
        if not isinstance(body, bytes):
            return body
        try:
            data = json.loads(body.decode("utf-8"))
            user, decision = data["user_id"], data["decision"]
            if not isinstance(user, str) or not user or decision not in ("approve", "reject"):
                raise ValueError
        except (UnicodeDecodeError, ValueError, TypeError, KeyError):
            return _error(400, "body must be JSON with 'user_id' and 'decision' ('approve' or 'reject')")
        if not self.gateway.accepting:
            return _error(503, "shutting down, try again")
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

    async def _reply_of(self, inbound_id: int, fields: dict[str, Any]) -> web.Response:
        """Wait for the first reply to inbox row `inbound_id` and answer with it (202 if too slow)."""
        waiter = self._waiting[inbound_id] = asyncio.get_running_loop().create_future()
        try:
            reply = await asyncio.wait_for(asyncio.shield(waiter), self.reply_timeout)
        except asyncio.TimeoutError:
            return _json({**fields, "accepted": True, "pending": True}, 202)
        finally:
            self._waiting.pop(inbound_id, None)
        if reply.approval is not None:
            fields["approval"] = _approval_fields(reply.approval)
        return _json({"reply": reply.text, **fields})

    async def _verified_body(self, request: web.Request) -> bytes | web.Response:
        """The request's body, or the error answer: too large (413), not signed when it must be (401)."""
        body = await read_body(request, MAX_BODY)
        if body is None:
            return _error(413, "body too large")
        if self.secret and not self._signed(request.headers, body):
            return _error(401, "missing or invalid signature")
        return body

    def _signed(self, headers: Any, body: bytes) -> bool:
        assert self.secret is not None
        timestamp = headers.get("X-Hermes-Timestamp", "")
        try:
            fresh = abs(time.time() - float(timestamp)) <= SIGNATURE_WINDOW
        except ValueError:
            return False
        expected = sign(self.secret, timestamp, body)
        return fresh and hmac.compare_digest(expected, headers.get("X-Hermes-Signature", ""))

    @staticmethod
    def _parse(body: bytes) -> InboundMessage:
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"body must be UTF-8 JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("body must be a JSON object")
        text, user = data.get("message"), data.get("user_id")
        if not isinstance(text, str) or not text.strip():
            raise ValueError("'message' must be a non-empty string")
        if len(text) > MAX_MESSAGE_CHARS:
            raise ValueError(f"'message' is longer than {MAX_MESSAGE_CHARS} characters")
        if not isinstance(user, str) or not user:
            raise ValueError("'user_id' must be a non-empty string")
        callback = data.get("callback_url")
        if callback is not None and not (
            isinstance(callback, str) and callback.startswith(("http://", "https://"))
        ):
            raise ValueError("'callback_url' must be an http(s) URL")
        message_id = data.get("message_id") or uuid.uuid4().hex
        conversation = data.get("conversation_id") or user
        if not isinstance(message_id, str) or not isinstance(conversation, str):
            raise ValueError("'message_id' and 'conversation_id' must be strings")
        return InboundMessage(
            channel="webhook",
            conversation=f"webhook:{conversation}",
            sender=user,
            text=text,
            message_id=message_id,
            callback_url=callback,
        )

    async def send(self, message: OutboundMessage) -> str | None:
        if not message.callback_url:  # synchronous request: the reply is the HTTP response
            waiter = self._waiting.get(message.inbound_id or -1)
            if waiter is not None and not waiter.done():
                waiter.set_result(message)
            return None  # no waiter: the caller timed out or the process restarted; nothing to deliver
        return await self._post_callback(message)

    async def _post_callback(self, message: OutboundMessage) -> str | None:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        fields = {"reply": message.text, "conversation_id": message.conversation.removeprefix("webhook:"),
                  "reply_id": message.uuid, "index": message.index}  # fmt: skip
        if message.approval is not None:
            fields["approval"] = _approval_fields(message.approval)
        body = json.dumps(fields, ensure_ascii=False).encode()
        headers = {"Content-Type": "application/json; charset=utf-8", "Idempotency-Key": message.uuid}
        if self.secret:
            timestamp = str(int(time.time()))
            headers.update(
                {"X-Hermes-Timestamp": timestamp, "X-Hermes-Signature": sign(self.secret, timestamp, body)}
            )
        assert message.callback_url is not None
        try:
            async with self._session.post(message.callback_url, data=body, headers=headers) as response:
                if response.status < 300:
                    return None
                transient = response.status == 429 or response.status >= 500
                raise DeliveryError(f"callback answered HTTP {response.status}", permanent=not transient)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise DeliveryError(f"callback failed: {type(exc).__name__}: {exc}") from exc

    async def stop(self) -> None:
        for waiter in self._waiting.values():
            waiter.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None


def _approval_fields(approval: dict[str, Any]) -> dict[str, Any]:
    keys = ("id", "tool", "arguments", "requested_by", "created_at", "expires_at", "status")
    return {key: approval.get(key) for key in keys}


def _error(status: int, message: str) -> web.Response:
    return _json({"error": message}, status)


def _json(data: dict[str, Any], status: int = 200) -> web.Response:
    from aiohttp import web

    return web.json_response(data, status=status, dumps=_dumps)
