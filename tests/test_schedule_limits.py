"""Attacks on scheduled jobs, performed end to end through the gateway `serve` builds: the fake model
asks for the scheduling tools as a real one would, replies go to a local webhook callback server, and
the scheduler reads a moved clock.

The cases are issue 31's reproductions (items 1, 2, 3 and 9 of its second round of attacks): one
member creating `* * * * *` jobs until nothing refuses them; a job whose task schedules more jobs a
moment later; a job at 9999-12-31 that breaks `/jobs`, `list_scheduled`, the console's schedule page
and `hermes-kernel schedule list`; a daily job at 01:30 in America/New_York that fired twice on
2026-11-01, when clocks fall back from 02:00 EDT to 01:00 EST (the tz database's rule for the zone).
How cron itself treats that hour (a job at a fixed time runs once, a job whose minute or hour field
is a wildcard keeps its rhythm) is Vixie cron's, as its cron(8) page describes it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway_harness import post, scheduler_looked
from hermes_core.config import load_settings
from hermes_core.gateway.schedules import SQLiteScheduleStore
from hermes_core.schedule.jobs import Job, next_cron, utc_iso
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, RecordedRequest
from test_schedule import Callbacks, Model, fired_requests, gateway, jobs_in, seed
from virtual_clock import Clock, utc
from waiting import eventually


async def ask(url: str, callbacks: Callbacks, user: str, text: str, n: int) -> str:
    """One webhook message from `user`; its reply, as the callback received it."""
    body = {"message": text, "user_id": user, "message_id": f"{user}-{n}", "callback_url": callbacks.url}
    before = len(callbacks.received)
    status, _ = await post(f"{url}/webhook", body)
    assert status in (200, 202)
    await eventually(lambda: len(callbacks.received) > before)
    return str(callbacks.received[before]["reply"])


def offered(request: RecordedRequest) -> set[str]:
    return {str(t["function"]["name"]) for t in request.tools}  # type: ignore[index]


async def test_one_member_cannot_create_jobs_beyond_the_per_user_quota(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 item 1: 200 `* * * * *` jobs by one member. With the defaults, the 21st is refused
    and the model reads why; another member still schedules."""
    model = fake.handler = Model()
    model.calls["every minute"] = ("schedule_task", {"prompt": "ping", "cron": "* * * * *"})
    clock = Clock(utc("2026-12-01T00:00:00"))
    async with Callbacks() as callbacks:
        config = f"webhook: {{callback_hosts: ['{callbacks.host}']}}\n"
        # the per-sender message limit (gateway/flood.py) is another door: this is the job quota's
        limits = "user_messages_per_minute: null"
        async with gateway(tmp_path, fake, clock, monkeypatch, config=config, gateway_options=limits) as (
            _,
            url,
        ):
            replies = [await ask(url, callbacks, "mal", "every minute ping", n) for n in range(21)]
            other = await ask(url, callbacks, "ann", "every minute ping", 0)
    assert all("job_id" in reply for reply in replies[:20])
    assert "max_jobs_per_user" in replies[20] and "cancel" in replies[20], replies[20]
    assert "job_id" in other
    jobs = await jobs_in(tmp_path)
    assert sum(job.sender == "mal" for job in jobs) == 20 and len(jobs) == 21


async def test_a_group_cannot_hold_more_jobs_than_the_per_chat_quota(
    tmp_path: Path, fake: FakeOpenAIServer, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 item 1, shared: several members of one group each stay under their own quota and
    together fill the group's (`schedule.max_jobs_per_chat`)."""
    model = fake.handler = Model()
    model.calls["every minute"] = ("schedule_task", {"prompt": "ping", "cron": "* * * * *"})
    clock = Clock(utc("2026-12-01T00:00:00"))
    config = "schedule: {max_jobs_per_chat: 2}\n"
    async with gateway(tmp_path, fake, clock, monkeypatch, feishu=feishu, config=config) as (_, url):
        for n, sender in enumerate(["ou_a", "ou_b", "ou_c"], start=1):
            asked = feishu.user_message("every minute ping", chat_id="oc_team", chat_type="group",
                                        sender=sender, mention_bot=True)  # fmt: skip
            assert (await feishu.push(asked, f"{url}/feishu/events")).ok
            await eventually(lambda n=n: len(feishu.messages_in("oc_team")) == n)
    refused = feishu.messages_in("oc_team")[2].text
    assert "max_jobs_per_chat" in refused, refused
    assert sorted(job.sender for job in await jobs_in(tmp_path)) == ["ou_a", "ou_b"]


async def test_a_fired_task_is_not_offered_scheduling_and_one_shots_wait_a_minute(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 item 2: a job whose task schedules two more every 60 ms. A delay under the minimum
    is refused; a fired task is not offered `schedule_task`, and calling it anyway is refused."""
    model = fake.handler = Model()
    model.calls["right away"] = ("schedule_task", {"prompt": "spawn more", "delay_minutes": 0.001})
    model.calls["spawn more"] = ("schedule_task", {"prompt": "spawn more", "delay_minutes": 1})
    clock = Clock(utc("2026-12-01T10:00:00"))
    async with Callbacks() as callbacks:
        config = f"webhook: {{callback_hosts: ['{callbacks.host}']}}\n"
        async with gateway(tmp_path, fake, clock, monkeypatch, config=config) as (built, url):
            quick = await ask(url, callbacks, "mal", "right away", 0)
            assert await jobs_in(tmp_path) == []
            assert "at least 1 minute" in quick, quick
            first = await ask(url, callbacks, "mal", "spawn more", 1)
            assert "job_id" in first
            clock.now = utc("2026-12-01T10:01:00")
            await eventually(lambda: len(callbacks.received) == 3)
            clock.now = utc("2026-12-01T10:05:00")
            await scheduler_looked(built)
    [fired] = fired_requests(fake)
    assert "schedule_task" not in offered(fired) and "list_scheduled" in offered(fired)
    assert any("schedule_task" in offered(r) for r in fake.requests if r is not fired)  # the person's turn
    [job] = await jobs_in(tmp_path)  # the fired task created nothing
    assert job.status == "done"


FAR = "9999-12-31T23:00"


def far_job(job_id: str) -> Job:
    """A job at 9999-12-31 23:00 in New York (10000-01-01 in UTC), as an unbounded `at` stored it."""
    at = 253402318800.0 + 5 * 3600
    return Job(id=job_id, prompt="never", channel="webhook", conversation="webhook:mal", sender="mal",
               timezone="America/New_York", at=at, next_fire=at,
               callback_url="http://127.0.0.1:9/cb")  # fmt: skip


async def test_a_time_beyond_ten_years_is_refused(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 item 3: `schedule_task` at 9999-12-31 was stored; it is refused with the bound."""
    model = fake.handler = Model()
    model.calls["at the end of time"] = ("schedule_task", {"prompt": "never", "at": FAR,
                                                           "timezone": "America/New_York"})  # fmt: skip
    async with Callbacks() as callbacks:
        config = f"webhook: {{callback_hosts: ['{callbacks.host}']}}\n"
        async with gateway(tmp_path, fake, Clock(utc("2026-12-01T00:00:00")), monkeypatch, config=config) as (
            _, url,
        ):  # fmt: skip
            reply = await ask(url, callbacks, "mal", "at the end of time", 0)
    assert await jobs_in(tmp_path) == []
    assert "10 years" in reply, reply


async def test_every_listing_shows_a_job_it_cannot_show_by_its_id(
    tmp_path: Path, fake: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31 item 3: a job at year 9999 (stored before times were bounded) made `/jobs`,
    `list_scheduled`, the console's schedule page and `hermes-kernel schedule list` fail, so the
    flood's ids could not be found. Each lists it by id, and the console cancels it."""
    from hermes_core.cli import main
    from hermes_core.server import serve

    data = tmp_path / "data"
    await seed(tmp_path, far_job("jfar"))
    daily = Job(id="jok", prompt="standup", channel="webhook", conversation="webhook:mal", sender="mal",
                timezone="UTC", cron="0 9 * * *", next_fire=utc("2030-01-01T09:00:00"),
                callback_url="http://127.0.0.1:9/cb")  # fmt: skip
    await seed(tmp_path, daily)
    damaged = SQLiteScheduleStore(data / "gateway.db")  # a record written by hand, cut short
    await damaged.db.transaction(lambda db: db.execute(
        "INSERT INTO schedule_jobs (id, job, conversation, status, next_fire, created_at) "
        "VALUES ('jbad', '{\"id\": \"jbad\", \"pro', 'webhook:mal', 'active', ?, 0)",
        (utc("2031-01-01T00:00:00"),)))  # fmt: skip
    await damaged.close()
    model = fake.handler = Model()
    model.calls["what is scheduled"] = ("list_scheduled", {})
    path = tmp_path / "hermes.yaml"
    path.write_text(f"model: {{name: m, base_url: '{fake.base_url}'}}\ngateway: {{data_dir: '{data}'}}\n"
                    "observe: {traces: false}\n", encoding="utf-8")  # fmt: skip
    assert await asyncio.to_thread(main, ["--config", str(path), "schedule", "list"]) == 0
    listed = capsys.readouterr().out
    assert await asyncio.to_thread(main, ["--config", str(path), "schedule", "list", "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    settings = load_settings(path, env={}, dotenv=None)
    stop, address = asyncio.Event(), asyncio.get_running_loop().create_future()
    served = asyncio.ensure_future(serve(settings, port=0, ready=address.set_result, stop=stop))
    base = await asyncio.wait_for(address, 30)
    try:
        _, jobs_reply = await post(f"{base}/webhook", {"message": "/jobs", "user_id": "mal"})
        _, tool_reply = await post(f"{base}/webhook", {"message": "what is scheduled", "user_id": "mal"})
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/console/schedule") as page:
                html, page_status = await page.text(), page.status
            headers = {"Origin": base, "Content-Type": "application/json"}
            cancel = f"{base}/console/api/schedule/jfar/cancel"
            async with http.post(cancel, json={}, headers=headers) as answer:
                cancelled = answer.status
            async with http.post(cancel.replace("jfar", "jbad"), json={}, headers=headers) as answer:
                cancelled_bad = answer.status
    finally:
        stop.set()
        await served
    for shown in (listed, jobs_reply["reply"], tool_reply["reply"]):
        assert "jfar" in shown and "jok" in shown and "cannot be shown" in shown, shown
        assert "jbad" in shown and "cannot be read" in shown, shown
    assert {job["id"] for job in as_json} == {"jfar", "jok", "jbad"}
    assert page_status == 200 and all(f'data-job="{i}"' in html for i in ("jfar", "jok", "jbad"))
    assert cancelled == cancelled_bad == 200
    assert {job.id: job.status for job in await jobs_in(tmp_path)} == {
        "jfar": "cancelled", "jok": "active", "jbad": "cancelled"}  # fmt: skip


async def test_a_daily_job_fires_once_on_the_day_clocks_fall_back(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31 item 9: every day at 01:30 in New York. On 2026-11-01 01:30 comes twice (05:30 UTC
    in EDT, 06:30 UTC in EST): the job fires at the first, then the next day."""
    model = fake.handler = Model()
    model.calls["every night"] = ("schedule_task", {"prompt": "rotate the logs", "cron": "30 1 * * *",
                                                    "timezone": "America/New_York"})  # fmt: skip
    clock = Clock(utc("2026-10-31T12:00:00"))
    async with Callbacks() as callbacks:
        config = f"webhook: {{callback_hosts: ['{callbacks.host}']}}\n"
        async with gateway(tmp_path, fake, clock, monkeypatch, config=config) as (built, url):
            await ask(url, callbacks, "ops", "every night rotate the logs", 0)
            clock.now = utc("2026-11-01T05:30:00")  # 01:30 EDT
            await eventually(lambda: len(callbacks.received) == 2)
            clock.now = utc("2026-11-01T06:30:00")  # 01:30 EST: the same wall-clock time again
            await scheduler_looked(built)
            assert len(callbacks.received) == 2
            clock.now = utc("2026-11-02T06:30:00")
            await eventually(lambda: len(callbacks.received) == 3)
    [job] = await jobs_in(tmp_path)
    assert utc_iso(job.next_fire or 0) == "2026-11-03T06:30:00+00:00"


async def test_wildcard_hours_keep_their_rhythm_through_the_repeated_hour(tmp_path: Path) -> None:
    """Vixie cron's rule for the other kind of job: hourly (`0 * * * *`) fires 25 times on the day
    that has 25 hours, and every 30 minutes (`*/30 1 * * *`) four times in the two 1 o'clocks."""
    store = SQLiteScheduleStore(tmp_path / "gateway.db")
    start = utc("2026-11-01T04:00:00")  # midnight EDT
    counts: dict[str, int] = {}
    for cron in ("0 * * * *", "*/30 1 * * *"):
        job = Job(id=cron, prompt="p", channel="webhook", conversation="webhook:x", sender="x",
                  timezone="America/New_York", cron=cron,
                  next_fire=next_cron(cron, "America/New_York", start - 1))  # fmt: skip
        await store.add(job)
        fired: list[Any] = []
        while (nxt := (await store.get(cron)).next_fire) < utc("2026-11-02T05:00:00"):  # type: ignore[union-attr,operator]
            fired += [f for f in await store.claim_due(nxt, 300, 10) if f.status == "queued"]
        counts[cron] = len(fired)
    await store.close()
    assert counts == {"0 * * * *": 25, "*/30 1 * * *": 4}
