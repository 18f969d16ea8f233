"""Where conversations live between turns: their messages, and their state beside them.

`SessionStore` is the seam, a protocol of four methods (docs/seams.md; every implementation passes
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
Write = Callable[[sqlite3.Connection], None]


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

    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> None:
        """Add one finished turn's messages to the log, all or none; with a `turn_id`, only the first
        time that turn is appended."""
        ...

    async def update_state(self, conversation: str, change: StateChange) -> ConversationState:
        """Read the state, apply `change` to it (a quick, synchronous function), write it back,
        atomically; returns the new state. Read-modify-write, so a tool that records a fact during a
        turn and the fold before it can never overwrite each other; a `change` that raises writes
        nothing."""
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

    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> None:
        if messages:
            await self.db.transaction(partial(_append, conversation, messages, turn_id))

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

    async def close(self) -> None:
        await self.db.close()


def _append(conversation: str, messages: list[Message], turn_id: str | None, db: sqlite3.Connection) -> None:
    """Append `messages` after the conversation's last one; nothing if `turn_id` was stored before."""
    if not messages:
        return
    last = db.execute(
        "SELECT COALESCE(MAX(seq), 0) FROM session_messages WHERE conversation = ?", (conversation,)
    ).fetchone()[0]
    now = time.time()
    if turn_id is not None:
        first = db.execute(
            "INSERT OR IGNORE INTO session_turns (conversation, turn_id, first_seq, messages, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (conversation, turn_id, last + 1, len(messages), now),
        )
        if first.rowcount == 0:
            return
    db.executemany(
        "INSERT INTO session_messages (conversation, seq, message, created_at) VALUES (?, ?, ?, ?)",
        [
            (conversation, last + i, json.dumps(redact_data(message), ensure_ascii=False), now)
            for i, message in enumerate(messages, start=1)
        ],
    )


def _read_state(db: sqlite3.Connection, conversation: str) -> ConversationState:
    row = db.execute("SELECT state FROM session_state WHERE conversation = ?", (conversation,)).fetchone()
    return ConversationState.from_json(row[0]) if row else ConversationState()


class InMemorySessionStore(SessionStore):
    """Conversations in a dict, least recently used forgotten beyond `max_conversations`."""

    def __init__(self, max_conversations: int = 10_000) -> None:
        self.max_conversations = max_conversations
        self._logs: OrderedDict[str, tuple[list[Message], ConversationState]] = OrderedDict()
        self._turns: dict[str, set[str]] = {}  # turn ids stored, by conversation

    def _entry(self, conversation: str) -> tuple[list[Message], ConversationState]:
        entry = self._logs.pop(conversation, None) or ([], ConversationState())
        self._logs[conversation] = entry  # most recently used last
        while len(self._logs) > self.max_conversations:
            forgotten, _ = self._logs.popitem(last=False)
            self._turns.pop(forgotten, None)
        return entry

    async def load(self, conversation: str) -> Conversation:
        log, state = self._entry(conversation)
        copy = ConversationState.from_json(state.to_json())  # callers must not change the stored one
        return Conversation(conversation, json.loads(json.dumps(log[state.folded :])), copy)

    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> None:
        log = self._entry(conversation)[0]
        stored = self._turns.setdefault(conversation, set())
        if turn_id is not None:
            if turn_id in stored:
                return
            stored.add(turn_id)
        log.extend(json.loads(json.dumps(redact_data(messages))))

    async def update_state(self, conversation: str, change: StateChange) -> ConversationState:
        log, state = self._entry(conversation)
        updated = ConversationState.from_json(state.to_json())
        change(updated)
        self._logs[conversation] = (log, updated)
        return ConversationState.from_json(updated.to_json())

    async def close(self) -> None:
        return None


__all__ = [
    "Conversation",
    "ConversationState",
    "Fold",
    "InMemorySessionStore",
    "SQLiteSessionStore",
    "SessionStore",
    "TurnAppend",
]
