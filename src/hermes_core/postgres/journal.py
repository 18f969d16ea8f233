"""Task journals in PostgreSQL (tasks/journal.py's seam): a turn resumed on any node replays them.

An entry is written by one statement (`_FENCED`, or `_UNFENCED` outside a claim; one round trip:
the journal is written several times a turn, and a transaction around it took five): numbered
after the task's last entry, and when two writers of one task (parallel tool calls; a turn taken
up by another node after a lease expired) take the same number, the one that comes second
inserts nothing and tries again with the next. `prune` deletes whole tasks, never a part. A write
of a turn running under a claim is fenced (tasks/fence.py): the same statement reads the claim
row `FOR SHARE` — it must still carry this node and epoch, or nothing is written and `ClaimLost`
is raised — and holds it until the entry is committed, so a node taking the conversation over
waits for the write and then reads it.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from ..tasks.fence import CURRENT_FENCE, ClaimLost
from ..tasks.journal import JournalEntry, TaskJournal
from .database import PostgresDatabase
from .migrations import JOURNAL

if TYPE_CHECKING:
    from psycopg import AsyncConnection

_INSERT = """
INSERT INTO task_journal (task_id, seq, kind, data, at)
SELECT %(task)s, next.seq, %(kind)s, %(data)s, %(at)s FROM (
    SELECT COALESCE(MAX(seq), 0) + 1 AS seq FROM task_journal WHERE task_id = %(task)s
) AS next WHERE EXISTS (SELECT 1 FROM held)
ON CONFLICT (task_id, seq) DO NOTHING RETURNING seq
"""
# a turn under a claim: the claim row still this node's and epoch's, held until the entry commits
_FENCED = f"""
WITH held AS (
    SELECT 1 FROM turn_claims WHERE conversation = %(conversation)s AND node = %(node)s
        AND epoch = %(epoch)s FOR SHARE
), written AS ({_INSERT})
SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM written)
"""
_UNFENCED = f"WITH held AS (SELECT 1), written AS ({_INSERT}) SELECT 1, (SELECT count(*) FROM written)"


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

        return [JournalEntry(kind, json.loads(data)) for kind, data in await self.db.statement(read)]

    async def append(self, task_id: str, kind: str, data: dict[str, Any]) -> None:
        fence = CURRENT_FENCE.get()
        values = {
            "task": task_id, "kind": kind, "data": json.dumps(data, ensure_ascii=False), "at": time.time(),
            "conversation": fence.conversation if fence else "",
            "node": fence.node if fence else "", "epoch": fence.epoch if fence else 0,
        }  # fmt: skip
        statement = _FENCED if fence is not None else _UNFENCED  # no claims table without a gateway

        async def insert(db: AsyncConnection) -> tuple[int, int]:
            row = await (await db.execute(statement, values)).fetchone()
            assert row is not None
            return int(row[0]), int(row[1])

        while True:
            held, written = await self.db.statement(insert)
            if not held:  # a turn whose claim another node took writes nothing
                assert fence is not None
                raise ClaimLost(fence)
            if written:
                return

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
