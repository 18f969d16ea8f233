"""Feishu's send limits counted in PostgreSQL, for every node and worker of the app together.

A process's `SendLimiter` (channels/feishu/ratelimit.py) keeps Feishu's limits for what that
process sends: with N `serve` nodes, or N workers, the app would send N times the app's 50/s and
1,000/min, and two nodes sending into one chat could pass its 5/s. `SharedSendQuota` is the same
limits kept in the database (`send_quota`, gateway migration 3), taken after the process's own
buckets:

- each limit is the same bucket as the process's (`platform_limit`: at most `limit` requests in
  any `window + margin` seconds — a sliding window, as the platform counts), kept as the moment
  it is full again (`due`, GCRA, on the database's clock, so the nodes' clocks do not matter);
- a request takes its turn from all its scopes at once — the app's per-second and per-minute
  limits and its chat's — in one statement (`_TAKE`, one round trip): the rows are locked in one
  order (no deadlock), the turn is the first moment every bucket allows, each bucket moves on
  from it; then the process sleeps until that moment. A process killed while it waits has spent
  a turn nobody uses: the limits can only be kept more strictly than asked, never less;
- a row whose bucket is full again means nothing (a new one starts full): rows idle for
  `PRUNE_AFTER` seconds are deleted now and then, skipping rows a sender holds;
- while the database cannot be reached (`StoreUnavailable`, PostgreSQL restarting) a request waits
  and tries again (0.2 s, doubling, at most 5 s): nothing is sent outside the quota, nothing lost.

Which limits are shared is the caller's choice: the embedded gateway on PostgreSQL shares all three
(replies of one chat can be sent by two nodes: the node that finished each turn sends its replies,
and after a restart every node loads the outbox); a Temporal worker shares the per-minute limit
only (the per-second one is the sends' task-queue rate, a chat's replies are spaced by its
workflow). `second` and `minute` are the windows' lengths, shortened by tests.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING

from ..channels.feishu.ratelimit import MESSAGE_API, platform_limit
from ..kernel.redaction import redact_text
from ..storage import StoreUnavailable
from .database import PostgresDatabase
from .gateway import NOW
from .migrations import GATEWAY

if TYPE_CHECKING:
    from psycopg import AsyncConnection

log = logging.getLogger("hermes_core.postgres")
BACKOFF = (0.2, 5.0)  # seconds: first and longest wait for the database
PRUNE_AFTER = 300.0  # seconds a bucket has been full before its row is deleted
PRUNE_EVERY = 60.0  # seconds between this process's prunes


class SharedSendQuota:
    """The app's send limits (and each chat's) in `send_quota`; a `SharedQuota` for `SendLimiter`.

    `chat_per_s`, `app_per_s`, `app_per_min`: None leaves that limit to someone else. The app's
    per-minute bucket may burst as the process's does: `app_per_s` requests (at most half a minute's
    worth; half a minute's when `app_per_s` is not shared) at once."""

    def __init__(
        self,
        database: PostgresDatabase,
        app_id: str,
        *,
        chat_per_s: float | None = 5.0,
        app_per_s: float | None = 50.0,
        app_per_min: float | None = 1000.0,
        margin: float = 0.1,
        second: float = 1.0,
        minute: float = 60.0,
    ) -> None:
        self.db = database
        self.db.migrate("gateway", GATEWAY)
        self.app_id = app_id
        self._chat = platform_limit(chat_per_s, second, margin) if chat_per_s else None
        self._app: list[tuple[str, tuple[float, float]]] = []
        if app_per_s:
            self._app.append(("second", platform_limit(app_per_s, second, margin)))
        if app_per_min:
            burst = max(1.0, min(app_per_s or math.inf, app_per_min / 2))
            self._app.append(("minute", platform_limit(app_per_min, minute, margin, burst)))
        self._next_prune = time.monotonic() + PRUNE_EVERY
        self._closed = False

    def __repr__(self) -> str:
        return f"SharedSendQuota({self.db!r}, app_id={self.app_id!r})"

    def buckets(self, chat_id: str | None, api: str = MESSAGE_API) -> dict[str, tuple[float, float]]:
        """Scope → (seconds between requests, seconds of burst tolerance) for one request of `api`:
        the platform counts each API of the app on its own (channels/feishu/ratelimit.py)."""
        found = {
            f"{self.app_id}:{api}:{name}": (1 / rate, (burst - 1) / rate) for name, (rate, burst) in self._app
        }
        if chat_id is not None and self._chat is not None:
            rate, burst = self._chat
            found[f"{self.app_id}:chat:{chat_id}"] = (1 / rate, (burst - 1) / rate)
        return found

    async def take(self, chat_id: str | None, api: str = MESSAGE_API) -> None:
        buckets = self.buckets(chat_id, api)
        if not buckets:
            return
        delay = BACKOFF[0]
        while True:
            try:
                wait = await _reserve(self.db, buckets)
                break
            except StoreUnavailable as exc:  # back soon: the send waits, it is not lost
                log.warning("the shared send quota waits %.1fs for the database: %s", delay,
                            redact_text(str(exc)))  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF[1])
        if wait > 0:
            await asyncio.sleep(wait)
        if time.monotonic() >= self._next_prune:
            self._next_prune = time.monotonic() + PRUNE_EVERY
            await self.prune()

    async def prune(self, idle: float = PRUNE_AFTER) -> int:
        """Delete the rows whose bucket has been full for `idle` seconds; how many went."""

        async def prune(db: AsyncConnection) -> int:
            gone = await db.execute(
                "DELETE FROM send_quota WHERE scope IN (SELECT scope FROM send_quota "
                f"WHERE due < {NOW} - %s FOR UPDATE SKIP LOCKED)",
                (idle,),
            )
            return gone.rowcount

        try:
            return await self.db.transaction(prune)
        except StoreUnavailable as exc:  # tried again at the next prune
            log.warning("pruning the shared send quota failed: %s", redact_text(str(exc)))
            return 0

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.db.close()


# One statement takes a turn from every bucket (one round trip, in autocommit): it locks the rows
# in one order, reads the first moment every bucket allows after the locks (`clock_timestamp`),
# and moves each bucket on from it — only when every bucket's row is there; otherwise nothing
# moves, the missing rows are inserted (full) and the statement runs again.
_TAKE = f"""
WITH locked AS (
    SELECT scope, due FROM send_quota WHERE scope = ANY(%(scopes)s) ORDER BY scope FOR UPDATE
), spec AS (
    SELECT * FROM unnest(%(scopes)s::text[], %(steps)s::float8[], %(tolerances)s::float8[])
        AS v (scope, step, tolerance)
), turn AS (
    SELECT found, now, GREATEST(now, latest) AS at FROM (
        SELECT count(*) AS found, MAX(l.due - v.tolerance) AS latest, {NOW} AS now
        FROM locked l JOIN spec v USING (scope)
    ) AS seen
)
UPDATE send_quota q SET due = GREATEST(l.due, turn.at) + v.step
FROM locked l JOIN spec v USING (scope), turn
WHERE q.scope = l.scope AND turn.found = %(count)s
RETURNING turn.at - turn.now
"""


async def _reserve(database: PostgresDatabase, buckets: dict[str, tuple[float, float]]) -> float:
    """Take one turn from every bucket at the same moment; seconds until that moment."""
    scopes = sorted(buckets)
    values = {
        "scopes": scopes,
        "steps": [buckets[scope][0] for scope in scopes],
        "tolerances": [buckets[scope][1] for scope in scopes],
        "count": len(scopes),
    }

    async def take(db: AsyncConnection) -> float | None:
        row = await (await db.execute(_TAKE, values)).fetchone()
        return None if row is None else float(row[0])

    async def create(db: AsyncConnection) -> None:
        await db.execute(
            "INSERT INTO send_quota (scope, due) SELECT s, 0 FROM unnest(%s::text[]) AS s "
            "ON CONFLICT (scope) DO NOTHING",
            (scopes,),
        )

    while (wait := await database.statement(take)) is None:  # a bucket new, or pruned: full
        await database.statement(create)
    return max(0.0, wait)
