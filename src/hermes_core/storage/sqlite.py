"""One SQLite database file, written from one thread, with per-component schema migrations.

WAL and synchronous=FULL: a committed transaction survives a power cut. Every write runs in
BEGIN IMMEDIATE on a single writer thread, so the event loop never waits on fsync and writers never
race. Components (gateway, sessions, memory, journal) share the file — and so can share a
transaction boundary — while each versions its own tables.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_shared: dict[Path, SQLiteDatabase] = {}
_shared_lock = threading.Lock()


class SQLiteDatabase:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hermes-sqlite")
        self._db: sqlite3.Connection | None = None
        self._users = 0
        self._writer.submit(self._open).result()

    @classmethod
    def shared(cls, path: str | Path) -> SQLiteDatabase:
        """The one open database for this file in this process (opened on first use)."""
        key = Path(path).resolve()
        with _shared_lock:
            database = _shared.get(key)
            if database is None or database._db is None:
                database = _shared[key] = cls(key)
            database._users += 1
            return database

    def _open(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions "
            "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        self._db = db

    def migrate(self, component: str, migrations: Mapping[int, str]) -> None:
        """Apply the component's migrations above its recorded version, each in one transaction."""

        def apply(db: sqlite3.Connection) -> None:
            row = db.execute(
                "SELECT version FROM schema_versions WHERE component = ?", (component,)
            ).fetchone()
            current = row[0] if row else 0
            for version in sorted(v for v in migrations if v > current):
                db.execute("BEGIN IMMEDIATE")
                try:
                    for statement in filter(str.strip, migrations[version].split(";")):
                        db.execute(statement)
                    db.execute(
                        "INSERT INTO schema_versions (component, version) VALUES (?, ?) "
                        "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                        (component, version),
                    )
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise

        self._writer.submit(lambda: apply(self._connection())).result()

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError(f"the database {self.path} is closed")
        return self._db

    def _transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        db = self._connection()
        db.execute("BEGIN IMMEDIATE")
        try:
            result = fn(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return result

    async def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(connection)` in one write transaction on the writer thread."""
        return await asyncio.get_running_loop().run_in_executor(self._writer, self._transaction, fn)

    def transaction_sync(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """The same, from synchronous code (never from the event loop's thread)."""
        return self._writer.submit(self._transaction, fn).result()

    async def close(self) -> None:
        """Release one user; the connection closes when the last user of a shared database leaves."""
        self._users = max(0, self._users - 1)
        if self._users:
            return

        def close() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.get_running_loop().run_in_executor(self._writer, close)
        self._writer.shutdown(wait=False)
        with _shared_lock:
            if _shared.get(self.path.resolve()) is self:
                del _shared[self.path.resolve()]
