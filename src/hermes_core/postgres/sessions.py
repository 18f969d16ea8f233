"""Conversations in PostgreSQL (sessions/store.py's seam), shared by every node.

The same log of wire-format messages and one `ConversationState` per conversation as
`SQLiteSessionStore`. Two nodes may write one conversation at once (the gateway claims it per turn,
but a tool recording a fact and a console reading it need not): a state change takes a
transaction-scoped advisory lock on the conversation, so it reads, changes and writes without
another node's change in between. A turn is appended once (`session_turns`, keyed by its
task id) by one statement (`_APPEND`: one round trip, where a transaction of lock, read and two
inserts took six): its messages are numbered after the conversation's last one, and when two
appends of one conversation take the same numbers the second fails as a whole on the messages'
key and is run again under the lock. With the gateway store in the same database,
`PostgresGatewayStore.complete` appends it in the transaction of the done mark, under the lock.
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import TYPE_CHECKING

from ..kernel.messages import Message
from ..kernel.redaction import redact_data
from ..sessions.store import (
    PRUNE_BATCH,
    Conversation,
    ConversationState,
    SessionStore,
    StateChange,
    reply_text,
)
from .database import PostgresDatabase, driver
from .migrations import SESSIONS

APPEND_ATTEMPTS = 8  # an append whose numbers another took first is run again, locked

if TYPE_CHECKING:
    from psycopg import AsyncConnection


class PostgresSessionStore(SessionStore):
    def __init__(self, url: str, *, database: PostgresDatabase | None = None) -> None:
        self.db = database or PostgresDatabase.shared(url)
        self.db.migrate("sessions", SESSIONS)

    async def load(self, conversation: str) -> Conversation:
        async def load(db: AsyncConnection) -> Conversation:
            rows = await (await db.execute(_LOAD, {"conversation": conversation})).fetchall()
            stored = rows[0][1] if rows and rows[0][0] is None else None
            state = ConversationState.from_json(stored) if stored else ConversationState()
            messages = [json.loads(message) for seq, message in rows if seq is not None]
            return Conversation(conversation, messages, state)

        return await self.db.statement(load)

    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> bool:
        if not messages:
            return True
        unique_violation = driver().errors.UniqueViolation
        for attempt in range(APPEND_ATTEMPTS):
            try:
                if attempt == 0:  # one statement, no lock: appends of one conversation seldom meet
                    return await self.db.statement(partial(_append, conversation, messages, turn_id))
                return await self.db.transaction(lambda db: append_turn(db, conversation, messages, turn_id))
            except unique_violation:  # another append of this conversation took these numbers first:
                if attempt == APPEND_ATTEMPTS - 1:  # again, under the conversation's lock
                    raise
        raise AssertionError("unreachable")

    async def turn_reply(self, conversation: str, turn_id: str) -> str | None:
        async def read(db: AsyncConnection) -> str | None:
            row = await (
                await db.execute(
                    "SELECT m.message FROM session_turns t JOIN session_messages m "
                    "ON m.conversation = t.conversation AND m.seq = t.first_seq + t.messages - 1 "
                    "WHERE t.conversation = %s AND t.turn_id = %s",
                    (conversation, turn_id),
                )
            ).fetchone()
            return reply_text(json.loads(row[0]) if row is not None else None)

        return await self.db.statement(read)

    async def update_state(self, conversation: str, change: StateChange) -> ConversationState:
        async def update(db: AsyncConnection) -> ConversationState:
            await _lock(db, conversation)
            state = await _read_state(db, conversation)
            change(state)
            await db.execute(
                "INSERT INTO session_state (conversation, state, updated_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (conversation) "
                "DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at",
                (conversation, state.to_json(), time.time()),
            )
            return state

        return await self.db.transaction(update)

    async def prune(self, older_than: float) -> int:
        """As `SQLiteSessionStore.prune`: messages in batches, then per conversation that lost some
        the fold moved past them (under the conversation's write lock), then the idle and empty."""
        deleted: list[str] = []
        while True:
            batch = await self.db.transaction(lambda db: _prune_messages(db, older_than))
            deleted += batch
            if len(batch) < PRUNE_BATCH:
                break
        for conversation in sorted(set(deleted)):
            await self.db.transaction(partial(_move_fold, conversation=conversation))
        await self.db.transaction(lambda db: _prune_rest(db, older_than))
        return len(deleted)

    async def close(self) -> None:
        await self.db.close()


async def _prune_messages(db: AsyncConnection, older_than: float) -> list[str]:
    rows = await db.execute(
        "DELETE FROM session_messages WHERE (conversation, seq) IN (SELECT conversation, seq "
        "FROM session_messages WHERE created_at < %s LIMIT %s) RETURNING conversation",
        (older_than, PRUNE_BATCH),
    )
    return [row[0] for row in await rows.fetchall()]


async def _move_fold(db: AsyncConnection, *, conversation: str) -> None:
    """`state.folded` moved up to just before the first message left (the window stays contiguous)."""
    await _lock(db, conversation)
    row = await (
        await db.execute("SELECT MIN(seq) FROM session_messages WHERE conversation = %s", (conversation,))
    ).fetchone()
    state = await _read_state(db, conversation)
    if row is not None and row[0] is not None and row[0] - 1 > state.folded:
        state.folded = row[0] - 1
        await db.execute(
            "INSERT INTO session_state (conversation, state, updated_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (conversation) DO UPDATE SET state = excluded.state",
            (conversation, state.to_json(), time.time()),
        )


async def _prune_rest(db: AsyncConnection, older_than: float) -> None:
    await db.execute("DELETE FROM session_turns WHERE created_at < %s", (older_than,))
    await db.execute(
        "DELETE FROM session_state s WHERE updated_at < %s AND NOT EXISTS "
        "(SELECT 1 FROM session_messages m WHERE m.conversation = s.conversation)",
        (older_than,),
    )


async def _lock(db: AsyncConnection, conversation: str) -> None:
    """Hold the conversation's write lock until the transaction ends."""
    await db.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ("session:" + conversation,))


async def append_turn(
    db: AsyncConnection, conversation: str, messages: list[Message], turn_id: str | None
) -> bool:
    """Append `messages` after the conversation's last one in the caller's transaction, under the
    conversation's lock; nothing (False) if `turn_id` was stored before."""
    if not messages:
        return True
    await _lock(db, conversation)
    return await _append(conversation, messages, turn_id, db)


# the state (its row first, with no number), then the messages after the fold: one round trip
_LOAD = """
SELECT NULL::integer AS seq, state FROM session_state WHERE conversation = %(conversation)s
UNION ALL
SELECT seq, message FROM session_messages WHERE conversation = %(conversation)s AND seq > COALESCE(
    (SELECT (state::jsonb ->> 'folded')::integer FROM session_state WHERE conversation = %(conversation)s), 0)
ORDER BY seq NULLS FIRST
"""

# the last number: the conversation's last message's, never below the fold (the folded messages
# may have been pruned); the turn's key first, then its messages only if the key was new
_APPEND = """
WITH last AS (
    SELECT GREATEST(
        (SELECT COALESCE(MAX(seq), 0) FROM session_messages WHERE conversation = %(conversation)s),
        COALESCE((SELECT (state::jsonb ->> 'folded')::integer FROM session_state
                  WHERE conversation = %(conversation)s), 0)
    ) AS seq
), turn AS (
    INSERT INTO session_turns (conversation, turn_id, first_seq, messages, created_at)
    SELECT %(conversation)s, %(turn_id)s::text, seq + 1, %(count)s, %(now)s FROM last
    WHERE %(turn_id)s::text IS NOT NULL
    ON CONFLICT DO NOTHING RETURNING 1
)
INSERT INTO session_messages (conversation, seq, message, created_at)
SELECT %(conversation)s, last.seq + m.n, m.message, %(now)s
FROM last, unnest(%(messages)s::text[]) WITH ORDINALITY AS m(message, n)
WHERE %(turn_id)s::text IS NULL OR EXISTS (SELECT 1 FROM turn)
"""


async def _append(
    conversation: str, messages: list[Message], turn_id: str | None, db: AsyncConnection
) -> bool:
    values = {
        "conversation": conversation,
        "turn_id": turn_id,
        "count": len(messages),
        "now": time.time(),
        "messages": [json.dumps(redact_data(message), ensure_ascii=False) for message in messages],
    }
    cursor = await db.execute(_APPEND, values)
    return cursor.rowcount > 0


async def _read_state(db: AsyncConnection, conversation: str) -> ConversationState:
    row = await (
        await db.execute("SELECT state FROM session_state WHERE conversation = %s", (conversation,))
    ).fetchone()
    return ConversationState.from_json(row[0]) if row else ConversationState()
