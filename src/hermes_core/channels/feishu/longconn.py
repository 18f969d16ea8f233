"""Feishu long-connection mode: events arrive over an outbound WebSocket, so no public URL is needed.

The protocol (FEISHU.md §8) in the order this module follows it:

1. `POST {domain}/callback/ws/endpoint` with the app credentials returns a `wss://` URL (carrying
   `device_id` and `service_id`) and a `ClientConfig` (ping and reconnect settings, in seconds).
2. Connect, ping at once and then every `PingInterval`; a pong may carry a new `ClientConfig`.
   A connection that stays silent (no pong, no frame) for 1.5 `PingInterval`s is dead even if
   its TCP socket is still open (a NAT or proxy that dropped it): it is closed and reconnected,
   so a dead link is noticed within two ping intervals, not never.
3. DATA frames carry one event, possibly split into parts; the client joins the parts, runs the
   handler and ACKs by echoing the frame with `biz_rt` and `{"code":200}` (500 if the handler raised).
   When the handler answers (a card click's toast), the answer goes back as the SDK sends it:
   `{"code":200,"data":"<base64 of the answer's JSON>"}`, which Feishu shows to the clicker.
   Without an ACK within 3 s Feishu re-pushes the event later (15 s, 5 min, 1 h, 6 h).
4. On any disconnect, reconnect with the platform's numbers, as the SDK does: a random delay of
   up to `ReconnectNonce` before the first attempt (so a fleet of clients does not come back at
   once), then `ReconnectInterval` between attempts, at most `ReconnectCount` of them. A
   connection that gave up stays down (no event arrives until `serve` is restarted): `gave_up`
   and `down_since` say so, the channel lists it under `degraded` in /healthz, and the gauge
   `hermes_feishu_longconn_up` (GET /metrics) is 0 whenever the link is not up.

Written on aiohttp instead of lark-oapi, whose import takes ~5 s and grabs an event loop at import;
the tests check it against lark-oapi's own codec, ACKs and reconnect rules (tests/lark_reference.py).

Hostile frames never end the connection: an undecodable frame, a split event with absurd part
headers, a pong whose payload is not a config are dropped with one WARNING line; an event whose
payload is not a JSON object of the expected shape (channels/feishu/events.py `envelope_problem`)
is dropped and ACKed 200 — a re-push could never succeed. Only a handler failure (the gateway could
not store the event) ACKs 500, so that Feishu pushes the event again later.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ...observe.metrics import REGISTRY
from .events import envelope_problem
from .frames import METHOD_CONTROL, METHOD_DATA, Frame, FrameError

log = logging.getLogger("hermes_core.feishu")
LINK_UP = REGISTRY.gauge(
    "hermes_feishu_longconn_up",
    "1 while the Feishu long connection is up; 0 while it connects, reconnects or has given up.",
    ("app_id",),
)

# a non-None result (a card toast) goes back in the ACK
EventHandler = Callable[[dict[str, Any]], Awaitable[Any]]

TRANSIENT_CODES = frozenset({1, 1000040343})  # "system busy", "internal error": worth retrying
_CLIENT_HANDSHAKE_CODES = frozenset({403, 1000040350})  # forbidden, too many connections
_HANDSHAKE_TIMEOUT = 10.0  # seconds for the endpoint POST
_CLOSE_TIMEOUT = 1.0  # seconds to wait for the server's close frame before dropping the socket
MAX_PARTS = 64  # parts of one split event; Feishu splits an event into a handful at most
MAX_PARTIAL_EVENTS = 256  # split events being reassembled at once; the oldest is dropped beyond
SILENT_PINGS = 1.5  # ping intervals without a pong (or any frame) after which the connection is dead
_DEAD_CLOSE_TIMEOUT = 0.1  # a dead peer never answers the close frame: do not wait for it


class LongConnectionError(RuntimeError):
    """Feishu refused the connection; `code` and `msg` are Feishu's own."""

    def __init__(self, code: int, msg: str, *, transient: bool | None = None) -> None:
        super().__init__(f"Feishu long connection refused: code {code}: {msg}")
        self.code, self.msg = code, msg
        self.transient = code in TRANSIENT_CODES if transient is None else transient


@dataclass
class ClientConfig:
    """Server-tuned settings, in seconds; the defaults are what Feishu sends today."""

    ping_interval: float = 120.0
    reconnect_interval: float = 120.0  # between two reconnect attempts
    reconnect_nonce: float = 30.0  # the first attempt waits a random part of it: clients spread out
    reconnect_count: int = -1  # consecutive failed attempts before giving up; -1 means never

    def update(self, raw: dict[str, Any]) -> None:
        """Apply the fields Feishu sent (handshake `ClientConfig` or a pong); ignore anything odd."""
        for key, name in _CONFIG_FIELDS.items():
            value = raw.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if name == "reconnect_count":
                self.reconnect_count = int(value)
            elif value > 0 or (value == 0 and name == "reconnect_nonce"):  # a zero interval would spin
                setattr(self, name, float(value))


_CONFIG_FIELDS = {
    "PingInterval": "ping_interval",
    "ReconnectInterval": "reconnect_interval",
    "ReconnectNonce": "reconnect_nonce",
    "ReconnectCount": "reconnect_count",
}


@dataclass
class _PartialEvent:
    """Parts of one split event, keyed by `seq`; Feishu lets us hold them for 5 s."""

    total: int
    first_seen: float
    parts: dict[int, bytes] = field(default_factory=dict)


class FeishuLongConnection:
    """One long connection for one app: `await start()`, events flow to `on_event`, `await stop()`.

    `on_event` gets the event envelope (the same JSON as a webhook) and must be quick: the ACK waits
    for it and Feishu re-pushes events not ACKed within 3 s. The gateway's handler only persists the
    event, so a handler slower than `ack_timeout` is a bug worth a warning, not a reason to ACK
    early (an early ACK would lose the event if the handler then failed). Each event runs in its
    own task, so a slow handler never delays pings or other events.

    `clock` (monotonic seconds) and `sleep` time the pings, the silence and split events' expiry;
    tests pass virtual ones and move time rather than wait for it.
    """

    def __init__(self, app_id: str, app_secret: str, on_event: EventHandler, *,
                 domain: str = "https://open.feishu.cn", ack_timeout: float = 2.5,
                 part_timeout: float = 5.0, config: ClientConfig | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:  # fmt: skip
        self.app_id, self._app_secret, self._on_event = app_id, app_secret, on_event
        self._clock, self._sleep = clock, sleep
        self.domain = domain.rstrip("/")
        self.ack_timeout, self.part_timeout = ack_timeout, part_timeout
        self.config = config or ClientConfig()  # until the first handshake brings the platform's
        self.connected = False
        self.reconnects = 0
        self.events_received = 0
        self._session: Any = None  # aiohttp.ClientSession, imported lazily
        self._ws: Any = None
        self._service_id = 0
        self._run_task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._partial: dict[str, _PartialEvent] = {}
        self._config_changed = asyncio.Event()
        self._heard_at = 0.0  # `clock` time of the last frame from the server
        self.dead_connections = 0  # connections given up for silence
        self.down_since: float | None = time.time()  # wall time the link went down; None while up
        self.failed_attempts = 0  # connect attempts failed in a row
        self.gave_up: str | None = None  # why, once reconnecting stopped for good (ReconnectCount)
        LINK_UP.set(0, app_id=app_id)

    async def start(self) -> None:
        """Connect, then keep the connection alive in the background. Bad credentials raise here."""
        if self._run_task is not None:
            raise RuntimeError("FeishuLongConnection already started")
        import aiohttp

        self._session = aiohttp.ClientSession()
        try:
            await self._connect_with_backoff(retry_all=False)
        except BaseException:
            await self.stop()
            raise
        self._run_task = asyncio.create_task(self._run(), name="feishu-longconn")

    async def stop(self) -> None:
        """Cancel the connection and in-flight handlers and close the socket; safe to call twice.

        A handler cancelled here has not been ACKed, so Feishu re-pushes its event later.
        """
        me = asyncio.current_task()  # stop() may be called from a handler, which must not await itself
        tasks = [t for t in (self._run_task, *self._handlers) if t is not None and t is not me]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._run_task = None
        self._mark_down()
        await self._close_socket()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        """Serve the socket until it drops, reconnect, repeat; ends only on stop() or giving up."""
        while True:
            try:
                await self._serve(self._ws)
            except Exception:  # a bug in frame handling must not end the connection for good
                log.exception("feishu long connection for %s: reader failed", self.app_id)
            try:
                await self._connect_with_backoff(retry_all=True)
            except Exception as exc:
                self.gave_up = str(exc)
                log.error("feishu long connection for %s gave up: %s; no event arrives until serve is "
                          "restarted", self.app_id, exc)  # fmt: skip
                return
            self.reconnects += 1

    async def _connect_with_backoff(self, *, retry_all: bool) -> None:
        """Try to connect until it works, sleeping between attempts as the platform says.

        At start (`retry_all=False`) the first attempt is immediate and only Feishu's transient
        codes are retried, so a wrong secret fails loudly; after a disconnect everything is
        retried, since the network is what usually broke. Each retry waits `_retry_delay`.
        """
        failures = 0
        while True:
            if retry_all or failures:
                await asyncio.sleep(self._retry_delay(failures if retry_all else failures - 1))
            try:
                await self._connect()
                return
            except Exception as exc:
                transient = isinstance(exc, LongConnectionError) and exc.transient
                if not (retry_all or transient):
                    raise
                failures += 1
                self.failed_attempts += 1
                if 0 <= self.config.reconnect_count <= failures:
                    raise ConnectionError(f"no connection after {failures} attempts: {exc}") from exc
                log.warning("feishu: connect attempt %d for %s failed: %s", failures, self.app_id, exc)

    def _retry_delay(self, retry: int) -> float:
        """Seconds before retry number `retry` (0 first): the SDK's and the platform's spacing.

        The first waits a random part of `ReconnectNonce` (jitter: after an outage a fleet of
        clients comes back spread out, not all in the same second); each further one waits
        `ReconnectInterval` (120 s from the real platform), never a faster self-invented backoff.
        """
        if retry == 0:
            return random.uniform(0, self.config.reconnect_nonce)
        return self.config.reconnect_interval

    async def _connect(self) -> None:
        url = await self._fetch_endpoint()
        query = parse_qs(urlsplit(url).query)
        if not query.get("device_id") or not query.get("service_id"):
            raise LongConnectionError(0, f"endpoint URL lacks device_id or service_id: {url}")
        service_id = int(query["service_id"][0])
        import aiohttp

        try:
            self._ws = await self._session.ws_connect(url, autoping=True)
        except aiohttp.WSServerHandshakeError as exc:  # auth errors come back as handshake headers
            raise _handshake_error(exc) from exc
        self._service_id, self.connected = service_id, True
        self.down_since, self.failed_attempts = None, 0
        LINK_UP.set(1, app_id=self.app_id)
        log.info("feishu long connection for %s up (device %s)", self.app_id, query["device_id"][0])

    async def _fetch_endpoint(self) -> str:
        """The handshake: credentials in the body, `locale: zh`, and no Authorization header."""
        import aiohttp

        body = {"AppID": self.app_id, "AppSecret": self._app_secret}
        url, headers = f"{self.domain}/callback/ws/endpoint", {"locale": "zh"}
        timeout = aiohttp.ClientTimeout(total=_HANDSHAKE_TIMEOUT)
        async with self._session.post(url, json=body, headers=headers, timeout=timeout) as response:
            try:
                reply = await response.json(content_type=None)
            except ValueError:
                reply = None
        if not isinstance(reply, dict):
            raise LongConnectionError(response.status, "endpoint reply is not JSON", transient=True)
        if reply.get("code") != 0:
            raise LongConnectionError(int(reply.get("code") or -1), str(reply.get("msg", "")))
        data = reply.get("data") or {}
        self.config.update(data.get("ClientConfig") or {})
        return str(data.get("URL", ""))

    async def _serve(self, ws: Any) -> None:
        """Read frames until the socket closes or the ping loop finds it dead; then close it."""
        self._heard_at = self._clock()
        reader = asyncio.create_task(self._read(ws), name="feishu-longconn-read")
        pinger = asyncio.create_task(self._ping_loop(ws), name="feishu-longconn-ping")
        try:
            await asyncio.wait({reader, pinger}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._mark_down()
            for task in (reader, pinger):
                task.cancel()
            alive = await asyncio.gather(reader, pinger, return_exceptions=True)
            await self._close_socket(_CLOSE_TIMEOUT if alive[1] is not False else _DEAD_CLOSE_TIMEOUT)
            for result in alive:
                if isinstance(result, Exception):
                    raise result

    async def _read(self, ws: Any) -> None:
        import aiohttp

        async for message in ws:
            self._heard_at = self._clock()
            if message.type == aiohttp.WSMsgType.BINARY:
                self._on_frame_safely(ws, message.data)
            elif message.type == aiohttp.WSMsgType.ERROR:
                log.warning("feishu long connection error: %s", ws.exception())
                break
        log.warning("feishu long connection for %s closed (code %s)", self.app_id, ws.close_code)

    def _mark_down(self) -> None:
        if self.connected or self.down_since is None:
            self.down_since = time.time()
        self.connected = False
        LINK_UP.set(0, app_id=self.app_id)

    async def _close_socket(self, timeout: float = _CLOSE_TIMEOUT) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(), timeout)  # stop() must not hang on a dead peer

    async def _ping_loop(self, ws: Any) -> bool:
        """Ping now and every PingInterval; False once the server has been silent too long.

        Silence is measured from the last frame of any kind (a pong, an event): more than
        `SILENT_PINGS` intervals of it means the link is gone even though the socket looks open.
        A pong that changes the interval wakes the loop early. True: a ping could not be sent
        (the reader sees the broken socket too).
        """
        ping = Frame(service=self._service_id, method=METHOD_CONTROL, headers=[("type", "ping")]).encode()
        sent_at = -float("inf")
        while True:
            self._config_changed.clear()
            interval, now = self.config.ping_interval, self._clock()
            if now - self._heard_at >= interval * SILENT_PINGS:
                self.dead_connections += 1
                log.warning("feishu long connection for %s silent for %.1fs (no pong): reconnecting",
                            self.app_id, now - self._heard_at)  # fmt: skip
                return False
            if now >= sent_at + interval:
                try:
                    await ws.send_bytes(ping)
                except Exception as exc:
                    log.warning("feishu long connection ping failed: %s", exc)
                    return True
                sent_at = now
            wake = min(sent_at + interval, self._heard_at + interval * SILENT_PINGS)
            waits = [asyncio.ensure_future(self._config_changed.wait()),
                     asyncio.ensure_future(self._sleep(max(0.0, wake - self._clock())))]  # fmt: skip
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
                await asyncio.gather(*waits, return_exceptions=True)

    def _on_frame_safely(self, ws: Any, data: bytes) -> None:
        """`_on_frame`, with any failure one WARNING line: one bad frame must not drop the socket."""
        try:
            self._on_frame(ws, data)
        except Exception as exc:
            log.warning("feishu long connection: frame dropped: %s: %s", type(exc).__name__, str(exc)[:200])

    def _on_frame(self, ws: Any, data: bytes) -> None:
        """Route one frame without awaiting, so the reader never waits on a handler."""
        try:
            frame = Frame.decode(data)
        except FrameError as exc:
            log.warning("feishu long connection: undecodable frame dropped: %s", exc)
            return
        kind = frame.header("type")
        if frame.method == METHOD_CONTROL:
            if kind == "pong" and frame.payload:
                with contextlib.suppress(ValueError, AttributeError, RecursionError):
                    self.config.update(json.loads(frame.payload))
                    self._config_changed.set()
        elif frame.method == METHOD_DATA and kind == "event":  # "card" (old card callbacks): no ACK
            payload = self._reassemble(frame)
            if payload is not None:
                task = asyncio.create_task(self._handle_event(ws, frame, payload))
                self._handlers.add(task)
                task.add_done_callback(self._handlers.discard)

    def _reassemble(self, frame: Frame) -> bytes | None:
        """The whole payload once every part of a split event is here; None while parts are missing.

        Parts are joined in `seq` order; a part older than `part_timeout` is dropped (checked when
        the next split frame arrives), so a late part can never complete a stale event.
        """
        message_id, trace_id = frame.header("message_id"), frame.header("trace_id")
        total, seq = frame.header("sum") or "", frame.header("seq") or ""
        if not (message_id and trace_id is not None and _small_number(total) and _small_number(seq)):
            log.warning("feishu long connection: event frame without its headers dropped: %s",
                        str(frame.headers)[:300])  # fmt: skip
            return None
        if int(total) <= 1:
            return frame.payload or b""
        if int(total) > MAX_PARTS or int(seq) >= int(total):
            log.warning("feishu long connection: event part %s of %s dropped", seq, total)
            return None
        now = self._clock()
        for stale in [k for k, p in self._partial.items() if now - p.first_seen > self.part_timeout]:
            log.warning("feishu long connection: incomplete event %s expired", stale)
            del self._partial[stale]
        if message_id not in self._partial and len(self._partial) >= MAX_PARTIAL_EVENTS:
            oldest = next(iter(self._partial))
            log.warning("feishu long connection: too many split events at once; %s dropped", oldest)
            del self._partial[oldest]
        partial = self._partial.setdefault(message_id, _PartialEvent(int(total), now))
        partial.parts[int(seq)] = frame.payload or b""
        if len(partial.parts) < partial.total:
            return None
        del self._partial[message_id]
        return b"".join(part for _, part in sorted(partial.parts.items()))

    async def _handle_event(self, ws: Any, frame: Frame, payload: bytes) -> None:
        """Run the handler, then ACK on the socket the frame came from (a lost ACK means a re-push)."""
        started, code, answer = time.monotonic(), 200, None
        message_id = frame.header("message_id")
        slow = asyncio.get_running_loop().call_later(
            self.ack_timeout, log.warning, "feishu event %s: handler still running after %.1fs; "
            "Feishu re-pushes events not ACKed within 3 s", message_id, self.ack_timeout,
        )  # fmt: skip
        try:
            event = _event_of(payload)
            self.events_received += 1
            if isinstance(event, str):
                log.warning("feishu event %s dropped (ACKed, never re-pushed): %s", message_id, event)
            else:
                answer = await self._on_event(event)
        except Exception:
            log.exception("feishu event %s: handler failed; ACKing 500", message_id)
            code = 500
        finally:
            slow.cancel()
        elapsed_ms = int((time.monotonic() - started) * 1000)
        payload = _ack_payload(code, answer if code == 200 else None)
        ack = dataclasses.replace(frame.with_header("biz_rt", str(elapsed_ms)), payload=payload)
        try:
            await ws.send_bytes(ack.encode())
        except Exception as exc:
            log.warning("feishu event %s: ACK not sent (%s); Feishu will re-push it", message_id, exc)


def _ack_payload(code: int, answer: Any) -> bytes:
    """The ACK's payload as the SDK writes it: `{"code":…}`, plus the handler's answer (a card
    toast) as base64 of its JSON in `data` — the platform reads the toast from there."""
    if answer is None:
        return b'{"code":%d}' % code
    data = base64.b64encode(json.dumps(answer, ensure_ascii=False).encode("utf-8")).decode("ascii")
    return json.dumps({"code": code, "data": data}, separators=(",", ":")).encode("ascii")


def _small_number(text: str) -> bool:
    return text.isdecimal() and len(text) <= 6


def _event_of(payload: bytes) -> dict[str, Any] | str:
    """The event envelope in a DATA frame's payload, or why it cannot be one (one line)."""
    try:
        event = json.loads(payload.decode("utf-8"))
    except UnicodeDecodeError:
        return "payload is not UTF-8"
    except RecursionError:
        return "payload JSON nested too deeply"
    except ValueError as exc:
        return f"payload is not JSON: {str(exc)[:120]}"
    return envelope_problem(event) or event


def _handshake_error(exc: Any) -> LongConnectionError:
    """Map a refused WebSocket upgrade (`handshake-status` and friends) to Feishu's own code."""
    headers = exc.headers or {}
    status = headers.get("handshake-status")
    if status is None:
        return LongConnectionError(exc.status, f"WebSocket upgrade refused: {exc.message}", transient=True)
    code = int(headers.get("handshake-autherrcode") or status)
    transient = code not in _CLIENT_HANDSHAKE_CODES and int(status) not in _CLIENT_HANDSHAKE_CODES
    return LongConnectionError(code, headers.get("handshake-msg", ""), transient=transient)
