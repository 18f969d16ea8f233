"""Long-term memory: past task outcomes, found again by full-text search and offered as dated examples.

What is remembered is small and structured — task type, key parameters, result, when — in one SQLite
table, with an FTS5 index beside it; no vector database. Search ranks with FTS5's bm25, task type
and parameters weighted above the result text, because "which task, with what arguments" is what a
new request most often repeats. Every query is filtered by owner in SQL, so one user's past never
reaches another user's prompt. The index also holds a one-token key per owner that each search
ANDs in, so FTS5 skips other owners' postings instead of scoring them (2-4x faster with 30 owners,
more with more); the SQL filter, not the key, is what guarantees the isolation.

Tokenizer: `unicode61` (with `porter` stemming) over text in which runs of CJK characters are
rewritten as overlapping bigrams ("华东地区" → "华东 东地 地区"), both when indexing and when
querying. FTS5's `trigram` tokenizer (SQLite ≥ 3.34) was tried and rejected: it cannot match a
query term shorter than three characters, and the commonest Chinese words — 华东, 上海, 销售 — have
two. Bigrams are the classic CJK indexing scheme (Lucene's CJKAnalyzer), need no SQLite version
check, and keep the database file readable by any SQLite with FTS5.

User text is never an FTS query: it is cut into word and bigram terms, each double-quoted, OR-ed
together, so quotes, AND/OR/NEAR, `*`, `:` and parentheses are plain words or nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..kernel.messages import JSON
from ..storage import SQLiteDatabase

MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE longterm_outcomes (
        id INTEGER PRIMARY KEY,          -- grows with insertion: orders outcomes even if the clock jumps
        owner TEXT NOT NULL,
        task_type TEXT NOT NULL,
        params TEXT NOT NULL,            -- JSON
        result TEXT NOT NULL,
        at TEXT NOT NULL                 -- ISO 8601 with its UTC offset
    );
    CREATE INDEX longterm_outcomes_by_owner ON longterm_outcomes (owner, id);
    CREATE VIRTUAL TABLE longterm_fts USING fts5 (
        owner, task_type, params, result, tokenize = 'porter unicode61 remove_diacritics 2'
    )
    """,
}

RESULT_LIMIT = 2_000  # characters kept of a result: memory is a hint, not an archive
MAX_QUERY_TERMS = 64  # a pasted essay must not become a thousand-term OR
# bm25 column weights: owner (a filter, not a relevance signal), task_type, params, result.
_WEIGHTS = "0.0, 2.0, 2.0, 1.0"
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+")
_TERM = re.compile(r"[^\W_]+")  # letters and digits; everything else separates terms
_EXAMPLES = {  # language: (header, one example)
    "en": (
        "Past results of this user's tasks, for reference only — they may be outdated; "
        "look current facts up again:",
        "- On {date} you did {task_type} with {params} → result: {result}",
    ),
    "zh": (
        "以下是该用户过去任务的结果，仅供参考，可能已过时；涉及当前数据时请重新查询：",
        "- {date} 你执行过 {task_type}，参数 {params}，结果：{result}",
    ),
}
_COLUMNS = "o.id, o.owner, o.task_type, o.params, o.result, o.at"  # the order of _outcome()'s arguments


@dataclass
class Outcome:
    """One finished task, as remembered for one owner."""

    owner: str  # the user/chat key (e.g. "feishu:ou_x"); memories never cross owners
    task_type: str  # e.g. "query_sales+make_report" (sorted tool names joined by "+")
    params: JSON  # key parameters (JSON-serialisable: the tools' arguments)
    result: str  # what came out (the reply, truncated)
    at: datetime  # when (timezone-aware)
    id: int | None = None


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class LongTermMemory:
    """Past outcomes per owner in the shared SQLite file (component "longterm")."""

    def __init__(
        self,
        db: SQLiteDatabase,
        *,
        clock: Callable[[], datetime] = _utc_now,
        max_per_owner: int = 10_000,
    ) -> None:
        if max_per_owner < 1:
            raise ValueError("max_per_owner must be at least 1")
        self.db = db
        self._clock = clock
        self.max_per_owner = max_per_owner
        db.migrate("longterm", MIGRATIONS)

    async def record(self, owner: str, task_type: str, params: JSON, result: str) -> Outcome:
        """Remember an outcome; the owner's oldest ones go once there are more than `max_per_owner`.

        Parameters that are not JSON (a datetime, say) are stored as their str(): recording a
        memory must never fail the turn that produced it.
        """
        at = self._clock()
        if at.tzinfo is None:
            raise ValueError("the clock must return timezone-aware datetimes")
        params_json = json.dumps(params, ensure_ascii=False, sort_keys=True, default=str)
        result = result[:RESULT_LIMIT]

        def insert(conn: sqlite3.Connection) -> int | None:
            outcome_id = conn.execute(
                "INSERT INTO longterm_outcomes (owner, task_type, params, result, at) VALUES (?, ?, ?, ?, ?)",
                (owner, task_type, params_json, result, at.isoformat()),
            ).lastrowid
            conn.execute(
                "INSERT INTO longterm_fts (rowid, owner, task_type, params, result) VALUES (?, ?, ?, ?, ?)",
                (outcome_id, _owner_key(owner), *map(_searchable, (task_type, params_json, result))),
            )
            newest_evicted = conn.execute(
                "SELECT id FROM longterm_outcomes WHERE owner = ? ORDER BY id DESC LIMIT 1 OFFSET ?",
                (owner, self.max_per_owner),
            ).fetchone()
            if newest_evicted is not None:
                _delete(conn, "owner = ? AND id <= ?", (owner, newest_evicted[0]))
            return outcome_id

        outcome_id = await self.db.transaction(insert)
        return Outcome(owner, task_type, json.loads(params_json), result, at, outcome_id)

    async def relevant(self, owner: str, query: str, k: int = 3) -> list[Outcome]:
        """The owner's `k` outcomes most relevant to `query`, best first (ties: most recent first).

        A query with no usable terms ("👍", "?", "") carries no signal, so the owner's most recent
        outcomes are the best guess. A query whose terms match nothing returns nothing: the text
        says what the user wants, and none of the past is about it.
        """
        if k <= 0:
            return []
        match = _fts_query(query)
        if match is None:
            sql = f"SELECT {_COLUMNS} FROM longterm_outcomes o WHERE o.owner = ? ORDER BY o.id DESC LIMIT ?"
            args: tuple[Any, ...] = (owner, k)
        else:
            sql = (
                f"SELECT {_COLUMNS} FROM longterm_fts JOIN longterm_outcomes o ON o.id = longterm_fts.rowid "
                f"WHERE longterm_fts MATCH ? AND o.owner = ? "
                f"ORDER BY bm25(longterm_fts, {_WEIGHTS}), o.id DESC LIMIT ?"
            )
            args = (f'owner:"{_owner_key(owner)}" AND ({match})', owner, k)
        rows = await self.db.transaction(lambda conn: conn.execute(sql, args).fetchall())
        return [_outcome(*row) for row in rows]

    def format_examples(self, outcomes: list[Outcome], language: str = "en") -> str:
        """Dated examples for the turn's context ("en", or "zh" for Chinese); "" when there are none.

        Each line carries its date and the header says the results may be outdated, so the model
        treats "East China sold 1.2M" as what was true then — not as today's figure.
        """
        if not outcomes:
            return ""
        header, example = _EXAMPLES["zh" if language.lower().startswith("zh") else "en"]
        examples = [
            example.format(
                date=outcome.at.date().isoformat(),
                task_type=outcome.task_type,
                params=_shorten(json.dumps(outcome.params, ensure_ascii=False, default=str), 120),
                result=_shorten(outcome.result, 160),
            )
            for outcome in outcomes
        ]
        return "\n".join([header, *examples])

    async def forget(self, owner: str) -> int:
        """Delete everything remembered for `owner`; returns how many outcomes went."""
        return await self.db.transaction(lambda conn: _delete(conn, "owner = ?", (owner,)))

    async def prune(self, older_than: float) -> int:
        """Delete every outcome recorded before `older_than` (a UNIX time; `memory.retention_days`)."""
        where = "CAST(strftime('%s', at) AS REAL) < ?"  # `at` is ISO 8601 with its offset
        return await self.db.transaction(lambda conn: _delete(conn, where, (older_than,)))

    async def count(self, owner: str | None = None) -> int:
        """Outcomes remembered for `owner`, or for everyone."""
        where, args = ("WHERE owner = ?", (owner,)) if owner is not None else ("", ())
        sql = f"SELECT count(*) FROM longterm_outcomes {where}"
        return int(await self.db.transaction(lambda conn: conn.execute(sql, args).fetchone()[0]))


def _fts_query(text: str) -> str | None:
    """A safe FTS5 query for arbitrary user text: its distinct terms, quoted and OR-ed; None if none."""
    terms = dict.fromkeys(_TERM.findall(_searchable(text).lower()))  # ordered, deduplicated
    return " OR ".join(f'"{term}"' for term in list(terms)[:MAX_QUERY_TERMS]) or None


def _owner_key(owner: str) -> str:
    """One letters-and-digits token per owner, whatever characters the owner's key holds."""
    return "k" + hashlib.blake2b(owner.encode(), digest_size=10).hexdigest()


def _searchable(text: str) -> str:
    """Rewrite CJK runs as overlapping bigrams, so unicode61 indexes Chinese by two-character pieces."""

    def bigrams(run: re.Match[str]) -> str:
        chars = run.group()
        pieces = [chars[i : i + 2] for i in range(len(chars) - 1)] or [chars]
        return f" {' '.join(pieces)} "

    return _CJK_RUN.sub(bigrams, text)


def _delete(conn: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> int:
    conn.execute(
        f"DELETE FROM longterm_fts WHERE rowid IN (SELECT id FROM longterm_outcomes WHERE {where})", args
    )
    return conn.execute(f"DELETE FROM longterm_outcomes WHERE {where}", args).rowcount


def _outcome(outcome_id: int, owner: str, task_type: str, params: str, result: str, at: str) -> Outcome:
    return Outcome(owner, task_type, json.loads(params), result, datetime.fromisoformat(at), outcome_id)


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())  # one line per example, whatever the result's layout
    return text if len(text) <= limit else text[: limit - 1] + "…"
