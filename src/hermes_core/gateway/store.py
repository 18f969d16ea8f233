"""The gateway's durable inbox and outbox: what was received, what is done, what must still be sent.

`GatewayStore` is the seam, a protocol: what the gateway, its channels and the console ask of the
store, nothing more (docs/seams.md; tests/contracts/ holds the suite every implementation passes).
`SQLiteGatewayStore` is the embedded default (`PostgresGatewayStore`, postgres/gateway.py, the one
for several nodes on one database, `database.url`), in the process's shared database file
(`storage/sqlite.py`: WAL, synchronous=FULL, every write in BEGIN IMMEDIATE on one writer thread).

The order of facts makes "nothing lost, nothing twice" hold across crashes:
    accept:   dedup (message_id, event_id) + insert pending   — one transaction, then the ack
    stream:   a reply streamed into a platform message (a Feishu card patched as the model writes):
              that message's id, stored as soon as it exists (`keep_stream`)
    complete: mark done + the turn's session history + insert the replies into the outbox
              — one transaction (the session store shares the file; sessions/store.py)
    send:     deliver with an idempotency uuid, then mark sent (a streamed reply: patched into
              the message `stream_of` names)
A crash before `complete` re-runs the message, with no trace of its turn in the history; a crash
before `mark_sent` re-sends with the same uuid, which the platform deduplicates; a crash while a
reply streams runs the message again, and the run writes into the stored message, not a new one
(and so does the reply, however late it is sent). The history rows
are keyed by the task id as well, so even a history stored apart (a session store in another
database) is added once. A finished message's replies stay readable (`replies_of`) until pruned:
a webhook caller whose request was cut by a crash asks again and gets them. `seen_nonces` keeps
each signed webhook request's signature for as long as its timestamp is fresh: the same request
sent again is refused, even after a restart.

Recalled messages: a message its sender takes back before its turn started is marked 'withdrawn'
(`withdraw`; a recall that comes before the message leaves a withdrawn row, so the message is a
duplicate when it comes), and `begin_attempt` answers 0 for it: its turn is not run, across
restarts too. Chats the bot was removed from are kept in `chat_membership` (`set_chat_left`).

Poison messages: every run of a message is counted (`begin_attempt`, durable before the turn
starts; a graceful stop takes its count back with `release_attempt`). A message still pending
with two counted runs took the process down twice: at the next start it is `set_aside` — marked,
with why, and a polite reply queued in the same transaction — instead of running a third time.
`set_aside_messages` lists them for the operator; `counts` has their number. A store that several
processes share (PostgreSQL) also names the messages no process is running (`orphaned_inbound`,
every `sweep_seconds`): a process that died mid-turn leaves them to another one, which takes them up
with the same counting and setting aside (gateway/dispatcher.py `sweep`); and likewise the replies
a process queued and did not send before it died (`orphaned_outbound`), sent by another one.

Nothing is stored unredacted (kernel/redaction.py): `accept` redacts the message's text and details in
place — a key a user pasted is hidden from the inbox and from everything downstream (the agent, the
session history, traces, logs) — and replies and delivery errors are redacted as they are stored.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar

from ..channels.seam import Earlier, InboundMessage, OutboundMessage, Records
from ..kernel.redaction import cut_text, redact_data, redact_text
from ..storage import SQLiteDatabase

if TYPE_CHECKING:
    from ..sessions.store import TurnAppend

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
    3: """
    ALTER TABLE inbox ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE inbox ADD COLUMN set_aside_reason TEXT
    """,
    4: """
    CREATE INDEX outbox_by_inbound ON outbox (inbound_id, id);
    """,
    # 5: a dead letter can be sent again. `resend_requested_at` is set by whoever asks (the CLI, in
    # another process); the running gateway claims the row, puts the reply back in the outbox and
    # drops the dead letter (it is dead-lettered anew if it fails again).
    5: """
    ALTER TABLE dead_letters ADD COLUMN resend_requested_at REAL;
    CREATE INDEX dead_letters_by_resend ON dead_letters (resend_requested_at)
    """,
    # 6: scheduled jobs (schedule/jobs.py, gateway/schedules.py). A fire is claimed by inserting its
    # `schedule_fires` row (job, fire time) and its inbox row (message_id job:<id>@<ms>) in the
    # transaction that moves the job's next_fire on: once, across crashes.
    6: """
    CREATE TABLE schedule_jobs (
        id TEXT PRIMARY KEY,
        job TEXT NOT NULL,                           -- JSON of schedule.jobs.Job
        conversation TEXT NOT NULL,
        status TEXT NOT NULL,                        -- active | done | cancelled
        next_fire REAL,
        created_at REAL NOT NULL
    );
    CREATE INDEX schedule_jobs_due ON schedule_jobs (status, next_fire);
    CREATE INDEX schedule_jobs_by_conversation ON schedule_jobs (conversation, status);
    CREATE TABLE schedule_fires (
        job_id TEXT NOT NULL,
        fire_at REAL NOT NULL,
        status TEXT NOT NULL,                        -- queued | skipped | refused
        reason TEXT NOT NULL DEFAULT '',
        inbox_id INTEGER,
        claimed_at REAL NOT NULL,
        PRIMARY KEY (job_id, fire_at)
    )
    """,
    # 7: a reply streamed into a platform message (a Feishu card patched as the model writes): that
    # message, kept from the moment it exists, so a run after a crash and the final reply write
    # into the same one instead of sending a second message.
    7: """
    CREATE TABLE streams (
        inbound_id INTEGER PRIMARY KEY,
        channel TEXT NOT NULL,
        platform_id TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    """,
    # 8: whether the bot was removed from a chat (a Feishu `im.chat.member.bot.deleted_v1`; nothing
    # is sent there) or added to it again, as of the platform's time of the change: a late
    # redelivery of an older change does not undo a newer one. (A message its sender recalled is
    # an inbox row with status 'withdrawn': no table of its own.)
    8: """
    CREATE TABLE chat_membership (
        channel TEXT NOT NULL,
        chat_id TEXT NOT NULL,
        is_left INTEGER NOT NULL,
        changed_at REAL NOT NULL,
        PRIMARY KEY (channel, chat_id)
    );
    """,
}


class DeadLetter(TypedDict):
    """A reply given up on, as the store keeps it (`GatewayStore.dead_letters`)."""

    outbox_id: int
    channel: str
    conversation: str
    payload: str  # the reply, JSON (an OutboundMessage's fields)
    error: str  # why its last send failed
    attempts: int
    dead_at: float
    resend_requested_at: float | None  # a resend asked for from another process, not yet taken up


def dead_letter_summary(row: DeadLetter) -> dict[str, Any]:
    """A dead letter as listed (CLI, console): its id, where it was going, why it died, its text cut."""
    try:
        payload = json.loads(row["payload"])
        text = str(payload.get("text", "")) if isinstance(payload, dict) else ""
    except ValueError:
        text = ""
    return {
        "id": row["outbox_id"],
        "channel": row["channel"],
        "conversation": row["conversation"],
        "attempts": row["attempts"],
        "error": row["error"],
        "dead_at": row["dead_at"],
        "resend_requested_at": row["resend_requested_at"],
        "text": " ".join(text.split())[:200],
    }


# DeadLetter's keys, in the table's column order
DEAD_LETTER_KEYS = ("outbox_id", "channel", "conversation", "payload", "error", "attempts", "dead_at",
                    "resend_requested_at")  # fmt: skip


class GatewayStore(Records, Protocol):
    """The durable inbox and outbox, as the gateway (dispatcher.py), its channels (`Records`), the
    console and /healthz use them. Every method is one atomic step; each is covered by
    tests/contracts/test_gateway_store_contract.py, which a second implementation runs unchanged."""

    # -- the inbox: what was received, and whether it is done
    async def accept(self, message: InboundMessage) -> int | None:
        """Persist a new message (redacted, `message.id` set); None when its message_id (per
        channel) or its event_id was accepted before. Durable when it returns."""
        ...

    async def pending_inbound(self) -> list[InboundMessage]:
        """Messages accepted and neither done nor set aside, in arrival order."""
        ...

    async def begin_attempt(self, inbound_id: int) -> int:
        """Count a run of the message, durably, before it starts; returns the runs counted, or 0
        when the message is no longer pending (withdrawn by its sender): then it is not run."""
        ...

    async def release_attempt(self, inbound_id: int) -> None:
        """Take back the count of a run that a graceful stop interrupted (not a crash)."""
        ...

    async def crashed_inbound(self, min_attempts: int) -> list[tuple[InboundMessage, int]]:
        """Pending messages with at least `min_attempts` counted runs, and their counts."""
        ...

    async def complete(
        self, inbound_id: int, replies: list[OutboundMessage], history: TurnAppend | None = None
    ) -> list[OutboundMessage]:
        """Mark the message done, store its turn's `history` and queue its replies, atomically;
        returns the replies with their ids ([] when the message was done already)."""
        ...

    async def stream_of(self, inbound_id: int) -> str | None:
        """The platform message the reply to `inbound_id` is streamed into (None: not streamed)."""
        ...

    async def keep_stream(self, inbound_id: int, channel: str, platform_id: str) -> None:
        """Record, durably, the platform message the reply to `inbound_id` is streamed into: a run
        after a crash and the final reply write into it. Kept as long as the message's row."""
        ...

    async def set_aside(
        self, inbound_id: int, reason: str, replies: list[OutboundMessage]
    ) -> list[OutboundMessage]:
        """Stop trying a message: mark it set aside with `reason` and queue `replies`, atomically;
        returns them with their ids (none if the message was no longer pending)."""
        ...

    # -- the outbox: what must still be sent
    async def pending_outbound(self) -> list[OutboundMessage]:
        """Replies not yet sent nor dead, in the order they were queued, with their attempts."""
        ...

    async def mark_sent(self, outbox_id: int, platform_id: str | None) -> None:
        """The reply reached the platform: it leaves the outbox (still read by `replies_of`)."""
        ...

    async def record_attempt(self, outbox_id: int, error: str) -> None:
        """Count one failed send of the reply, and why."""
        ...

    async def dead_letter(self, outbox_id: int, error: str) -> None:
        """Give up on a reply: keep it, with why, in the dead letters."""
        ...

    async def dead_letter_reply(self, reply: OutboundMessage, error: str) -> int:
        """Give up on a reply that may never have been queued here (a workflow engine sends its
        replies itself), atomically; returns its outbox id. With an id, its row's attempts are set
        to `reply.attempts` and it is dead-lettered as by `dead_letter`; without one, the dead
        outbox row of its conversation and uuid is taken, made the first time (redacted, with
        `reply.attempts`): one dead letter per uuid, however often it is given up on."""
        ...

    # -- dead letters
    async def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        """Replies given up on, newest first."""
        ...

    async def resend(self, outbox_id: int) -> OutboundMessage | None:
        """Put a dead letter back in the outbox (attempts reset, same uuid); None if there is none."""
        ...

    async def request_resend(self, outbox_id: int) -> bool:
        """Ask the running gateway to resend a dead letter (from another process); False if none."""
        ...

    async def claim_resends(self) -> list[OutboundMessage]:
        """Resend every dead letter whose resend was requested; returns them, back in the outbox."""
        ...

    # -- upkeep
    async def counts(self) -> dict[str, int]:
        """Queue depths: `inbox_pending`, `outbox_pending`, `dead_letters`, `set_aside`."""
        ...

    async def prune(self, older_than: float) -> None:
        """Forget dedup keys and finished rows older than `older_than` (a time.time() value);
        messages not done and replies not sent are kept."""
        ...

    # how often (seconds) a process looks for messages another process left unfinished; None: this
    # store serves one process, which resumes them at its start (the embedded one)
    sweep_seconds: float | None = None

    async def orphaned_inbound(self, older_than: float) -> list[tuple[InboundMessage, int]]:
        """Pending messages received before `older_than` (a time.time() value) whose conversation
        no process is running (no live claim: its node died mid-turn, or never took it up), with
        their counted runs, oldest first. None where one process serves the store."""
        return []

    async def orphaned_outbound(self, older_than: float) -> list[OutboundMessage]:
        """Replies this process is now to send because the process that queued them stopped:
        pending, queued before `older_than`, held by no live process — taken (held by this one
        from now on, in queue order). Each call also renews this process's hold on the replies
        it queued or took, so a process keeps its own while it lives (call it every
        `sweep_seconds`). None where one process serves the store (it loads them at its start)."""
        return []

    def turn_claim(self, message: InboundMessage) -> AbstractAsyncContextManager[InboundMessage | None]:
        """Held while a turn of `message`'s conversation runs: gives the message to run now — the
        conversation's oldest pending one: `message`, or one before it that another node left —
        or None when `message` is no longer pending (it ran elsewhere). Where several processes
        share the store (postgres/gateway.py) it is what keeps one turn per conversation in flight,
        and while it is held the claim's fence is current (tasks/fence.py: the turn's writes are
        refused once another process takes the claim over); the embedded store serves one
        process, whose lanes do that already: it gives `message`, with no fence."""
        return _this_one(message)

    async def close(self) -> None:
        """Release the store (another instance may open the same storage again)."""
        ...


@asynccontextmanager
async def _this_one(message: InboundMessage) -> AsyncIterator[InboundMessage | None]:
    yield message


class SQLiteGatewayStore(GatewayStore):
    def __init__(self, path: str | Path) -> None:
        self.db = SQLiteDatabase.shared(path)
        self.db.migrate("gateway", MIGRATIONS)
        self._run = self.db.transaction

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

    async def complete(
        self, inbound_id: int, replies: list[OutboundMessage], history: TurnAppend | None = None
    ) -> list[OutboundMessage]:
        write_history = history.write_in(self.db) if history is not None else None
        if history is not None and write_history is None:  # kept elsewhere: stored first, once
            await history.apply()

        def complete(db: sqlite3.Connection) -> list[OutboundMessage]:
            now = time.time()
            done = db.execute(
                "UPDATE inbox SET status = 'done', finished_at = ? WHERE id = ? AND status = 'pending'",
                (now, inbound_id),
            )
            if done.rowcount == 0:  # already completed (a racing duplicate run): queue nothing twice
                return []
            if write_history is not None:
                write_history(db)
            return _queue(db, inbound_id, replies)

        return await self._run(complete)

    async def stream_of(self, inbound_id: int) -> str | None:
        row = await self._run(
            lambda db: db.execute(
                "SELECT platform_id FROM streams WHERE inbound_id = ?", (inbound_id,)
            ).fetchone()
        )
        return str(row[0]) if row else None

    async def keep_stream(self, inbound_id: int, channel: str, platform_id: str) -> None:
        await self._run(
            lambda db: db.execute(
                "INSERT OR REPLACE INTO streams (inbound_id, channel, platform_id, created_at) "
                "VALUES (?, ?, ?, ?)",
                (inbound_id, channel, platform_id, time.time()),
            )
        )

    async def begin_attempt(self, inbound_id: int) -> int:
        def begin(db: sqlite3.Connection) -> int:
            row = db.execute(
                "UPDATE inbox SET attempts = attempts + 1 WHERE id = ? AND status = 'pending' "
                "RETURNING attempts",
                (inbound_id,),
            ).fetchone()
            return int(row[0]) if row else 0

        return await self._run(begin)

    async def release_attempt(self, inbound_id: int) -> None:
        await self._run(
            lambda db: db.execute(
                "UPDATE inbox SET attempts = MAX(attempts - 1, 0) WHERE id = ? AND status = 'pending'",
                (inbound_id,),
            )
        )

    async def crashed_inbound(self, min_attempts: int) -> list[tuple[InboundMessage, int]]:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT id, payload, attempts FROM inbox WHERE status = 'pending' AND attempts >= ? "
                "ORDER BY id",
                (min_attempts,),
            ).fetchall()
        )
        return [(_load(InboundMessage, payload, id=row_id), attempts) for row_id, payload, attempts in rows]

    async def withdraw(self, channel: str, message_id: str, conversation: str) -> bool:
        def withdraw(db: sqlite3.Connection) -> bool:
            now = time.time()
            marked = db.execute(
                "UPDATE inbox SET status = 'withdrawn', finished_at = ? WHERE channel = ? AND "
                "message_id = ? AND status = 'pending' AND attempts = 0",
                (now, channel, message_id),
            )
            if marked.rowcount:
                return True
            kept = db.execute(
                "INSERT OR IGNORE INTO inbox (channel, conversation, message_id, payload, status, "
                "received_at, finished_at) VALUES (?, ?, ?, ?, 'withdrawn', ?, ?)",
                (channel, conversation, message_id, _withdrawn(channel, conversation, message_id), now, now),
            )
            return bool(kept.rowcount)

        return await self.db.transaction(withdraw, urgent=True)  # on the ack path

    async def set_chat_left(self, channel: str, chat_id: str, left: bool, at: float) -> None:
        await self.db.transaction(
            lambda db: db.execute(
                "INSERT INTO chat_membership VALUES (?, ?, ?, ?) ON CONFLICT (channel, chat_id) DO UPDATE "
                "SET is_left = excluded.is_left, changed_at = excluded.changed_at "
                "WHERE excluded.changed_at >= chat_membership.changed_at",
                (channel, chat_id, int(left), at),
            ),
            urgent=True,  # on the ack path
        )

    async def chat_left(self, channel: str, chat_id: str) -> bool:
        row = await self._run(
            lambda db: db.execute(
                "SELECT is_left FROM chat_membership WHERE channel = ? AND chat_id = ?", (channel, chat_id)
            ).fetchone()
        )
        return bool(row and row[0])

    async def set_aside(
        self, inbound_id: int, reason: str, replies: list[OutboundMessage]
    ) -> list[OutboundMessage]:
        def set_aside(db: sqlite3.Connection) -> list[OutboundMessage]:
            marked = db.execute(
                "UPDATE inbox SET status = 'set_aside', finished_at = ?, set_aside_reason = ? "
                "WHERE id = ? AND status = 'pending'",
                (time.time(), _error(reason), inbound_id),
            )
            return _queue(db, inbound_id, replies) if marked.rowcount else []

        return await self._run(set_aside)

    async def set_aside_messages(self) -> list[dict[str, Any]]:
        """The messages set aside, oldest first: what they said, how often they ran, why."""
        rows = await self._run(
            lambda db: db.execute(
                "SELECT id, channel, conversation, message_id, payload, attempts, set_aside_reason, "
                "received_at, finished_at FROM inbox WHERE status = 'set_aside' ORDER BY id"
            ).fetchall()
        )
        keys = ("id", "channel", "conversation", "message_id", "payload", "attempts", "reason",
                "received_at", "set_aside_at")  # fmt: skip
        return [dict(zip(keys, row, strict=True)) for row in rows]

    async def replies_of(self, channel: str, message_id: str) -> Earlier | None:
        def find(db: sqlite3.Connection) -> Earlier | None:
            row = db.execute(
                "SELECT id, payload, status FROM inbox WHERE channel = ? AND message_id = ?",
                (channel, message_id),
            ).fetchone()
            if row is None:
                return None
            inbound_id, payload, status = row
            replies = db.execute(
                "SELECT id, payload, attempts FROM outbox WHERE inbound_id = ? ORDER BY id", (inbound_id,)
            ).fetchall()
            return Earlier(
                _load(InboundMessage, payload, id=inbound_id),
                status == "done",
                [_load(OutboundMessage, p, id=i, attempts=a) for i, p, a in replies],
            )

        return await self._run(find)

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
        await self._run(lambda db: _bury(db, outbox_id, error))

    async def dead_letter_reply(self, reply: OutboundMessage, error: str) -> int:
        def bury(db: sqlite3.Connection) -> int:
            outbox_id = reply.id
            if outbox_id is None:
                found = db.execute(
                    "SELECT id FROM outbox WHERE conversation = ? AND status = 'dead' "
                    "AND json_extract(payload, '$.uuid') = ?",
                    (reply.conversation, reply.uuid),
                ).fetchone()
                outbox_id = found[0] if found is not None else db.execute(
                    "INSERT INTO outbox (inbound_id, channel, conversation, payload, status, attempts, "
                    "last_error, created_at) VALUES (NULL, ?, ?, ?, 'dead', ?, ?, ?)",
                    (reply.channel, reply.conversation, _dump(reply), reply.attempts, _error(error),
                     time.time()),
                ).lastrowid  # fmt: skip
            else:
                db.execute("UPDATE outbox SET attempts = ? WHERE id = ?", (reply.attempts, outbox_id))
            assert outbox_id is not None
            _bury(db, outbox_id, error)
            return outbox_id

        return await self._run(bury)

    async def prune(self, older_than: float) -> None:
        def prune(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM seen_events WHERE seen_at < ?", (older_than,))
            db.execute("DELETE FROM inbox WHERE status IN ('done', 'withdrawn') AND received_at < ?",
                       (older_than,))  # fmt: skip
            db.execute("DELETE FROM outbox WHERE status = 'sent' AND created_at < ?", (older_than,))
            db.execute("DELETE FROM streams WHERE inbound_id NOT IN (SELECT id FROM inbox)")

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

    async def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        columns = ", ".join(DEAD_LETTER_KEYS)
        rows = await self._run(
            lambda db: db.execute(
                f"SELECT {columns} FROM dead_letters ORDER BY dead_at DESC, outbox_id DESC LIMIT ?",
                (-1 if limit is None else limit,),
            ).fetchall()
        )
        return [_dead_letter(row) for row in rows]

    async def resend(self, outbox_id: int) -> OutboundMessage | None:
        replies = await self._run(lambda db: _revive(db, [outbox_id]))
        return replies[0] if replies else None

    async def request_resend(self, outbox_id: int) -> bool:
        asked = await self._run(
            lambda db: db.execute(
                "UPDATE dead_letters SET resend_requested_at = ? WHERE outbox_id = ?",
                (time.time(), outbox_id),
            )
        )
        return bool(asked.rowcount)

    async def claim_resends(self) -> list[OutboundMessage]:
        def claim(db: sqlite3.Connection) -> list[OutboundMessage]:
            rows = db.execute(
                "SELECT outbox_id FROM dead_letters WHERE resend_requested_at IS NOT NULL ORDER BY outbox_id"
            ).fetchall()
            return _revive(db, [row[0] for row in rows]) if rows else []

        return await self._run(claim)

    async def counts(self) -> dict[str, int]:
        """Queue depths for /healthz and the status page."""

        def count(db: sqlite3.Connection) -> dict[str, int]:
            inbox = db.execute("SELECT COUNT(*) FROM inbox WHERE status = 'pending'").fetchone()[0]
            outbox = db.execute("SELECT COUNT(*) FROM outbox WHERE status = 'pending'").fetchone()[0]
            dead = db.execute("SELECT COUNT(*) FROM dead_letters").fetchone()[0]
            aside = db.execute("SELECT COUNT(*) FROM inbox WHERE status = 'set_aside'").fetchone()[0]
            return {
                "inbox_pending": inbox,
                "outbox_pending": outbox,
                "dead_letters": dead,
                "set_aside": aside,
            }

        return await self._run(count)

    async def close(self) -> None:
        await self.db.close()


def _queue(db: sqlite3.Connection, inbound_id: int, replies: list[OutboundMessage]) -> list[OutboundMessage]:
    """Insert `inbound_id`'s replies into the outbox (inside the caller's transaction, as `complete`)."""
    now = time.time()
    for reply in replies:
        reply.inbound_id = inbound_id
        cursor = db.execute(
            "INSERT INTO outbox (inbound_id, channel, conversation, payload, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (inbound_id, reply.channel, reply.conversation, _dump(reply), now),
        )
        reply.id = cursor.lastrowid
    return replies


def _bury(db: sqlite3.Connection, outbox_id: int, error: str) -> None:
    """Mark the reply dead and keep it in the dead letters (in the caller's transaction)."""
    db.execute("UPDATE outbox SET status = 'dead', last_error = ? WHERE id = ?", (_error(error), outbox_id))
    db.execute(
        "INSERT OR REPLACE INTO dead_letters "
        "(outbox_id, channel, conversation, payload, error, attempts, dead_at) "
        "SELECT id, channel, conversation, payload, ?, attempts, ? FROM outbox WHERE id = ?",
        (_error(error), time.time(), outbox_id),
    )


def _revive(db: sqlite3.Connection, outbox_ids: list[int]) -> list[OutboundMessage]:
    """Dead letters back to pending outbox rows, attempts reset (one transaction, the caller's).
    A dead letter leaves its table only once its outbox row is pending again."""
    revived: list[OutboundMessage] = []
    for outbox_id in outbox_ids:
        row = db.execute(
            "UPDATE outbox SET status = 'pending', attempts = 0 WHERE id = ? AND status = 'dead' "
            "AND EXISTS (SELECT 1 FROM dead_letters WHERE outbox_id = ?) RETURNING payload",
            (outbox_id, outbox_id),
        ).fetchone()
        if row is not None:
            db.execute("DELETE FROM dead_letters WHERE outbox_id = ?", (outbox_id,))
            revived.append(_load(OutboundMessage, row[0], id=outbox_id, attempts=0))
    return revived


def _dead_letter(row: tuple[Any, ...]) -> DeadLetter:
    outbox_id, channel, conversation, payload, error, attempts, dead_at, resend_requested_at = row
    return DeadLetter(outbox_id=outbox_id, channel=channel, conversation=conversation, payload=payload,
                      error=error, attempts=attempts, dead_at=dead_at,
                      resend_requested_at=resend_requested_at)  # fmt: skip


def _dump(message: InboundMessage | OutboundMessage) -> str:
    data = dataclasses.asdict(message)
    data.pop("id", None)
    data.pop("attempts", None)
    return json.dumps(redact_data(data), ensure_ascii=False)


def _withdrawn(channel: str, conversation: str, message_id: str) -> str:
    """The stored payload of a message withdrawn before it arrived: its ids, no text."""
    return _dump(InboundMessage(channel, conversation, "", "", message_id, kind="withdrawn"))


def _error(error: str, limit: int = 2000) -> str:
    """A delivery error as stored: redacted, then cut (nothing of a secret left at the cut)."""
    return cut_text(error, limit)[0]


M = TypeVar("M", InboundMessage, OutboundMessage)


def _load(cls: type[M], payload: str, **fields: Any) -> M:
    data = json.loads(payload)
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known}, **fields)
