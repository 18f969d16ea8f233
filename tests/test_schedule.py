"""Scheduled and proactive tasks against the real gateway (`build_gateway`, as `serve` builds it):
the fake model asks for `schedule_task` like a real one would, the fake Feishu platform and a local
callback server receive the proactive replies, and the scheduler reads an injected clock, so "at
15:00" is reached by moving the clock, never by waiting.

The cases come from the scheduling request: "remind me at 3 pm", "every weekday at 9:00", "in 20
minutes"; 9:00 Asia/Shanghai is 01:00 UTC; a cron in America/New_York across the 2026 spring-forward;
fires missed while the service was down (inside and beyond `misfire_grace`); who may schedule where,
and a creator who lost the role by the fire.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway_harness import look_often, post, scheduler_looked, serving
from hermes_core.config import build_agent, load_settings
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.schedules import SQLiteScheduleStore
from hermes_core.gateway.server import build_gateway
from hermes_core.schedule.jobs import Job, next_cron, utc_iso
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from virtual_clock import Clock, utc
from waiting import eventually


class Model:
    """The fake model's behaviour: a user message containing a key of `calls` asks for that tool
    call; a tool result is acknowledged with its content; a scheduled task's prompt is answered
    "Reminder: <prompt>"; anything else "ok"."""

    def __init__(self) -> None:
        self.calls: dict[str, tuple[str, dict[str, Any]]] = {}

    def __call__(self, request: RecordedRequest) -> FakeReply:
        last = request.messages[-1]
        content = str(last.get("content") or "")
        if last["role"] == "tool":
            return FakeReply.text(f"tool said: {content}")
        for key, (name, args) in self.calls.items():
            if key in content:
                return FakeReply.tool_call(name, args)
        if content.startswith("[scheduled task"):
            return FakeReply.text("Reminder: " + content.split("] ", 1)[1])
        return FakeReply.text("ok")


def fired_requests(fake: FakeOpenAIServer) -> list[RecordedRequest]:
    return [
        r for r in fake.requests if str(r.messages[-1].get("content") or "").startswith("[scheduled task")
    ]


@asynccontextmanager
async def gateway(
    tmp_path: Path,
    fake: FakeOpenAIServer,
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
    *,
    feishu: FakeFeishu | None = None,
    config: str = "",
    gateway_options: str = "",
) -> AsyncIterator[tuple[Gateway, str]]:
    """The gateway serve builds from a configuration (model: the fake; Feishu: the fake platform);
    `gateway_options`: more of the `gateway:` section, as YAML flow items."""
    for name in ("FEISHU_APP_SECRET", "FEISHU_VERIFICATION_TOKEN", "FEISHU_ENCRYPT_KEY"):
        monkeypatch.delenv(name, raising=False)
    feishu_part = ""
    if feishu is not None:
        monkeypatch.setenv("FEISHU_APP_SECRET", feishu.app_secret)
        monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", feishu.verification_token)
        # one final message per reply: streaming has its own tests (test_streaming_feishu.py)
        feishu_part = f"feishu: {{app_id: {feishu.app_id}, base_url: '{feishu.base_url}', stream: false}}\n"
    path = tmp_path / "hermes.yaml"
    path.write_text(
        f"model: {{name: m, base_url: '{fake.base_url}'}}\n"
        f"gateway: {{data_dir: '{tmp_path / 'data'}', {gateway_options}}}\n"
        "observe: {traces: false}\n" + feishu_part + textwrap.dedent(config),
        encoding="utf-8",
    )
    settings = load_settings(path, env={}, dotenv=None)
    agent = build_agent(settings)
    built, routes = build_gateway(settings, agent, clock=clock)
    look_often(built)  # the test moves the clock
    try:
        async with serving(built, routes) as url:
            yield built, url
    finally:
        await built.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()


class Callbacks:
    """A webhook caller's callback endpoint: every POSTed reply, in order."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.url = ""

    async def __aenter__(self) -> Callbacks:
        async def receive(request: web.Request) -> web.Response:
            self.received.append({**await request.json(), "key": request.headers.get("Idempotency-Key")})
            return web.json_response({"ok": True})

        app = web.Application()
        app.router.add_post("/cb", receive)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url, self.host = f"http://127.0.0.1:{port}/cb", f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


async def jobs_in(tmp_path: Path) -> list[Job]:
    store = SQLiteScheduleStore(tmp_path / "data" / "gateway.db")
    try:
        return await store.jobs(active_only=False)
    finally:
        await store.close()


async def test_remind_me_at_3pm_fires_once_into_the_feishu_chat_proactively(
    tmp_path: Path, fake: FakeOpenAIServer, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake.handler = Model()
    model.calls["remind me at 3 pm"] = (
        "schedule_task",
        {"prompt": "send the report", "at": "2026-12-01T15:00"},
    )
    clock = Clock(utc("2026-12-01T05:00:00"))  # 13:00 in Shanghai
    async with gateway(tmp_path, fake, clock, monkeypatch, feishu=feishu,
                       config="schedule: {timezone: Asia/Shanghai}\n") as (built, url):  # fmt: skip
        events = f"{url}/feishu/events"
        asked = feishu.user_message("remind me at 3 pm to send the report", chat_id="oc_dm", sender="ou_ann")
        assert (await feishu.push(asked, events)).ok
        await eventually(lambda: len(feishu.messages_in("oc_dm")) == 1)
        assert "2026-12-01T15:00:00+08:00" in feishu.messages_in("oc_dm")[0].text
        [job] = await jobs_in(tmp_path)
        assert job.next_fire == utc("2026-12-01T07:00:00") and job.sender == "ou_ann"
        assert job.conversation == "feishu:ou_ann" and job.chat_id == "oc_dm"

        clock.now = utc("2026-12-01T06:59:59")
        await scheduler_looked(built)
        assert not fired_requests(fake)
        clock.now = utc("2026-12-01T07:00:00")
        await eventually(lambda: len(feishu.messages_in("oc_dm")) == 2)
        reminder = feishu.messages_in("oc_dm")[1]
        assert reminder.text == "Reminder: send the report"
        assert reminder.reply_to is None and reminder.receive_id == "oc_dm"  # created, not a reply
        clock.now = utc("2026-12-02T07:00:00")
        await scheduler_looked(built)
    assert len(fired_requests(fake)) == 1
    assert len(feishu.messages_in("oc_dm")) == 2
    [done] = await jobs_in(tmp_path)
    assert done.status == "done" and done.last_outcome == "queued"


async def test_every_day_at_9_shanghai_fires_at_01_utc_through_the_webhook_callback(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake.handler = Model()
    model.calls["every day at 9"] = (
        "schedule_task",
        {"prompt": "post yesterday's open tickets", "cron": "0 9 * * *"},
    )
    clock = Clock(utc("2026-12-01T00:30:00"))
    async with Callbacks() as callbacks:
        config = f"schedule: {{timezone: Asia/Shanghai}}\nwebhook: {{callback_hosts: ['{callbacks.host}']}}\n"
        async with gateway(tmp_path, fake, clock, monkeypatch, config=config) as (built, url):
            body = {"message": "every day at 9 post yesterday's open tickets", "user_id": "bo",
                    "message_id": "m1", "callback_url": callbacks.url}  # fmt: skip
            status, _ = await post(f"{url}/webhook", body)
            assert status in (200, 202)
            await eventually(lambda: len(callbacks.received) == 1)
            [job] = await jobs_in(tmp_path)
            assert utc_iso(job.next_fire or 0) == "2026-12-01T01:00:00+00:00"
            clock.now = utc("2026-12-01T00:59:59.5")
            await scheduler_looked(built)
            assert len(callbacks.received) == 1
            clock.now = utc("2026-12-01T01:00:00")
            await eventually(lambda: len(callbacks.received) == 2)
            clock.now = utc("2026-12-02T01:00:01")
            await eventually(lambda: len(callbacks.received) == 3)
    fired = callbacks.received[1:]
    assert [r["reply"] for r in fired] == ["Reminder: post yesterday's open tickets"] * 2
    assert fired[0]["key"] != fired[1]["key"]  # each fire its own task and idempotency key
    [job] = await jobs_in(tmp_path)
    assert utc_iso(job.next_fire or 0) == "2026-12-03T01:00:00+00:00"


async def test_a_webhook_conversation_without_callback_cannot_schedule(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake.handler = Model()
    model.calls["in 20 minutes"] = ("schedule_task", {"prompt": "check the deploy", "delay_minutes": 20})
    async with gateway(tmp_path, fake, Clock(utc("2026-12-01T00:00:00")), monkeypatch) as (_, url):
        status, answer = await post(f"{url}/webhook", {"message": "in 20 minutes check whether the deploy "
                                                       "finished", "user_id": "cy"})  # fmt: skip
    assert status == 200 and "no callback_url" in answer["reply"]
    assert await jobs_in(tmp_path) == []


async def test_in_20_minutes_in_a_group_fires_into_that_group(
    tmp_path: Path, fake: FakeOpenAIServer, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake.handler = Model()
    model.calls["in 20 minutes"] = ("schedule_task", {"prompt": "check the deploy", "delay_minutes": 20})
    clock = Clock(utc("2026-12-01T10:00:00"))
    async with gateway(tmp_path, fake, clock, monkeypatch, feishu=feishu) as (built, url):
        asked = feishu.user_message("in 20 minutes check whether the deploy finished", chat_id="oc_team",
                                    chat_type="group", sender="ou_dev", mention_bot=True)  # fmt: skip
        assert (await feishu.push(asked, f"{url}/feishu/events")).ok
        await eventually(lambda: len(feishu.messages_in("oc_team")) == 1)
        assert "2026-12-01T10:20:00+00:00" in feishu.messages_in("oc_team")[0].text
        clock.now = utc("2026-12-01T10:19:59")
        await scheduler_looked(built)
        assert len(feishu.messages_in("oc_team")) == 1
        clock.now = utc("2026-12-01T10:20:00")
        await eventually(lambda: len(feishu.messages_in("oc_team")) == 2)
    assert feishu.messages_in("oc_team")[1].text == "Reminder: check the deploy"
    [job] = await jobs_in(tmp_path)
    assert job.conversation == "feishu:oc_team" and job.chat_type == "group" and job.status == "done"
    [fired] = fired_requests(fake)  # in a group the model is told who set it up, to address them
    said = str(fired.messages[-1]["content"])
    assert 'set up earlier in this conversation by <at user_id="ou_dev">' in said


async def test_in_20_minutes_asked_inside_a_group_topic_fires_into_that_topic(
    tmp_path: Path, fake: FakeOpenAIServer, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job asked for inside a topic belongs to the topic's conversation (feishu.group_session:
    topic, the default): its reminder goes into that topic, as the reply to the request did, not
    into the group's main stream (Feishu: a reply in the topic, `reply_in_thread`; the topics
    overview, open.feishu.cn/document/server-docs/im-v1/message/thread-introduction)."""
    model = fake.handler = Model()
    model.calls["in 20 minutes"] = ("schedule_task", {"prompt": "check the deploy", "delay_minutes": 20})
    clock = Clock(utc("2026-12-01T10:00:00"))
    async with gateway(tmp_path, fake, clock, monkeypatch, feishu=feishu) as (_, url):
        events = f"{url}/feishu/events"
        first = feishu.user_message("deploying now", chat_id="oc_team", chat_type="group", sender="ou_dev",
                                    mention_bot=True)  # fmt: skip
        assert (await feishu.push(first, events)).ok
        await eventually(lambda: len(feishu.messages_in("oc_team")) == 1)
        root = first["event"]["message"]["message_id"]
        asked = feishu.topic_message("in 20 minutes check whether the deploy finished", root=root,
                                     sender="ou_dev", mention_bot=True)  # fmt: skip
        topic = asked["event"]["message"]["thread_id"]
        assert (await feishu.push(asked, events)).ok
        await eventually(lambda: len(feishu.messages_in("oc_team")) == 2)
        assert feishu.messages_in("oc_team")[1].thread_id == topic
        clock.now = utc("2026-12-01T10:20:00")
        await eventually(lambda: len(feishu.messages_in("oc_team")) == 3)
    reminder = feishu.messages_in("oc_team")[2]
    assert reminder.text == "Reminder: check the deploy" and reminder.thread_id == topic
    [job] = await jobs_in(tmp_path)
    assert job.conversation == f"feishu:oc_team:{topic}" and job.thread_id == topic


async def test_a_member_may_not_post_into_another_chat_an_admin_may_and_loses_it_by_the_fire(
    tmp_path: Path, fake: FakeOpenAIServer, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake.handler = Model()
    model.calls["post to ops"] = ("schedule_task", {"prompt": "good morning ops", "cron": "0 9 * * 1-5",
                                                    "chat_id": "oc_ops"})  # fmt: skip
    clock = Clock(utc("2026-12-01T00:00:00"))  # a Tuesday, 08:00 in Shanghai
    admins = "permissions: {admins: ['feishu:ou_boss']}\nschedule: {timezone: Asia/Shanghai}\n"
    async with gateway(tmp_path, fake, clock, monkeypatch, feishu=feishu, config=admins) as (_, url):
        events = f"{url}/feishu/events"
        member = feishu.user_message("post to ops every weekday", chat_id="oc_dm1", sender="ou_dev")
        assert (await feishu.push(member, events)).ok
        await eventually(lambda: len(feishu.messages_in("oc_dm1")) == 1)
        assert "admins only" in feishu.messages_in("oc_dm1")[0].text
        assert await jobs_in(tmp_path) == []
        boss = feishu.user_message("post to ops every weekday", chat_id="oc_dm2", sender="ou_boss")
        assert (await feishu.push(boss, events)).ok
        await eventually(lambda: len(feishu.messages_in("oc_dm2")) == 1)
        [job] = await jobs_in(tmp_path)
        assert job.broadcast and job.conversation == "feishu:oc_ops" and job.creator_role == "admin"
        clock.now = utc("2026-12-01T01:00:00")
        await eventually(lambda: len(feishu.messages_in("oc_ops")) == 1)
        assert feishu.messages_in("oc_ops")[0].text == "Reminder: good morning ops"
    # the next day the person is no admin any more: the fire is refused, recorded, nothing runs
    clock.now = utc("2026-12-02T01:00:00")
    before = len(fake.requests)
    async with gateway(tmp_path, fake, clock, monkeypatch, feishu=feishu,
                       config="schedule: {timezone: Asia/Shanghai}\n") as (built, _):  # fmt: skip
        await eventually(lambda: built.scheduler.counts["refused"] == 1)  # type: ignore[union-attr]
        await scheduler_looked(built)
    assert len(fake.requests) == before and len(feishu.messages_in("oc_ops")) == 1
    store = SQLiteScheduleStore(tmp_path / "data" / "gateway.db")
    fires = await store.fires(job.id)
    await store.close()
    assert [f.status for f in fires] == ["refused", "queued"]
    assert "no longer an admin" in fires[0].reason


async def seed(tmp_path: Path, job: Job) -> None:
    store = SQLiteScheduleStore(tmp_path / "data" / "gateway.db")
    await store.add(job)
    await store.close()


def callback_job(job_id: str, callbacks: Callbacks, cron: str, next_fire: float) -> Job:
    return Job(id=job_id, prompt=f"report {job_id}", channel="webhook", conversation=f"webhook:{job_id}",
               sender="ops", timezone="UTC", cron=cron, next_fire=next_fire,
               callback_url=callbacks.url)  # fmt: skip


async def test_fires_missed_while_down_run_once_within_the_grace_else_are_recorded_skipped(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.handler = Model()
    async with Callbacks() as callbacks:
        # down from 08:50 to 09:03: "every 10 minutes" missed 09:00 (3 min ago, inside 5 min) and
        # "hourly at :30" missed 07:30 and 08:30 (33 min ago: beyond the grace)
        await seed(tmp_path, callback_job("ten", callbacks, "*/10 * * * *", utc("2026-12-01T09:00:00")))
        await seed(tmp_path, callback_job("half", callbacks, "30 * * * *", utc("2026-12-01T07:30:00")))
        clock = Clock(utc("2026-12-01T09:03:00"))
        config = f"webhook: {{callback_hosts: ['{callbacks.host}']}}\nschedule: {{misfire_grace: 300}}\n"
        async with gateway(tmp_path, fake, clock, monkeypatch, config=config) as (built, _):
            await eventually(lambda: len(callbacks.received) == 1)
            await scheduler_looked(built)
            assert built.scheduler.counts == {"queued": 1, "skipped": 2, "refused": 0}  # type: ignore[union-attr]
    assert [r["reply"] for r in callbacks.received] == ["Reminder: report ten"]
    store = SQLiteScheduleStore(tmp_path / "data" / "gateway.db")
    half, ten = await store.get("half"), await store.get("ten")
    half_fires = await store.fires("half")
    await store.close()
    assert half is not None and ten is not None
    assert utc_iso(half.next_fire or 0) == "2026-12-01T09:30:00+00:00"
    assert utc_iso(ten.next_fire or 0) == "2026-12-01T09:10:00+00:00"
    assert [(utc_iso(f.fire_at), f.status) for f in half_fires] == [
        ("2026-12-01T08:30:00+00:00", "skipped"), ("2026-12-01T07:30:00+00:00", "skipped")]  # fmt: skip
    assert "beyond misfire_grace" in half_fires[0].reason and "1 fire time(s)" in half_fires[1].reason


async def test_cron_in_new_york_keeps_9am_local_across_the_spring_forward(tmp_path: Path) -> None:
    store = SQLiteScheduleStore(tmp_path / "gateway.db")
    start = utc("2026-03-06T15:00:00")  # Friday 10:00 EST
    cron, zone = "0 9 * * *", "America/New_York"
    first = next_cron(cron, zone, start)
    job = Job(id="ny", prompt="standup", channel="webhook", conversation="webhook:ny", sender="u",
              timezone=zone, cron=cron, next_fire=first)  # fmt: skip
    await store.add(job)
    fired: list[str] = []
    now = start
    for _ in range(4):
        nxt = (await store.get("ny")).next_fire  # type: ignore[union-attr]
        assert nxt is not None
        now = nxt
        fires = await store.claim_due(now, 300, 10)
        fired += [utc_iso(f.fire_at) for f in fires if f.status == "queued"]
    await store.close()
    assert fired == ["2026-03-07T14:00:00+00:00", "2026-03-08T13:00:00+00:00",
                     "2026-03-09T13:00:00+00:00", "2026-03-10T13:00:00+00:00"]  # fmt: skip


async def test_a_fire_claimed_twice_is_one_inbox_row(tmp_path: Path) -> None:
    """The claim is the only way in: run it concurrently from two stores on the same file (two
    claimers racing) and each fire time is queued once."""
    first, second = SQLiteScheduleStore(tmp_path / "gateway.db"), SQLiteScheduleStore(tmp_path / "gateway.db")
    for n in range(50):
        job = Job(id=f"j{n}", prompt="p", channel="webhook", conversation=f"webhook:{n}", sender="u",
                  timezone="UTC", cron="* * * * *", next_fire=utc("2026-12-01T00:00:00"))  # fmt: skip
        await first.add(job)
    now = utc("2026-12-01T00:00:30")
    results = await asyncio.gather(*(store.claim_due(now, 300, 7) for store in [first, second] * 10))
    queued = [f for fires in results for f in fires if f.status == "queued"]
    rows = await first.db.transaction(lambda db: db.execute("SELECT COUNT(*) FROM inbox").fetchone()[0])
    await first.close()
    await second.close()
    assert len(queued) == 50 == rows
    assert len({f.job_id for f in queued}) == 50


async def test_operator_jobs_from_yaml_are_stored_kept_and_cancelled_when_removed(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.handler = Model()
    clock = Clock(utc("2026-12-01T00:00:00"))
    yaml_jobs = """\
    schedule:
      timezone: Asia/Shanghai
      jobs:
        - {id: tickets, prompt: "post yesterday's open tickets", cron: "0 9 * * 1-5", channel: webhook,
           callback_url: "CALLBACK"}
    webhook: {callback_hosts: ["HOST"]}
    """
    async with (
        Callbacks() as callbacks,
        gateway(
            tmp_path,
            fake,
            clock,
            monkeypatch,
            config=yaml_jobs.replace("CALLBACK", callbacks.url).replace("HOST", callbacks.host),
        ) as (built, _),
    ):
        await eventually(lambda: built.scheduler.counts["queued"] == 0 and bool(built.scheduler._task))  # type: ignore[union-attr]
        clock.now = utc("2026-12-01T01:00:00")
        await eventually(lambda: len(callbacks.received) == 1)
    assert callbacks.received[0]["reply"] == "Reminder: post yesterday's open tickets"
    [job] = await jobs_in(tmp_path)
    assert job.id == "config:tickets" and utc_iso(job.next_fire or 0) == "2026-12-02T01:00:00+00:00"
    async with gateway(tmp_path, fake, clock, monkeypatch, config="") as (built, _):
        await eventually(lambda: built.scheduler is not None and built.scheduler._task is not None)  # type: ignore[union-attr]
        await scheduler_looked(built)
    [job] = await jobs_in(tmp_path)
    assert job.status == "cancelled"


def test_bad_schedule_configuration_names_the_problem(tmp_path: Path) -> None:
    from hermes_core.config import ConfigError

    for config, words in [
        ("schedule: {timezone: Mars/Olympus}\n", "unknown time zone 'Mars/Olympus'"),
        (
            "schedule: {jobs: [{id: a, prompt: p, cron: '61 * * * *', chat_id: oc}]}\n",
            "not a cron expression",
        ),
        ("schedule: {jobs: [{id: a, prompt: p, chat_id: oc}]}\n", "give either cron or at"),
        ("schedule: {jobs: [{id: a, prompt: p, cron: '* * * * *'}]}\n", "needs chat_id"),
    ]:
        path = tmp_path / "h.yaml"
        path.write_text(config, encoding="utf-8")
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("*", r"\*")):
            load_settings(path, env={}, dotenv=None)


def test_tool_arguments_with_a_bad_time_come_back_to_the_model_as_sentences() -> None:
    from hermes_core.schedule.jobs import ScheduleError, check_cron, parse_at

    with pytest.raises(ScheduleError, match="in the past"):
        parse_at("2026-12-01T08:00", "Asia/Shanghai", utc("2026-12-01T01:00:00"))
    with pytest.raises(ScheduleError, match="not an ISO date"):
        parse_at("tomorrow-ish", "UTC", 0)
    with pytest.raises(ScheduleError, match="five fields"):
        check_cron("every monday")
    now = utc("2026-11-01T00:00:00")
    assert json.loads(json.dumps(utc_iso(parse_at("2026-12-01T09:00", "Asia/Shanghai", now)))) == (
        "2026-12-01T01:00:00+00:00")  # fmt: skip


DEPLOY_TOOL = """
from hermes_core import tool

RUNS = []

@tool(level=2)
def deploy(env: str) -> str:
    \"\"\"Deploy to an environment (irreversible).\"\"\"
    RUNS.append(env)
    return f"deployed {env}"
"""


async def test_a_level_2_tool_in_a_job_waits_for_approval_asked_in_the_jobs_chat(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "deploy_tools.py").write_text(DEPLOY_TOOL, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    model = fake.handler = Model()
    model.calls["deploy staging"] = ("deploy", {"env": "staging"})
    async with Callbacks() as callbacks:
        await seed(tmp_path, Job(id="nightly", prompt="deploy staging", channel="webhook",
                                 conversation="webhook:ops", sender="ops", timezone="UTC",
                                 cron="0 2 * * *", next_fire=utc("2026-12-01T02:00:00"),
                                 callback_url=callbacks.url))  # fmt: skip
        clock = Clock(utc("2026-12-01T01:59:00"))
        config = (f"webhook: {{callback_hosts: ['{callbacks.host}']}}\n"
                  "tools: [deploy_tools]\npermissions: {allow_irreversible: [deploy]}\n")  # fmt: skip
        async with gateway(tmp_path, fake, clock, monkeypatch, config=config) as (_, url):
            clock.now = utc("2026-12-01T02:00:00")
            await eventually(lambda: len(callbacks.received) == 1)
            asked = callbacks.received[0]
            assert asked["approval"]["tool"] == "deploy" and asked["conversation_id"] == "ops"
            import deploy_tools

            assert deploy_tools.RUNS == []  # nothing ran before a person approved
            status, decided = await post(f"{url}/webhook/approvals/{asked['approval']['id']}",
                                         {"user_id": "ops", "decision": "approve"})  # fmt: skip
            assert status == 202 and decided["status"] == "approved", decided
            await eventually(lambda: len(callbacks.received) == 2)
    assert deploy_tools.RUNS == ["staging"]
    assert "deployed staging" in callbacks.received[1]["reply"]


async def test_the_console_lists_jobs_and_cancels_one(
    tmp_path: Path, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aiohttp

    from hermes_core.server import serve

    await seed(tmp_path, Job(id="weekly", prompt="send the <b>weekly</b> summary", channel="web",
                             conversation="web:console", sender="console", timezone="Asia/Shanghai",
                             cron="0 9 * * 1", next_fire=utc("2030-01-07T01:00:00")))  # fmt: skip
    path = tmp_path / "hermes.yaml"
    data = tmp_path / "data"
    path.write_text(f"model: {{name: m, base_url: '{fake.base_url}'}}\ngateway: {{data_dir: '{data}'}}\n")
    settings = load_settings(path, env={}, dotenv=None)
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
            async with http.post(
                f"{base}/console/api/schedule/weekly/cancel", json={}, headers=headers
            ) as again:
                twice = again.status
            async with http.get(f"{base}/console/api/schedule") as listing:
                jobs = (await listing.json())["jobs"]
    finally:
        stop.set()
        await served
    assert 'data-job="weekly"' in html and "cron 0 9 * * 1 (Asia/Shanghai)" in html
    assert "&lt;b&gt;weekly&lt;/b&gt;" in html and "<b>weekly</b>" not in html
    assert cancelled == (200, {"cancelled": "weekly"}) and twice == 404
    assert [(job["id"], job["status"]) for job in jobs] == [("weekly", "cancelled")]


async def test_turn_slots_go_to_people_before_jobs_and_jobs_never_take_them_all() -> None:
    from hermes_core.gateway.dispatcher import TurnSlots

    slots = TurnSlots(4, floor=4, lag_target=0)
    order: list[str] = []

    async def turn(name: str, batch: bool, hold: asyncio.Event) -> None:
        async with slots.slot(batch):
            order.append(name)
            await hold.wait()

    hold = asyncio.Event()
    jobs = [asyncio.ensure_future(turn(f"job{n}", True, hold)) for n in range(6)]
    await eventually(lambda: slots.in_flight == 3)  # three quarters of 4: one slot stays free
    person = asyncio.ensure_future(turn("person", False, hold))
    await eventually(lambda: slots.in_flight == 4)
    assert order == ["job0", "job1", "job2", "person"] and slots.waiting == 3
    hold.set()
    await asyncio.gather(*jobs, person)
    assert sorted(order[4:]) == ["job3", "job4", "job5"] and slots.in_flight == slots.batch_in_flight == 0


async def test_the_scheduler_forgets_old_fires_hourly(tmp_path: Path) -> None:
    """The record of fires does not grow without bound: the scheduler prunes fires older than
    `gateway.retention_days` once an hour (the store's own rule is in the contract suite)."""
    from hermes_core.gateway.schedules import PRUNE_EVERY, Scheduler

    class Lanes:
        def enqueue(self, message: Any) -> None:
            pass

    start = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc).timestamp()
    now = [start]
    store = SQLiteScheduleStore(tmp_path / "gateway.db")
    job = Job(id="tick", channel="webhook", conversation="webhook:ops", sender="ops", timezone="UTC",
              cron="0 * * * *", prompt="tick", next_fire=start)  # fmt: skip
    await store.add(job)
    scheduler = Scheduler(store, Lanes(), clock=lambda: now[0], retention=2 * 3600)
    try:
        for hour in range(4):  # fires at 9, 10, 11 and 12 o'clock
            now[0] = start + hour * 3600
            await scheduler.run_due()
        assert len(await store.fires("tick")) == 4
        await scheduler.prune()  # at 12: the fires of 9 (and before) are over two hours old
        assert [f.fire_at - start for f in await store.fires("tick")] == [3 * 3600, 2 * 3600, 3600]
        now[0] += PRUNE_EVERY / 2  # 12:30: the fire of 10 is over two hours old, but pruning is hourly
        await scheduler.prune()
        assert [f.fire_at - start for f in await store.fires("tick")] == [3 * 3600, 2 * 3600, 3600]
        now[0] += PRUNE_EVERY / 2  # 13:00: the fire of 13 runs, and the one of 10 is forgotten
        await scheduler.run_due()
        await scheduler.prune()
        assert [f.fire_at - start for f in await store.fires("tick")] == [4 * 3600, 3 * 3600, 2 * 3600]
    finally:
        await store.close()


async def test_catching_up_after_a_week_down_does_not_hold_up_a_feishu_acknowledgement(
    tmp_path: Path, fake: FakeOpenAIServer, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack (reported by hand against the last release): 20 minutely jobs, the service down
    for a week. At start the scheduler counted each job's 10,080 missed fire times one croniter call
    at a time inside the claim's write (about 1.5 s a job), so the Feishu event that arrived then
    waited ~30 s for the database writer and missed the platform's 3 s deadline (FEISHU.md: an event
    not acknowledged in 3 s is pushed again). Now the catch-up is planned outside the write and
    counts at most a hundred; the event is acknowledged in time and each job moves on once."""
    fake.handler = Model()
    now = utc("2026-12-01T09:00:30")
    for n in range(20):
        minutely = Job(id=f"minutely{n}", prompt="tick", channel="webhook", conversation=f"webhook:m{n}",
                       sender="ops", timezone="Asia/Shanghai", cron="* * * * *",
                       next_fire=now - 7 * 86400)  # fmt: skip
        await seed(tmp_path, minutely)
    clock = Clock(now)
    async with gateway(tmp_path, fake, clock, monkeypatch, feishu=feishu,
                       config="schedule: {misfire_grace: 1}\n") as (built, url):  # fmt: skip
        pushed = await feishu.push(
            feishu.user_message("hello", chat_id="oc_dm", sender="ou_ann"), f"{url}/feishu/events"
        )
        assert pushed.ok and pushed.elapsed < 3, pushed
        await eventually(lambda: built.scheduler.counts["skipped"] == 40, timeout=60)  # type: ignore[union-attr]
    [job] = [j for j in await jobs_in(tmp_path) if j.id == "minutely0"]
    assert job.next_fire == utc("2026-12-01T09:01:00")
    store = SQLiteScheduleStore(tmp_path / "data" / "gateway.db")
    fires = await store.fires("minutely0")
    await store.close()
    assert [(utc_iso(f.fire_at), f.status) for f in fires] == [
        ("2026-12-01T09:00:00+00:00", "skipped"), ("2026-11-24T09:00:30+00:00", "skipped")]  # fmt: skip
    assert fires[1].reason.startswith("more than 100 fire time(s)"), fires[1].reason
