"""One SQLite database file, written from one thread, with per-component schema migrations.

WAL and synchronous=FULL: a committed transaction survives a power cut. Every write runs on a
single writer thread, so the event loop never waits on fsync and writers never race. Components
(gateway, sessions, memory, journal) share the file while each versions its own tables.

Group commit: the writer takes every job waiting in its queue, runs each inside its own SAVEPOINT
of one BEGIN IMMEDIATE transaction, and commits once. One fsync then serves many concurrent turns,
so an inbox write (which an acknowledgement waits for) never queues behind a long line of
separate fsyncs. A job that raises is rolled back to its savepoint alone; its caller gets the error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import sqlite3
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_shared: dict[Path, SQLiteDatabase] = {}
_shared_lock = threading.Lock()


class SQLiteDatabase:
    MAX_BATCH = 256

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._db: sqlite3.Connection | None = None
        self._users = 0
        self._thread = threading.Thread(target=self._serve, name="hermes-sqlite", daemon=True)
        self._thread.start()
        self._call(lambda db: None)  # opened (or failed to open) on the writer thread

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

    def _open(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions "
            "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        return db

    def _serve(self) -> None:
        try:
            self._db = self._open()
        except BaseException as exc:  # reported to whoever waits first
            self._open_error: BaseException | None = exc
        else:
            self._open_error = None
        while True:
            job = self._jobs.get()
            if job is None:
                break
            batch = [job]
            while len(batch) < self.MAX_BATCH:
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)  # stop after this batch
                    break
                batch.append(more)
            self._run_batch(batch)
        if self._db is not None:
            self._db.close()
            self._db = None
        while True:  # anything queued while closing fails instead of waiting forever
            try:
                late = self._jobs.get_nowait()
            except queue.Empty:
                break
            if late is not None and late.future.set_running_or_notify_cancel():
                late.future.set_exception(RuntimeError(f"the database {self.path} is closed"))

    def _run_batch(self, batch: list[_Job]) -> None:
        if self._db is None:
            error = self._open_error or RuntimeError(f"the database {self.path} is closed")
            for job in batch:
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(error)
            return
        db = self._db
        results: list[tuple[_Job, bool, Any]] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            for job in batch:
                if not job.future.set_running_or_notify_cancel():
                    continue  # its caller is gone (cancelled): nothing waits for this write
                db.execute("SAVEPOINT job")
                try:
                    value = job.fn(db)
                except BaseException as exc:
                    db.execute("ROLLBACK TO job")
                    db.execute("RELEASE job")
                    results.append((job, False, exc))
                else:
                    db.execute("RELEASE job")
                    results.append((job, True, value))
            db.execute("COMMIT")
        except BaseException as exc:  # the commit itself failed: nothing of the batch is durable
            if db.in_transaction:
                db.execute("ROLLBACK")
            for job in batch:
                if job.future.running():
                    job.future.set_exception(exc)
            return
        for job, ok, value in results:
            if ok:
                job.future.set_result(value)
            else:
                job.future.set_exception(value)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if not self._thread.is_alive():
            raise RuntimeError(f"the database {self.path} is closed")
        job = _Job(fn, concurrent.futures.Future())
        self._jobs.put(job)
        return job.future.result()

    def migrate(self, component: str, migrations: Mapping[int, str]) -> None:
        """Apply the component's migrations above its recorded version (before the database is busy)."""

        def apply(db: sqlite3.Connection) -> None:
            row = db.execute(
                "SELECT version FROM schema_versions WHERE component = ?", (component,)
            ).fetchone()
            current = row[0] if row else 0
            for version in sorted(v for v in migrations if v > current):
                for statement in filter(str.strip, migrations[version].split(";")):
                    db.execute(statement)
                db.execute(
                    "INSERT INTO schema_versions (component, version) VALUES (?, ?) "
                    "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                    (component, version),
                )

        self._call(apply)

    async def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(connection)` atomically on the writer thread; durable when this returns."""
        if not self._thread.is_alive():
            raise RuntimeError(f"the database {self.path} is closed")
        job = _Job(fn, concurrent.futures.Future())
        self._jobs.put(job)
        return await asyncio.wrap_future(job.future)

    def transaction_sync(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """The same, from synchronous code (never from the event loop's thread)."""
        return self._call(fn)

    async def close(self) -> None:
        """Release one user; the connection closes when the last user of a shared database leaves."""
        self._users = max(0, self._users - 1)
        if self._users:
            return
        self._jobs.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        with _shared_lock:
            if _shared.get(self.path.resolve()) is self:
                del _shared[self.path.resolve()]


@dataclass
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    future: concurrent.futures.Future[Any]
