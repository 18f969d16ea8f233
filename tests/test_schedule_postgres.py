"""Scheduled jobs with `database.url`: the jobs in PostgreSQL, fired by every gateway node.

Gateways as `serve` builds them (`build_gateway`), each with its own connection pool (two nodes:
their URLs differ in `application_name`), on one real PostgreSQL (tests/pg_server.py); the fake
model asks for `schedule_task` as a real one would; replies go to a local webhook callback server;
the schedulers read an injected clock, so a fire time is reached by moving the clock.

- two nodes racing for 50 jobs due at the same moment: each fire claimed by one node (both take
  part), one inbox row and one reply per job;
- "remind me in 30 seconds", asked through the webhook: the job is in PostgreSQL and fires; the
  `hermes-kernel schedule` commands and the console read and change the same jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from gateway_harness import look_often, post, scheduler_looked, serving
from hermes_core.cli import main
from hermes_core.config import build_agent, load_settings
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.server import build_gateway
from hermes_core.postgres.schedules import PostgresScheduleStore
from hermes_core.schedule.jobs import Job, fire_message_id
from hermes_core.testing.fake_openai import FakeOpenAIServer
from test_schedule import Callbacks, Clock, Model, fired_requests, utc
from waiting import eventually

pytestmark = pytest.mark.slow  # a PostgreSQL server


def write_config(folder: Path, fake: FakeOpenAIServer, config: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "hermes.yaml"
    path.write_text(
        f"model: {{name: m, base_url: '{fake.base_url}'}}\ngateway: {{data_dir: '{folder / 'data'}'}}\n"
        "observe: {traces: false}\n" + textwrap.dedent(config),
        encoding="utf-8",
    )
    return path


@contextlib.asynccontextmanager
async def node(
    folder: Path, url: str, name: str, fake: FakeOpenAIServer, clock: Clock, config: str = ""
) -> AsyncIterator[tuple[Gateway, str]]:
    """One gateway node on `url` (a pool of its own), its scheduler looking every 20 ms."""
    path = write_config(folder / name, fake, config)
    settings = load_settings(path, env={"HERMES_DATABASE_URL": f"{url}?application_name={name}"}, dotenv=None)
    agent = build_agent(settings)
    built, routes = build_gateway(settings, agent, clock=clock)
    assert built.scheduler is not None, "no scheduler with database.url"
    look_often(built)
    try:
        async with serving(built, routes) as address:
            yield built, address
    finally:
        await built.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as db:
        return db.execute(sql).fetchall()


async def nothing_pending(gateways: list[Gateway]) -> bool:
    counts = [await g.store.counts() for g in gateways]
    return all(c["inbox_pending"] == 0 and c["outbox_pending"] == 0 for c in counts)


async def test_two_nodes_racing_for_50_due_jobs_fire_each_once(
    pg_url: str, tmp_path: Path, fake: FakeOpenAIServer
) -> None:
    fake.handler = Model()
    due = utc("2026-12-01T09:00:00")
    clock = Clock(due - 60)
    async with Callbacks() as callbacks:
        seeding = PostgresScheduleStore(pg_url)
        for n in range(50):
            await seeding.add(Job(id=f"k{n:02}", prompt=f"report {n}", channel="webhook",
                                  conversation=f"webhook:k{n}", sender="ops", timezone="UTC", at=due,
                                  next_fire=due, callback_url=callbacks.url))  # fmt: skip
        await seeding.close()
        config = f"webhook: {{callback_hosts: ['{callbacks.host}']}}\n"
        async with (
            node(tmp_path, pg_url, "a", fake, clock, config) as (first, _),
            node(tmp_path, pg_url, "b", fake, clock, config) as (second, _),
        ):
            schedulers = [first.scheduler, second.scheduler]
            for scheduler in schedulers:
                scheduler.batch = 5  # type: ignore[union-attr]  # several claims each: they interleave
            clock.now = due + 1  # both look within 20 ms: a race for the same 50 rows
            await eventually(lambda: len(callbacks.received) >= 50, timeout=40)
            await eventually(lambda: nothing_pending([first, second]), what="both nodes done and sent")
            queued = [s.counts["queued"] for s in schedulers]  # type: ignore[union-attr]
    assert sum(queued) == 50 and min(queued) > 0, queued  # both nodes claimed, together each job once
    by_fire = {r["message_id"]: r for r in callbacks.received}
    assert len(callbacks.received) == 50 == len(by_fire) == len({r["key"] for r in callbacks.received})
    assert sorted(by_fire) == sorted(fire_message_id(f"k{n:02}", due) for n in range(50))
    assert all(r["reply"] == f"Reminder: report {int(m[5:7])}" for m, r in by_fire.items())
    assert len(fired_requests(fake)) == 50
    fires = rows(pg_url, "SELECT job_id, status, claimed_by FROM schedule_fires")
    assert len(fires) == 50 and {status for _, status, _ in fires} == {"queued"}
    assert len({node for _, _, node in fires}) == 2
    assert rows(pg_url, "SELECT COUNT(*), COUNT(DISTINCT message_id) FROM inbox WHERE status = 'done'") == [
        (50, 50)
    ]


def cli(path: Path, url: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`hermes-kernel --config PATH schedule …` with HERMES_DATABASE_URL (run in a thread: it has its
    own event loop); its exit code and output."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HERMES_DATABASE_URL", url)
        code = main(["--config", str(path), "schedule", *args])
    out = capsys.readouterr()
    return code, out.out + out.err


async def test_remind_me_in_30_seconds_on_postgresql_fires_and_the_cli_and_console_see_it(
    pg_url: str, tmp_path: Path, fake: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from hermes_core.server import serve

    model = fake.handler = Model()
    model.calls["remind me in 30 seconds"] = ("schedule_task", {"prompt": "stretch", "delay_minutes": 0.5})
    start = utc("2026-12-01T10:00:00")
    clock = Clock(start)
    async with Callbacks() as callbacks:
        config = (f"webhook: {{callback_hosts: ['{callbacks.host}']}}\n"
                  "schedule: {min_delay_minutes: 0.5}\n")  # fmt: skip  # the default: a minute at least
        async with node(tmp_path, pg_url, "a", fake, clock, config) as (built, url):
            body = {"message": "remind me in 30 seconds to stretch", "user_id": "ann", "message_id": "m1",
                    "callback_url": callbacks.url}  # fmt: skip
            status, _ = await post(f"{url}/webhook", body)
            assert status in (200, 202)
            await eventually(lambda: len(callbacks.received) == 1)
            assert "2026-12-01T10:00:30" in callbacks.received[0]["reply"]
            path = tmp_path / "a" / "hermes.yaml"
            code, listed = await asyncio.to_thread(cli, path, pg_url, capsys, "list", "--json")
            [job] = json.loads(listed)
            assert code == 0 and job["conversation"] == "webhook:ann" and job["next_fire"] == start + 30
            clock.now = start + 29.9
            await scheduler_looked(built)
            assert len(callbacks.received) == 1
            clock.now = start + 30
            await eventually(lambda: len(callbacks.received) == 2)
    assert callbacks.received[1]["reply"] == "Reminder: stretch"
    assert callbacks.received[1]["message_id"] == fire_message_id(job["id"], start + 30)
    code, listed = await asyncio.to_thread(cli, path, pg_url, capsys, "list", "--all", "--json")
    [done] = json.loads(listed)
    assert (done["status"], done["last_outcome"]) == ("done", "queued")
    # a job added from the command line: the console of a node lists it and cancels it
    code, added = await asyncio.to_thread(
        cli, path, pg_url, capsys, "add", "--id", "weekly", "--prompt", "send the summary", "--cron",
        "0 9 * * 1", "--channel", "web",
    )  # fmt: skip
    assert code == 0 and "job weekly: cron 0 9 * * 1 (UTC)" in added, added
    settings = load_settings(path, env={"HERMES_DATABASE_URL": pg_url}, dotenv=None)
    stop, address = asyncio.Event(), asyncio.get_running_loop().create_future()
    served = asyncio.ensure_future(serve(settings, port=0, ready=address.set_result, stop=stop))
    base = await asyncio.wait_for(address, 30)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/console/schedule") as page:
                html = await page.text()
            headers = {"Origin": base, "Content-Type": "application/json"}
            async with http.post(
                f"{base}/console/api/schedule/weekly/cancel", json={}, headers=headers
            ) as answer:
                cancelled = answer.status, await answer.json()
    finally:
        stop.set()
        await served
    assert 'data-job="weekly"' in html and "send the summary" in html
    assert cancelled == (200, {"cancelled": "weekly"})
    code, listed = await asyncio.to_thread(cli, path, pg_url, capsys, "list", "--all", "--json")
    assert {j["id"]: j["status"] for j in json.loads(listed)} == {job["id"]: "done", "weekly": "cancelled"}
    assert not list(tmp_path.rglob("gateway.db"))  # nothing of it in SQLite
