"""Client-side pacing for Feishu sends, so the platform rarely has to say no (FEISHU.md §7).

Feishu limits each API — message create, reply, card patch, each CardKit call — to 50/s and
1,000/min per app, counted for that API alone ("per API × per app × per tenant", the
frequency-control page; FEISHU.md §7, §11), and sending to 5/s per chat (shared by every bot in a
group) or per user; patching one card is limited to 5/s per message. `SendLimiter` keeps under all
of them — each chat at its own 5/s, each API of the app at 50/s and 1,000/min, so twenty busy chats
are served at twenty times one chat's pace, and a burst of streaming-card updates (their own API)
never makes a reply wait — optionally under a steady overall rate of messages too (`rate_per_s`,
off by default), and holds every request back while the platform has asked us to wait:

    async with limiter.slot(chat_id, api="im.message.reply"):
        ...  # one HTTP request

All limits are `TokenBucket`s. With rate `r` and burst `b`, any `n` requests that a bucket lets
through span at least `(n - b) / r` seconds, so "at most L requests in any W seconds" holds with
`r = (L + 1 - b) / W`. The platform counts requests when they arrive, and arrivals jitter (a large
body takes longer to upload than a small one), so each platform limit is kept over `W + margin`
seconds: a request sent exactly on time would otherwise be refused now and then.

A `SendLimiter` counts what its own process sends. Where several processes send for one app (serve
nodes sharing PostgreSQL, several workers) it is also given a `SharedQuota`
(postgres/quota.py `SharedSendQuota`): after the process's own buckets — the fast path, which also
spreads this process's sends — each request takes its turn from the same limits counted in the
database for every process together, so the app-wide limits (and a chat's) hold across them all.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[object]]

MESSAGE_API = "im.message.create"  # the API a call is counted under when its caller names none
# The APIs that put a new message in a chat: the extra steady cap (`rate_per_s`) paces these only.
MESSAGE_APIS = frozenset({"im.message.create", "im.message.reply"})


class TokenBucket:
    """`burst` requests at once, then `rate_per_s` on average; waiting callers are served in order.

    Kept in its "theoretical arrival time" form (GCRA): `_due` is when the bucket would be full
    again. A caller reserves its turn at once and then sleeps until it comes, so nobody overtakes.
    """

    def __init__(
        self,
        rate_per_s: float,
        burst: float = 1,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate_per_s > 0 and burst >= 1")
        self.interval = 1.0 / rate_per_s
        self._tolerance = (burst - 1) * self.interval
        self._due = -math.inf
        self._clock = clock
        self._sleep = sleep

    def earliest(self, now: float) -> float:
        """The first moment at or after `now` when a token is available."""
        return max(now, self._due - self._tolerance)

    def take(self, at: float) -> None:
        """Spend one token at time `at` (which must be at or after `earliest`)."""
        self._due = max(self._due, at) + self.interval

    def is_full(self, now: float) -> bool:
        """True when the bucket is as good as new: forgetting it would change nothing."""
        return self._due <= now

    async def acquire(self) -> None:
        now = self._clock()
        at = self.earliest(now)
        self.take(at)
        if at > now:
            await self._sleep(at - now)


def platform_limit(limit: float, window: float, margin: float, burst: float = 1.0) -> tuple[float, float]:
    """The `(rate_per_s, burst)` of a bucket letting at most `limit` requests start in any
    `window + margin` seconds (module docstring), e.g. the app's 1,000 a minute."""
    return (limit + 1 - burst) / (window + margin), burst


class SharedQuota(Protocol):
    """Limits counted for every process of the app together (postgres/quota.py)."""

    async def take(self, chat_id: str | None, api: str = MESSAGE_API) -> None:
        """Wait for this request's turn under the shared limits (the app's for `api`, and `chat_id`'s)."""
        ...

    async def close(self) -> None: ...


@dataclass
class _ChatState:
    bucket: TokenBucket
    paused_until: float = -math.inf


class SendLimiter:
    """The app-wide limits, a steady overall rate, one bucket per chat, and pauses.

    - `rate_per_s`: an extra steady overall pace (evenly spaced); None (the default) leaves only
      the platform limits. Never set it to one chat's pace: it would cap the whole app there.
    - `app_per_s`, `app_per_min`: Feishu's 50/s and 1,000/min (§7), for each API of the app on
      its own (a bucket pair per API name, made on its first call). The per-second limit spaces
      requests evenly; the minute bucket may burst `app_per_s` requests, then refills.
    - `chat_per_s`: the per-chat (or per-message, for card patches) limit, evenly spaced.
    - `margin`: seconds added to each platform window to absorb network jitter.
    - `idle_after`: how often (seconds) per-chat state that no longer matters is dropped; a chat
      whose bucket is full and whose pause is over is indistinguishable from a new one.
    - `shared`: the same limits counted across processes (module docstring); None: this process's.
    - `minute`: the per-minute window's length in seconds (a test shortens it).
    """

    def __init__(
        self,
        *,
        rate_per_s: float | None = None,
        chat_per_s: float = 5.0,
        app_per_s: float = 50.0,
        app_per_min: float = 1000.0,
        margin: float = 0.1,
        idle_after: float = 60.0,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        shared: SharedQuota | None = None,
        minute: float = 60.0,
    ) -> None:
        self._clock, self._sleep = clock, sleep
        self.shared = shared
        self._margin = margin
        self._chat_per_s = chat_per_s
        self._app_per_s, self._app_per_min, self._minute = app_per_s, app_per_min, minute
        self._apis: dict[str, list[TokenBucket]] = {}  # API name → its app-wide buckets
        self._steady = TokenBucket(rate_per_s, 1, clock=clock, sleep=sleep) if rate_per_s else None
        self._chats: dict[str, _ChatState] = {}
        self._paused_until = -math.inf
        self._idle_after = idle_after
        self._next_sweep = clock() + idle_after

    @asynccontextmanager
    async def slot(self, chat_id: str | None = None, api: str = MESSAGE_API) -> AsyncIterator[None]:
        """Wait for a turn to send one request of `api` to `chat_id` (None: app-wide limits only).

        The turn is taken from every bucket at the same moment, so a wait imposed by one limit
        never makes the others burst afterwards; then, with a `shared` quota, from the limits of
        every process together. A pause announced while we waited for our turn sends us back to
        the start. Nothing is held once the block is entered.
        """
        while True:
            while (pause := self._pause_left(chat_id)) > 0:
                await self._sleep(pause)
            now = self._clock()
            buckets = list(self._api_buckets(api))
            if chat_id is not None:
                buckets.append(self._chat(chat_id).bucket)
            at = max(bucket.earliest(now) for bucket in buckets)
            for bucket in buckets:
                bucket.take(at)
            if at > now:
                await self._sleep(at - now)
            if self.shared is not None:  # then the turn among every process of the app
                await self.shared.take(chat_id, api)
            if self._pause_left(chat_id) <= 0:
                break
        yield

    def now(self) -> float:
        """The limiter's clock (`time.monotonic` unless one was given): pause deadlines are on it."""
        return self._clock()

    def pause_until(self, deadline: float) -> None:
        """Hold every send until `deadline` (the limiter's clock): the app hit 99991400 (§7)."""
        self._paused_until = max(self._paused_until, deadline)

    def pause_chat(self, chat_id: str, deadline: float) -> None:
        """Hold sends to one chat until `deadline`: the chat hit 230020 (§7)."""
        state = self._chat(chat_id)
        state.paused_until = max(state.paused_until, deadline)

    async def close(self) -> None:
        """Release the shared quota's hold on its database (nothing else to release)."""
        if self.shared is not None:
            await self.shared.close()

    def tracked_chats(self) -> int:
        """How many chats the limiter currently remembers (idle ones are dropped)."""
        return len(self._chats)

    def _api_buckets(self, api: str) -> list[TokenBucket]:
        """The app-wide buckets of one API (its 50/s and 1,000/min), plus the steady cap for messages."""
        buckets = self._apis.get(api)
        if buckets is None:
            burst = max(1.0, min(self._app_per_s, self._app_per_min / 2))  # at most half a minute's worth
            buckets = [
                self._platform_limit(self._app_per_s, 1.0),
                self._platform_limit(self._app_per_min, self._minute, burst),
            ]
            if self._steady is not None and api in MESSAGE_APIS:
                buckets.append(self._steady)
            self._apis[api] = buckets
        return buckets

    def _platform_limit(self, limit: float, window: float, burst: float = 1.0) -> TokenBucket:
        """A bucket letting at most `limit` requests start in any `window + margin` seconds."""
        rate, burst = platform_limit(limit, window, self._margin, burst)
        return TokenBucket(rate, burst, clock=self._clock, sleep=self._sleep)

    def _chat(self, chat_id: str) -> _ChatState:
        now = self._clock()
        if now >= self._next_sweep:
            self._forget_idle_chats(now)
        state = self._chats.get(chat_id)
        if state is None:
            bucket = self._platform_limit(self._chat_per_s, 1.0)
            state = self._chats[chat_id] = _ChatState(bucket)
        return state

    def _forget_idle_chats(self, now: float) -> None:
        idle = [chat for chat, s in self._chats.items() if s.bucket.is_full(now) and s.paused_until <= now]
        for chat in idle:
            del self._chats[chat]
        self._next_sweep = now + self._idle_after

    def _pause_left(self, chat_id: str | None) -> float:
        state = self._chats.get(chat_id) if chat_id is not None else None
        until = max(self._paused_until, state.paused_until if state else -math.inf)
        return until - self._clock()
