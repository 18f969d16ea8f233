"""One SQLite database file, written from one thread, with per-component schema migrations.

WAL and synchronous=FULL: a committed transaction survives a power cut. Every write runs on a
single writer thread, so the event loop never waits on fsync and writers never race. Components
(gateway, sessions, memory, journal) share the file while each versions its own tables.

Group commit: the writer takes every job waiting in its queue, runs each inside its own SAVEPOINT
of one BEGIN IMMEDIATE transaction, and commits once. One fsync then serves many concurrent turns,
so an inbox write (which an acknowledgement waits for) never queues behind a long line of
separate fsyncs. A job that raises is rolled back to its savepoint alone; its caller gets the error.

Two queues: `transaction(fn, urgent=True)` is for writes a caller on the network waits for (the
inbox insert an acknowledgement waits for). The writer takes urgent jobs first and commits them in
a batch of their own; a batch of ordinary jobs (a turn's journal, session, trace and outbox writes)
stops taking more as soon as an urgent job is waiting, commits what it has, and lets the urgent
ones go next. So an accept never waits behind a long line of turn writes — at most behind the one
ordinary job already running. Order within each queue is kept; the two queues touch separate facts
(an accept inserts new rows, nothing queued behind it can depend on them).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sqlite3
import threading
from collections import deque
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
        self._urgent: deque[_Job] = deque()
        self._jobs: deque[_Job] = deque()
        self._ready = threading.Condition()
        self._closing = False  # set by close(): the writer stops once both queues are empty
        self._closed = False  # set by the writer when it stopped: new jobs fail at once
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
        while self._wait_for_work():
            self._run_batch()
        if self._db is not None:
            self._db.close()
            self._db = None

    def _wait_for_work(self) -> bool:
        """Block until a job is queued; False once closing with nothing left (the writer then stops)."""
        with self._ready:
            while not self._urgent and not self._jobs:
                if self._closing:
                    self._closed = True
                    return False
                self._ready.wait()
            return True

    def _next(self, urgent_batch: bool, taken: int) -> _Job | None:
        """The next job of the running batch: an urgent batch takes only urgent jobs; an ordinary
        one stops at MAX_BATCH or as soon as an urgent job waits (it then goes first)."""
        with self._ready:
            if urgent_batch:
                return self._urgent.popleft() if self._urgent and taken < self.MAX_BATCH else None
            if self._urgent or not self._jobs or taken >= self.MAX_BATCH:
                return None
            return self._jobs.popleft()

    def _put(self, job: _Job, urgent: bool) -> None:
        with self._ready:
            if self._closed or not self._thread.is_alive():
                raise RuntimeError(f"the database {self.path} is closed")
            (self._urgent if urgent else self._jobs).append(job)
            self._ready.notify()

    def _run_batch(self) -> None:
        with self._ready:
            urgent_batch = bool(self._urgent)
        first = self._next(urgent_batch, 0)
        if first is None:
            return
        if self._db is None:
            error = self._open_error or RuntimeError(f"the database {self.path} is closed")
            job: _Job | None = first
            while job is not None:
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(error)
                job = self._next(urgent_batch, 0)
            return
        db = self._db
        batch: list[_Job] = []
        results: list[tuple[_Job, bool, Any]] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            job = first
            while job is not None:
                batch.append(job)
                if job.future.set_running_or_notify_cancel():  # else its caller is gone (cancelled)
                    results.append(self._run_job(db, job))
                job = self._next(urgent_batch, len(batch))
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

    @staticmethod
    def _run_job(db: sqlite3.Connection, job: _Job) -> tuple[_Job, bool, Any]:
        db.execute("SAVEPOINT job")
        try:
            value = job.fn(db)
        except BaseException as exc:
            db.execute("ROLLBACK TO job")
            db.execute("RELEASE job")
            return job, False, exc
        db.execute("RELEASE job")
        return job, True, value

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        job = _Job(fn, concurrent.futures.Future())
        self._put(job, urgent=False)
        result: T = job.future.result()
        return result

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

    async def transaction(self, fn: Callable[[sqlite3.Connection], T], *, urgent: bool = False) -> T:
        """Run `fn(connection)` atomically on the writer thread; durable when this returns.

        `urgent`: a short write someone on the network waits for; it overtakes ordinary jobs."""
        job = _Job(fn, concurrent.futures.Future())
        self._put(job, urgent)
        return await asyncio.wrap_future(job.future)

    @property
    def queued(self) -> dict[str, int]:
        """Jobs waiting for the writer, by queue (for metrics)."""
        return {"urgent": len(self._urgent), "ordinary": len(self._jobs)}

    def transaction_sync(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """The same, from synchronous code (never from the event loop's thread)."""
        return self._call(fn)

    async def close(self) -> None:
        """Release one user; the connection closes when the last user of a shared database leaves."""
        self._users = max(0, self._users - 1)
        if self._users:
            return
        with self._ready:
            self._closing = True
            self._ready.notify()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
        with _shared_lock:
            if _shared.get(self.path.resolve()) is self:
                del _shared[self.path.resolve()]


@dataclass
class _Job:
    fn: Callable[[sqlite3.Connection], Any]
    future: concurrent.futures.Future[Any]
