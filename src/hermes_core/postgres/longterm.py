"""Long-term memory in PostgreSQL (memory/longterm.py), found by PostgreSQL's full-text search.

The same outcomes, owners and examples as the SQLite `LongTermMemory`, which this class extends.
The searchable text is the one SQLite's FTS5 indexes — CJK runs rewritten as overlapping bigrams
(`_searchable`) — made a `tsvector` with the `english` configuration (stemmed: "reporting" finds
"make_report", as porter does in SQLite), task type and parameters weighted A and the result B, so
they count twice as much, as in the SQLite bm25 weights. User text is never a query: its terms
(letters and digits only) are quoted and OR-ed. Every query is filtered by owner in SQL.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..memory.longterm import (
    _TERM,
    MAX_QUERY_TERMS,
    RESULT_LIMIT,
    LongTermMemory,
    Outcome,
    _outcome,
    _searchable,
    _utc_now,
)
from .database import PostgresDatabase
from .migrations import LONGTERM

if TYPE_CHECKING:
    from psycopg import AsyncConnection

_COLUMNS = "id, owner, task_type, params, result, at"
_VECTOR = ("setweight(to_tsvector('english', %s), 'A') || setweight(to_tsvector('english', %s), 'A') || "
           "setweight(to_tsvector('english', %s), 'B')")  # fmt: skip
_WEIGHTS = "'{0, 0, 0.5, 1.0}'"  # D, C, B, A: the result half as much as task type and parameters


class PostgresLongTermMemory(LongTermMemory):
    def __init__(self, db: PostgresDatabase, *, clock: Callable[[], datetime] = _utc_now,
                 max_per_owner: int = 10_000) -> None:  # fmt: skip
        if max_per_owner < 1:
            raise ValueError("max_per_owner must be at least 1")
        self.pg = db
        self._clock = clock
        self.max_per_owner = max_per_owner
        db.migrate("longterm", LONGTERM)

    async def record(self, owner: str, task_type: str, params: Any, result: str) -> Outcome:
        at = self._clock()
        if at.tzinfo is None:
            raise ValueError("the clock must return timezone-aware datetimes")
        params_json = json.dumps(params, ensure_ascii=False, sort_keys=True, default=str)
        result = result[:RESULT_LIMIT]

        async def insert(db: AsyncConnection) -> int:
            row = await (
                await db.execute(
                    f"INSERT INTO longterm_outcomes (owner, task_type, params, result, at, search) "
                    f"VALUES (%s, %s, %s, %s, %s, {_VECTOR}) RETURNING id",
                    (owner, task_type, params_json, result, at.isoformat(),
                     *map(_searchable, (task_type, params_json, result))),
                )
            ).fetchone()  # fmt: skip
            await db.execute(
                "DELETE FROM longterm_outcomes WHERE owner = %s AND id <= (SELECT id FROM longterm_outcomes "
                "WHERE owner = %s ORDER BY id DESC LIMIT 1 OFFSET %s)",
                (owner, owner, self.max_per_owner),
            )
            assert row is not None  # RETURNING
            return int(row[0])

        outcome_id = await self.pg.transaction(insert)
        return Outcome(owner, task_type, json.loads(params_json), result, at, outcome_id)

    async def relevant(self, owner: str, query: str, k: int = 3) -> list[Outcome]:
        """The owner's `k` outcomes most relevant to `query`, best first (see LongTermMemory)."""
        if k <= 0:
            return []
        terms = list(dict.fromkeys(_TERM.findall(_searchable(query).lower())))[:MAX_QUERY_TERMS]
        if not terms:
            sql = f"SELECT {_COLUMNS} FROM longterm_outcomes WHERE owner = %s ORDER BY id DESC LIMIT %s"
            args: tuple[Any, ...] = (owner, k)
        else:
            sql = (
                f"SELECT {_COLUMNS} FROM longterm_outcomes, to_tsquery('english', %s) AS q "
                f"WHERE owner = %s AND search @@ q "
                f"ORDER BY ts_rank({_WEIGHTS}, search, q) DESC, id DESC LIMIT %s"
            )
            args = (" | ".join(f"'{term}'" for term in terms), owner, k)

        async def run(db: AsyncConnection) -> list[Any]:
            return await (await db.execute(sql, args)).fetchall()

        return [_outcome(*row) for row in await self.pg.statement(run)]

    async def forget(self, owner: str) -> int:
        """Delete everything remembered for `owner`; returns how many outcomes went."""

        async def run(db: AsyncConnection) -> int:
            return (await db.execute("DELETE FROM longterm_outcomes WHERE owner = %s", (owner,))).rowcount

        return await self.pg.transaction(run)

    async def prune(self, older_than: float) -> int:
        """Delete every outcome recorded before `older_than` (a UNIX time; `memory.retention_days`)."""

        async def run(db: AsyncConnection) -> int:
            sql = "DELETE FROM longterm_outcomes WHERE at::timestamptz < to_timestamp(%s)"
            return (await db.execute(sql, (older_than,))).rowcount

        return await self.pg.transaction(run)

    async def count(self, owner: str | None = None) -> int:
        """Outcomes remembered for `owner`, or for everyone."""
        where, args = ("WHERE owner = %s", (owner,)) if owner is not None else ("", ())

        async def run(db: AsyncConnection) -> int:
            row = await (await db.execute(f"SELECT count(*) FROM longterm_outcomes {where}", args)).fetchone()
            return int(row[0]) if row else 0

        return await self.pg.transaction(run)
