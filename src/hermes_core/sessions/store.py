"""Where conversations live between turns: their messages, and their state beside them.

`SessionStore` is the seam, a protocol of five methods (docs/seams.md; every implementation passes
tests/contracts/test_session_store_contract.py); `SQLiteSessionStore` is the embedded default, in
the gateway's database file (component "sessions"); `InMemorySessionStore` serves tests and the
terminal REPL.

A conversation is an append-only log of wire-format messages plus one `ConversationState`: the
snapshot (facts, steps), the summary of folded turns, and `folded`, the number of log messages the
summary replaced. `load` returns only the messages after that point, so a long conversation costs
the same to load as a short one; the folded messages stay in the log for traces and audits.

A turn's messages are appended once: a `TurnAppend` is keyed by its task id (`session_turns`), so
the same turn stored again — a message run again after a crash — adds nothing. The gateway writes it
in the transaction that marks the message done and queues its replies (`GatewayStore.complete`),
when this store lives in the gateway's database file (`TurnAppend.write_in`): then the history,
the done mark and the replies are there together or not at all. A store kept elsewhere has the turn
stored first, once (its turn id), then the done mark.

Messages and state are redacted as they are stored (kernel/redaction.py): a secret a user pasted or a tool
read is never written to the database, whichever code path produced the message.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from ..kernel.messages import Message
from ..kernel.redaction import redact_data
from ..storage import SQLiteDatabase

MAX_FOLDS_KEPT = 50  # fold records kept in the state for traces; the summary itself covers them all

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE session_messages (
        conversation TEXT NOT NULL,
        seq INTEGER NOT NULL,                -- 1, 2, 3… within the conversation
        message TEXT NOT NULL,               -- JSON, OpenAI wire format
        created_at REAL NOT NULL,
        PRIMARY KEY (conversation, seq)
    ) WITHOUT ROWID;
    CREATE TABLE session_state (
        conversation TEXT PRIMARY KEY,
        state TEXT NOT NULL,                 -- JSON of ConversationState
        updated_at REAL NOT NULL
    )
    """,
    2: """
    CREATE TABLE session_turns (
        conversation TEXT NOT NULL,
        turn_id TEXT NOT NULL,               -- the task id: a turn stored again adds nothing
        first_seq INTEGER NOT NULL,
        messages INTEGER NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (conversation, turn_id)
    ) WITHOUT ROWID
    """,
    # 3: history older than `memory.retention_days` is deleted by age (SessionStore.prune)
    3: "CREATE INDEX session_messages_by_time ON session_messages (created_at)",
}


@dataclass
class Fold:
    """One fold, kept so a trace can show what replaced which turns."""

    summary: str  # the model's summary of everything folded so far (≤ 200 chars); "" if none was made
    turns: int  # turns moved out of the window
    messages: int
    at: float
    fallback: str | None = None  # why plain truncation was used instead (the summary call's error)


@dataclass
class ConversationState:
    """Everything about a conversation that is not its chat history, injected into every call."""

    goal: str = ""  # the first user message, pinned once its turn has left the window
    facts: list[str] = field(default_factory=list)  # key facts and constraints ("budget ≤ 5000")
    pending: list[str] = field(default_factory=list)  # steps still to do
    done: list[str] = field(default_factory=list)  # steps completed
    summary: str = ""  # the accumulated summary of the folded turns
    folded: int = 0  # log messages replaced by the summary (or truncated)
    folds: list[Fold] = field(default_factory=list)
    # the context messages given, each [log index of the message it stands before, notes, hints]:
    # they go back there on later turns, so requests stay append-only for the provider's cache
    # (agent.py `context_update`)
    contexts: list[tuple[int, str, str]] = field(default_factory=list)

    def to_json(self) -> str:
        data = asdict(self)
        data["folds"] = data["folds"][-MAX_FOLDS_KEPT:]
        return json.dumps(redact_data(data), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> ConversationState:
        data: dict[str, Any] = json.loads(text)
        folds = [Fold(**fold) for fold in data.pop("folds", [])]
        known = {name: value for name, value in data.items() if name in cls.__dataclass_fields__}
        known["contexts"] = [(int(at), str(n), str(h)) for at, n, h in known.get("contexts", [])]
        return cls(**known, folds=folds)


@dataclass
class Conversation:
    id: str
    messages: list[Message]  # the messages after the folded ones, oldest first
    state: ConversationState


StateChange = Callable[[ConversationState], object]
Write = Callable[[sqlite3.Connection], object]


@dataclass(frozen=True)
class TurnAppend:
    """One finished turn's messages, to be stored exactly once, keyed by `turn_id` (the task id)."""

    store: SessionStore
    conversation: str
    turn_id: str | None  # None: not keyed (appended every time it is applied)
    messages: list[Message]

    def write_in(self, database: SQLiteDatabase) -> Write | None:
        """The function that stores this turn inside a transaction of `database`, or None when the
        session store lives elsewhere: then call `apply`."""
        if isinstance(self.store, SQLiteSessionStore) and self.store.db is database:
            return partial(_append, self.conversation, self.messages, self.turn_id)
        return None

    async def apply(self) -> None:
        """Store the turn on its own (idempotent)."""
        await self.store.append(self.conversation, self.messages, turn_id=self.turn_id)


class SessionStore(Protocol):
    """Conversations by key, as `ConversationMemory` (memory.py) and the gateway use them. Each
    method is one atomic step; what is returned is the caller's copy (changing it changes nothing
    stored), and what is stored is redacted."""

    async def load(self, conversation: str) -> Conversation:
        """The conversation's state and its messages after `state.folded` (empty if it is new)."""
        ...

    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> bool:
        """Add one finished turn's messages to the log, all or none; with a `turn_id`, only the first
        time that turn is appended. False when that turn was stored before (nothing is added)."""
        ...

    async def turn_reply(self, conversation: str, turn_id: str) -> str | None:
        """The reply of the turn appended under `turn_id`: the text of its last message when that is
        the assistant's (a string); None when the turn is not stored (never, or pruned since) or
        ends otherwise. Read by a workflow engine whose retried message's reply is in the turn."""
        ...

    async def update_state(self, conversation: str, change: StateChange) -> ConversationState:
        """Read the state, apply `change` to it (a quick, synchronous function), write it back,
        atomically; returns the new state. Read-modify-write, so a tool that records a fact during a
        turn and the fold before it can never overwrite each other; a `change` that raises writes
        nothing."""
        ...

    async def prune(self, older_than: float) -> int:
        """Delete the messages stored before `older_than` (a UNIX time) and the turn keys of that age;
        a conversation left with no message and no state change since is forgotten entirely.
        Returns how many messages went. Messages appended later are numbered after the fold, so a
        conversation whose folded messages are gone still shows its new ones."""
        ...

    async def close(self) -> None:
        """Release the store (another instance may open the same storage again)."""
        ...


class SQLiteSessionStore(SessionStore):
    """The embedded default: two tables in the shared database file (WAL, synchronous=FULL)."""

    def __init__(self, path: str | Path) -> None:
        self.db = SQLiteDatabase.shared(path)
        self.db.migrate("sessions", MIGRATIONS)

    async def load(self, conversation: str) -> Conversation:
        def load(db: sqlite3.Connection) -> Conversation:
            state = _read_state(db, conversation)
            rows = db.execute(
                "SELECT message FROM session_messages WHERE conversation = ? AND seq > ? ORDER BY seq",
                (conversation, state.folded),
            ).fetchall()
            return Conversation(conversation, [json.loads(row[0]) for row in rows], state)

        return await self.db.transaction(load)

    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> bool:
        return not messages or await self.db.transaction(partial(_append, conversation, messages, turn_id))

    async def turn_reply(self, conversation: str, turn_id: str) -> str | None:
        row = await self.db.transaction(
            lambda db: db.execute(
                "SELECT m.message FROM session_turns t JOIN session_messages m "
                "ON m.conversation = t.conversation AND m.seq = t.first_seq + t.messages - 1 "
                "WHERE t.conversation = ? AND t.turn_id = ?",
                (conversation, turn_id),
            ).fetchone()
        )
        return reply_text(json.loads(row[0]) if row is not None else None)

    async def update_state(self, conversation: str, change: StateChange) -> ConversationState:
        def update(db: sqlite3.Connection) -> ConversationState:
            state = _read_state(db, conversation)
            change(state)
            db.execute(
                "INSERT INTO session_state (conversation, state, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (conversation) "
                "DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at",
                (conversation, state.to_json(), time.time()),
            )
            return state

        return await self.db.transaction(update)

    async def prune(self, older_than: float) -> int:
        deleted: list[str] = []  # the conversation of each message deleted
        while len(batch := await self.db.transaction(partial(_prune_messages, older_than))) == PRUNE_BATCH:
            deleted += batch  # in short writes: an acknowledgement waiting for the writer is not held up
        await self.db.transaction(partial(_prune_rest, older_than, sorted({*deleted, *batch})))
        return len(deleted) + len(batch)

    async def close(self) -> None:
        await self.db.close()


PRUNE_BATCH = 2000  # messages deleted per write


def _prune_messages(older_than: float, db: sqlite3.Connection) -> list[str]:
    rows = db.execute(
        "DELETE FROM session_messages WHERE (conversation, seq) IN (SELECT conversation, seq "
        "FROM session_messages WHERE created_at < ? LIMIT ?) RETURNING conversation",
        (older_than, PRUNE_BATCH),
    )
    return [row[0] for row in rows.fetchall()]


def _prune_rest(older_than: float, conversations: list[str], db: sqlite3.Connection) -> None:
    """After the messages: the turn keys of that age, the fold moved past what went (so the messages
    left stay `state.folded + 1…`), and conversations left with nothing, idle since, forgotten."""
    db.execute("DELETE FROM session_turns WHERE created_at < ?", (older_than,))
    for conversation in conversations:
        first = db.execute(
            "SELECT MIN(seq) FROM session_messages WHERE conversation = ?", (conversation,)
        ).fetchone()[0]
        state = _read_state(db, conversation)
        if first is not None and first - 1 > state.folded:
            state.folded = first - 1
            db.execute(
                "INSERT INTO session_state (conversation, state, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (conversation) DO UPDATE SET state = excluded.state",
                (conversation, state.to_json(), time.time()),
            )
    db.execute(
        "DELETE FROM session_state WHERE updated_at < ? AND NOT EXISTS "
        "(SELECT 1 FROM session_messages m WHERE m.conversation = session_state.conversation)",
        (older_than,),
    )


def _append(conversation: str, messages: list[Message], turn_id: str | None, db: sqlite3.Connection) -> bool:
    """Append `messages` after the conversation's last one; nothing (False) if `turn_id` was stored before."""
    last = db.execute(  # never at or below the fold: the folded messages may have been pruned
        "SELECT MAX(COALESCE((SELECT MAX(seq) FROM session_messages WHERE conversation = ?), 0), "
        "COALESCE((SELECT json_extract(state, '$.folded') FROM session_state WHERE conversation = ?), 0))",
        (conversation, conversation),
    ).fetchone()[0]
    now = time.time()
    if turn_id is not None:
        first = db.execute(
            "INSERT OR IGNORE INTO session_turns (conversation, turn_id, first_seq, messages, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (conversation, turn_id, last + 1, len(messages), now),
        )
        if first.rowcount == 0:
            return False
    db.executemany(
        "INSERT INTO session_messages (conversation, seq, message, created_at) VALUES (?, ?, ?, ?)",
        [
            (conversation, last + i, json.dumps(redact_data(message), ensure_ascii=False), now)
            for i, message in enumerate(messages, start=1)
        ],
    )
    return True


def reply_text(message: Message | None) -> str | None:
    """A turn's last message as its reply (`SessionStore.turn_reply`): the assistant's text, or None."""
    content = (message or {}).get("content")
    return content if (message or {}).get("role") == "assistant" and isinstance(content, str) else None


def _read_state(db: sqlite3.Connection, conversation: str) -> ConversationState:
    row = db.execute("SELECT state FROM session_state WHERE conversation = ?", (conversation,)).fetchone()
    return ConversationState.from_json(row[0]) if row else ConversationState()


class InMemorySessionStore(SessionStore):
    """Conversations in a dict, least recently used forgotten beyond `max_conversations`.

    Messages are numbered as in the database stores: `pruned` of a conversation's first messages
    are gone, so `state.folded` (a message number) is an index once `pruned` is taken off."""

    def __init__(self, max_conversations: int = 10_000) -> None:
        self.max_conversations = max_conversations
        self._logs: OrderedDict[str, _Log] = OrderedDict()

    def _entry(self, conversation: str) -> _Log:
        entry = self._logs.pop(conversation, None) or _Log()
        self._logs[conversation] = entry  # most recently used last
        while len(self._logs) > self.max_conversations:
            self._logs.popitem(last=False)
        return entry

    async def load(self, conversation: str) -> Conversation:
        entry = self._entry(conversation)
        copy = ConversationState.from_json(entry.state.to_json())  # callers must not change the stored one
        shown = entry.messages[max(0, entry.state.folded - entry.pruned) :]
        return Conversation(conversation, json.loads(json.dumps(shown)), copy)

    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> bool:
        entry = self._entry(conversation)
        if turn_id is not None:
            if turn_id in entry.turns:
                return False
            entry.turns[turn_id] = entry.pruned + len(entry.messages) + len(messages) if messages else 0
        entry.messages.extend(json.loads(json.dumps(redact_data(messages))))
        entry.stamps.extend([time.time()] * len(messages))
        return True

    async def turn_reply(self, conversation: str, turn_id: str) -> str | None:
        entry = self._logs.get(conversation)
        last = entry.turns.get(turn_id, 0) - entry.pruned - 1 if entry is not None else -1
        return reply_text(entry.messages[last]) if entry is not None and last >= 0 else None

    async def update_state(self, conversation: str, change: StateChange) -> ConversationState:
        entry = self._entry(conversation)
        updated = ConversationState.from_json(entry.state.to_json())
        change(updated)
        entry.state, entry.updated_at = updated, time.time()
        return ConversationState.from_json(updated.to_json())

    async def prune(self, older_than: float) -> int:
        deleted = 0
        for conversation, entry in list(self._logs.items()):
            gone = next((i for i, stamp in enumerate(entry.stamps) if stamp >= older_than), len(entry.stamps))
            del entry.messages[:gone], entry.stamps[:gone]
            entry.pruned, deleted = entry.pruned + gone, deleted + gone
            entry.state.folded = max(entry.state.folded, entry.pruned)
            if not entry.messages and entry.updated_at < older_than:
                del self._logs[conversation]
        return deleted

    async def close(self) -> None:
        return None


@dataclass
class _Log:
    """One conversation of `InMemorySessionStore`."""

    messages: list[Message] = field(default_factory=list)
    stamps: list[float] = field(default_factory=list)  # when each message was stored
    state: ConversationState = field(default_factory=ConversationState)
    updated_at: float = 0.0  # the state's last change
    pruned: int = 0  # messages deleted from the front
    turns: dict[str, int] = field(default_factory=dict)  # turn id → the number of its last message


__all__ = [
    "Conversation",
    "ConversationState",
    "Fold",
    "InMemorySessionStore",
    "SQLiteSessionStore",
    "SessionStore",
    "TurnAppend",
    "reply_text",
]
