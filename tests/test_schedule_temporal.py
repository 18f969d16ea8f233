"""Scheduled jobs on `engine: temporal`, as deployed: two `serve` nodes and two `worker` nodes (real
processes, tests/test_temporal_engine.py's `Cluster`) on a Temporal dev server and one PostgreSQL
(`database.url`, the password from PGPASSWORD), the fake Feishu platform and the fake model.

- a member asks "remind me in 3 seconds to stretch": `schedule_task` runs on a worker and stores the
  job in PostgreSQL; `list_scheduled` and `cancel_scheduled` work there too; both serve nodes fire,
  and the job fires once, into its conversation's workflow, its reply a new message in the chat;
  the fired task is not offered `schedule_task` (issue 31: jobs that created jobs);
  a broadcast whose creator is no admin any more is refused at the fire, and nothing is sent;
- a node killed between the claim and the signal: the fire is recorded, not delivered; another
  node's sweep signals it again (with the same message id), and where the first signal did arrive
  the workflow drops the copy — each fire answered once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from hermes_core.config import load_settings, policy
from hermes_core.schedule.jobs import Job, fire_message_id
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer
from pg_server import PASSWORD, PostgresServer
from test_schedule import Model, fired_requests
from test_temporal_engine import Cluster
from waiting import eventually

pytestmark = pytest.mark.slow  # real processes, a Temporal server, PostgreSQL


class Setup:
    def __init__(
        self, cluster: Cluster, url: str, model: Model, feishu: FakeFeishu, fake: FakeOpenAIServer
    ) -> None:
        self.cluster, self.url, self.model, self.feishu, self.fake = cluster, url, model, feishu, fake

    def rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url) as db:
            return db.execute(sql, args).fetchall()

    def texts(self, chat: str) -> list[str]:
        return [message.text for message in self.feishu.messages_in(chat)]

    async def inbox(self) -> Any:
        """A `TemporalInbox` of this test (the nodes' configuration), for signals and queries."""
        from hermes_core.engine.temporal.client import TemporalInbox, connect

        settings = load_settings(self.cluster.folder / "hermes.yaml", env={}, dotenv=None)
        client = await connect(settings.temporal)
        return TemporalInbox(client, settings.temporal, policy(settings.permissions))


@pytest.fixture(scope="module")
def setup(
    postgres: PostgresServer, temporal_dev: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    url = postgres.fresh_database()
    bare = postgres.url(url.rsplit("/", 1)[1], password=False)  # the file may not hold the password
    model = Model()
    fake = FakeOpenAIServer(handler=model, latency=0.02).start_in_thread()
    feishu = FakeFeishu(time_scale=0.01, seed=5).start_in_thread()
    sections = {"database": {"url": bare}, "schedule": {"tick": 0.2, "min_delay_minutes": 0}}  # 3 s reminders
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PGPASSWORD", PASSWORD)
        cluster = Cluster(
            tmp_path_factory.mktemp("cluster"), temporal_dev, fake, feishu, sections, database=url
        )
    try:
        yield Setup(cluster, url, model, feishu, fake)
    finally:
        codes = cluster.stop()
        feishu.stop()
        fake.stop()
    assert set(codes) == {0}, codes


async def test_a_job_made_on_a_worker_fires_once_into_its_conversation(setup: Setup) -> None:
    feishu, run = setup.feishu, uuid.uuid4().hex[:6]
    chat, sender = f"oc_{run}", f"ou_{run}"
    conversation = f"feishu:{sender}"
    cancelled: dict[str, Any] = {}  # its job id, once known (the model's calls are read by its thread)
    setup.model.calls.update({
        f"remind {run} tomorrow": ("schedule_task", {"prompt": f"water {run}", "delay_minutes": 1440}),
        f"what is scheduled {run}": ("list_scheduled", {}),
        f"remind {run} in 3 seconds": ("schedule_task", {"prompt": f"stretch {run}", "delay_minutes": 0.05}),
        f"cancel the water {run}": ("cancel_scheduled", cancelled),
    })  # fmt: skip

    async def say(text: str, node: int) -> None:
        before = len(feishu.messages_in(chat))
        await feishu.push(feishu.user_message(text, chat_id=chat, sender=sender), setup.cluster.events(node))
        await eventually(lambda: len(feishu.messages_in(chat)) > before, 30, text)

    await say(f"remind {run} tomorrow", 0)
    [(tomorrow,)] = setup.rows("SELECT id FROM schedule_jobs WHERE conversation = %s", (conversation,))
    await say(f"what is scheduled {run}", 1)
    assert tomorrow in setup.texts(chat)[-1] and f"water {run}" in setup.texts(chat)[-1]  # list_scheduled
    await say(f"remind {run} in 3 seconds", 0)
    cancelled["job_id"] = tomorrow
    await say(f"cancel the water {run}", 1)
    await eventually(lambda: f"Reminder: stretch {run}" in setup.texts(chat), 30, "the fire")
    reminder = next(m for m in feishu.messages_in(chat) if m.text == f"Reminder: stretch {run}")
    assert reminder.reply_to is None and reminder.receive_id == chat  # a new message, proactively
    [fired] = [r for r in fired_requests(setup.fake) if f"stretch {run}" in str(r.messages[-1]["content"])]
    assert "schedule_task" not in {t["function"]["name"] for t in fired.tools}  # type: ignore[index]  # issue 31
    inbox = await setup.inbox()

    async def five_turns() -> dict[str, Any] | None:
        status = await inbox.conversation_status(conversation)
        return status if status["turns"] >= 5 and not status["queued"] else None

    status = await eventually(five_turns, what="five turns, none queued")
    assert status["duplicates"] == 0 and status["turns"] == 5
    texts = setup.texts(chat)
    assert texts.count(f"Reminder: stretch {run}") == 1 and len(texts) == 5, texts
    assert any("cancelled" in text and "true" in text for text in texts), texts  # cancel_scheduled
    jobs = dict(setup.rows("SELECT id, status FROM schedule_jobs WHERE conversation = %s", (conversation,)))
    [soon] = set(jobs) - {tomorrow}
    assert jobs == {soon: "done", tomorrow: "cancelled"}
    fires = setup.rows(
        "SELECT status, delivered_at IS NOT NULL FROM schedule_fires WHERE job_id = %s", (soon,)
    )
    assert fires == [("queued", True)]


async def test_a_broadcast_of_a_creator_no_longer_admin_is_refused_at_the_fire(setup: Setup) -> None:
    from hermes_core.postgres.schedules import PostgresScheduleStore

    chat = f"oc_ops_{uuid.uuid4().hex[:6]}"
    store = PostgresScheduleStore(setup.url)
    due = time.time() + 0.5
    await store.add(Job(id=f"b-{chat}", prompt="good morning", channel="feishu",
                        conversation=f"feishu:{chat}", sender="ou_former_admin", timezone="UTC", at=due,
                        next_fire=due, creator_role="admin", broadcast=True, chat_id=chat,
                        chat_type="group"))  # fmt: skip
    await store.close()
    await eventually(lambda: setup.rows("SELECT 1 FROM schedule_fires WHERE job_id = %s",
                                                           (f"b-{chat}",)), 20, "the fire")  # fmt: skip
    [(status, reason)] = setup.rows(
        "SELECT status, reason FROM schedule_fires WHERE job_id = %s", (f"b-{chat}",)
    )
    assert status == "refused" and "no longer an admin" in reason
    assert setup.feishu.messages_in(chat) == []  # refused fires are never signalled


async def test_a_fire_claimed_by_a_node_killed_before_its_signal_is_signalled_by_another(
    setup: Setup,
) -> None:
    from hermes_core.postgres.schedules import PostgresScheduleStore

    feishu, run = setup.feishu, uuid.uuid4().hex[:6]
    later = time.time() + 3600  # the nodes do not see it due; this "node" claims it at that time
    killed = PostgresScheduleStore(setup.url, inbox=False)
    for name in ("signalled", "never"):
        chat = f"oc_{run}_{name}"
        await killed.add(Job(id=f"{name}-{run}", prompt=f"{name} {run}", channel="feishu",
                             conversation=f"feishu:{chat}", sender="ou_ops", timezone="UTC", at=later,
                             next_fire=later, chat_id=chat, chat_type="group"))  # fmt: skip
    fires = await killed.claim_due(later, 300, 10)
    assert [f.status for f in fires] == ["queued", "queued"]
    inbox = await setup.inbox()
    signalled = next(f for f in fires if f.job_id.startswith("signalled"))
    assert signalled.message is not None and signalled.message.message_id == fire_message_id(
        signalled.job_id, later
    )
    await inbox.signal(signalled.message)  # it got this far, then died: neither marked delivered
    await killed.close()
    setup.rows(
        "UPDATE schedule_fires SET claimed_at = claimed_at - 60 WHERE job_id LIKE %s RETURNING 1",
        (f"%-{run}",),
    )
    for name in ("signalled", "never"):
        chat = f"oc_{run}_{name}"
        await eventually(lambda chat=chat: len(feishu.messages_in(chat)) >= 1, 30, f"{name}'s reply")
    delivered = setup.rows("SELECT job_id, delivered_at IS NOT NULL, claimed_by FROM schedule_fires "
                           "WHERE job_id LIKE %s", (f"%-{run}",))  # fmt: skip
    assert {job_id: ok for job_id, ok, _ in delivered} == {f"signalled-{run}": True, f"never-{run}": True}
    assert all(by != killed.node for _, _, by in delivered)  # taken over by a serve node's sweep

    async def copy_dropped() -> dict[str, Any] | None:
        status = await inbox.conversation_status(f"feishu:oc_{run}_signalled")
        return (
            status if status["duplicates"] >= 1 and not status["in_flight"] and not status["queued"] else None
        )

    status = await eventually(copy_dropped, what="the sweep's copy dropped")
    assert status["turns"] == 1 and status["duplicates"] == 1  # the sweep's copy dropped
    assert setup.texts(f"oc_{run}_signalled") == [f"Reminder: signalled {run}"]
    assert setup.texts(f"oc_{run}_never") == [f"Reminder: never {run}"]
