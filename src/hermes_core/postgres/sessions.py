"""Conversations in PostgreSQL (sessions/store.py's seam), shared by every node.

The same log of wire-format messages and one `ConversationState` per conversation as
`SQLiteSessionStore`. Two nodes may write one conversation at once (the gateway claims it per turn,
but a tool recording a fact and a console reading it need not): each write takes a
transaction-scoped advisory lock on the conversation, so an append numbers its messages after the
last one and a state change reads, changes and writes without another node's change in between.
A turn is appended once (`session_turns`, keyed by its task id); with the gateway store in the same
database, `PostgresGatewayStore.complete` appends it in the transaction of the done mark.
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import TYPE_CHECKING

from ..kernel.messages import Message
from ..kernel.redaction import redact_data
from ..sessions.store import PRUNE_BATCH, Conversation, ConversationState, SessionStore, StateChange
from .database import PostgresDatabase
from .migrations import SESSIONS

if TYPE_CHECKING:
    from psycopg import AsyncConnection


class PostgresSessionStore(SessionStore):
    def __init__(self, url: str, *, database: PostgresDatabase | None = None) -> None:
        self.db = database or PostgresDatabase.shared(url)
        self.db.migrate("sessions", SESSIONS)

    async def load(self, conversation: str) -> Conversation:
        async def load(db: AsyncConnection) -> Conversation:
            state = await _read_state(db, conversation)
            rows = await (
                await db.execute(
                    "SELECT message FROM session_messages WHERE conversation = %s AND seq > %s ORDER BY seq",
                    (conversation, state.folded),
                )
            ).fetchall()
            return Conversation(conversation, [json.loads(row[0]) for row in rows], state)

        # two reads, each on its own: in a transaction (READ COMMITTED) each statement would see
        # its own snapshot all the same, and BEGIN and COMMIT are two round trips more per turn
        return await self.db.statement(load)

    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> None:
        if messages:
            await self.db.transaction(lambda db: append_turn(db, conversation, messages, turn_id))

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
) -> None:
    """Append `messages` after the conversation's last one (in the caller's transaction); nothing if
    `turn_id` was stored before."""
    if not messages:
        return
    await _lock(db, conversation)
    row = await (
        await db.execute(
            "SELECT (SELECT COALESCE(MAX(seq), 0) FROM session_messages WHERE conversation = %s), "
            "(SELECT state FROM session_state WHERE conversation = %s)",
            (conversation, conversation),
        )
    ).fetchone()
    assert row is not None
    state = ConversationState.from_json(row[1]) if row[1] else ConversationState()
    # never at or below the fold: the folded messages may have been pruned
    last, now = max(int(row[0]), state.folded), time.time()
    if turn_id is not None:
        first = await db.execute(
            "INSERT INTO session_turns (conversation, turn_id, first_seq, messages, created_at) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (conversation, turn_id, last + 1, len(messages), now),
        )
        if first.rowcount == 0:
            return
    async with db.cursor() as cursor:
        await cursor.executemany(
            "INSERT INTO session_messages (conversation, seq, message, created_at) VALUES (%s, %s, %s, %s)",
            [
                (conversation, last + i, json.dumps(redact_data(message), ensure_ascii=False), now)
                for i, message in enumerate(messages, start=1)
            ],
        )


async def _read_state(db: AsyncConnection, conversation: str) -> ConversationState:
    row = await (
        await db.execute("SELECT state FROM session_state WHERE conversation = %s", (conversation,))
    ).fetchone()
    return ConversationState.from_json(row[0]) if row else ConversationState()
