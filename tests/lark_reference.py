"""A Feishu platform whose long connection and card callbacks speak through the official SDK's code.

Our client (channels/feishu/longconn.py, frames.py) and our fake (testing/fake_feishu/ws.py) were
written together, so a shared misreading of the protocol would pass every test that pits one
against the other. Here the other side is lark-oapi (the official Python SDK, a test dependency
only), used for everything it defines:

- every frame the server sends is built, and every frame the client sends is parsed, with the
  SDK's protobuf `pbbp2.Frame` (`lark_oapi.ws.pb.pbbp2_pb2`), not with our `frames.Frame`;
- the endpoint's `ClientConfig` and the ACK's payload are read with the SDK's models
  (`lark_oapi.ws.model.Response`: `code`, and `data` = base64 of the handler's answer);
- `sdk_ack` runs the SDK's own ws client (`Client._handle_data_frame`, with an
  `EventDispatcherHandler` whose card handler answers a given toast) on the very frame we pushed,
  and returns the ACK the SDK writes: what our client's ACK is compared with;
- `legacy_card_request` builds a card 1.0 callback, and `sdk_card_handler_accepts` runs the
  SDK's `CardActionHandler` on it: the request our gateway must accept is one the SDK accepts.

Everything else (the open API, tokens, cards sent and patched) is FakeFeishu's. Importing
lark_oapi takes a few seconds and makes an event loop at import, hence this module is imported
only by the tests that need it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import lark_oapi as lark
from aiohttp import WSCloseCode, WSMsgType, web
from lark_oapi.card.action_handler import CardActionHandler
from lark_oapi.card.model import Card
from lark_oapi.core.model import RawRequest
from lark_oapi.event.callback.model.p2_card_action_trigger import P2CardActionTriggerResponse
from lark_oapi.ws.client import Client as SdkClient
from lark_oapi.ws.const import HEADER_BIZ_RT
from lark_oapi.ws.enum import FrameType, MessageType
from lark_oapi.ws.model import ClientConfig as SdkClientConfig
from lark_oapi.ws.pb.pbbp2_pb2 import Frame as SdkFrame

from hermes_core.channels.feishu.crypto import encrypt
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_feishu.api import Answer

SERVICE_ID = 1  # what FakeFeishu's endpoint puts in the URL


def sdk_frame(data: bytes) -> SdkFrame:
    """`data` parsed by the SDK's protobuf Frame (raises on anything it would not accept)."""
    frame = SdkFrame()
    frame.ParseFromString(data)
    return frame


def sdk_headers(frame: SdkFrame) -> dict[str, str]:
    return {header.key: header.value for header in frame.headers}


@dataclass
class AckPayload:
    """An ACK's payload read as the platform reads the SDK's `Response`: code, and the answer."""

    code: int
    answer: dict[str, Any] | None  # the handler's answer, base64-decoded from `data`
    raw: dict[str, Any]

    @classmethod
    def parse(cls, payload: bytes) -> AckPayload:
        raw = json.loads(payload.decode("utf-8"))
        data = raw.get("data")
        answer = json.loads(base64.b64decode(data, validate=True)) if data is not None else None
        return cls(raw["code"], answer, raw)

    def toast(self) -> Any:
        """The answer as the SDK's `P2CardActionTriggerResponse` (its `toast`), or None."""
        return None if self.answer is None else P2CardActionTriggerResponse(self.answer).toast


@dataclass
class RefSocket:
    """One long connection, seen from the server."""

    device_id: str
    ws: web.WebSocketResponse
    opened_at: float
    pings: list[float] = field(default_factory=list)
    frozen: bool = False
    closed_at: float | None = None


class LarkReference(FakeFeishu):
    """FakeFeishu whose long-connection side encodes and decodes with lark-oapi.

    `client_config` is what the endpoint hands out (the SDK's defaults unless a test scales it
    down, as the platform's own numbers would be); `endpoint_busy` answers that many handshakes
    with "system busy" (code 1, which the SDK retries); `freeze()` makes the newest connection
    go silent while its TCP socket stays open (nothing read, so neither pings nor WebSocket
    pings are answered). Times are `time.monotonic()`.
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.client_config: dict[str, float] = {
            "ReconnectCount": -1, "ReconnectInterval": 120, "ReconnectNonce": 30, "PingInterval": 120,
        }  # fmt: skip
        self.endpoint_busy = 0
        self.endpoint_times: list[float] = []
        self.sockets: list[RefSocket] = []
        self.acks: dict[str, SdkFrame] = {}  # by the pushed frame's message_id
        self.closed_by_server_at: float | None = None
        self._ack_arrived = asyncio.Event()
        self._thaw = asyncio.Event()

    # -- the endpoint and the socket ---------------------------------------------------------

    def _ws_endpoint(self, request: web.Request, body: Any) -> Answer:
        self.endpoint_times.append(time.monotonic())
        if self.endpoint_busy > 0:
            self.endpoint_busy -= 1
            return Answer(200, {"code": 1, "msg": "system busy"})
        self.ws_client_config = dict(self.client_config)  # type: ignore[assignment]
        answer = super()._ws_endpoint(request, body)
        if answer.body.get("code") == 0:  # the SDK's own model must read the config we hand out
            config = SdkClientConfig(answer.body["data"]["ClientConfig"])
            assert config.PingInterval == self.client_config["PingInterval"]
        return answer

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        device_id = request.query.get("device_id", "")
        if not device_id or self._tickets.get(request.query.get("ticket", "")) != device_id:
            refused = {"handshake-status": "514", "handshake-msg": "auth failed"}
            refused["handshake-autherrcode"] = "514"
            return web.Response(status=403, headers=refused)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sock = RefSocket(device_id, ws, time.monotonic())
        self.sockets.append(sock)
        try:
            async for message in ws:
                if sock.frozen:
                    await self._thaw.wait()  # never reads again: the link is silently dead
                    break
                if message.type == WSMsgType.BINARY:
                    await self._on_client_frame(sock, message.data)
        finally:
            sock.closed_at = time.monotonic()
        return ws

    async def _on_client_frame(self, sock: RefSocket, data: bytes) -> None:
        frame = sdk_frame(data)
        kind = sdk_headers(frame).get("type")
        if frame.method == FrameType.CONTROL.value and kind == MessageType.PING.value:
            sock.pings.append(time.monotonic())
            pong = SdkFrame(SeqID=0, LogID=0, service=frame.service, method=FrameType.CONTROL.value)
            header = pong.headers.add()
            header.key, header.value = "type", MessageType.PONG.value
            with contextlib.suppress(ConnectionError):
                await sock.ws.send_bytes(pong.SerializeToString())
        elif frame.method == FrameType.DATA.value:
            self.acks[sdk_headers(frame).get("message_id", "")] = frame
            self._ack_arrived.set()

    async def _close_connections(self) -> None:
        self._thaw.set()
        for sock in self.sockets:
            with contextlib.suppress(Exception):
                await sock.ws.close(code=WSCloseCode.GOING_AWAY)

    # -- what a test does ----------------------------------------------------------------------

    @property
    def live(self) -> list[RefSocket]:
        return [sock for sock in self.sockets if sock.closed_at is None and not sock.frozen]

    def freeze(self) -> float:
        """The newest connection goes silent (TCP stays open); returns when."""
        self.sockets[-1].frozen = True
        return time.monotonic()

    async def drop(self) -> float:
        """The server closes every connection (going away); returns when."""
        self.closed_by_server_at = time.monotonic()
        await self._close_connections()
        self._thaw = asyncio.Event()
        return self.closed_by_server_at

    async def ws_push(self, envelope: dict[str, Any]) -> bytes:
        """One event as one DATA frame, built by the SDK's Frame, on the newest live connection."""
        message_id = uuid.uuid4().hex
        frame = SdkFrame(SeqID=41, LogID=42, service=SERVICE_ID, method=FrameType.DATA.value)
        for key, value in (("type", MessageType.EVENT.value), ("message_id", message_id), ("sum", "1"),
                           ("seq", "0"), ("trace_id", uuid.uuid4().hex)):  # fmt: skip
            header = frame.headers.add()
            header.key, header.value = key, value
        frame.payload = json.dumps(envelope, ensure_ascii=False).encode("utf-8")
        data = frame.SerializeToString()
        await self.live[-1].ws.send_bytes(data)
        return data

    async def ack_of(self, pushed: bytes, timeout: float = 10.0) -> SdkFrame:
        """The client's ACK of the frame `pushed`, parsed by the SDK's Frame."""
        message_id = sdk_headers(sdk_frame(pushed))["message_id"]
        deadline = time.monotonic() + timeout
        while message_id not in self.acks:
            self._ack_arrived.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no ACK for {message_id} within {timeout} s")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._ack_arrived.wait(), left)
        return self.acks[message_id]


async def sdk_ack(pushed: bytes, answer: dict[str, Any] | None) -> SdkFrame:
    """The ACK lark-oapi's ws client writes for the frame `pushed` when its card handler answers
    `answer` (the same toast our handler gave): the SDK's own dispatch and encoding, run here."""

    def on_card(_: Any) -> P2CardActionTriggerResponse | None:
        return None if answer is None else P2CardActionTriggerResponse(answer)

    handler = lark.EventDispatcherHandler.builder("", "").register_p2_card_action_trigger(on_card).build()
    client = SdkClient("cli_reference", "secret", event_handler=handler)
    written: list[bytes] = []

    async def write(data: bytes) -> None:
        written.append(data)

    client._write_message = write  # type: ignore[method-assign]
    try:
        await client._handle_data_frame(sdk_frame(pushed))
    finally:
        client._cache._cron.cancel()
    assert len(written) == 1, "the SDK wrote no ACK"
    return sdk_frame(written[0])


def ack_without_timing(frame: SdkFrame) -> tuple[Any, ...]:
    """An ACK frame's fields, `biz_rt` (the handler's milliseconds) aside, and its payload read."""
    headers = [(h.key, h.value) for h in frame.headers if h.key != HEADER_BIZ_RT]
    assert HEADER_BIZ_RT in sdk_headers(frame) and sdk_headers(frame)[HEADER_BIZ_RT].isdigit()
    payload = AckPayload.parse(frame.payload)
    return frame.SeqID, frame.LogID, frame.service, frame.method, headers, payload.code, payload.answer


# -- legacy (card 1.0) callbacks ---------------------------------------------------------------


def legacy_card_request(
    verification_token: str, *, open_id: str, open_message_id: str, value: dict[str, Any],
    open_chat_id: str = "oc_p2p", timestamp: str | None = None, encrypt_key: str | None = None,
) -> tuple[dict[str, str], bytes]:  # fmt: skip
    """Headers and body of a card 1.0 callback as older apps' card request URL receives it: the
    fields of the SDK's `Card` model, signed with SHA-1 over timestamp + nonce + token + body
    (with `encrypt_key`, the body is `{"encrypt": …}` and the signature covers that)."""
    body = json.dumps({
        "open_id": open_id, "user_id": "u_" + open_id.removeprefix("ou_"), "open_message_id": open_message_id,
        "open_chat_id": open_chat_id, "tenant_key": "tenant_fake", "token": "c-" + uuid.uuid4().hex,
        "action": {"value": value, "tag": "button"},
    }, ensure_ascii=False).encode("utf-8")  # fmt: skip
    if encrypt_key is not None:
        body = json.dumps({"encrypt": encrypt(body.decode("utf-8"), encrypt_key)}).encode("utf-8")
    timestamp = timestamp or str(int(time.time()))
    nonce = uuid.uuid4().hex[:16]
    signature = hashlib.sha1((timestamp + nonce + verification_token).encode() + body).hexdigest()
    headers = {"X-Lark-Request-Timestamp": timestamp, "X-Lark-Request-Nonce": nonce,
               "X-Lark-Signature": signature, "Content-Type": "application/json"}  # fmt: skip
    return headers, body


def sdk_card_handler_accepts(
    verification_token: str, headers: dict[str, str], body: bytes, encrypt_key: str | None = None
) -> Card | None:
    """Run the SDK's `CardActionHandler` on the request: the Card it hands its processor, or None
    when it refuses the request (a signature it does not accept)."""
    seen: list[Card] = []
    handler = CardActionHandler.builder(encrypt_key or "", verification_token).register(seen.append).build()
    request = RawRequest()
    request.uri, request.headers, request.body = "/feishu/events", dict(headers), body
    response = handler.do(request)
    return seen[0] if response.status_code == 200 and seen else None
