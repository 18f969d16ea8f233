"""The gateway's inbox and outbox in PostgreSQL, for several nodes at once (gateway/store.py's seam).

The same facts in the same order as `SQLiteGatewayStore`, each one transaction; what changes is
that other processes run the same statements at the same moment:

- accept: `INSERT … ON CONFLICT DO NOTHING` on (channel, event_id) and (channel, message_id): the
  same event delivered to two nodes is one row, and only one of them acknowledges it as new;
- complete: the done mark (`… AND status = 'pending'`), the turn's history (when the session store
  shares this database) and the replies are one transaction: a node killed in the middle leaves
  none of them, and a second run of the message queues nothing twice;
- turn_claim: one turn in flight per conversation across nodes. A node takes the conversation's
  row of `turn_claims` (a lease, timed by the database's clock, renewed while the turn runs) and
  then runs the conversation's oldest pending message; another node waits until the row is free.
  A node killed mid-turn stops renewing: after `lease_seconds` another node may take the
  conversation up again (its journal replays what the dead turn had done). Each take gets a new
  epoch (one sequence), the turn's fence (tasks/fence.py): a node that was only paused past its
  lease finds its next journal write or `complete` refused (`ClaimLost`), in the write's own
  transaction, and stops without running a tool or queuing a reply;
- orphaned_inbound: what every node's sweep looks for, every `sweep_seconds` (a third of the
  lease): pending messages whose conversation has no live claim — a node died mid-turn, or
  between accepting a message and taking it up. The sweeping node runs them through the same
  `turn_claim` as any turn, so two nodes sweeping at once, or a sweep racing a new message of the
  conversation, still run each turn once (gateway/dispatcher.py);
- claim_resends: `FOR UPDATE SKIP LOCKED`, so a requested resend is taken up by one node;
- orphaned_outbound: every reply is held by the node that queued it (`outbox.node`, until
  `held_until` on the database's clock), the hold renewed at each sweep while that node lives and
  let go when it stops. A node killed with replies still to send stops renewing: once the hold
  has expired, the next sweep of any node takes them (`FOR UPDATE SKIP LOCKED`: one node each)
  and sends them in queue order, each under its own idempotency key, as the dead node would have.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

from ..channels.seam import Earlier, InboundMessage, OutboundMessage
from ..gateway.store import DEAD_LETTER_KEYS, DeadLetter, GatewayStore, _dump, _error, _load, _withdrawn
from ..kernel.redaction import redact_data, redact_text
from ..tasks.fence import Fence, fenced
from .database import PostgresDatabase
from .fence import hold_claim
from .migrations import GATEWAY
from .sessions import PostgresSessionStore, append_turn

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from ..sessions.store import TurnAppend

ACCEPT_WAIT = 2.0  # seconds for a connection to store a message: past it a 503 within Feishu's 3 s
log = logging.getLogger("hermes_core.postgres")
NOW = "EXTRACT(EPOCH FROM clock_timestamp())"  # the database's clock: nodes' clocks may differ
_WAIT = object()


# A message is taken once (one statement, one round trip): its event id is remembered first, and
# the message goes into the inbox only if that id is new (or it has none) and its message id too.
_ACCEPT = """
WITH seen AS (
    INSERT INTO seen_events (channel, event_id, seen_at)
    SELECT %(channel)s, %(event_id)s::text, %(now)s WHERE %(event_id)s::text IS NOT NULL
    ON CONFLICT DO NOTHING RETURNING 1
)
INSERT INTO inbox (channel, conversation, message_id, payload, received_at)
SELECT %(channel)s, %(conversation)s, %(message_id)s, %(payload)s, %(now)s
WHERE %(event_id)s::text IS NULL OR EXISTS (SELECT 1 FROM seen)
ON CONFLICT DO NOTHING RETURNING id
"""


class PostgresGatewayStore(GatewayStore):
    lease_seconds = 30.0  # a turn's claim on its conversation, renewed every third of it
    poll_seconds = 0.5  # at most this long between tries for a conversation another node runs

    def __init__(
        self, url: str, *, database: PostgresDatabase | None = None, lease_seconds: float | None = None
    ) -> None:
        if lease_seconds is not None:
            self.lease_seconds = lease_seconds
        self.db = database or PostgresDatabase.shared(url)
        self.db.migrate("gateway", GATEWAY)
        self.node = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._holding = False  # whether this node may hold replies (it queued or took some)

    async def _one(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        async def run(db: AsyncConnection) -> Any:
            return await (await db.execute(sql, args)).fetchone()

        return await self.db.statement(run)

    async def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        async def run(db: AsyncConnection) -> list[Any]:
            return await (await db.execute(sql, args)).fetchall()

        return await self.db.statement(run)

    async def _count(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        async def run(db: AsyncConnection) -> int:
            return (await db.execute(sql, args)).rowcount

        return await self.db.statement(run)

    # -- GatewayStore -------------------------------------------------------------------------
    async def accept(self, message: InboundMessage) -> int | None:
        message.text, message.extra = redact_text(message.text), redact_data(message.extra)

        async def accept(db: AsyncConnection) -> int | None:
            values = {
                "channel": message.channel, "event_id": message.event_id, "now": time.time(),
                "conversation": message.conversation, "message_id": message.message_id,
                "payload": _dump(message),
            }  # fmt: skip
            row = await (await db.execute(_ACCEPT, values)).fetchone()
            return int(row[0]) if row else None

        inbound_id = await self.db.statement(accept, wait=ACCEPT_WAIT)
        if inbound_id is not None:
            message.id = inbound_id
        return inbound_id

    async def pending_inbound(self) -> list[InboundMessage]:
        rows = await self._all("SELECT id, payload FROM inbox WHERE status = 'pending' ORDER BY id")
        return [_load(InboundMessage, payload, id=row_id) for row_id, payload in rows]

    async def complete(
        self, inbound_id: int, replies: list[OutboundMessage], history: TurnAppend | None = None
    ) -> list[OutboundMessage]:
        together = isinstance(getattr(history, "store", None), PostgresSessionStore) and (
            history is not None and history.store.db is self.db  # type: ignore[attr-defined]
        )
        if history is not None and not together:  # kept elsewhere: stored first, once
            await history.apply()

        async def complete(db: AsyncConnection) -> list[OutboundMessage]:
            await hold_claim(db)  # under a claim another node has taken: nothing (ClaimLost)
            done = await db.execute(
                "UPDATE inbox SET status = 'done', finished_at = %s WHERE id = %s AND status = 'pending'",
                (time.time(), inbound_id),
            )
            if done.rowcount == 0:  # already completed (a racing duplicate run): queue nothing twice
                return []
            if together and history is not None:
                await append_turn(db, history.conversation, history.messages, history.turn_id)
            return await _queue(db, inbound_id, replies, self._hold)

        return await self.db.transaction(complete)

    async def begin_attempt(self, inbound_id: int) -> int:
        row = await self._one("UPDATE inbox SET attempts = attempts + 1 WHERE id = %s "
                              "AND status = 'pending' RETURNING attempts", (inbound_id,))  # fmt: skip
        return int(row[0]) if row else 0

    async def release_attempt(self, inbound_id: int) -> None:
        await self._count(
            "UPDATE inbox SET attempts = GREATEST(attempts - 1, 0) WHERE id = %s AND status = 'pending'",
            (inbound_id,),
        )

    async def crashed_inbound(self, min_attempts: int) -> list[tuple[InboundMessage, int]]:
        rows = await self._all(  # not one running now on a live node: that run is no crash
            "SELECT id, payload, attempts FROM inbox WHERE status = 'pending' AND attempts >= %s "
            "AND NOT EXISTS (SELECT 1 FROM turn_claims c WHERE c.conversation = inbox.conversation "
            f"AND c.inbound_id = inbox.id AND c.expires_at >= {NOW}) ORDER BY id",
            (min_attempts,),
        )
        return [(_load(InboundMessage, payload, id=row_id), attempts) for row_id, payload, attempts in rows]

    @property
    def sweep_seconds(self) -> float:  # type: ignore[override]
        return self.lease_seconds / 3

    async def orphaned_inbound(self, older_than: float) -> list[tuple[InboundMessage, int]]:
        rows = await self._all(
            "SELECT id, payload, attempts FROM inbox WHERE status = 'pending' AND received_at < %s "
            "AND NOT EXISTS (SELECT 1 FROM turn_claims c WHERE c.conversation = inbox.conversation "
            f"AND c.expires_at >= {NOW}) ORDER BY id LIMIT 1000",
            (older_than,),
        )
        return [(_load(InboundMessage, payload, id=row_id), attempts) for row_id, payload, attempts in rows]

    async def withdraw(self, channel: str, message_id: str, conversation: str) -> bool:
        async def withdraw(db: AsyncConnection) -> bool:
            now = time.time()
            marked = await db.execute(
                "UPDATE inbox SET status = 'withdrawn', finished_at = %s WHERE channel = %s AND "
                "message_id = %s AND status = 'pending' AND attempts = 0",
                (now, channel, message_id),
            )
            if marked.rowcount:
                return True
            kept = await db.execute(
                "INSERT INTO inbox (channel, conversation, message_id, payload, status, received_at, "
                "finished_at) VALUES (%s, %s, %s, %s, 'withdrawn', %s, %s) ON CONFLICT DO NOTHING",
                (channel, conversation, message_id, _withdrawn(channel, conversation, message_id), now, now),
            )
            return bool(kept.rowcount)

        return await self.db.transaction(withdraw, wait=ACCEPT_WAIT)  # on the ack path

    async def set_chat_left(self, channel: str, chat_id: str, left: bool, at: float) -> None:
        await self._count(
            "INSERT INTO chat_membership VALUES (%s, %s, %s, %s) ON CONFLICT (channel, chat_id) DO UPDATE "
            "SET is_left = excluded.is_left, changed_at = excluded.changed_at "
            "WHERE excluded.changed_at >= chat_membership.changed_at",
            (channel, chat_id, left, at),
        )

    async def chat_left(self, channel: str, chat_id: str) -> bool:
        row = await self._one(
            "SELECT is_left FROM chat_membership WHERE channel = %s AND chat_id = %s", (channel, chat_id)
        )
        return bool(row and row[0])

    async def set_aside(
        self, inbound_id: int, reason: str, replies: list[OutboundMessage]
    ) -> list[OutboundMessage]:
        async def set_aside(db: AsyncConnection) -> list[OutboundMessage]:
            marked = await db.execute(
                "UPDATE inbox SET status = 'set_aside', finished_at = %s, set_aside_reason = %s "
                "WHERE id = %s AND status = 'pending'",
                (time.time(), _error(reason), inbound_id),
            )
            return await _queue(db, inbound_id, replies, self._hold) if marked.rowcount else []

        return await self.db.transaction(set_aside)

    async def set_aside_messages(self) -> list[dict[str, Any]]:
        """The messages set aside, oldest first: what they said, how often they ran, why."""
        rows = await self._all(
            "SELECT id, channel, conversation, message_id, payload, attempts, set_aside_reason, "
            "received_at, finished_at FROM inbox WHERE status = 'set_aside' ORDER BY id"
        )
        keys = ("id", "channel", "conversation", "message_id", "payload", "attempts", "reason",
                "received_at", "set_aside_at")  # fmt: skip
        return [dict(zip(keys, row, strict=True)) for row in rows]

    async def replies_of(self, channel: str, message_id: str) -> Earlier | None:
        async def find(db: AsyncConnection) -> Earlier | None:
            row = await (
                await db.execute(
                    "SELECT id, payload, status FROM inbox WHERE channel = %s AND message_id = %s",
                    (channel, message_id),
                )
            ).fetchone()
            if row is None:
                return None
            inbound_id, payload, status = row
            replies = await (
                await db.execute(
                    "SELECT id, payload, attempts FROM outbox WHERE inbound_id = %s ORDER BY id",
                    (inbound_id,),
                )
            ).fetchall()
            return Earlier(
                _load(InboundMessage, payload, id=inbound_id),
                status == "done",
                [_load(OutboundMessage, p, id=i, attempts=a) for i, p, a in replies],
            )

        return await self.db.transaction(find)

    async def pending_outbound(self) -> list[OutboundMessage]:
        rows = await self._all(
            "SELECT id, payload, attempts FROM outbox WHERE status = 'pending' ORDER BY id"
        )
        return [_load(OutboundMessage, p, id=row_id, attempts=a) for row_id, p, a in rows]

    @property
    def _hold(self) -> tuple[str, float]:
        """This node's hold on a reply it queues or takes: its id, and the seconds it lasts."""
        self._holding = True
        return self.node, self.lease_seconds

    async def orphaned_outbound(self, older_than: float) -> list[OutboundMessage]:
        async def take(db: AsyncConnection) -> list[Any]:
            await db.execute(  # this node lives: its own replies stay its own
                f"UPDATE outbox SET held_until = {NOW} + %s WHERE node = %s AND status = 'pending'",
                (self.lease_seconds, self.node),
            )
            rows = await (
                await db.execute(
                    f"UPDATE outbox SET node = %s, held_until = {NOW} + %s WHERE id IN (SELECT id "
                    f"FROM outbox WHERE status = 'pending' AND held_until < {NOW} AND created_at < %s "
                    "ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED) RETURNING id, payload, attempts",
                    (self.node, self.lease_seconds, older_than),
                )
            ).fetchall()
            return sorted(rows)  # queue order: each conversation's replies in theirs

        rows = await self.db.transaction(take)
        self._holding = self._holding or bool(rows)
        return [_load(OutboundMessage, p, id=row_id, attempts=a) for row_id, p, a in rows]

    async def mark_sent(self, outbox_id: int, platform_id: str | None) -> None:
        await self._count("UPDATE outbox SET status = 'sent', sent_at = %s, platform_id = %s WHERE id = %s",
                          (time.time(), platform_id, outbox_id))  # fmt: skip

    async def record_attempt(self, outbox_id: int, error: str) -> None:
        await self._count("UPDATE outbox SET attempts = attempts + 1, last_error = %s WHERE id = %s",
                          (_error(error), outbox_id))  # fmt: skip

    async def dead_letter(self, outbox_id: int, error: str) -> None:
        await self.db.transaction(lambda db: _bury(db, outbox_id, error))

    async def dead_letter_reply(self, reply: OutboundMessage, error: str) -> int:
        """Under a lock on the reply's uuid: two nodes giving it up at once make one row."""

        async def bury(db: AsyncConnection) -> int:
            await db.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ("dead:" + reply.uuid,))
            outbox_id = reply.id
            if outbox_id is None:
                found = await (
                    await db.execute(
                        "SELECT id FROM outbox WHERE conversation = %s AND status = 'dead' "
                        "AND payload::jsonb ->> 'uuid' = %s",
                        (reply.conversation, reply.uuid),
                    )
                ).fetchone()
                if found is None:
                    found = await (
                        await db.execute(
                            "INSERT INTO outbox (inbound_id, channel, conversation, payload, status, "
                            "attempts, last_error, created_at) "
                            "VALUES (NULL, %s, %s, %s, 'dead', %s, %s, %s) RETURNING id",
                            (reply.channel, reply.conversation, _dump(reply), reply.attempts, _error(error),
                             time.time()),
                        )
                    ).fetchone()  # fmt: skip
                assert found is not None
                outbox_id = int(found[0])
            else:
                await db.execute("UPDATE outbox SET attempts = %s WHERE id = %s", (reply.attempts, outbox_id))
            await _bury(db, outbox_id, error)
            return outbox_id

        return await self.db.transaction(bury)

    async def prune(self, older_than: float) -> None:
        async def prune(db: AsyncConnection) -> None:
            await db.execute("DELETE FROM seen_events WHERE seen_at < %s", (older_than,))
            await db.execute("DELETE FROM inbox WHERE status IN ('done', 'withdrawn') AND received_at < %s",
                             (older_than,))  # fmt: skip
            await db.execute("DELETE FROM outbox WHERE status = 'sent' AND created_at < %s", (older_than,))
            await db.execute("DELETE FROM streams WHERE inbound_id NOT IN (SELECT id FROM inbox)")

        await self.db.transaction(prune)

    async def claim_nonce(self, channel: str, nonce: str, keep_seconds: float) -> bool:
        async def claim(db: AsyncConnection) -> bool:
            now = time.time()
            await db.execute("DELETE FROM seen_nonces WHERE expires_at < %s", (now,))
            fresh = await db.execute(
                "INSERT INTO seen_nonces (channel, nonce, expires_at) VALUES (%s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                (channel, nonce, now + keep_seconds),
            )
            return fresh.rowcount == 1

        return await self.db.transaction(claim)

    async def stream_of(self, inbound_id: int) -> str | None:
        row = await self._one("SELECT platform_id FROM streams WHERE inbound_id = %s", (inbound_id,))
        return None if row is None else str(row[0])

    async def keep_stream(self, inbound_id: int, channel: str, platform_id: str) -> None:
        await self._count(
            "INSERT INTO streams (inbound_id, channel, platform_id, created_at) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (inbound_id) DO UPDATE SET channel = EXCLUDED.channel, "
            "platform_id = EXCLUDED.platform_id",
            (inbound_id, channel, platform_id, time.time()),
        )

    async def dead_letters(self, limit: int | None = None) -> list[DeadLetter]:
        columns = ", ".join(DEAD_LETTER_KEYS)
        rows = await self._all(
            f"SELECT {columns} FROM dead_letters ORDER BY dead_at DESC, outbox_id DESC LIMIT %s", (limit,)
        )
        return [cast(DeadLetter, dict(zip(DEAD_LETTER_KEYS, row, strict=True))) for row in rows]

    async def resend(self, outbox_id: int) -> OutboundMessage | None:
        async def revive(db: AsyncConnection) -> list[OutboundMessage]:
            return await _revive(db, [outbox_id], self._hold)

        replies = await self.db.transaction(revive)
        return replies[0] if replies else None

    async def request_resend(self, outbox_id: int) -> bool:
        asked = await self._count("UPDATE dead_letters SET resend_requested_at = %s WHERE outbox_id = %s",
                                  (time.time(), outbox_id))  # fmt: skip
        return bool(asked)

    async def claim_resends(self) -> list[OutboundMessage]:
        async def claim(db: AsyncConnection) -> list[OutboundMessage]:
            rows = await (
                await db.execute(
                    "SELECT outbox_id FROM dead_letters WHERE resend_requested_at IS NOT NULL "
                    "ORDER BY outbox_id FOR UPDATE SKIP LOCKED"  # another node's are its own
                )
            ).fetchall()
            return await _revive(db, [row[0] for row in rows], self._hold) if rows else []

        return await self.db.transaction(claim)

    async def counts(self) -> dict[str, int]:
        """Queue depths for /healthz and the status page."""
        row = await self._one(
            "SELECT (SELECT COUNT(*) FROM inbox WHERE status = 'pending'), "
            "(SELECT COUNT(*) FROM outbox WHERE status = 'pending'), (SELECT COUNT(*) FROM dead_letters), "
            "(SELECT COUNT(*) FROM inbox WHERE status = 'set_aside')"
        )
        keys = ("inbox_pending", "outbox_pending", "dead_letters", "set_aside")
        return {key: int(value) for key, value in zip(keys, row, strict=True)}

    # -- one turn per conversation, across nodes ---------------------------------------------
    @asynccontextmanager
    async def turn_claim(self, message: InboundMessage) -> AsyncIterator[InboundMessage | None]:
        delay = 0.02
        while (claimed := await self.db.transaction(lambda db: self._claim(db, message))) is _WAIT:
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.poll_seconds)
        if claimed is None:
            yield None
            return
        turn, fence = claimed
        renewing = asyncio.create_task(self._renew(fence))
        try:
            with fenced(fence):  # the turn's writes are refused once another node takes the claim
                yield turn
        finally:
            renewing.cancel()
            await asyncio.shield(self._release(message.conversation))

    async def _claim(self, db: AsyncConnection, message: InboundMessage) -> Any:
        """`message`'s conversation for this node: the oldest pending message to run with the
        claim's fence (a new epoch), `_WAIT` while another node holds it, None when `message` is
        no longer pending. A claim this node holds already is its own lane's, left by a try whose
        release the database did not take (it was down): taken again at once (a new epoch), or let
        go when the message turns out done, so neither this node nor another waits out the lease."""
        status = await (await db.execute("SELECT status FROM inbox WHERE id = %s", (message.id,))).fetchone()
        if status is None or status[0] != "pending":  # done; a claim of ours left by a lost release goes
            await db.execute("DELETE FROM turn_claims WHERE conversation = %s AND node = %s",
                             (message.conversation, self.node))  # fmt: skip
            return None
        taken = await (
            await db.execute(
                "INSERT INTO turn_claims (conversation, node, inbound_id, expires_at, epoch) "
                f"VALUES (%s, %s, %s, {NOW} + %s, nextval('turn_claim_epochs')) ON CONFLICT (conversation) "
                "DO UPDATE SET node = excluded.node, inbound_id = excluded.inbound_id, "
                f"expires_at = {NOW} + %s, epoch = excluded.epoch "  # the clock once the row is ours
                f"WHERE turn_claims.expires_at < {NOW} OR turn_claims.node = excluded.node "
                "RETURNING epoch",
                (message.conversation, self.node, message.id, self.lease_seconds, self.lease_seconds),
            )
        ).fetchone()
        if taken is None:
            return _WAIT
        row = await (
            await db.execute(
                "SELECT id, payload FROM inbox WHERE conversation = %s AND status = 'pending' "
                "ORDER BY id LIMIT 1",
                (message.conversation,),
            )
        ).fetchone()
        if row is None:  # set aside just now, by a node starting up (not under a claim): let go
            await db.execute("DELETE FROM turn_claims WHERE conversation = %s AND node = %s",
                             (message.conversation, self.node))  # fmt: skip
            return None
        fence = Fence(message.conversation, self.node, int(taken[0]))
        if row[0] == message.id:
            return message, fence
        await db.execute(
            "UPDATE turn_claims SET inbound_id = %s WHERE conversation = %s", (row[0], message.conversation)
        )
        return _load(InboundMessage, row[1], id=row[0]), fence

    async def _renew(self, fence: Fence) -> None:
        conversation = fence.conversation
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                kept = await self._count(
                    f"UPDATE turn_claims SET expires_at = {NOW} + %s "
                    "WHERE conversation = %s AND node = %s AND epoch = %s",
                    (self.lease_seconds, conversation, self.node, fence.epoch),
                )
            except Exception as exc:  # the database away for a moment: try again at the next third
                log.warning("renewing the claim on conversation %s failed: %s", conversation,
                            redact_text(str(exc)))  # fmt: skip
                continue
            if not kept:
                log.warning("the claim on conversation %s is no longer this node's (it expired while the "
                            "turn ran): the turn's next write is refused", conversation)  # fmt: skip
                return

    async def _release(self, conversation: str) -> None:
        await self._count(
            "DELETE FROM turn_claims WHERE conversation = %s AND node = %s", (conversation, self.node)
        )

    async def close(self) -> None:
        if self._holding:  # stopping: the replies it did not send are the others' at their next sweep
            await self._let_go()
        await self.db.close()

    async def _let_go(self) -> None:
        async def let_go(db: AsyncConnection) -> None:
            await db.execute("UPDATE outbox SET held_until = 0 WHERE node = %s AND status = 'pending'",
                             (self.node,))  # fmt: skip

        try:
            await self.db.transaction(let_go, wait=ACCEPT_WAIT)
        except Exception as exc:  # the database away: they are taken once the hold expires
            log.warning("letting go of this node's unsent replies failed: %s", redact_text(str(exc)))


async def _queue(
    db: AsyncConnection, inbound_id: int, replies: list[OutboundMessage], hold: tuple[str, float]
) -> list[OutboundMessage]:
    """Insert `inbound_id`'s replies into the outbox, held by the node and for the seconds of
    `hold` (inside the caller's transaction)."""
    now = time.time()
    for reply in replies:
        reply.inbound_id = inbound_id
        row = await (
            await db.execute(
                "INSERT INTO outbox (inbound_id, channel, conversation, payload, created_at, node, "
                f"held_until) VALUES (%s, %s, %s, %s, %s, %s, {NOW} + %s) RETURNING id",
                (inbound_id, reply.channel, reply.conversation, _dump(reply), now, *hold),
            )
        ).fetchone()
        assert row is not None  # RETURNING
        reply.id = int(row[0])
    return replies


async def _bury(db: AsyncConnection, outbox_id: int, error: str) -> None:
    """Mark the reply dead and keep it in the dead letters (in the caller's transaction)."""
    await db.execute(
        "UPDATE outbox SET status = 'dead', last_error = %s WHERE id = %s", (_error(error), outbox_id)
    )
    await db.execute(
        "INSERT INTO dead_letters "
        "(outbox_id, channel, conversation, payload, error, attempts, dead_at) "
        "SELECT id, channel, conversation, payload, %s, attempts, %s FROM outbox WHERE id = %s "
        "ON CONFLICT (outbox_id) DO UPDATE SET error = excluded.error, attempts = excluded.attempts, "
        "dead_at = excluded.dead_at, resend_requested_at = NULL",
        (_error(error), time.time(), outbox_id),
    )


async def _revive(
    db: AsyncConnection, outbox_ids: list[int], hold: tuple[str, float]
) -> list[OutboundMessage]:
    """Dead letters back to pending outbox rows, attempts reset, held as `hold` says (in the
    caller's transaction)."""
    revived: list[OutboundMessage] = []
    for outbox_id in outbox_ids:
        row = await (
            await db.execute(
                f"UPDATE outbox SET status = 'pending', attempts = 0, node = %s, held_until = {NOW} + %s "
                "WHERE id = %s AND status = 'dead' AND EXISTS (SELECT 1 FROM dead_letters WHERE "
                "outbox_id = %s) RETURNING payload",
                (*hold, outbox_id, outbox_id),
            )
        ).fetchone()
        if row is not None:
            await db.execute("DELETE FROM dead_letters WHERE outbox_id = %s", (outbox_id,))
            revived.append(_load(OutboundMessage, row[0], id=outbox_id, attempts=0))
    return revived
