"""Approvals and questions in PostgreSQL (tasks/pending.py's record): the console of any node lists
and decides them.

Every decision locks its row (`SELECT … FOR UPDATE`): two people deciding one approval on two
nodes at once get one decision and one "already decided". `expire_due` skips rows another node is
expiring (`FOR UPDATE SKIP LOCKED`), so each expired approval resumes its task once. A record is
created once per (task, call) — `ON CONFLICT DO NOTHING` — whichever node's run asks first.
"""

from __future__ import annotations

import builtins
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..kernel.approvals import APPROVAL_TTL, DecisionRefused, Pending, may_decide
from ..kernel.tools.permissions import Caller
from ..tasks.pending import _COLUMNS, _RECORDED, PendingRecords, _new_id, _pending, _row
from .database import PostgresDatabase
from .migrations import PENDING

if TYPE_CHECKING:
    from psycopg import AsyncConnection

_SELECT = f"SELECT {_COLUMNS} FROM pending"


class PostgresInteractions(PendingRecords):
    def __init__(self, url: str, *, approval_ttl: float = APPROVAL_TTL, now: Callable[[], float] = time.time,
                 database: PostgresDatabase | None = None) -> None:  # fmt: skip
        self.db = database or PostgresDatabase.shared(url)
        self.db.migrate("pending", PENDING)
        self.approval_ttl = approval_ttl
        self.now = now

    async def approval(self, task_id: str, call_id: str, tool: str, arguments: str, caller: Caller | None,
                       conversation: str | None) -> Pending:  # fmt: skip
        now, who = self.now(), caller or Caller()
        fresh = Pending(_new_id(), "approval", task_id, call_id, tool, arguments, who.user_id, who.channel,
                        conversation, now, now + self.approval_ttl)  # fmt: skip
        return await self._get_or_create(fresh, now)

    async def question(self, task_id: str, call_id: str, question: str, caller: Caller | None,
                       conversation: str | None) -> Pending:  # fmt: skip
        who = caller or Caller()
        fresh = Pending(_new_id(), "question", task_id, call_id, "clarify", question, who.user_id,
                        who.channel, conversation, self.now())  # fmt: skip
        return await self._get_or_create(fresh, self.now())

    async def _get_or_create(self, fresh: Pending, now: float) -> Pending:
        async def run(db: AsyncConnection) -> Pending:
            placeholders = ", ".join(["%s"] * 16)
            await db.execute(f"INSERT INTO pending ({_COLUMNS}) VALUES ({placeholders}) "
                             "ON CONFLICT DO NOTHING",
                             _row(fresh))  # fmt: skip
            found = await _one(db, f"{_SELECT} WHERE task_id = %s AND call_id = %s FOR UPDATE",
                               (fresh.task_id, fresh.call_id))  # fmt: skip
            assert found is not None
            if (
                found.id != fresh.id
                and found.open
                and found.expires_at is not None
                and found.expires_at <= now
            ):
                await _set_status(db, found, "expired", None, now)
            return found

        return await self.db.transaction(run)

    async def decide(self, pending_id: str, decider: Caller, approve: bool) -> Pending:
        now = self.now()

        async def run(db: AsyncConnection) -> tuple[Pending | None, str | None]:
            found = await _one(db, f"{_SELECT} WHERE id = %s FOR UPDATE", (pending_id,))
            if found is None or found.kind != "approval":
                return None, "approval_unknown"
            if not may_decide(found, decider):
                return found, "approval_not_allowed"
            if found.open and found.expires_at is not None and found.expires_at <= now:
                await _set_status(db, found, "expired", None, now)  # kept: a refusal must not roll it back
                return found, "approval_expired"
            if not found.open:
                return found, "approval_expired" if found.status == "expired" else "approval_already_decided"
            await _set_status(db, found, "approved" if approve else "rejected", decider.user_id, now)
            return found, None

        found, refusal = await self.db.transaction(run)
        if refusal is not None or found is None:
            raise DecisionRefused(refusal or "approval_unknown", found)
        return found

    async def answer(self, conversation: str, sender: str, text: str, *, channel: str) -> Pending | None:
        now = self.now()
        if not sender:
            return None

        async def run(db: AsyncConnection) -> Pending | None:
            found = await _one(
                db,
                f"{_SELECT} WHERE conversation = %s AND status = 'pending' AND kind = 'question' "
                "AND requested_by = %s AND channel = %s ORDER BY created_at DESC LIMIT 1 FOR UPDATE",
                (conversation, sender, channel),
            )
            if found is None:
                return None
            await db.execute("UPDATE pending SET answer = %s WHERE id = %s", (text, found.id))
            found.answer = text
            await _set_status(db, found, "answered", sender, now)
            return found

        return await self.db.transaction(run)

    async def expire_due(self, now: float | None = None) -> list[Pending]:
        when = self.now() if now is None else now

        async def run(db: AsyncConnection) -> list[Pending]:
            cursor = await db.execute(
                f"{_SELECT} WHERE status = 'pending' AND expires_at <= %s FOR UPDATE SKIP LOCKED", (when,)
            )
            expired = [_pending(row) for row in await cursor.fetchall()]
            for found in expired:
                await _set_status(db, found, "expired", None, when)
            return expired

        return await self.db.transaction(run)

    async def get(self, pending_id: str) -> Pending | None:
        return await self.db.transaction(lambda db: _one(db, f"{_SELECT} WHERE id = %s", (pending_id,)))

    async def open_for_task(self, task_id: str) -> list[Pending]:
        return await self._many(f"{_SELECT} WHERE task_id = %s AND status = 'pending' ORDER BY created_at",
                                (task_id,))  # fmt: skip

    async def list(self, status: str | None = "pending", limit: int = 100) -> list[Pending]:
        """For consoles: the most recent approvals and questions, optionally of one status."""
        where, args = ("WHERE status = %s", (status, limit)) if status else ("", (limit,))
        return await self._many(f"{_SELECT} {where} ORDER BY created_at DESC LIMIT %s", args)

    async def set_resume(self, task_id: str, resume: dict[str, Any]) -> None:
        payload = json.dumps(resume, ensure_ascii=False)

        async def run(db: AsyncConnection) -> None:
            await db.execute("UPDATE pending SET resume = %s WHERE task_id = %s AND status = 'pending'",
                             (payload, task_id))  # fmt: skip

        await self.db.transaction(run)

    async def record(self, pending: Pending) -> None:
        async def run(db: AsyncConnection) -> None:
            placeholders = ", ".join(["%s"] * 16)
            await db.execute(
                f"INSERT INTO pending ({_COLUMNS}) VALUES ({placeholders}) {_RECORDED}", _row(pending)
            )

        await self.db.transaction(run)

    async def _many(self, sql: str, args: tuple[Any, ...]) -> builtins.list[Pending]:
        async def run(db: AsyncConnection) -> builtins.list[Pending]:
            return [_pending(row) for row in await (await db.execute(sql, args)).fetchall()]

        return await self.db.transaction(run)

    async def close(self) -> None:
        await self.db.close()


async def _one(db: AsyncConnection, sql: str, args: tuple[Any, ...]) -> Pending | None:
    row = await (await db.execute(sql, args)).fetchone()
    return _pending(row) if row is not None else None


async def _set_status(db: AsyncConnection, p: Pending, status: str, by: str | None, now: float) -> None:
    await db.execute("UPDATE pending SET status = %s, decided_by = %s, decided_at = %s WHERE id = %s",
                     (status, by, now, p.id))  # fmt: skip
    p.status, p.decided_by, p.decided_at = status, by, now
