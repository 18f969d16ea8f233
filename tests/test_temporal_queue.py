"""`temporal.task_queue` changed on a running cluster: the conversations started on the old queue
are still answered, and move to the new one.

The case is issue 33's ("changing `temporal.task_queue` leaves existing conversations
unanswered: their workflows stay on the old queue"). Two `serve` nodes and a worker
(tests/test_temporal_engine.py's `Cluster`) on a Temporal dev server answer two chats on queue A;
every process is stopped, the configuration changed to queue B with A in
`temporal.previous_task_queues` (docs/scale-out.md, "Changing the task queue"), and the nodes
and a worker started again. The chat that speaks again is answered, once, and its next run is on
B; the chat that stays quiet moves to B when its idle period ends (`idle_days`, 15 s here); a new
chat starts on B. Where each run is, is read from the server (DescribeWorkflowExecution).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer
from test_temporal_engine import Cluster, steps
from waiting import eventually

pytestmark = pytest.mark.slow  # real processes, a Temporal server, PostgreSQL

IDLE_DAYS = 15 / 86400  # an idle conversation continues as new after 15 s


@pytest.fixture
def platform() -> Iterator[tuple[FakeOpenAIServer, FakeFeishu]]:
    model = FakeOpenAIServer(handler=steps, latency=0.02).start_in_thread()
    feishu = FakeFeishu(time_scale=0.01, seed=13).start_in_thread()
    try:
        yield model, feishu
    finally:
        feishu.stop()
        model.stop()


async def queue_of(address: str, workflow_id: str) -> str:
    """The task queue of the workflow's current run, as the server has it."""
    from temporalio.client import Client

    described = await (await Client.connect(address)).get_workflow_handle(workflow_id).describe()
    return str(described.task_queue)


async def until_on(address: str, workflow_id: str, queue: str, timeout: float) -> None:
    async def on_it() -> bool:
        return await queue_of(address, workflow_id) == queue

    await eventually(on_it, timeout, f"{workflow_id} on {queue}", interval=0.2)


async def say(cluster: Cluster, feishu: FakeFeishu, chat: str, text: str) -> str:
    before = len(feishu.messages_in(chat))
    await feishu.push(feishu.user_message(text, chat_id=chat, sender=f"ou_{chat}"), cluster.events(0))

    def answered() -> bool:
        return len(feishu.messages_in(chat)) > before

    await eventually(answered, 60, f"the reply to {text}")
    return str(feishu.messages_in(chat)[before].text)


async def test_conversations_on_the_old_task_queue_are_answered_and_move(
    tmp_path: Path, temporal_dev: str, platform: tuple[FakeOpenAIServer, FakeFeishu], pg_url: str
) -> None:
    model, feishu = platform
    old, new = f"old-{uuid.uuid4().hex[:6]}", f"new-{uuid.uuid4().hex[:6]}"
    cluster = Cluster(
        tmp_path, temporal_dev, model, feishu, database=pg_url, workers=1, task_queue=old, idle_days=IDLE_DAYS
    )
    try:
        talking, quiet, fresh = (f"oc_{uuid.uuid4().hex[:6]}_{n}" for n in range(3))
        assert await say(cluster, feishu, talking, "call record a1") == "done: recorded a1"
        assert await say(cluster, feishu, quiet, "call record q1") == "done: recorded q1"
        assert await queue_of(temporal_dev, f"feishu:ou_{talking}") == old

        assert set(cluster.stop()) == {0}
        config = json.loads((tmp_path / "hermes.yaml").read_text())
        config["temporal"].update(task_queue=new, previous_task_queues=[old])
        (tmp_path / "hermes.yaml").write_text(json.dumps(config))
        cluster.processes = []
        cluster.nodes = [cluster.serve(i) for i in range(2)]
        cluster.workers = [cluster.worker(0)]

        assert await say(cluster, feishu, talking, "call record a2") == "done: recorded a2"
        await until_on(temporal_dev, f"feishu:ou_{talking}", new, 30)
        assert await say(cluster, feishu, talking, "call record a3") == "done: recorded a3"
        assert await say(cluster, feishu, fresh, "call record f1") == "done: recorded f1"
        assert await queue_of(temporal_dev, f"feishu:ou_{fresh}") == new
        await until_on(temporal_dev, f"feishu:ou_{quiet}", new, 40)  # when its idle period ends
        records = [step["arg"] for step in cluster.steps() if step["kind"] == "record"]
        assert sorted(records) == ["a1", "a2", "a3", "f1", "q1"], records
        assert [m.text for m in feishu.messages_in(talking)] == [f"done: recorded a{i}" for i in (1, 2, 3)]
    finally:
        cluster.stop()
