"""Scheduled jobs in PostgreSQL, shared by every node (the `ScheduleStore` of schedule/jobs.py).

The same jobs, fires and claim as `SQLiteScheduleStore` (gateway/schedules.py), each method one
transaction, for several nodes that all run the firing loop at once:

- claim: the due jobs' rows are selected `FOR UPDATE SKIP LOCKED`, so two nodes claiming at the
  same moment take disjoint jobs (a row another node holds is skipped, and once that node commits
  the row's `next_fire` has moved on and it is no longer due). For each job, in the same
  transaction, the fire is recorded in `schedule_fires` (primary key: job id, fire time — the
  second line of defence: a fire inserted twice is one row), and the job is moved on to its next
  fire time. Which node claimed it is kept (`claimed_by`).
- delivery, engine embedded (`inbox=True`, the default): the fire's message goes into the gateway's
  inbox (postgres/gateway.py's table, message id `job:<id>@<ms>`) in that same transaction, as in
  SQLite: a node killed before the commit leaves the job due, after it the message is in the inbox
  and runs once, like any accepted message.
- delivery, engine temporal (`inbox=False`): there is no inbox to share a transaction with; the
  fire's message is recorded with the fire (`payload`), and the node then signals it to its
  conversation's workflow with the same deterministic message id and marks it `delivered`. A node
  killed between the two leaves a recorded, undelivered fire: `undelivered` hands it to another
  node's sweep (again under `FOR UPDATE SKIP LOCKED`), which signals it again; the workflow drops
  the second copy if the first did arrive (engine/temporal/schedules.py).

Job ids are compared byte-wise (`COLLATE "C"`), so lists come in the order SQLite gives them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING, Any

from ..channels.seam import InboundMessage, task_id_of
from ..gateway.schedules import LISTED, _job_json, _job_of, _listed
from ..gateway.store import _dump, _load
from ..schedule.jobs import Fire, Job, JobLimits, RefusalCheck, ScheduleStore, plan_claims
from .database import PostgresDatabase
from .migrations import GATEWAY, SCHEDULES

if TYPE_CHECKING:
    from psycopg import AsyncConnection

UNDELIVERED_AFTER = 10.0  # seconds: a recorded fire not yet signalled by then is another node's to signal


class PostgresScheduleStore(ScheduleStore):
    def __init__(self, url: str, *, inbox: bool = True, database: PostgresDatabase | None = None) -> None:
        self.db = database or PostgresDatabase.shared(url)
        self.db.migrate("gateway", GATEWAY)  # the inbox the claim writes into
        self.db.migrate("schedules", SCHEDULES)
        self.inbox = inbox
        self.node = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    async def add(self, job: Job, limits: JobLimits | None = None) -> Job:
        async def add(db: AsyncConnection) -> Job:
            if limits is not None:
                if (known := await _read(db, job.id)) is not None:
                    return known
                if (refused := limits.refusal(*await _held(db, job))) is not None:
                    raise refused
            await db.execute(
                "INSERT INTO schedule_jobs (id, job, conversation, status, next_fire, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                (job.id, _job_json(job), job.conversation, job.status, job.next_fire, job.created_at),
            )
            return await _read(db, job.id) or job

        return await self.db.transaction(add)

    async def replace(self, job: Job) -> Job:
        """Store `job` whether or not its id exists (the operator's declared jobs, re-read at start)."""

        async def replace(db: AsyncConnection) -> Job:
            await db.execute(
                "INSERT INTO schedule_jobs (id, job, conversation, status, next_fire, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO UPDATE SET job = excluded.job, "
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
            where.append("conversation = %s")
            args.append(conversation)
        if active_only:
            where.append("status = 'active'")
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        order = 'ORDER BY next_fire IS NULL, next_fire, id COLLATE "C"'
        sql = f"SELECT {LISTED} FROM schedule_jobs {clause} {order}"

        async def jobs(db: AsyncConnection) -> list[Any]:
            return await (await db.execute(sql, args)).fetchall()

        return [_listed(*row) for row in await self.db.transaction(jobs)]

    async def cancel(self, job_id: str) -> Job | None:
        async def cancel(db: AsyncConnection) -> Job | None:
            sql = f"SELECT {LISTED} FROM schedule_jobs WHERE id = %s FOR UPDATE"  # after a claim in flight
            row = await (await db.execute(sql, (job_id,))).fetchone()
            if row is None or row[3] != "active":
                return None
            job = _listed(*row)
            job.status, job.next_fire = "cancelled", None
            await _write(db, job)
            return job

        return await self.db.transaction(cancel)

    async def claim_due(
        self, now: float, grace: float, limit: int, refusal: RefusalCheck | None = None
    ) -> list[Fire]:
        async def claim(db: AsyncConnection) -> list[Fire]:
            rows = await (
                await db.execute(
                    "SELECT job FROM schedule_jobs WHERE status = 'active' AND next_fire <= %s "
                    'ORDER BY next_fire, id COLLATE "C" LIMIT %s FOR UPDATE SKIP LOCKED',  # others': theirs
                    (now, limit),
                )
            ).fetchall()
            jobs = [_job_of(data) for (data,) in rows]
            plans = await asyncio.to_thread(plan_claims, jobs, now, grace, refusal)  # not on the loop
            fires: list[Fire] = []
            for job, planned in zip(jobs, plans, strict=True):
                for fire in planned:
                    fires.append(await self._record(db, fire))
                await _write(db, job)
            return fires

        return await self.db.transaction(claim)

    async def _record(self, db: AsyncConnection, fire: Fire) -> Fire:
        message = fire.message
        payload = None
        if message is not None:
            task_id_of(message)  # stored with it: a run after a crash, a signal sent again, is the same task
            payload = None if self.inbox else _dump(message)
        first = await db.execute(
            "INSERT INTO schedule_fires (job_id, fire_at, status, reason, claimed_at, claimed_by, payload) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (fire.job_id, fire.fire_at, fire.status, fire.reason, time.time(), self.node, payload),
        )
        if first.rowcount == 0:  # claimed before (cannot happen while next_fire moves on under the row lock)
            return dataclasses.replace(fire, status="skipped", reason="claimed before", message=None)
        if message is None or not self.inbox:
            return fire
        row = await (
            await db.execute(
                "INSERT INTO inbox (channel, conversation, message_id, payload, received_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id",
                (message.channel, message.conversation, message.message_id, _dump(message), time.time()),
            )
        ).fetchone()
        if row is None:
            return dataclasses.replace(fire, status="skipped", reason="already in the inbox", message=None)
        message.id = int(row[0])
        await db.execute(
            "UPDATE schedule_fires SET inbox_id = %s WHERE job_id = %s AND fire_at = %s",
            (message.id, fire.job_id, fire.fire_at),
        )
        return fire

    async def fires(self, job_id: str, limit: int = 20) -> list[Fire]:
        async def fires(db: AsyncConnection) -> list[Any]:
            return await (
                await db.execute(
                    "SELECT job_id, fire_at, status, reason FROM schedule_fires WHERE job_id = %s "
                    "ORDER BY fire_at DESC LIMIT %s",
                    (job_id, limit),
                )
            ).fetchall()

        rows = await self.db.transaction(fires)
        return [Fire(job, fire_at, status, reason) for job, fire_at, status, reason in rows]

    async def prune(self, older_than: float) -> int:
        async def prune(db: AsyncConnection) -> int:
            done = await db.execute(
                "DELETE FROM schedule_fires WHERE fire_at < %s"
                " AND (payload IS NULL OR delivered_at IS NOT NULL)",  # undelivered: the sweep's
                (older_than,),
            )
            return int(done.rowcount)

        result: int = await self.db.transaction(prune)
        return result

    async def next_due(self) -> float | None:
        """The earliest next fire time of an active job (None: nothing scheduled)."""

        async def earliest(db: AsyncConnection) -> Any:
            return await (
                await db.execute("SELECT MIN(next_fire) FROM schedule_jobs WHERE status = 'active'")
            ).fetchone()

        row = await self.db.transaction(earliest)
        return None if row is None or row[0] is None else float(row[0])

    # -- engine temporal: fires recorded here, signalled to their workflows afterwards ----------
    async def delivered(self, fires: list[Fire]) -> None:
        """Mark `fires` as signalled to their workflows: no sweep signals them again."""
        if not fires:
            return

        async def mark(db: AsyncConnection) -> None:
            for fire in fires:
                await db.execute(
                    "UPDATE schedule_fires SET delivered_at = %s WHERE job_id = %s AND fire_at = %s",
                    (time.time(), fire.job_id, fire.fire_at),
                )

        await self.db.transaction(mark)

    async def undelivered(self, claimed_before: float, limit: int = 100) -> list[Fire]:
        """Queued fires recorded before `claimed_before` and never marked delivered (their node died
        between the claim and the signal, or could not reach the cluster): taken for this node, each
        by one node at a time (the rows are locked, others skipped, and their claim time renewed, so
        another node's sweep leaves them alone for `UNDELIVERED_AFTER` seconds)."""

        async def take(db: AsyncConnection) -> list[Fire]:
            rows = await (
                await db.execute(
                    "SELECT job_id, fire_at, reason, payload FROM schedule_fires WHERE payload IS NOT NULL "
                    'AND delivered_at IS NULL AND claimed_at < %s ORDER BY claimed_at, job_id COLLATE "C" '
                    "LIMIT %s FOR UPDATE SKIP LOCKED",
                    (claimed_before, limit),
                )
            ).fetchall()
            for job_id, fire_at, _, _ in rows:
                await db.execute(
                    "UPDATE schedule_fires SET claimed_at = %s, claimed_by = %s "
                    "WHERE job_id = %s AND fire_at = %s",
                    (time.time(), self.node, job_id, fire_at),
                )
            return [
                Fire(job_id, fire_at, "queued", reason, _load(InboundMessage, payload))
                for job_id, fire_at, reason, payload in rows
            ]

        return await self.db.transaction(take)

    async def close(self) -> None:
        await self.db.close()


async def _held(db: AsyncConnection, job: Job) -> tuple[int, int]:
    """The active jobs `job`'s creator and conversation hold now. Read committed would let two adds
    both count 19 and both insert: a transaction-scoped advisory lock on each key (taken in one
    order, so two adds never wait on each other crosswise) makes adds for the same creator or
    conversation take turns, until the adding transaction ends."""
    keys = {f"schedule-quota:user:{job.channel}:{job.sender}", f"schedule-quota:chat:{job.conversation}"}
    for key in sorted(keys):
        await db.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))
    row = await (
        await db.execute(
            "SELECT COUNT(*) FILTER (WHERE job::jsonb->>'channel' = %s AND job::jsonb->>'sender' = %s),"
            " COUNT(*) FILTER (WHERE conversation = %s) FROM schedule_jobs"
            " WHERE status = 'active' AND job::jsonb->>'source' = 'chat'",
            (job.channel, job.sender, job.conversation),
        )
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def _read(db: AsyncConnection, job_id: str) -> Job | None:
    row = await (await db.execute("SELECT job FROM schedule_jobs WHERE id = %s", (job_id,))).fetchone()
    return _job_of(row[0]) if row else None


async def _write(db: AsyncConnection, job: Job) -> None:
    await db.execute(
        "UPDATE schedule_jobs SET job = %s, status = %s, next_fire = %s WHERE id = %s",
        (_job_json(job), job.status, job.next_fire, job.id),
    )
