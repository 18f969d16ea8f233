"""The shared SQLite database: group commit keeps each job atomic on its own."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from hermes_core.storage import SQLiteDatabase


async def test_concurrent_jobs_commit_and_a_failing_job_is_rolled_back_alone(tmp_path: Path) -> None:
    db = SQLiteDatabase(tmp_path / "x.db")
    db.migrate("test", {1: "CREATE TABLE t (n INTEGER PRIMARY KEY)"})

    def insert(n: int):  # type: ignore[no-untyped-def]
        def job(conn: sqlite3.Connection) -> int:
            conn.execute("INSERT INTO t (n) VALUES (?)", (n,))
            if n % 10 == 3:
                conn.execute("INSERT INTO t (n) VALUES (?)", (n + 1000,))
                raise ValueError(f"job {n} fails after writing")
            return n

        return job

    results = await asyncio.gather(*(db.transaction(insert(n)) for n in range(200)), return_exceptions=True)
    failed = [r for r in results if isinstance(r, ValueError)]
    rows = await db.transaction(lambda conn: [n for (n,) in conn.execute("SELECT n FROM t ORDER BY n")])
    await db.close()
    assert len(failed) == 20 and rows == [n for n in range(200) if n % 10 != 3]  # no partial writes

    reopened = sqlite3.connect(tmp_path / "x.db")  # durable, and readable by anyone
    assert reopened.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 180


async def test_migrations_apply_once_per_component(tmp_path: Path) -> None:
    first = SQLiteDatabase(tmp_path / "x.db")
    first.migrate("a", {1: "CREATE TABLE a1 (x)", 2: "CREATE TABLE a2 (x)"})
    await first.close()
    second = SQLiteDatabase(tmp_path / "x.db")
    second.migrate("a", {1: "CREATE TABLE a1 (x)", 2: "CREATE TABLE a2 (x)", 3: "CREATE TABLE a3 (x)"})
    second.migrate("b", {1: "CREATE TABLE b1 (x)"})
    versions = await second.transaction(
        lambda c: dict(c.execute("SELECT component, version FROM schema_versions"))
    )
    await second.close()
    assert versions == {"a": 3, "b": 1}
    with pytest.raises(RuntimeError, match="closed"):
        await second.transaction(lambda c: None)
