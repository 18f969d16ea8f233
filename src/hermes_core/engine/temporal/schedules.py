"""Scheduled jobs on `engine: temporal`: the serve nodes fire them into the conversation workflows.

Every `serve` node runs the firing loop of gateway/schedules.py (`Scheduler`) over the jobs in
PostgreSQL (postgres/schedules.py with `inbox=False`; `database.url` is required), so the jobs are
fired while any one node is up, and the claim's row locks keep each fire to one node. A fire's task
is delivered as a platform event is: signal-with-start of its conversation's workflow through
`TemporalInbox.signal`, with the fire's own message id `job:<id>@<ms>`, which needs no worker and is
durable once it returns. The turn then runs on a worker like any message, and its reply is sent
there proactively (the message has no `reply_to`: a Feishu chat gets a new message, a webhook job
its `callback_url`).

The claim (PostgreSQL) and the signal (Temporal) cannot be one transaction, so the delivery is made
idempotent instead: the claim records the fire with its message, then the node signals it, then
marks it delivered. A node killed (or cut off from the cluster) between the claim and the mark
leaves the fire recorded and undelivered; `sweep`, on every node's loop, takes such fires once they
are `UNDELIVERED_AFTER` seconds old (`FOR UPDATE SKIP LOCKED`, one node each) and signals them again
with the same message id and task id. If the first signal did arrive, the workflow drops the second
one as a duplicate (workflow.py: the last `dedup_ids` ids, at least 48 h): a fire runs at most once,
and it runs. The serve nodes were chosen over the workers for the loop because they are what
already turns outside events into workflow signals: fires keep being taken while every worker is
busy, down or being replaced, and run as soon as one is back.

The fire-time role check (`role_refusal`) runs on the node that claims, with the configuration's
permissions, as on the embedded engine. Turn slots do not apply here: the workers' own concurrency
(their task queue) bounds how many turns run, and a fire waits in its workflow like any message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from ...gateway.schedules import Scheduler
from ...postgres.schedules import UNDELIVERED_AFTER, PostgresScheduleStore
from ...schedule.jobs import Fire, utc_iso

if TYPE_CHECKING:
    from .client import TemporalInbox

log = logging.getLogger("hermes_core.schedule")
SIGNALS_AT_ONCE = 20  # concurrent signal-with-starts of one batch of fires


class TemporalScheduler(Scheduler):
    """The firing loop of a `serve` node of `engine: temporal` (see the module docstring)."""

    def __init__(self, store: PostgresScheduleStore, inbox: TemporalInbox, **options: Any) -> None:
        super().__init__(store, _NoLanes(), **options)
        self.pg, self.inbox = store, inbox
        self.resignalled = 0
        self._slots = asyncio.Semaphore(SIGNALS_AT_ONCE)

    async def deliver(self, fires: list[Fire]) -> None:
        sent = await asyncio.gather(*(self._signal(fire) for fire in fires))
        await self.pg.delivered([fire for fire, ok in zip(fires, sent, strict=True) if ok])

    async def sweep(self) -> None:
        """Signal again the fires claimed but never marked delivered (a node died in between)."""
        while fires := await self.pg.undelivered(time.time() - UNDELIVERED_AFTER):
            for fire in fires:
                log.warning("scheduled job %s: the fire at %s was claimed but not delivered; signalling "
                            "it again (a copy that did arrive is dropped)", fire.job_id,
                            utc_iso(fire.fire_at))  # fmt: skip
            self.resignalled += len(fires)
            await self.deliver(fires)
            if len(fires) < 100:
                return

    async def _signal(self, fire: Fire) -> bool:
        assert fire.message is not None
        async with self._slots:
            try:
                await self.inbox.signal(fire.message)
                return True
            except Exception as exc:  # the cluster away: the sweep signals it once it is back
                log.warning("scheduled job %s: signalling the fire at %s failed (%s); it is signalled "
                            "again within %.0f s", fire.job_id, utc_iso(fire.fire_at), exc,
                            UNDELIVERED_AFTER)  # fmt: skip
                return False


class _NoLanes:
    """The embedded gateway's lanes are not here: fires go to their workflows (`deliver`)."""

    def enqueue(self, message: Any) -> None:
        raise RuntimeError("engine temporal delivers fires by signal, not into lanes")
