"""The contract of `ScheduleStore` (schedule/jobs.py): what every implementation must do, through the
protocol only, for every registered backend that has one (SQLite, PostgreSQL; conftest.py).

Jobs are kept (an id added twice is the first job; `replace` overwrites; a reopen keeps them), listed
by next fire time, cancelled once. A due fire is claimed once: recorded, its message in the same
backend's gateway inbox (message id `job:<id>@<ms>`), the job moved on to its next fire time or
done; missed fires run the latest once within the grace and are recorded otherwise; a refused fire
runs nothing; at most `limit` jobs per claim, the earliest first; and claimers racing on the same
jobs — two stores, twenty claims at once — queue each fire exactly once; old fires are forgotten
and never claimed again; quotas are counted in the transaction that inserts.

How each test was seen to fail: tests/contracts/broken_backends.py holds schedule stores with one
bug each (add overwriting, a cancel never stored, the message kept out of the inbox, due jobs read
in one transaction and claimed in another…); test_contracts_fail_when_broken.py checks that every
test here fails against at least one of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime, timezone
from typing import Any

import pytest
from contract_backends import Opener

from hermes_core.gateway.store import GatewayStore
from hermes_core.schedule.jobs import Job, JobLimits, QuotaExceeded, ScheduleStore, fire_message_id

Stores = Opener[ScheduleStore]
Gateways = Opener[GatewayStore]
T = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc).timestamp()  # on the hour


def job(job_id: str, next_fire: float | None, *, cron: str | None = None, conversation: str = "webhook:ops",
        **fields: Any) -> Job:  # fmt: skip
    fields.setdefault("prompt", f"do {job_id}")
    at = None if cron else next_fire
    return Job(id=job_id, channel="webhook", conversation=conversation, sender="ops", timezone="UTC",
               cron=cron, at=at, next_fire=next_fire, callback_url="http://127.0.0.1:9/cb",
               **fields)  # fmt: skip


def ids(jobs: list[Job]) -> list[str]:
    return [j.id for j in jobs]


async def test_a_job_added_twice_is_the_first_and_a_reopen_keeps_it(schedule_stores: Stores) -> None:
    store = schedule_stores()
    first = job("j1", T + 3600, cron="0 * * * *", created_at=T - 10)
    assert await store.add(first) == first
    again = await store.add(job("j1", T + 60, prompt="another", created_at=T))  # a tool call run again
    assert again == first
    store = await schedule_stores.reopen(store)
    assert await store.get("j1") == first
    assert await store.get("j") is None and await store.get("j10") is None


async def test_replace_stores_the_job_whether_or_not_it_exists(schedule_stores: Stores) -> None:
    store = schedule_stores()
    await store.add(job("config:a", T + 60, cron="* * * * *"))
    changed = job("config:a", T + 7200, cron="0 */2 * * *", prompt="changed")
    await store.replace(changed)
    await store.replace(job("config:b", T + 30))
    assert await store.get("config:a") == changed
    found = await store.get("config:b")
    assert found is not None and found.next_fire == T + 30


async def test_jobs_by_next_fire_time_of_one_conversation_or_all(schedule_stores: Stores) -> None:
    store = schedule_stores()
    for made in [
        job("a", T + 300, conversation="webhook:one", created_at=T - 5),
        job("x2", T + 100, conversation="webhook:two", created_at=T - 4),
        job("c", T + 200, conversation="webhook:one", created_at=T - 3),
        job("x10", T + 100, conversation="webhook:two", created_at=T - 2),  # same time: by id, byte-wise
        job("gone", T + 50, conversation="webhook:one", created_at=T - 1),
    ]:
        await store.add(made)
    assert await store.cancel("gone") is not None
    assert ids(await store.jobs()) == ["x10", "x2", "c", "a"]
    assert ids(await store.jobs("webhook:one")) == ["c", "a"]
    assert ids(await store.jobs("webhook:one", active_only=False)) == ["c", "a", "gone"]  # none: last
    assert await store.jobs("webhook:nobody") == []


async def test_a_cancelled_job_never_fires_and_is_cancelled_once(
    schedule_stores: Stores, gateway_stores: Gateways
) -> None:
    store = schedule_stores()
    await store.add(job("j1", T, cron="* * * * *"))
    cancelled = await store.cancel("j1")
    assert cancelled is not None and cancelled.status == "cancelled" and cancelled.next_fire is None
    assert await store.cancel("j1") is None and await store.cancel("never") is None
    store = await schedule_stores.reopen(store)
    assert await store.claim_due(T + 10, 300, 10) == []
    assert await store.next_due() is None
    found = await store.get("j1")
    assert found is not None and found.status == "cancelled"
    assert await gateway_stores().pending_inbound() == []


async def test_a_due_fire_is_one_inbox_message_and_the_job_moves_on(
    schedule_stores: Stores, gateway_stores: Gateways
) -> None:
    store, inbox = schedule_stores(), gateway_stores()
    await store.add(job("every10", T, cron="*/10 * * * *"))
    await store.add(job("once", T + 5))
    await store.add(job("soon", T + 30))  # not due yet
    assert await store.next_due() == T
    fires = await store.claim_due(T + 5, 300, 10)
    assert [(f.job_id, f.fire_at, f.status) for f in fires] == [
        ("every10", T, "queued"),
        ("once", T + 5, "queued"),
    ]
    pending = await inbox.pending_inbound()
    assert [m.message_id for m in pending] == [fire_message_id("every10", T), fire_message_id("once", T + 5)]
    inbox_ids = [m.id for m in pending]
    assert [f.message.id for f in fires if f.message] == inbox_ids and None not in inbox_ids
    first = pending[0]
    assert (first.kind, first.text, first.sender) == ("scheduled", "do every10", "ops")
    assert first.callback_url == "http://127.0.0.1:9/cb" and first.reply_to is None
    repeating, once = await store.get("every10"), await store.get("once")
    assert repeating is not None and once is not None
    assert (repeating.status, repeating.next_fire, repeating.last_fire, repeating.last_outcome) == (
        "active", T + 600, T, "queued")  # fmt: skip
    assert (once.status, once.next_fire, once.last_outcome) == ("done", None, "queued")
    assert [(f.fire_at, f.status) for f in await store.fires("every10")] == [(T, "queued")]
    assert await store.claim_due(T + 5, 300, 10) == []  # claimed: nothing due any more
    assert await store.next_due() == T + 30
    assert len(await inbox.pending_inbound()) == 2


async def test_missed_fires_run_the_latest_once_within_the_grace_and_are_recorded_otherwise(
    schedule_stores: Stores, gateway_stores: Gateways
) -> None:
    store = schedule_stores()
    await store.add(job("every10", T, cron="*/10 * * * *"))  # down until T+22min: T, T+10 missed, T+20 late
    await store.add(job("hourly", T, cron="0 * * * *"))  # T: 22 minutes late, beyond the grace
    now = T + 22 * 60
    fires = await store.claim_due(now, 300, 10)
    assert sorted((f.job_id, f.fire_at, f.status) for f in fires) == [
        ("every10", T, "skipped"), ("every10", T + 1200, "queued"), ("hourly", T, "skipped")]  # fmt: skip
    recorded = await store.fires("every10")
    assert [(f.fire_at, f.status) for f in recorded] == [(T + 1200, "queued"), (T, "skipped")]  # newest first
    assert "2 fire time(s)" in recorded[1].reason
    assert [f.fire_at for f in await store.fires("every10", limit=1)] == [T + 1200]
    [late] = await store.fires("hourly")
    assert "beyond misfire_grace" in late.reason
    repeating, hourly = await store.get("every10"), await store.get("hourly")
    assert repeating is not None and hourly is not None
    assert (
        repeating.next_fire == T + 1800 and hourly.next_fire == T + 3600 and hourly.last_outcome == "skipped"
    )
    assert [m.message_id for m in await gateway_stores().pending_inbound()] == [
        fire_message_id("every10", T + 1200)]  # fmt: skip


async def test_a_refused_fire_is_recorded_runs_nothing_and_the_job_goes_on(
    schedule_stores: Stores, gateway_stores: Gateways
) -> None:
    store = schedule_stores()
    await store.add(job("broadcast", T, cron="0 * * * *", creator_role="admin", broadcast=True))
    await store.add(job("mine", T, cron="0 * * * *"))

    def refusal(checked: Job) -> str | None:
        return "refused: no longer an admin" if checked.broadcast else None

    fires = await store.claim_due(T + 1, 300, 10, refusal)
    assert sorted((f.job_id, f.status, f.message is None) for f in fires) == [
        ("broadcast", "refused", True), ("mine", "queued", False)]  # fmt: skip
    [refused] = await store.fires("broadcast")
    assert refused.status == "refused" and refused.reason == "refused: no longer an admin"
    moved = await store.get("broadcast")
    assert moved is not None and moved.next_fire == T + 3600 and moved.last_outcome == "refused"
    assert [m.message_id for m in await gateway_stores().pending_inbound()] == [fire_message_id("mine", T)]


async def test_a_claim_takes_at_most_limit_jobs_the_earliest_first(schedule_stores: Stores) -> None:
    store = schedule_stores()
    for n, due in enumerate([T + 2, T, T + 1]):
        await store.add(job(f"j{n}", due))
    first = await store.claim_due(T + 10, 300, 2)
    assert [(f.job_id, f.fire_at) for f in first] == [("j1", T), ("j2", T + 1)]
    assert [(f.job_id, f.fire_at) for f in await store.claim_due(T + 10, 300, 2)] == [("j0", T + 2)]


async def test_claimers_racing_on_the_same_jobs_queue_each_fire_once(
    schedule_stores: Stores, gateway_stores: Gateways
) -> None:
    """Two stores on the same storage (two nodes), twenty claims at once, seven jobs each: every
    fire is queued by exactly one of them, none is seen twice (not even as skipped)."""
    first, second = schedule_stores(), schedule_stores()
    for n in range(50):
        await first.add(job(f"j{n:02}", T, cron="* * * * *", conversation=f"webhook:{n}"))
    claims = await asyncio.gather(*(store.claim_due(T + 30, 300, 7) for store in [first, second] * 10))
    fires = [fire for claimed in claims for fire in claimed]
    assert sorted((f.job_id, f.status) for f in fires) == [(f"j{n:02}", "queued") for n in range(50)]
    assert len(await gateway_stores().pending_inbound()) == 50
    for n in range(50):
        stored = await second.get(f"j{n:02}")
        assert stored is not None and (stored.next_fire, stored.last_outcome) == (T + 60, "queued")
        assert len(await second.fires(f"j{n:02}")) == 1
    assert await first.claim_due(T + 30, 300, 100) == []


async def test_old_fires_are_forgotten_and_a_forgotten_fire_is_not_claimed_again(
    schedule_stores: Stores, gateway_stores: Gateways
) -> None:
    store, inbox = schedule_stores(), gateway_stores()
    await store.add(job("every10", T, cron="*/10 * * * *"))
    await store.claim_due(T, 300, 10)
    await store.claim_due(T + 600, 300, 10)
    assert [f.fire_at for f in await store.fires("every10")] == [T + 600, T]
    assert await store.prune(T + 1) == 1  # the fire at T is older: forgotten
    assert [f.fire_at for f in await store.fires("every10")] == [T + 600]
    assert await store.claim_due(T + 601, 300, 10) == []  # its fire times are past: nothing again
    assert await store.prune(T + 1) == 0
    assert len(await inbox.pending_inbound()) == 2


async def test_quotas_are_counted_in_the_transaction_that_inserts(schedule_stores: Stores) -> None:
    """`add` with `JobLimits` (issue 31: one member's 200 jobs): thirty adds at once from two stores
    store exactly the creator's quota and refuse the rest; a job already stored is returned as it is
    even over the quota (a call run again); a cancelled job frees its place; the operator's jobs are
    not counted; other members fill the conversation's quota."""
    first, second = schedule_stores(), schedule_stores()
    limits = JobLimits(per_user=5, per_chat=7)
    await first.add(job("config:x", T + 60, source="config"), limits)

    async def one(n: int) -> Job | None:
        try:
            return await (first, second)[n % 2].add(job(f"q{n:02}", T + 60), limits)
        except QuotaExceeded:
            return None

    stored = [added for added in await asyncio.gather(*(one(n) for n in range(30))) if added is not None]
    assert len(stored) == 5 and len(await first.jobs()) == 6
    assert await second.add(stored[0], limits) == stored[0]
    with pytest.raises(QuotaExceeded, match="max_jobs_per_user"):
        await second.add(job("q99", T + 60), limits)
    await first.cancel(stored[0].id)
    await second.add(job("again", T + 60), limits)
    for n in range(2):
        await first.add(dataclasses.replace(job(f"o{n}", T + 60), sender=f"other{n}"), limits)
    with pytest.raises(QuotaExceeded, match="max_jobs_per_chat"):
        await first.add(dataclasses.replace(job("o9", T + 60), sender="third"), limits)
    assert len(await first.jobs("webhook:ops")) == 8  # 7 members' and the operator's
