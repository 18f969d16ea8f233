"""The long connection (FEISHU.md §8, §10): the endpoint, the WebSocket server, event frames and ACKs.

Modelled:

- ``POST /callback/ws/endpoint`` with ``{"AppID", "AppSecret"}`` (no Authorization header) →
  ``{"code": 0, "data": {"URL": "ws://…/ws?device_id=…&service_id=…&ticket=…", "ClientConfig": …}}``.
  Bad credentials → code 514 "auth failed", more than ``max_ws_connections`` (50) clients →
  1000040350, both with HTTP 200 (**UNCONFIRMED**: the codes of the endpoint's body; FEISHU.md
  names them only for the upgrade headers). The ``ticket`` stands for the real URL's access key:
  a URL not issued by the endpoint is refused at the upgrade with HTTP 403 and the
  ``handshake-status`` / ``handshake-msg`` / ``handshake-autherrcode`` headers.
- Binary frames only (``frames.Frame``). A CONTROL frame with header ``type=ping`` is answered by
  ``type=pong``, whose payload is ``pong_config`` as JSON when set (a ClientConfig the client must
  apply). A text frame or an undecodable frame closes the connection (recorded in ``ws_errors``).
- Events go out as DATA frames with headers ``type=event``, ``message_id``, ``sum``, ``seq``,
  ``trace_id``; with ``parts > 1`` the UTF-8 payload is cut into byte ranges (a cut may split a
  character: clients must join the bytes before decoding). Each event goes to ONE connected client
  chosen at random (cluster mode). The client must echo the frame with a ``biz_rt`` header and
  payload ``{"code": 200}`` within ``ack_timeout`` (3 s); a handler's answer (a card click's toast)
  rides along as ``"data"``, base64 of its JSON, as lark-oapi's client sends it, and is recorded
  decoded as ``answer`` in ``ws_acks``. A missing ACK, ``{"code": 500}`` or a
  connection lost before the ACK fails the attempt, which is retried on the §3 schedule ×
  ``time_scale`` with the same ``message_id`` header. No client connected: the attempt waits up to
  ``ack_timeout`` for one, then fails.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from hermes_core.channels.feishu.frames import METHOD_CONTROL, METHOD_DATA, Frame, FrameError

from ...kernel.messages import JSON
from .api import Answer, error
from .pusher import Attempt, EventPusher, PushResult

SERVICE_ID = 1


@dataclass
class _Connection:
    device_id: str
    ws: web.WebSocketResponse
    pending: set[str] = field(default_factory=set)  # frame message_ids awaiting an ACK here


class LongConnectionPusher(EventPusher):
    """Event delivery over the long connection, with the webhook's retry machinery."""

    # Set by FakeFeishu.__init__ / start().
    app_id: str
    app_secret: str
    host: str
    port: int

    def _init_ws(self) -> None:
        self.max_ws_connections = 50
        self.ws_client_config: dict[str, int] = {
            "ReconnectCount": -1, "ReconnectInterval": 120, "ReconnectNonce": 0, "PingInterval": 120,
        }  # fmt: skip
        self.pong_config: dict[str, JSON] | None = None
        self.ws_acks: list[dict[str, JSON]] = []
        self.ws_errors: list[str] = []
        self.pings_received = 0
        self.ws_endpoint_calls = 0
        self.ws_connections_total = 0
        self._connections: list[_Connection] = []
        self._tickets: dict[str, str] = {}  # ticket → device_id
        self._ack_waiters: dict[str, asyncio.Future[int | None]] = {}
        self._frame_ids = itertools.count(1)
        self._client_joined: asyncio.Event | None = None  # created on the fake's loop
        self._envelopes: dict[str, dict[str, JSON]] = {}  # frame message_id → event, for its answer

    @property
    def ws_clients(self) -> int:
        """How many long-connection clients are connected now."""
        return len(self._connections)

    async def ws_deliver(self, envelope: dict[str, JSON], *, parts: int = 1) -> None:
        """Queue ``envelope`` for delivery over the long connection (retried until acked); returns at once."""
        if parts < 1:
            raise ValueError("parts must be at least 1")

        def prepare(env: dict[str, JSON]) -> Attempt:
            payload = json.dumps(env, ensure_ascii=False).encode()
            delivery_id = uuid.uuid4().hex  # the frames' message_id, the same on every retry
            self._envelopes[delivery_id] = env

            async def attempt() -> PushResult:
                return await self._send_event(payload, delivery_id, parts)

            return attempt

        self._start_delivery("ws", envelope, prepare)

    async def disconnect_all(self) -> None:
        """Close every long connection (code 1001, going away); clients must reconnect by themselves."""
        await self._on_loop(self._close_connections())

    async def _close_connections(self) -> None:
        reason = b"disconnected by FakeFeishu"
        closing = [conn.ws.close(code=WSCloseCode.GOING_AWAY, message=reason) for conn in self._connections]
        await asyncio.gather(*closing, return_exceptions=True)

    # -- endpoint and upgrade ----------------------------------------------------------------

    def _ws_endpoint(self, request: web.Request, body: Any) -> Answer:
        self.ws_endpoint_calls += 1
        if (
            not isinstance(body, dict)
            or body.get("AppID") != self.app_id
            or body.get("AppSecret") != self.app_secret
        ):
            return error(200, 514, "auth failed")
        if len(self._connections) >= self.max_ws_connections:
            return error(200, 1000040350, "too many connections")
        device_id, ticket = uuid.uuid4().hex[:16], uuid.uuid4().hex
        self._tickets[ticket] = device_id
        url = f"ws://{self.host}:{self.port}/ws?device_id={device_id}&service_id={SERVICE_ID}&ticket={ticket}"
        data = {"URL": url, "ClientConfig": dict(self.ws_client_config)}
        return Answer(200, {"code": 0, "msg": "ok", "data": data})

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        device_id = request.query.get("device_id", "")
        if self._tickets.get(request.query.get("ticket", "")) != device_id or not device_id:
            return _refuse("514", "auth failed: call /callback/ws/endpoint for a URL", "514")
        if len(self._connections) >= self.max_ws_connections:
            return _refuse("403", "too many connections", "1000040350")
        ws = web.WebSocketResponse(timeout=1.0)
        await ws.prepare(request)
        conn = _Connection(device_id, ws)
        self._connections.append(conn)
        self.ws_connections_total += 1
        self._joined().set()
        try:
            async for message in ws:
                if message.type == WSMsgType.ERROR:  # the connection broke
                    break
                if message.type != WSMsgType.BINARY:
                    self.ws_errors.append(
                        f"{device_id}: a {message.type.name} frame; only binary frames are allowed"
                    )
                    await ws.close(code=WSCloseCode.UNSUPPORTED_DATA)
                    break
                if not await self._on_frame(conn, message.data):
                    await ws.close(code=WSCloseCode.PROTOCOL_ERROR)
                    break
        finally:
            self._connections.remove(conn)
            for delivery_id in conn.pending:
                self._resolve_ack(delivery_id, None)
        return ws

    async def _on_frame(self, conn: _Connection, data: bytes) -> bool:
        """Handle one client frame (ping or ACK); False if it is not a valid frame."""
        try:
            frame = Frame.decode(data)
        except FrameError as exc:
            self.ws_errors.append(f"{conn.device_id}: undecodable frame: {exc}")
            return False
        if frame.method == METHOD_CONTROL:
            if frame.header("type") == "ping":
                self.pings_received += 1
                payload = None if self.pong_config is None else json.dumps(self.pong_config).encode()
                pong = Frame(
                    service=frame.service, method=METHOD_CONTROL, headers=[("type", "pong")], payload=payload
                )
                with contextlib.suppress(ConnectionError):  # the client is already gone
                    await conn.ws.send_bytes(pong.encode())
            return True
        delivery_id = frame.header("message_id") or ""
        code, answer = _ack_code(frame.payload), _ack_answer(frame.payload)
        self.ws_acks.append(
            {"message_id": delivery_id, "code": code, "biz_rt": frame.header("biz_rt"),
             "trace_id": frame.header("trace_id"), "device_id": conn.device_id, "answer": answer}
        )  # fmt: skip
        self._resolve_ack(delivery_id, code)
        envelope = self._envelopes.pop(delivery_id, None) if code == 200 else None
        if envelope is not None and answer is not None:  # a card callback's card applies as over HTTP
            self.apply_card_answer(envelope, answer)  # type: ignore[attr-defined]
        return True

    def _resolve_ack(self, delivery_id: str, code: int | None) -> None:
        waiter = self._ack_waiters.get(delivery_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(code)

    # -- sending one event -------------------------------------------------------------------

    async def _send_event(self, payload: bytes, delivery_id: str, parts: int) -> PushResult:
        """One attempt: frames to one random client, then wait for its ACK."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        conn = await self._any_client()
        if conn is None:
            return PushResult(None, "", loop.time() - started, False, "no long-connection client connected")
        waiter: asyncio.Future[int | None] = loop.create_future()
        self._ack_waiters[delivery_id] = waiter
        conn.pending.add(delivery_id)
        trace_id = uuid.uuid4().hex
        try:
            for seq, chunk in enumerate(_split(payload, parts)):
                headers = [
                    ("type", "event"), ("message_id", delivery_id), ("sum", str(parts)), ("seq", str(seq)),
                    ("trace_id", trace_id),
                ]  # fmt: skip
                frame_id = next(self._frame_ids)
                frame = Frame(frame_id, frame_id, SERVICE_ID, METHOD_DATA, headers, payload=chunk)
                await conn.ws.send_bytes(frame.encode())
            code = await asyncio.wait_for(waiter, self.ack_timeout)
        except asyncio.TimeoutError:
            return PushResult(None, "", loop.time() - started, False, f"no ACK within {self.ack_timeout} s")
        except (ConnectionError, RuntimeError) as exc:
            return PushResult(None, "", loop.time() - started, False, f"connection lost: {exc}")
        finally:
            conn.pending.discard(delivery_id)
            if self._ack_waiters.get(delivery_id) is waiter:
                del self._ack_waiters[delivery_id]
        elapsed = loop.time() - started
        if code is None:
            return PushResult(None, "", elapsed, False, "connection closed before the ACK")
        return PushResult(code, "", elapsed, code == 200, None if code == 200 else f"ACK code {code}")

    async def _any_client(self) -> _Connection | None:
        """A random connected client (cluster mode); waits up to ``ack_timeout`` for one."""
        joined = self._joined()
        if not self._connections:
            joined.clear()
            try:
                await asyncio.wait_for(joined.wait(), self.ack_timeout)
            except asyncio.TimeoutError:
                return None
        return self.rng.choice(self._connections) if self._connections else None

    def _joined(self) -> asyncio.Event:
        if self._client_joined is None:
            self._client_joined = asyncio.Event()
        return self._client_joined


def _split(payload: bytes, parts: int) -> list[bytes]:
    """``parts`` consecutive byte ranges of ``payload``, as even as possible."""
    size, extra = divmod(len(payload), parts)
    chunks, start = [], 0
    for index in range(parts):
        end = start + size + (1 if index < extra else 0)
        chunks.append(payload[start:end])
        start = end
    return chunks


def _ack_code(payload: bytes | None) -> int | None:
    try:
        code = json.loads(payload or b"").get("code")
    except (ValueError, AttributeError):
        return None
    return code if isinstance(code, int) else None


def _ack_answer(payload: bytes | None) -> Any:
    """The handler's answer in an ACK (``data``: base64 of JSON), or None when there is none."""
    try:
        data = json.loads(payload or b"").get("data")
        return None if data is None else json.loads(base64.b64decode(data, validate=True))
    except (ValueError, AttributeError, TypeError):
        return None


def _refuse(status: str, message: str, auth_code: str) -> web.Response:
    """A failed upgrade, with the headers the SDK reads (§8)."""
    headers = {"handshake-status": status, "handshake-msg": message, "handshake-autherrcode": auth_code}
    return web.Response(status=403, headers=headers)
