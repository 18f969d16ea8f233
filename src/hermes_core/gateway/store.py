"""The gateway's durable inbox and outbox: what was received, what is done, what must still be sent.

`GatewayStore` is the seam (a distributed engine can implement it later); `SQLiteGatewayStore` is
the embedded default, in the process's shared database file (`storage/sqlite.py`: WAL,
synchronous=FULL, every write in BEGIN IMMEDIATE on one writer thread).

The order of facts makes "nothing lost, nothing twice" hold across crashes:
    accept:   dedup (message_id, event_id) + insert pending   — one transaction, then the ack
    complete: mark done + insert the replies into the outbox  — one transaction
    send:     deliver with an idempotency uuid, then mark sent
A crash before `complete` re-runs the message; a crash before `mark_sent` re-sends with the same
uuid, which the platform deduplicates. `seen_nonces` keeps each signed webhook request's signature
for as long as its timestamp is fresh: the same request sent again is refused, even after a restart.

Nothing is stored unredacted (redaction.py): `accept` redacts the message's text and details in
place — a key a user pasted is hidden from the inbox and from everything downstream (the agent, the
session history, traces, logs) — and replies and delivery errors are redacted as they are stored.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, TypeVar

from ..redaction import cut_text, redact_data, redact_text
from ..storage import SQLiteDatabase
from .messages import InboundMessage, OutboundMessage

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE inbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        channel TEXT NOT NULL,
        conversation TEXT NOT NULL,
        message_id TEXT NOT NULL,
        payload TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending',      -- pending | done
        received_at REAL NOT NULL,
        finished_at REAL,
        UNIQUE (channel, message_id)
    );
    CREATE INDEX inbox_by_status ON inbox (status, id);
    CREATE TABLE seen_events (
        channel TEXT NOT NULL,
        event_id TEXT NOT NULL,
        seen_at REAL NOT NULL,
        PRIMARY KEY (channel, event_id)
    );
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        inbound_id INTEGER,
        channel TEXT NOT NULL,
        conversation TEXT NOT NULL,
        payload TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending',      -- pending | sent | dead
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        platform_id TEXT,
        created_at REAL NOT NULL,
        sent_at REAL
    );
    CREATE INDEX outbox_by_status ON outbox (status, id);
    CREATE TABLE dead_letters (
        outbox_id INTEGER PRIMARY KEY,
        channel TEXT NOT NULL,
        conversation TEXT NOT NULL,
        payload TEXT NOT NULL,
        error TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        dead_at REAL NOT NULL
    );
    """,
    2: """
    CREATE TABLE seen_nonces (
        channel TEXT NOT NULL,
        nonce TEXT NOT NULL,
        expires_at REAL NOT NULL,
        PRIMARY KEY (channel, nonce)
    );
    CREATE INDEX seen_nonces_by_expiry ON seen_nonces (expires_at);
    """,
}


class GatewayStore(ABC):
    """Durable inbox/outbox. Every method is a single atomic step."""

    @abstractmethod
    async def accept(self, message: InboundMessage) -> int | None:
        """Persist a new message; None when its message_id or event_id was seen before."""

    @abstractmethod
    async def pending_inbound(self) -> list[InboundMessage]:
        """Messages accepted but not completed, in arrival order."""

    @abstractmethod
    async def complete(self, inbound_id: int, replies: list[OutboundMessage]) -> list[OutboundMessage]:
        """Mark the message done and queue its replies, atomically; returns them with their ids."""

    @abstractmethod
    async def pending_outbound(self) -> list[OutboundMessage]:
        """Replies not yet sent, in order."""

    @abstractmethod
    async def mark_sent(self, outbox_id: int, platform_id: str | None) -> None: ...

    @abstractmethod
    async def record_attempt(self, outbox_id: int, error: str) -> None: ...

    @abstractmethod
    async def dead_letter(self, outbox_id: int, error: str) -> None:
        """Give up on a reply: keep it, with why, in the dead-letter table."""

    @abstractmethod
    async def prune(self, older_than: float) -> None:
        """Forget dedup keys and finished rows older than `older_than` (a time.time() value)."""

    @abstractmethod
    async def claim_nonce(self, channel: str, nonce: str, keep_seconds: float) -> bool:
        """True the first time `nonce` is claimed on `channel` within `keep_seconds`; False after
        that (a replay). Durable: a restart does not forget it."""

    async def close(self) -> None:
        return None


class SQLiteGatewayStore(GatewayStore):
    def __init__(self, path: str | Path) -> None:
        self.db = SQLiteDatabase.shared(path)
        self.db.migrate("gateway", MIGRATIONS)
        self._run = self.db.transaction

    # -- GatewayStore -------------------------------------------------------------------------
    async def accept(self, message: InboundMessage) -> int | None:
        message.text, message.extra = redact_text(message.text), redact_data(message.extra)

        def accept(db: sqlite3.Connection) -> int | None:
            now = time.time()
            if message.event_id:
                seen = db.execute(
                    "INSERT OR IGNORE INTO seen_events (channel, event_id, seen_at) VALUES (?, ?, ?)",
                    (message.channel, message.event_id, now),
                )
                if seen.rowcount == 0:
                    return None
            row = db.execute(
                "INSERT OR IGNORE INTO inbox (channel, conversation, message_id, payload, received_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (message.channel, message.conversation, message.message_id, _dump(message), now),
            )
            return row.lastrowid if row.rowcount else None

        inbound_id = await self.db.transaction(accept, urgent=True)  # the ack waits: overtakes turn writes
        if inbound_id is not None:
            message.id = inbound_id
        return inbound_id

    async def pending_inbound(self) -> list[InboundMessage]:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT id, payload FROM inbox WHERE status = 'pending' ORDER BY id"
            ).fetchall()
        )
        return [_load(InboundMessage, payload, id=row_id) for row_id, payload in rows]

    async def complete(self, inbound_id: int, replies: list[OutboundMessage]) -> list[OutboundMessage]:
        def complete(db: sqlite3.Connection) -> list[OutboundMessage]:
            now = time.time()
            done = db.execute(
                "UPDATE inbox SET status = 'done', finished_at = ? WHERE id = ? AND status = 'pending'",
                (now, inbound_id),
            )
            if done.rowcount == 0:  # already completed (a racing duplicate run): queue nothing twice
                return []
            for reply in replies:
                reply.inbound_id = inbound_id
                cursor = db.execute(
                    "INSERT INTO outbox (inbound_id, channel, conversation, payload, created_at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (inbound_id, reply.channel, reply.conversation, _dump(reply), now),
                )
                reply.id = cursor.lastrowid
            return replies

        return await self._run(complete)

    async def pending_outbound(self) -> list[OutboundMessage]:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT id, payload, attempts FROM outbox WHERE status = 'pending' ORDER BY id"
            ).fetchall()
        )
        return [
            _load(OutboundMessage, payload, id=row_id, attempts=attempts)
            for row_id, payload, attempts in rows
        ]

    async def mark_sent(self, outbox_id: int, platform_id: str | None) -> None:
        await self._run(
            lambda db: db.execute(
                "UPDATE outbox SET status = 'sent', sent_at = ?, platform_id = ? WHERE id = ?",
                (time.time(), platform_id, outbox_id),
            )
        )

    async def record_attempt(self, outbox_id: int, error: str) -> None:
        await self._run(
            lambda db: db.execute(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ? WHERE id = ?",
                (_error(error), outbox_id),
            )
        )

    async def dead_letter(self, outbox_id: int, error: str) -> None:
        def bury(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE outbox SET status = 'dead', last_error = ? WHERE id = ?", (_error(error), outbox_id)
            )
            db.execute(
                "INSERT OR REPLACE INTO dead_letters "
                "(outbox_id, channel, conversation, payload, error, attempts, dead_at) "
                "SELECT id, channel, conversation, payload, ?, attempts, ? FROM outbox WHERE id = ?",
                (_error(error), time.time(), outbox_id),
            )

        await self._run(bury)

    async def prune(self, older_than: float) -> None:
        def prune(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM seen_events WHERE seen_at < ?", (older_than,))
            db.execute("DELETE FROM inbox WHERE status = 'done' AND received_at < ?", (older_than,))
            db.execute("DELETE FROM outbox WHERE status = 'sent' AND created_at < ?", (older_than,))

        await self._run(prune)

    async def claim_nonce(self, channel: str, nonce: str, keep_seconds: float) -> bool:
        def claim(db: sqlite3.Connection) -> bool:
            now = time.time()
            db.execute("DELETE FROM seen_nonces WHERE expires_at < ?", (now,))
            fresh = db.execute(
                "INSERT OR IGNORE INTO seen_nonces (channel, nonce, expires_at) VALUES (?, ?, ?)",
                (channel, nonce, now + keep_seconds),
            )
            return fresh.rowcount == 1

        return await self.db.transaction(claim, urgent=True)  # on the ack path of a signed webhook

    async def dead_letters(self) -> list[dict[str, Any]]:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT outbox_id, channel, conversation, payload, error, attempts, dead_at FROM dead_letters"
            ).fetchall()
        )
        keys = ("outbox_id", "channel", "conversation", "payload", "error", "attempts", "dead_at")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    async def counts(self) -> dict[str, int]:
        """Queue depths for /healthz and the status page."""

        def count(db: sqlite3.Connection) -> dict[str, int]:
            inbox = db.execute("SELECT COUNT(*) FROM inbox WHERE status = 'pending'").fetchone()[0]
            outbox = db.execute("SELECT COUNT(*) FROM outbox WHERE status = 'pending'").fetchone()[0]
            dead = db.execute("SELECT COUNT(*) FROM dead_letters").fetchone()[0]
            return {"inbox_pending": inbox, "outbox_pending": outbox, "dead_letters": dead}

        return await self._run(count)

    async def close(self) -> None:
        await self.db.close()


def _dump(message: InboundMessage | OutboundMessage) -> str:
    data = dataclasses.asdict(message)
    data.pop("id", None)
    data.pop("attempts", None)
    return json.dumps(redact_data(data), ensure_ascii=False)


def _error(error: str, limit: int = 2000) -> str:
    """A delivery error as stored: redacted, then cut (nothing of a secret left at the cut)."""
    return cut_text(error, limit)[0]


M = TypeVar("M", InboundMessage, OutboundMessage)


def _load(cls: type[M], payload: str, **fields: Any) -> M:
    data = json.loads(payload)
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known}, **fields)
