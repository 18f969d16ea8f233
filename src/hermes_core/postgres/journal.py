"""Task journals in PostgreSQL (tasks/journal.py's seam): a turn resumed on any node replays them.

Entries are numbered per task under a transaction-scoped advisory lock on the task id, so two
writers of one task (a turn taken up by another node after a lease expired) never collide on a
number; `prune` deletes whole tasks, never a part. A write of a turn running under a claim is
fenced (tasks/fence.py): checked, in its transaction, against the claim's epoch, and refused
(`ClaimLost`) once another node has taken the conversation.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from ..tasks.journal import JournalEntry, TaskJournal
from .database import PostgresDatabase
from .fence import hold_claim
from .migrations import JOURNAL

if TYPE_CHECKING:
    from psycopg import AsyncConnection


class PostgresTaskJournal(TaskJournal):
    def __init__(self, url: str, *, database: PostgresDatabase | None = None) -> None:
        self.db = database or PostgresDatabase.shared(url)
        self.db.migrate("journal", JOURNAL)

    async def entries(self, task_id: str) -> list[JournalEntry]:
        async def read(db: AsyncConnection) -> list[Any]:
            cursor = await db.execute(
                "SELECT kind, data FROM task_journal WHERE task_id = %s ORDER BY seq", (task_id,)
            )
            return await cursor.fetchall()

        return [JournalEntry(kind, json.loads(data)) for kind, data in await self.db.transaction(read)]

    async def append(self, task_id: str, kind: str, data: dict[str, Any]) -> None:
        payload = json.dumps(data, ensure_ascii=False)

        async def insert(db: AsyncConnection) -> None:
            await hold_claim(db)  # a turn whose claim another node took writes nothing (ClaimLost)
            await db.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ("journal:" + task_id,))
            await db.execute(
                "INSERT INTO task_journal (task_id, seq, kind, data, at) "
                "SELECT %s, COALESCE(MAX(seq), 0) + 1, "
                "%s, %s, %s FROM task_journal WHERE task_id = %s",
                (task_id, kind, payload, time.time(), task_id),
            )

        await self.db.transaction(insert)

    async def prune(self, older_than: float) -> None:
        """Forget the tasks whose last entry is older than `older_than`: whole tasks, never a part."""

        async def delete(db: AsyncConnection) -> None:
            await db.execute(
                "DELETE FROM task_journal WHERE task_id IN "
                "(SELECT task_id FROM task_journal GROUP BY task_id HAVING MAX(at) < %s)",
                (older_than,),
            )

        await self.db.transaction(delete)

    async def close(self) -> None:
        await self.db.close()
