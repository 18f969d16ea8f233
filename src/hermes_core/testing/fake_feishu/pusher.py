"""How the fake platform delivers events: one push, and the background delivery with retries.

Modelled on FEISHU.md:

- §1/§2 the webhook request: the v2 envelope as JSON, or ``{"encrypt": …}`` when the app has an
  Encrypt Key; ``header.token`` (v2) or the top-level ``token`` (v1, url_verification) set to the
  Verification Token; the ``X-Lark-Request-Timestamp``, ``-Nonce`` and ``-Signature`` headers on
  every request (the SDK crashes without them), signed with plain SHA-256 (``crypto.signature``).
- §3 delivery: a push succeeds only on HTTP 200 within 3 s (2 s to connect); otherwise it is
  retried with the same body bytes and ``event_id`` after 15 s, 5 min, 1 h and 6 h (at most 4
  retries), each delay multiplied by ``time_scale``. Each retry gets a fresh timestamp, nonce and
  signature (**UNCONFIRMED**: FEISHU.md does not say; re-signing keeps a replay window usable).
  At-least-once: knobs add a duplicate after a successful ack (same ``event_id``) or a
  re-delivery with a new ``event_id`` and the same ``message_id``.

The same retry machinery drives the long connection (``ws.py``): only the transport differs.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from hermes_core.channels.feishu import crypto
from hermes_core.kernel.messages import JSON

T = TypeVar("T")

RETRY_DELAYS: tuple[float, ...] = (15.0, 300.0, 3600.0, 21600.0)
"""Seconds between a failed attempt and the next one (FEISHU.md §3): 15 s, 5 min, 1 h, 6 h."""


@dataclass(frozen=True)
class PushResult:
    """The outcome of one push. ``ok`` means HTTP 200 within the deadline (for a challenge: echoed)."""

    status: int | None  # HTTP status (None: timeout or connection error)
    body: str
    elapsed: float  # seconds
    ok: bool
    error: str | None = None


@dataclass(frozen=True)
class PushAttempt:
    """One attempt recorded in ``FakeFeishu.push_log`` (webhook pushes and long-connection sends)."""

    transport: str  # "webhook" or "ws"
    kind: str  # "push" (a direct push()), "event" (deliver/ws_deliver), "duplicate", "new_event_id"
    event_id: str | None
    message_id: str | None  # event.message.message_id, when the event carries one
    attempt: int  # 0 for the first try, 1..4 for the retries
    status: int | None  # HTTP status; for "ws", the code of the ACK
    ok: bool
    elapsed: float
    error: str | None
    at: float  # time.monotonic() when the attempt started


Attempt = Callable[[], Awaitable[PushResult]]
Prepare = Callable[[dict[str, JSON]], Attempt]
"""A transport: ``prepare(envelope)`` fixes what is sent (body bytes, frame ids) and returns the
function that makes one attempt; every retry calls that same function."""


def event_ids(envelope: dict[str, JSON]) -> tuple[str | None, str | None]:
    """``(event_id, message_id)`` of a v2 envelope (``uuid`` for v1); either may be None."""
    header = envelope.get("header")
    event_id = header.get("event_id") if isinstance(header, dict) else envelope.get("uuid")
    event = envelope.get("event")
    message = event.get("message") if isinstance(event, dict) else None
    message_id = message.get("message_id") if isinstance(message, dict) else None
    return event_id, message_id


def redelivery(envelope: dict[str, JSON], *, new_event_id: bool) -> dict[str, JSON]:
    """A copy of ``envelope``: the same event, or (``new_event_id``) the same message under a new event id.

    FEISHU.md §3: the platform may re-send a message with a new ``event_id``; only ``message_id``
    identifies it. A new-id copy also gets a fresh ``header.create_time``.
    """
    again = copy.deepcopy(envelope)
    if new_event_id:
        if isinstance(again.get("header"), dict):
            again["header"]["event_id"] = uuid.uuid4().hex
            again["header"]["create_time"] = str(int(time.time() * 1000))
        elif "uuid" in again:
            again["uuid"] = uuid.uuid4().hex
    return again


class EventPusher:
    """The platform's event delivery: webhook pushes, retries, duplicates, ``drain``.

    Knobs (plain attributes, change them at any time):

    - ``ack_timeout`` (3.0) and ``connect_timeout`` (2.0): the §3 deadlines, in real seconds. They
      are *not* multiplied by ``time_scale``, so a healthy bot is never failed by a scaled-down
      deadline; lower them to test a slow endpoint quickly.
    - ``challenge_timeout`` (1.0): the url_verification deadline (§1).
    - ``duplicate_after_ack`` / ``redeliver_new_event_id``: probabilities (0..1) of an extra
      delivery after a successful one, with the same / a new ``event_id``.
    - ``shuffle``: every attempt waits a random 0..``shuffle_window`` s first, and extra deliveries
      wait up to the first retry delay, so retries and duplicates overtake newer events.
      Without it, first attempts start in the order of the ``deliver()`` calls (still concurrent,
      as on the platform).

    All randomness comes from ``rng`` (seed it with ``FakeFeishu(seed=…)``).
    """

    # Set by FakeFeishu.__init__ / start().
    verification_token: str
    encrypt_key: str | None
    time_scale: float
    rng: random.Random

    def _init_pusher(self) -> None:
        self.ack_timeout = 3.0
        self.connect_timeout = 2.0
        self.challenge_timeout = 1.0
        self.duplicate_after_ack = 0.0
        self.redeliver_new_event_id = 0.0
        self.shuffle = False
        self.shuffle_window = 0.05
        self.push_log: list[PushAttempt] = []
        self._deliveries: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- one push ----------------------------------------------------------------------------

    async def push(
        self,
        envelope: dict[str, JSON],
        url: str,
        *,
        encrypt: bool | None = None,
        token: str | None = None,
        sign: bool = True,
        bad_signature: bool = False,
        timestamp: str | None = None,
    ) -> PushResult:
        """POST ``envelope`` to ``url`` once, as the platform does (§1, §2), and report the outcome.

        ``encrypt`` defaults to "when the app has an Encrypt Key"; ``token`` replaces the
        Verification Token in the body; ``sign=False`` leaves out ``X-Lark-Signature``;
        ``bad_signature`` sends a signature with one hex digit changed. Recorded in ``push_log``.
        """
        body = self._body(envelope, encrypt, token)
        headers = self._headers(body, sign, bad_signature, timestamp)

        async def attempt() -> PushResult:
            started = time.monotonic()
            result = await self._post(url, body, headers, self.ack_timeout)
            self._log("webhook", "push", envelope, 0, result, started)
            self._answered(envelope, result)
            return result

        return await self._on_loop(attempt())

    async def url_verification(
        self, url: str, *, encrypt: bool | None = None, token: str | None = None
    ) -> PushResult:
        """Send the §1 challenge (encrypted when the app has an Encrypt Key, unless ``encrypt=False``).

        ``ok`` iff HTTP 200 with a JSON body ``{"challenge": <the same value>}`` within
        ``challenge_timeout`` (1 s). Signature headers are sent too; the receiver must not need them.
        """
        challenge = uuid.uuid4().hex
        envelope = {"challenge": challenge, "token": self.verification_token, "type": "url_verification"}
        body = self._body(envelope, encrypt, token)
        headers = self._headers(body, True, False, None)
        result = await self._on_loop(self._post(url, body, headers, self.challenge_timeout))
        if not result.ok:
            return result
        try:
            echoed = json.loads(result.body)
        except ValueError:
            echoed = None
        if isinstance(echoed, dict) and echoed.get("challenge") == challenge:
            return result
        return PushResult(result.status, result.body, result.elapsed, False, "challenge not echoed")

    def _body(self, envelope: dict[str, JSON], encrypt: bool | None, token: str | None) -> bytes:
        """The body bytes of a push: the envelope with its token, encrypted if asked (§1, §2)."""
        plaintext = json.dumps(
            _with_token(envelope, self.verification_token if token is None else token), ensure_ascii=False
        )
        if not (bool(self.encrypt_key) if encrypt is None else encrypt):
            return plaintext.encode()
        if not self.encrypt_key:
            raise ValueError("encrypt=True needs FakeFeishu(encrypt_key=...)")
        return json.dumps({"encrypt": crypto.encrypt(plaintext, self.encrypt_key)}).encode()

    def _headers(self, body: bytes, sign: bool, bad_signature: bool, timestamp: str | None) -> dict[str, str]:
        """Fresh timestamp, nonce and signature for one request (§2)."""
        stamp = timestamp if timestamp is not None else str(int(time.time()))
        nonce = os.urandom(8).hex()
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            "X-Lark-Request-Timestamp": stamp,
            "X-Lark-Request-Nonce": nonce,
        }
        if sign:
            signature = crypto.signature(stamp, nonce, self.encrypt_key or "", body)
            if bad_signature:
                signature = ("1" if signature[0] == "0" else "0") + signature[1:]
            headers["X-Lark-Signature"] = signature
        return headers

    async def _post(self, url: str, body: bytes, headers: dict[str, str], deadline: float) -> PushResult:
        if self._session is None:
            raise RuntimeError("FakeFeishu is not running")
        timeout = aiohttp.ClientTimeout(total=deadline, sock_connect=min(deadline, self.connect_timeout))
        started = time.monotonic()
        try:
            async with self._session.post(url, data=body, headers=headers, timeout=timeout) as response:
                text = await response.text(errors="replace")
        except asyncio.TimeoutError:
            return PushResult(None, "", time.monotonic() - started, False, f"no answer within {deadline} s")
        except aiohttp.ClientError as exc:
            return PushResult(None, "", time.monotonic() - started, False, f"{type(exc).__name__}: {exc}")
        ok = response.status == 200
        error = None if ok else f"HTTP {response.status}"
        return PushResult(response.status, text, time.monotonic() - started, ok, error)

    # -- background delivery -----------------------------------------------------------------

    def deliver(self, envelope: dict[str, JSON], url: str) -> None:
        """Deliver ``envelope`` to ``url`` in the background, retrying on the §3 schedule × ``time_scale``.

        Callable from any thread once the fake runs. ``drain()`` waits for every delivery.
        """

        def prepare(env: dict[str, JSON]) -> Attempt:
            body = self._body(env, None, None)  # the same bytes on every retry

            async def attempt() -> PushResult:
                result = await self._post(url, body, self._headers(body, True, False, None), self.ack_timeout)
                self._answered(env, result)
                return result

            return attempt

        self._start_delivery("webhook", envelope, prepare)

    def _answered(self, envelope: dict[str, JSON], result: PushResult) -> None:
        """A successful push's answer, as the platform reads it (a card callback's card: api.py)."""
        if result.ok and result.body:
            try:
                answer = json.loads(result.body)
            except ValueError:
                return
            self.apply_card_answer(envelope, answer)  # type: ignore[attr-defined]

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait until every delivery (webhook and long connection) is acked or out of retries.

        Raises ``TimeoutError`` if some are still pending after ``timeout`` seconds.
        """
        await self._on_loop(self._drain(timeout))

    async def _drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._deliveries:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{len(self._deliveries)} deliveries still pending after {timeout} s")
            await asyncio.wait(set(self._deliveries), timeout=remaining)

    @property
    def pending_deliveries(self) -> int:
        """Deliveries (webhook and long connection) not yet acked or out of retries."""
        return len(self._deliveries)

    def _start_delivery(self, transport: str, envelope: dict[str, JSON], prepare: Prepare) -> None:
        self._spawn(self._deliver(transport, "event", envelope, prepare, extras=True))

    async def _deliver(
        self,
        transport: str,
        kind: str,
        envelope: dict[str, JSON],
        prepare: Prepare,
        *,
        extras: bool,
        delay: float = 0.0,
    ) -> None:
        """One event: the first attempt, then up to four retries; then maybe an extra copy."""
        attempt_once = prepare(envelope)
        if delay > 0:
            await asyncio.sleep(delay)
        delivered = False
        for attempt in range(len(RETRY_DELAYS) + 1):
            if attempt:
                await asyncio.sleep(RETRY_DELAYS[attempt - 1] * self.time_scale)
            if self.shuffle:
                await asyncio.sleep(self.rng.uniform(0.0, self.shuffle_window))
            started = time.monotonic()
            result = await attempt_once()
            self._log(transport, kind, envelope, attempt, result, started)
            if result.ok:
                delivered = True
                break
        if delivered and extras:
            self._maybe_send_again(transport, envelope, prepare)

    def _maybe_send_again(self, transport: str, envelope: dict[str, JSON], prepare: Prepare) -> None:
        """At-least-once (§3): an acked event may come again, under the same or a new event_id."""
        chances = ((self.duplicate_after_ack, "duplicate"), (self.redeliver_new_event_id, "new_event_id"))
        for probability, kind in chances:
            if self.rng.random() < probability:
                copy_ = redelivery(envelope, new_event_id=kind == "new_event_id")
                delay = self.rng.uniform(0.0, RETRY_DELAYS[0] * self.time_scale) if self.shuffle else 0.0
                self._spawn(self._deliver(transport, kind, copy_, prepare, extras=False, delay=delay))

    def _log(
        self,
        transport: str,
        kind: str,
        envelope: dict[str, JSON],
        attempt: int,
        result: PushResult,
        at: float,
    ) -> None:
        event_id, message_id = event_ids(envelope)
        self.push_log.append(
            PushAttempt(
                transport, kind, event_id, message_id, attempt,
                result.status, result.ok, result.elapsed, result.error, at,
            )
        )  # fmt: skip

    # -- running on the fake's loop ------------------------------------------------------------

    def _spawn(self, delivery: Coroutine[Any, Any, None]) -> None:
        """Run a delivery as a task on the fake's loop (from any thread); ``aclose`` cancels it."""
        loop = self._running_loop()

        def start() -> None:
            task = loop.create_task(delivery)
            self._deliveries.add(task)
            task.add_done_callback(self._deliveries.discard)

        if _current_loop() is loop:
            start()
        else:
            loop.call_soon_threadsafe(start)

    async def _on_loop(self, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` on the fake's loop, even when called from another thread's loop."""
        loop = self._running_loop()
        if _current_loop() is loop:
            return await work
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, loop))

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError(
                "FakeFeishu is not running: use `async with FakeFeishu()` or start_in_thread()"
            )
        return self._loop

    async def _cancel_deliveries(self) -> None:
        tasks = list(self._deliveries)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _with_token(envelope: dict[str, JSON], token: str) -> dict[str, JSON]:
    """A shallow copy with ``token`` where the platform puts it: ``header.token`` (v2), else top level."""
    if isinstance(envelope.get("header"), dict):
        return {**envelope, "header": {**envelope["header"], "token": token}}
    return {**envelope, "token": token}


def _current_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
