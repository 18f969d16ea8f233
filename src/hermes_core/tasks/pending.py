"""Tasks that wait for a person: approvals (T5) and clarifying questions (T6).

A tool declared `confirm=True`, and every level-2 tool, does not run when the model calls it.
`ToolRegistry.execute` asks the agent's `Interactions` for the call's approval instead:

- none yet: a pending approval is recorded (tool, arguments, who asked, when, until when) and the
  call's outcome is `awaiting_approval`: the task stops there, its journal intact;
- approved: the call runs; rejected or expired: the model reads that, and decides what to do.

The `clarify` tool works the same way: its question is recorded and the task stops with
`awaiting_answer`; the asker's next message in that conversation becomes the answer.

An approval is found by its task and call id, and it covers exactly that call: the same tool
with the same arguments (`Pending.covers`). A later call of the task is a new call with a new id
and needs its own approval, whatever it resembles; a call that reuses an approved id for other
arguments is refused, never run (and the loop refuses a repeated call id before that).

Once a decision or an answer is in, the task is run again under the same task id. Its journal
replays everything up to the paused call, which now finds its decision: nothing runs twice and
the model is not asked again for what it already said. Only the person who started the task (the
same id on the same channel), or an admin, can decide, and only the asker's own answer counts: a
webhook caller who sends a Feishu user's open_id is someone else (kernel/tools/permissions.py). An
approval left undecided expires (10 minutes by default).

The record and the protocols are declared once in kernel/approvals.py; this module holds the SQLite
implementation. `SQLiteInteractions` persists all of this (the gateway's database);
`InlineInteractions` asks at once, in the terminal, and never pauses. `PendingRecords` is the
pending store of an engine that takes the decisions itself and keeps the records for the
approvals list (`engine: temporal`): one operation more, `record`.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from abc import abstractmethod
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..kernel.approvals import (
    APPROVAL_TTL,
    DecisionRefused,
    Interactions,
    Pending,
    PendingStore,
    may_decide,
)
from ..kernel.tools.permissions import Caller
from ..storage import SQLiteDatabase

__all__ = [
    "APPROVAL_TTL", "DecisionRefused", "InlineInteractions", "Interactions", "Pending", "PendingRecords",
    "PendingStore", "SQLiteInteractions", "may_decide",
]  # fmt: skip

MIGRATIONS = {
    1: """
    CREATE TABLE pending (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,                  -- approval | question
        task_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        arguments TEXT NOT NULL,             -- the call's arguments, or the question
        requested_by TEXT NOT NULL,
        channel TEXT NOT NULL,
        conversation TEXT,
        created_at REAL NOT NULL,
        expires_at REAL,
        status TEXT NOT NULL,                -- pending | approved | rejected | expired | answered
        decided_by TEXT,
        decided_at REAL,
        answer TEXT,
        resume TEXT,                         -- the message to run again once decided (JSON)
        UNIQUE (task_id, call_id)
    );
    CREATE INDEX pending_open ON pending (status, expires_at);
    CREATE INDEX pending_by_conversation ON pending (conversation, status);
    """,
}

_COLUMNS = (
    "id, kind, task_id, call_id, tool, arguments, requested_by, channel, conversation, created_at, "
    "expires_at, status, decided_by, decided_at, answer, resume"
)
# `PendingRecords.record`: what a record kept again changes
_RECORDED = (
    "ON CONFLICT (id) DO UPDATE SET status = excluded.status, decided_by = excluded.decided_by, "
    "decided_at = excluded.decided_at, answer = excluded.answer"
)


class PendingRecords(PendingStore):
    """A pending store that also keeps the records of pauses decided elsewhere: a workflow engine
    waits for the decision in the workflow that asked (engine/temporal/), and keeps its records
    here so that the approvals list shows them."""

    @abstractmethod
    async def record(self, pending: Pending) -> None:
        """Keep `pending` as its engine has it, atomically: inserted whole when its id is new; else
        only its `status`, `decided_by`, `decided_at` and `answer` are set from it (the request
        itself, and its `resume`, stay as first recorded). Recording it again changes nothing more."""


class SQLiteInteractions(PendingRecords):
    def __init__(self, path: str | Path, *, approval_ttl: float = APPROVAL_TTL,
                 now: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.db = SQLiteDatabase.shared(path)
        self.db.migrate("pending", MIGRATIONS)
        self.approval_ttl = approval_ttl
        self.now = now

    async def approval(self, task_id: str, call_id: str, tool: str, arguments: str, caller: Caller | None,
                       conversation: str | None) -> Pending:  # fmt: skip
        now = self.now()
        fresh = Pending(_new_id(), "approval", task_id, call_id, tool, arguments,
                        (caller or Caller()).user_id, (caller or Caller()).channel, conversation,
                        now, now + self.approval_ttl)  # fmt: skip
        return await self._get_or_create(fresh, now)

    async def question(self, task_id: str, call_id: str, question: str, caller: Caller | None,
                       conversation: str | None) -> Pending:  # fmt: skip
        who = caller or Caller()
        fresh = Pending(_new_id(), "question", task_id, call_id, "clarify", question, who.user_id,
                        who.channel, conversation, self.now())  # fmt: skip
        return await self._get_or_create(fresh, self.now())

    async def _get_or_create(self, fresh: Pending, now: float) -> Pending:
        def run(db: sqlite3.Connection) -> Pending:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM pending WHERE task_id = ? AND call_id = ?",
                (fresh.task_id, fresh.call_id),
            ).fetchone()
            if row is None:
                db.execute(f"INSERT INTO pending ({_COLUMNS}) VALUES ({', '.join('?' * 16)})", _row(fresh))
                return fresh
            found = _pending(row)
            if found.open and found.expires_at is not None and found.expires_at <= now:
                _set_status(db, found, "expired", None, now)
            return found

        return await self.db.transaction(run)

    async def decide(self, pending_id: str, decider: Caller, approve: bool) -> Pending:
        now = self.now()

        def run(db: sqlite3.Connection) -> tuple[Pending | None, str | None]:
            row = db.execute(f"SELECT {_COLUMNS} FROM pending WHERE id = ?", (pending_id,)).fetchone()
            found = _pending(row) if row is not None else None
            if found is None or found.kind != "approval":
                return None, "approval_unknown"
            if not may_decide(found, decider):
                return found, "approval_not_allowed"
            if found.open and found.expires_at is not None and found.expires_at <= now:
                _set_status(db, found, "expired", None, now)  # kept: a refusal must not roll it back
                return found, "approval_expired"
            if not found.open:
                return found, "approval_expired" if found.status == "expired" else "approval_already_decided"
            _set_status(db, found, "approved" if approve else "rejected", decider.user_id, now)
            return found, None

        found, refusal = await self.db.transaction(run)
        if refusal is not None or found is None:
            raise DecisionRefused(refusal or "approval_unknown", found)
        return found

    async def answer(self, conversation: str, sender: str, text: str, *, channel: str) -> Pending | None:
        now = self.now()
        if not sender:
            return None

        def run(db: sqlite3.Connection) -> Pending | None:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM pending WHERE conversation = ? AND status = 'pending' "
                "AND kind = 'question' AND requested_by = ? AND channel = ? ORDER BY created_at DESC LIMIT 1",
                (conversation, sender, channel),
            ).fetchone()
            if row is None:
                return None
            found = _pending(row)
            db.execute("UPDATE pending SET answer = ? WHERE id = ?", (text, found.id))
            found.answer = text
            _set_status(db, found, "answered", sender, now)
            return found

        return await self.db.transaction(run)

    async def expire_due(self, now: float | None = None) -> list[Pending]:
        when = self.now() if now is None else now

        def run(db: sqlite3.Connection) -> list[Pending]:
            rows = db.execute(
                f"SELECT {_COLUMNS} FROM pending WHERE status = 'pending' AND expires_at <= ?", (when,)
            ).fetchall()
            expired = [_pending(row) for row in rows]
            for found in expired:
                _set_status(db, found, "expired", None, when)
            return expired

        return await self.db.transaction(run)

    async def get(self, pending_id: str) -> Pending | None:
        row = await self.db.transaction(
            lambda db: db.execute(f"SELECT {_COLUMNS} FROM pending WHERE id = ?", (pending_id,)).fetchone()
        )
        return _pending(row) if row else None

    async def open_for_task(self, task_id: str) -> list[Pending]:
        rows = await self.db.transaction(
            lambda db: db.execute(
                f"SELECT {_COLUMNS} FROM pending WHERE task_id = ? AND status = 'pending' "
                "ORDER BY created_at",
                (task_id,),
            ).fetchall()
        )
        return [_pending(row) for row in rows]

    async def list(self, status: str | None = "pending", limit: int = 100) -> list[Pending]:
        """For consoles: the most recent approvals and questions, optionally of one status."""
        where, args = ("WHERE status = ?", (status, limit)) if status else ("", (limit,))
        rows = await self.db.transaction(
            lambda db: db.execute(
                f"SELECT {_COLUMNS} FROM pending {where} ORDER BY created_at DESC LIMIT ?", args
            ).fetchall()
        )
        return [_pending(row) for row in rows]

    async def set_resume(self, task_id: str, resume: dict[str, Any]) -> None:
        payload = json.dumps(resume, ensure_ascii=False)
        await self.db.transaction(
            lambda db: db.execute(
                "UPDATE pending SET resume = ? WHERE task_id = ? AND status = 'pending'", (payload, task_id)
            )
        )

    async def record(self, pending: Pending) -> None:
        await self.db.transaction(
            lambda db: db.execute(
                f"INSERT INTO pending ({_COLUMNS}) VALUES ({', '.join('?' * 16)}) {_RECORDED}", _row(pending)
            )
        )

    async def close(self) -> None:
        await self.db.close()


class InlineInteractions(Interactions):
    """Ask at once (a terminal's y/n prompt): the task waits in place and never pauses."""

    def __init__(self, confirm: Callable[[Pending], Awaitable[bool]],
                 ask: Callable[[str], Awaitable[str]], *, timeout: float = APPROVAL_TTL) -> None:  # fmt: skip
        self.confirm, self.ask, self.timeout = confirm, ask, timeout

    async def approval(self, task_id: str, call_id: str, tool: str, arguments: str, caller: Caller | None,
                       conversation: str | None) -> Pending:  # fmt: skip
        who = caller or Caller()
        pending = Pending(_new_id(), "approval", task_id, call_id, tool, arguments, who.user_id, who.channel)
        try:
            approved = await asyncio.wait_for(self.confirm(pending), self.timeout)
        except asyncio.TimeoutError:
            pending.status = "expired"
            return pending
        pending.status, pending.decided_by = ("approved" if approved else "rejected"), who.user_id
        return pending

    async def question(self, task_id: str, call_id: str, question: str, caller: Caller | None,
                       conversation: str | None) -> Pending:  # fmt: skip
        who = caller or Caller()
        pending = Pending(_new_id(), "question", task_id, call_id, "clarify", question, who.user_id)
        pending.answer, pending.status = await self.ask(question), "answered"
        return pending

    # It keeps nothing: a trace that reads back a task's pauses finds none.
    async def get(self, pending_id: str) -> Pending | None:
        return None

    async def open_for_task(self, task_id: str) -> list[Pending]:
        return []


def _new_id() -> str:
    return "ap_" + uuid.uuid4().hex[:16]


def _row(p: Pending) -> tuple[Any, ...]:
    resume = json.dumps(p.resume, ensure_ascii=False) if p.resume is not None else None
    return (p.id, p.kind, p.task_id, p.call_id, p.tool, p.arguments, p.requested_by, p.channel,
            p.conversation, p.created_at, p.expires_at, p.status, p.decided_by, p.decided_at, p.answer,
            resume)  # fmt: skip


def _pending(row: tuple[Any, ...]) -> Pending:
    values = list(row)
    values[15] = json.loads(values[15]) if values[15] else None
    return Pending(*values)


def _set_status(db: sqlite3.Connection, p: Pending, status: str, by: str | None, now: float) -> None:
    db.execute(
        "UPDATE pending SET status = ?, decided_by = ?, decided_at = ? WHERE id = ?", (status, by, now, p.id)
    )
    p.status, p.decided_by, p.decided_at = status, by, now
