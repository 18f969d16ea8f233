"""Scheduled jobs in the gateway: the SQLite `ScheduleStore` and the loop that fires jobs.

The store lives in the gateway's database file (tables of gateway migration 6). A fire is claimed
in ONE transaction that records it in `schedule_fires` (primary key: job id, fire time), inserts
its task's message into the inbox (message id `job:<id>@<ms>`, unique like every inbox key) and moves
the job's `next_fire` on. So a kill -9 at any moment either left the job due (claimed again at the
next start) or left the message in the inbox (resumed at start like any accepted message, run once).

`Scheduler.run_due` claims what is due in batches of `batch` fires per transaction (an ack's urgent
insert never waits behind one huge write); what each claim writes is worked out before the write,
in a thread (`plan_claims`: catching up after downtime is croniter work), and written only for jobs
unchanged since they were read and hands each queued message to the gateway's lanes
(`Gateway.enqueue`): its conversation's order holds, and it waits for a turn slot as batch work,
after interactive turns (`TurnSlots` priorities). The loop sleeps until the next fire time or one
`tick`, whichever is sooner; the clock and the sleep are injectable (tests use virtual time).

At fire time the creator's role is checked again (`refusal`): a job whose creator no longer holds
the role it was created with (an admin's broadcast, once the person is no admin) is refused, and the
refusal is recorded as the fire's outcome; nothing runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from ..channels.seam import InboundMessage, task_id_of
from ..kernel.tools.permissions import ADMIN, MEMBER, Policy
from ..schedule.jobs import (
    Fire,
    Job,
    JobLimits,
    JobStatus,
    RefusalCheck,
    ScheduleStore,
    first_fire,
    parse_at,
    plan_claims,
    utc_iso,
)
from ..storage import SQLiteDatabase
from .store import MIGRATIONS, _dump

if TYPE_CHECKING:
    from ..config import ScheduleConfig

log = logging.getLogger("hermes_core.schedule")


class SQLiteScheduleStore(ScheduleStore):
    def __init__(self, path: str | Path) -> None:
        self.db = SQLiteDatabase.shared(path)
        self.db.migrate("gateway", MIGRATIONS)

    async def add(self, job: Job, limits: JobLimits | None = None) -> Job:
        def add(db: sqlite3.Connection) -> Job:
            if limits is not None and (known := _read(db, job.id)) is not None:
                return known
            if limits is not None and (refused := limits.refusal(*_held(db, job))) is not None:
                raise refused
            db.execute(
                "INSERT OR IGNORE INTO schedule_jobs (id, job, conversation, status, next_fire, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (job.id, _job_json(job), job.conversation, job.status, job.next_fire, job.created_at),
            )
            return _read(db, job.id) or job

        return await self.db.transaction(add)

    async def replace(self, job: Job) -> Job:
        """Store `job` whether or not its id exists (the operator's declared jobs, re-read at start)."""

        def replace(db: sqlite3.Connection) -> Job:
            db.execute(
                "INSERT INTO schedule_jobs (id, job, conversation, status, next_fire, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET job = excluded.job, "
                "conversation = excluded.conversation, status = excluded.status, "
                "next_fire = excluded.next_fire",
                (job.id, _job_json(job), job.conversation, job.status, job.next_fire, job.created_at),
            )
            return job

        return await self.db.transaction(replace)

    async def get(self, job_id: str) -> Job | None:
        return await self.db.transaction(lambda db: _read(db, job_id))

    async def jobs(self, conversation: str | None = None, *, active_only: bool = True) -> list[Job]:
        where, args = [], []
        if conversation is not None:
            where.append("conversation = ?")
            args.append(conversation)
        if active_only:
            where.append("status = 'active'")
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT {LISTED} FROM schedule_jobs {clause} ORDER BY next_fire IS NULL, next_fire, id"
        rows = await self.db.transaction(lambda db: db.execute(sql, args).fetchall())
        return [_listed(*row) for row in rows]

    async def cancel(self, job_id: str) -> Job | None:
        def cancel(db: sqlite3.Connection) -> Job | None:
            row = db.execute(f"SELECT {LISTED} FROM schedule_jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None or row[3] != "active":
                return None
            job = _listed(*row)
            job.status, job.next_fire = "cancelled", None
            _write(db, job)
            return job

        return await self.db.transaction(cancel)

    async def claim_due(
        self, now: float, grace: float, limit: int, refusal: RefusalCheck | None = None
    ) -> list[Fire]:
        fires: list[Fire] = []
        while limit > 0:
            rows: list[tuple[str]] = await self.db.transaction(partial(_due, now, limit))
            jobs = [_job_of(data) for (data,) in rows]
            # planned outside the writer (catch-up after downtime is CPU work), applied in one short write
            plans = await asyncio.to_thread(plan_claims, jobs, now, grace, refusal)
            claimed, written = await self.db.transaction(partial(_claim, rows, jobs, plans))
            fires += claimed
            if written == len(rows):  # else another claimer moved some on meanwhile: read again
                return fires
            limit -= written
        return fires

    async def fires(self, job_id: str, limit: int = 20) -> list[Fire]:
        rows = await self.db.transaction(
            lambda db: db.execute(
                "SELECT job_id, fire_at, status, reason FROM schedule_fires WHERE job_id = ? "
                "ORDER BY fire_at DESC LIMIT ?",
                (job_id, limit),
            ).fetchall()
        )
        return [Fire(job_id, fire_at, status, reason) for job_id, fire_at, status, reason in rows]

    async def prune(self, older_than: float) -> int:
        done = await self.db.transaction(
            lambda db: db.execute("DELETE FROM schedule_fires WHERE fire_at < ?", (older_than,))
        )
        return int(done.rowcount)

    async def next_due(self) -> float | None:
        """The earliest next fire time of an active job (None: nothing scheduled)."""
        row = await self.db.transaction(
            lambda db: db.execute(
                "SELECT MIN(next_fire) FROM schedule_jobs WHERE status = 'active'"
            ).fetchone()
        )
        return None if row is None or row[0] is None else float(row[0])

    async def close(self) -> None:
        await self.db.close()


def _due(now: float, limit: int, db: sqlite3.Connection) -> list[tuple[str]]:
    return db.execute(
        "SELECT job FROM schedule_jobs WHERE status = 'active' AND next_fire <= ? "
        "ORDER BY next_fire, id LIMIT ?",
        (now, limit),
    ).fetchall()


def _claim(
    rows: list[tuple[str]], jobs: list[Job], plans: list[list[Fire]], db: sqlite3.Connection
) -> tuple[list[Fire], int]:
    """Write the planned fires of each job still stored as it was read; the fires and how many jobs."""
    fires, written = [], 0
    for (before,), job, planned in zip(rows, jobs, plans, strict=True):
        stored = db.execute("SELECT job FROM schedule_jobs WHERE id = ?", (job.id,)).fetchone()
        if stored is not None and stored[0] == before:
            fires += [_record(db, fire) for fire in planned]
            _write(db, job)
            written += 1
    return fires, written


def _record(db: sqlite3.Connection, fire: Fire) -> Fire:
    inbox_id = None
    first = db.execute(
        "INSERT OR IGNORE INTO schedule_fires (job_id, fire_at, status, reason, claimed_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (fire.job_id, fire.fire_at, fire.status, fire.reason, time.time()),
    )
    if first.rowcount == 0:  # claimed before (cannot happen while next_fire moves on in the same step)
        return dataclasses.replace(fire, status="skipped", reason="claimed before", message=None)
    if fire.message is not None:
        message = fire.message
        task_id_of(message)  # stored with the row: a run after a crash resumes its own journal
        row = db.execute(
            "INSERT OR IGNORE INTO inbox (channel, conversation, message_id, payload, received_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (message.channel, message.conversation, message.message_id, _dump(message), time.time()),
        )
        if not row.rowcount:
            return dataclasses.replace(fire, status="skipped", reason="already in the inbox", message=None)
        inbox_id = message.id = row.lastrowid
        db.execute(
            "UPDATE schedule_fires SET inbox_id = ? WHERE job_id = ? AND fire_at = ?",
            (inbox_id, fire.job_id, fire.fire_at),
        )
    return fire


def _held(db: sqlite3.Connection, job: Job) -> tuple[int, int]:
    """The active jobs `job`'s creator and conversation hold now (inside the adding transaction,
    which BEGIN IMMEDIATE makes the only writer: no other add can slip in between)."""
    row = db.execute(
        "SELECT COUNT(*) FILTER (WHERE json_extract(job, '$.channel') = ?"
        " AND json_extract(job, '$.sender') = ?), COUNT(*) FILTER (WHERE conversation = ?) FROM schedule_jobs"
        " WHERE status = 'active' AND json_extract(job, '$.source') = 'chat'",
        (job.channel, job.sender, job.conversation),
    ).fetchone()
    return int(row[0]), int(row[1])


def _read(db: sqlite3.Connection, job_id: str) -> Job | None:
    row = db.execute("SELECT job FROM schedule_jobs WHERE id = ?", (job_id,)).fetchone()
    return _job_of(row[0]) if row else None


def _write(db: sqlite3.Connection, job: Job) -> None:
    db.execute(
        "UPDATE schedule_jobs SET job = ?, status = ?, next_fire = ? WHERE id = ?",
        (_job_json(job), job.status, job.next_fire, job.id),
    )


def _job_json(job: Job) -> str:
    return json.dumps(dataclasses.asdict(job), ensure_ascii=False)


def _job_of(data: str) -> Job:
    fields = json.loads(data)
    known = {f.name for f in dataclasses.fields(Job)}
    return Job(**{k: v for k, v in fields.items() if k in known})


LISTED = "id, job, conversation, status"  # the columns `_listed` reads
UNREADABLE = "(this job's record cannot be read; cancel it by its id)"


def _listed(job_id: str, data: str, conversation: str, status: str) -> Job:
    """A row as lists and cancels see it: one whose record cannot be read (written by hand, damaged)
    is listed as such, by its id, so that one bad row never fails a list and can still be cancelled
    (its record then becomes this placeholder)."""
    try:
        return _job_of(data)
    except (ValueError, TypeError, AttributeError):  # not JSON, not an object, a field missing
        return Job(id=job_id, prompt=UNREADABLE, channel="?", conversation=conversation, sender="?",
                   timezone="UTC", status=cast(JobStatus, status))  # fmt: skip


class Enqueue(Protocol):
    """Where a fire's stored message is handed to be run: the gateway's lanes (`Gateway.enqueue`)."""

    def enqueue(self, message: InboundMessage) -> None: ...


FIRES_KEPT = 30 * 86400.0  # seconds a fire's record is kept (`gateway.retention_days`)
PRUNE_EVERY = 3600.0  # seconds between prunings


class Scheduler:
    """Fires due jobs into the gateway (see the module docstring)."""

    def __init__(
        self,
        store: ScheduleStore,
        gateway: Enqueue,
        *,
        misfire_grace: float = 300.0,
        refusal: RefusalCheck | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        tick: float = 1.0,
        batch: int = 100,
        retention: float = FIRES_KEPT,
    ) -> None:
        self.store, self.gateway = store, gateway
        self.retention, self._pruned_at = retention, float("-inf")
        self.misfire_grace, self.refusal = misfire_grace, refusal
        self.clock, self.sleep, self.tick, self.batch = clock, sleep, tick, batch
        self.counts: dict[str, int] = {"queued": 0, "skipped": 0, "refused": 0}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.declared: Callable[[], Awaitable[None]] | None = None  # the operator's jobs, synced at start
        self.owns_store = False  # closed by `stop` (serve builds the store for it)

    async def run_due(self) -> list[Fire]:
        """Claim every fire due now and queue its task; returns the fires (queued, skipped, refused)."""
        fires: list[Fire] = []
        while True:
            claimed = await self.store.claim_due(self.clock(), self.misfire_grace, self.batch, self.refusal)
            for fire in claimed:
                self.counts[fire.status] += 1
                if fire.message is None:
                    log.warning("scheduled job %s: the fire at %s was %s: %s",
                                fire.job_id, utc_iso(fire.fire_at), fire.status, fire.reason)  # fmt: skip
            await self.deliver([fire for fire in claimed if fire.message is not None])
            fires += claimed
            if len({fire.job_id for fire in claimed}) < self.batch:
                return fires

    async def deliver(self, fires: list[Fire]) -> None:
        """Hand the queued fires, their messages stored in the inbox by the claim, to the gateway's
        lanes (engine temporal signals them to their workflows instead: engine/temporal/schedules.py)."""
        for fire in fires:
            assert fire.message is not None
            self.gateway.enqueue(fire.message)

    async def sweep(self) -> None:
        """Deliver what a claim recorded but did not hand over (nothing here: the inbox row is the
        delivery, and the gateway resumes it at start)."""

    async def prune(self) -> None:
        """Hourly: forget the fires older than `retention` (the store keeps the rest for the
        console and `hermes-kernel schedule`)."""
        now = self.clock()
        if now - self._pruned_at < PRUNE_EVERY:
            return
        self._pruned_at = now
        if forgotten := await self.store.prune(now - self.retention):
            log.info("forgot %d scheduled fire(s) older than %.0f days", forgotten, self.retention / 86400)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="scheduler")

    def wake(self) -> None:
        """A job was added or changed: look again now rather than at the next tick."""
        self._wake.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.owns_store:
            self.owns_store = False
            await self.store.close()

    async def _run(self) -> None:
        if self.declared is not None:
            try:
                await self.declared()
            except Exception:
                log.exception("storing the declared schedule.jobs failed")
        while True:
            try:
                await self.run_due()
                await self.sweep()
                await self.prune()
                due = await self.store.next_due()
            except Exception:
                log.exception("firing scheduled jobs failed; trying again")
                due = None
            wait = self.tick if due is None else min(self.tick, max(0.0, due - self.clock()))
            self._wake.clear()
            sleeper = asyncio.ensure_future(self.sleep(wait))
            waker = asyncio.ensure_future(self._wake.wait())
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            for pending in (sleeper, waker):
                pending.cancel()


def role_refusal(policy: Policy) -> RefusalCheck:
    """The fire-time check: the creator must still hold the role the job was created with (an admin
    stays allowed everything); a broadcast needs an admin."""

    def refusal(job: Job) -> str | None:
        role = policy.caller(job.sender, job.channel).role
        who = f"{job.channel}:{job.sender}"
        if job.broadcast and role != ADMIN:
            return f"refused: {who} is no longer an admin, and posting into another chat needs one"
        if job.creator_role not in (MEMBER, role) and role != ADMIN:
            return f"refused: {who} no longer has the {job.creator_role} role the job was created with"
        return None

    return refusal


async def declare_jobs(store: ScheduleStore, options: ScheduleConfig, policy: Policy, now: float) -> None:
    """The operator's `schedule.jobs` into the store (ids `config:<id>`): a new or changed one is
    (re)scheduled from now, an unchanged one keeps its next fire time, one no longer declared is
    cancelled."""
    declared: dict[str, Job] = {}
    for entry in options.jobs:
        zone_name = entry.timezone or options.timezone
        at = parse_at(entry.at, zone_name, now, past_ok=True) if entry.at is not None else None
        conversation = entry.conversation or conversation_of(entry.channel, entry.chat_id, entry.sender)
        job = Job(
            id=f"config:{entry.id}", prompt=entry.prompt, channel=entry.channel, conversation=conversation,
            sender=entry.sender, timezone=zone_name, cron=entry.cron, at=at,
            creator_role=policy.caller(entry.sender, entry.channel).role, chat_id=entry.chat_id,
            chat_type="group" if entry.chat_id else "p2p", callback_url=entry.callback_url, source="config",
        )  # fmt: skip
        declared[job.id] = job
    for stored in await store.jobs(active_only=False):
        if stored.source == "config" and stored.id not in declared and stored.status == "active":
            await store.cancel(stored.id)
            log.info("scheduled job %s is no longer declared: cancelled", stored.id)
    for job in declared.values():
        known = await store.get(job.id)
        if known is not None and _definition(known) == _definition(job):
            continue  # unchanged: keeps its next fire time (and a finished one-shot stays finished)
        if job.cron is None and job.at is not None and job.at <= now:
            job.status = "done"
        else:
            job.next_fire = first_fire(job.cron, job.at, job.timezone, now)
        await store.replace(job)
        log.info("scheduled job %s: %s, next %s", job.id, job.when,
                 utc_iso(job.next_fire) if job.next_fire else "none (in the past)")  # fmt: skip


def _definition(job: Job) -> tuple[Any, ...]:
    return (job.prompt, job.channel, job.conversation, job.sender, job.timezone, job.cron, job.at,
            job.chat_id, job.callback_url)  # fmt: skip


def conversation_of(channel: str, chat_id: str | None, sender: str) -> str:
    """The conversation key a channel gives a chat (as its inbound messages carry it)."""
    if channel == "feishu":
        return f"feishu:{chat_id}"
    if channel == "web":
        return "web:console"
    return f"webhook:{sender}"
