"""Traces in PostgreSQL (observe/traces.py's seam): the console of any node shows every task.

The same record and summaries as `SQLiteTraceStore`. A record stored again under its task id
replaces the earlier one (`ON CONFLICT DO UPDATE`, its tool rows with it), in one statement
(`_RECORD`: one round trip, where a transaction of three statements took five).
"""

from __future__ import annotations

import builtins
import json
from typing import TYPE_CHECKING, Any, cast

from ..kernel.redaction import redact_data
from ..observe.traces import REPLY_SUMMARY_CHARS, TraceStore, TraceSummary, clip, is_failure
from .database import PostgresDatabase
from .migrations import TRACES

if TYPE_CHECKING:
    from psycopg import AsyncConnection

_COLUMNS = ("task_id", "conversation", "input", "started_at", "finished_at", "stop_reason", "ok", "failed",
            "reply", "model_calls", "tool_names", "tokens", "data")  # fmt: skip
_SUMMARY = ("task_id", "conversation", "input", "started_at", "finished_at", "stop_reason", "ok", "reply",
            "model_calls", "tool_names", "tokens")  # fmt: skip
# the trace, then its tool rows: the names it no longer has deleted, the new ones added (a row of
# trace_tools is checked against its trace at the statement's end, when the trace is in)
_RECORD = f"""
WITH stored AS (
    INSERT INTO traces ({", ".join(_COLUMNS)}) VALUES ({", ".join(f"%({c})s" for c in _COLUMNS)})
    ON CONFLICT (task_id) DO UPDATE SET {", ".join(f"{c} = excluded.{c}" for c in _COLUMNS[1:])}
    RETURNING task_id
), gone AS (
    DELETE FROM trace_tools WHERE task_id = %(task_id)s AND tool <> ALL(%(tools)s::text[])
)
INSERT INTO trace_tools (tool, task_id)
SELECT tool, stored.task_id FROM stored, unnest(%(tools)s::text[]) AS tool ON CONFLICT DO NOTHING
"""  # noqa: S608 (column names only)


class PostgresTraceStore(TraceStore):
    def __init__(self, url: str, *, database: PostgresDatabase | None = None) -> None:
        self.db = database or PostgresDatabase.shared(url)
        self.db.migrate("traces", TRACES)

    async def record(self, trace: dict[str, Any]) -> None:
        trace = redact_data(trace)
        names = list(dict.fromkeys(str(call["name"]) for call in trace.get("tool_calls") or []))
        row = (
            trace["task_id"], trace.get("conversation"), trace.get("input") or "", trace["started_at"],
            trace.get("finished_at"), trace.get("stop_reason") or "", bool(trace.get("ok")),
            is_failure(trace),
            trace.get("reply") or "", len(trace.get("model_calls") or []),
            json.dumps(names, ensure_ascii=False),
            int((trace.get("usage") or {}).get("total_tokens", 0)), json.dumps(trace, ensure_ascii=False),
        )  # fmt: skip
        values = {**dict(zip(_COLUMNS, row, strict=True)), "tools": names}

        async def write(db: AsyncConnection) -> None:
            await db.execute(_RECORD, values)

        await self.db.statement(write)

    async def get(self, task_id: str) -> dict[str, Any] | None:
        rows = await self._rows("SELECT data FROM traces WHERE task_id = %s", (task_id,))
        return json.loads(rows[0][0]) if rows else None

    async def ids_starting(self, prefix: str, limit: int = 10) -> builtins.list[str]:
        """The task ids that begin with `prefix` (a pasted part of one), at most `limit`, sorted."""
        query = "SELECT task_id FROM traces WHERE left(task_id, %s) = %s ORDER BY task_id LIMIT %s"
        return [row[0] for row in await self._rows(query, (len(prefix), prefix, limit))]

    async def list(
        self,
        *,
        failed: bool | None = None,
        conversation: str | None = None,
        tool: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
    ) -> builtins.list[TraceSummary]:
        where, args = ["TRUE"], []
        for clause, value in (
            ("failed = %s", failed),
            ("conversation = %s", conversation),
            ("task_id IN (SELECT task_id FROM trace_tools WHERE tool = %s)", tool),
            ("started_at >= %s", since),
            ("started_at < %s", until),
        ):
            if value is not None:
                where.append(clause)
                args.append(value)
        query = (
            f"SELECT {', '.join(_SUMMARY)} FROM traces WHERE {' AND '.join(where)} "
            "ORDER BY started_at DESC LIMIT %s"
        )
        summaries = [dict(zip(_SUMMARY, row, strict=True)) for row in await self._rows(query, (*args, limit))]
        for summary in summaries:
            summary["tool_names"] = json.loads(summary["tool_names"])
            summary["reply"] = clip(summary["reply"], REPLY_SUMMARY_CHARS)
        return [cast(TraceSummary, summary) for summary in summaries]

    async def prune(self, older_than: float) -> None:
        """Forget the tasks started before `older_than` (their tool rows go with them)."""

        async def delete(db: AsyncConnection) -> None:
            await db.execute("DELETE FROM traces WHERE started_at < %s", (older_than,))

        await self.db.transaction(delete)

    async def _rows(self, sql: str, args: tuple[Any, ...]) -> builtins.list[Any]:
        async def run(db: AsyncConnection) -> builtins.list[Any]:
            return await (await db.execute(sql, args)).fetchall()

        return await self.db.transaction(run)

    async def close(self) -> None:
        await self.db.close()
