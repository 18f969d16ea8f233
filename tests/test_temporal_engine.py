"""`engine: temporal` as it is deployed, with the commands of docs/scale-out.md (scale-out.md:
`pip install ".[temporal]"` is what .ci/run installs, then `hermes-kernel --config hermes.yaml
serve --port …` and `… worker`): two `serve` nodes and two `worker` nodes (real processes)
against a Temporal dev server (tests/temporal_dev.py), the fake Feishu platform pushing to the
nodes' callback URLs and counting what the bot sends, and the fake model.

- every push duplicated on the other node (the same event id, or the same message id under a new
  event id): each message answered exactly once, each chat's replies in its messages' order, each
  tool call run once;
- a worker SIGKILLed while a turn's second step runs: the turn finishes on the other worker within
  15 s, the completed first step is not run again, the interrupted level-1 step is not run again
  (its outcome is unknown to the model), an interrupted read-only step is; one reply;
- an approval card clicked on the other node resumes the task, on whichever worker is alive;
- the webhook's synchronous answer through another node, and its approval decided through a third;
- continue-as-new keeps order, dedup and the conversation; send pacing per chat and app-wide;
- a `clarify` question answered by the asker's next message, pushed to the other node;
- the Temporal server SIGKILLed mid-run and started again on the same address and state file:
  pushes meanwhile get a 503 within Feishu's 3 s (redelivered), nothing lost or answered twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import clean_environ, free_port
from waiting import eventually, wait_for

pytestmark = pytest.mark.slow  # real processes, a Temporal server, SIGKILL

TOOLS = '''
import json, os, time
from pathlib import Path
from hermes_core import tool

LOG = Path(os.environ["STEP_LOG"])


def _note(kind, arg):
    with LOG.open("a") as f:
        f.write(json.dumps({"kind": kind, "arg": arg, "pid": os.getpid()}) + "\\n")


@tool(level=1)
def record(arg: str) -> str:
    """Record a step (a write)."""
    _note("record", arg)
    return f"recorded {arg}"


@tool(level=1, timeout=60)
def slow_write(arg: str) -> str:
    """A long write."""
    _note("slow_write:start", arg)
    time.sleep(float(os.environ.get("SLOW_SECONDS", "3")))
    _note("slow_write:done", arg)
    return f"wrote {arg}"


@tool(level=0, timeout=60)
def slow_read(arg: str) -> str:
    """A long read."""
    _note("slow_read:start", arg)
    time.sleep(float(os.environ.get("SLOW_SECONDS", "3")))
    _note("slow_read:done", arg)
    return f"read {arg}"


@tool(level=1, confirm=True)
def transfer(arg: str) -> str:
    """Move money (needs approval)."""
    _note("transfer", arg)
    return f"transferred {arg}"
'''


def steps(request: RecordedRequest) -> FakeReply:
    """ "call <tool> <arg>": that call; "chain <a> <tool> <b>": record a, then <tool> b; once the
    calls are done: "done: <results>"."""
    messages = request.messages
    user = next(m for m in reversed(messages) if m["role"] == "user")
    words = str(user["content"]).split()
    results = [str(m["content"]) for m in messages[messages.index(user) :] if m["role"] == "tool"]
    if words[0] == "call" and not results:
        return FakeReply.tool_call(words[1], {"question" if words[1] == "clarify" else "arg": words[2]})
    if words[0] == "chain" and len(results) < 2:
        return FakeReply.tool_call(
            *(("record", {"arg": words[1]}) if not results else (words[2], {"arg": words[3]}))
        )
    return FakeReply.text("done: " + " | ".join(results) if results else f"ok: {user['content']}")


class Cluster:
    """The nodes of one test: `serve` ×2, `worker` ×2, in `folder`, on a task queue of their own."""

    def __init__(
        self,
        folder: Path,
        temporal: str,
        model: FakeOpenAIServer,
        feishu: FakeFeishu,
        sections: dict[str, Any] | None = None,
        *,
        database: str,
        workers: int = 2,
        env: dict[str, str] | None = None,
        **options: Any,
    ) -> None:
        self.folder = folder
        self.log = folder / "steps.jsonl"
        self.log.touch()
        (folder / "test_tools_mod.py").write_text(textwrap.dedent(TOOLS), encoding="utf-8")
        config = {
            "engine": "temporal", "tools": ["test_tools_mod"],
            "temporal": {"address": temporal, "task_queue": f"q-{uuid.uuid4().hex[:8]}",
                         "heartbeat_timeout": 3, **options},
            "agent": {"max_turns": 6}, **(sections or {}),
        }  # fmt: skip
        (folder / "hermes.yaml").write_text(json.dumps(config), encoding="utf-8")
        self.env = clean_environ(
            PYTHONPATH=os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])),
            HERMES_BASE_URL=model.base_url, HERMES_MODEL="m", STEP_LOG=str(self.log),
            FEISHU_APP_ID=feishu.app_id, FEISHU_APP_SECRET=feishu.app_secret,
            FEISHU_VERIFICATION_TOKEN=feishu.verification_token, FEISHU_BASE_URL=feishu.base_url,
            SLOW_SECONDS="4", HERMES_DATABASE_URL=database, **(env or {}),
        )  # fmt: skip
        self.processes: list[subprocess.Popen[bytes]] = []
        self.nodes = [self.serve(i) for i in range(2)]
        self.workers = [self.worker(i) for i in range(workers)]

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", *args]
        output = (self.folder / f"{name}.log").open("ab")
        process = subprocess.Popen(
            command, cwd=self.folder, env=self.env, stdout=output, stderr=subprocess.STDOUT
        )
        self.processes.append(process)
        return process

    def serve(self, index: int) -> str:
        port = free_port()
        process = self._start(f"serve-{index}", "serve", "--port", str(port))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: process.poll() is not None or _healthy(url), 60, f"serve node {index}")
        assert process.poll() is None, self.output(f"serve-{index}")
        return url

    def worker(self, index: int) -> subprocess.Popen[bytes]:
        process = self._start(f"worker-{index}", "worker")
        wait_for(
            lambda: process.poll() is not None or "worker running" in self.output(f"worker-{index}"),
            60, f"worker {index}",
        )  # fmt: skip
        assert process.poll() is None, self.output(f"worker-{index}")
        return process

    def events(self, node: int) -> str:
        return f"{self.nodes[node]}/feishu/events"

    def output(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def steps(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def stop(self) -> list[int]:
        """SIGTERM to every process still running; their exit codes (a SIGKILLed one: -9)."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return [process.returncode for process in self.processes]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture
def platform() -> Iterator[tuple[FakeOpenAIServer, FakeFeishu]]:
    model = FakeOpenAIServer(handler=steps, latency=0.02).start_in_thread()
    feishu = FakeFeishu(time_scale=0.01, seed=3).start_in_thread()
    try:
        yield model, feishu
    finally:
        feishu.stop()
        model.stop()


@pytest.fixture
def cluster(
    tmp_path: Path, temporal_dev: str, platform: tuple[FakeOpenAIServer, FakeFeishu], pg_url: str
) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path, temporal_dev, *platform, database=pg_url)
    try:
        yield nodes
    finally:
        codes = nodes.stop()
    assert set(codes) <= {0, -signal.SIGKILL}, codes  # a graceful stop exits 0


def replies_by_message(feishu: FakeFeishu) -> Counter[str | None]:
    return Counter(message.reply_to for message in feishu.sent)


async def push_twice(
    feishu: FakeFeishu, envelope: dict[str, Any], first: str, second: str, new_id: bool
) -> None:
    """The push on one node and its redelivery on another at once: the same event id, or the same
    message under a new event id (FEISHU.md §3)."""
    again = feishu.redelivery_of(envelope, new_event_id=new_id)
    results = await asyncio.gather(feishu.push(envelope, first), feishu.push(again, second))
    assert all(result.ok for result in results), results


async def test_duplicated_pushes_on_two_nodes_answered_once_in_order(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu]
) -> None:
    _, feishu = platform
    run = uuid.uuid4().hex[:6]
    chats = [f"oc_{run}_{n}" for n in range(6)]
    sent: dict[str, list[str]] = {chat: [] for chat in chats}

    async def talk(number: int, chat: str) -> None:  # one user's messages, one after another
        for i in range(5):
            envelope = feishu.user_message(f"call record {chat}-{i}", chat_id=chat, sender=f"ou_{chat}")
            sent[chat].append(envelope["event"]["message"]["message_id"])
            first, second = (0, 1) if (number + i) % 2 == 0 else (1, 0)
            await push_twice(
                feishu, envelope, cluster.events(first), cluster.events(second), new_id=i % 2 == 1
            )

    await asyncio.gather(*(talk(n, chat) for n, chat in enumerate(chats)))
    everything = {mid for ids in sent.values() for mid in ids}
    await eventually(lambda: set(replies_by_message(feishu)) >= everything, 90, "a reply to every message")
    counts = replies_by_message(feishu)
    assert {mid: n for mid, n in counts.items() if n != 1} == {}, "a message answered more than once"
    for chat in chats:
        answered = [message.reply_to for message in feishu.messages_in(chat)]
        assert answered == sent[chat], f"{chat}: replies out of order"
        texts = [message.text for message in feishu.messages_in(chat)]
        assert texts == [f"done: recorded {chat}-{i}" for i in range(5)]
    executed = Counter(step["arg"] for step in cluster.steps() if step["kind"] == "record")
    assert executed == Counter({f"{chat}-{i}": 1 for chat in chats for i in range(5)})


async def test_a_plain_turn_is_one_activity_task_its_short_steps_run_locally(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu], temporal_dev: str
) -> None:
    """A turn without tools: its model call is an activity task (a worker must be able to take
    it over mid-way, heartbeating), preparing and recording the turn and sending its reply are
    local steps (markers in the history, no task queue round trip): two workflow tasks per turn,
    not four — what CPU per turn comes down to on a worker and on the Temporal server
    (benchmarks/bench_temporal.py)."""
    from temporalio.client import Client

    _, feishu = platform
    chat = f"oc_{uuid.uuid4().hex[:6]}"
    for i in range(2):
        envelope = feishu.user_message(f"hello {i}", chat_id=chat, sender=f"ou_{chat}")
        assert (await feishu.push(envelope, cluster.events(i))).ok
        await eventually(lambda n=i: len(feishu.messages_in(chat)) > n, 30, "the reply")
    client = await Client.connect(temporal_dev)
    history = await client.get_workflow_handle(f"feishu:ou_{chat}").fetch_history()  # p2p: by sender
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled == ["hermes.model_call"] * 2
    local = [
        e
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]
    assert len(local) == 3 * 2  # prepare_task, record_turn and send_reply, per turn
    tasks = [e for e in history.events if e.HasField("workflow_task_completed_event_attributes")]
    assert len(tasks) <= 2 * 2 + 1, len(tasks)  # two a turn (one more when a signal comes mid-task)
    assert [m.text for m in feishu.messages_in(chat)] == ["ok: hello 0", "ok: hello 1"]


async def test_worker_killed_mid_turn_the_turn_finishes_on_the_other(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu]
) -> None:
    _, feishu = platform
    run = uuid.uuid4().hex[:6]
    for kill, tool in enumerate(["slow_write", "slow_read", "slow_write"]):
        await kill_mid_step(cluster, feishu, f"oc_{run}_k{kill}", tool, kill)
    await eventually(lambda: len(feishu.sent) >= 3, 5, "all replies")
    assert all(n == 1 for n in replies_by_message(feishu).values()), "a reply was sent twice"


async def kill_mid_step(cluster: Cluster, feishu: FakeFeishu, chat: str, tool: str, kill: int) -> None:
    """A two-step turn (record, then `tool`); SIGKILL the worker running `tool`; a worker is
    started in its place afterwards."""
    first, second = f"first{kill}", f"second{kill}"
    envelope = feishu.user_message(f"chain {first} {tool} {second}", chat_id=chat, sender=f"ou_{chat}")
    message_id = envelope["event"]["message"]["message_id"]
    await feishu.push(envelope, cluster.events(kill % 2))

    def started() -> dict[str, Any] | None:
        return next((s for s in cluster.steps() if (s["kind"], s["arg"]) == (f"{tool}:start", second)), None)

    await eventually(lambda: started() is not None, 60, "the slow step to start")
    step = started()
    assert step is not None
    victim = next(w for w in cluster.workers if w.pid == step["pid"])
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait(timeout=10)
    await eventually(lambda: message_id in replies_by_message(feishu), 30, "the reply")
    took = time.monotonic() - killed_at
    assert took < 15, f"the turn took {took:.1f} s after the kill"
    reply = next(m for m in feishu.sent if m.reply_to == message_id)
    ran = Counter(s["kind"] for s in cluster.steps() if s["arg"] in (first, second))
    assert ran["record"] == 1, "the completed first step ran again"
    if tool == "slow_write":  # level 1: not run again; the model is told its outcome is unknown
        assert ran["slow_write:start"] == 1 and ran["slow_write:done"] == 0, ran
        assert reply.text.startswith(f"done: recorded {first} | ")
        assert "outcome of this call is unknown" in reply.text
    else:  # level 0: safe to run again, and it was
        assert ran["slow_read:start"] == 2 and ran["slow_read:done"] == 1, ran
        assert reply.text == f"done: recorded {first} | read {second}"
    cluster.workers[cluster.workers.index(victim)] = cluster.worker(len(cluster.processes))


async def test_approval_clicked_on_the_other_node_resumes_the_task(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu]
) -> None:
    _, feishu = platform
    chat = f"oc_{uuid.uuid4().hex[:6]}_a"
    payer = f"ou_{chat}"
    envelope = feishu.user_message("call transfer 42", chat_id=chat, sender=payer)
    await feishu.push(envelope, cluster.events(0))
    await eventually(lambda: len(feishu.messages_in(chat)) >= 1, 60, "the approval card")
    card = feishu.messages_in(chat)[0]
    assert card.msg_type == "interactive", card
    approval_id = _approval_id(card.content)
    assert [s for s in cluster.steps() if s["kind"] == "transfer"] == [], "ran before the approval"
    stranger = feishu.card_action(
        "ou_stranger", card.message_id, {"approval_id": approval_id, "decision": "approve"}
    )
    refused = await feishu.push(stranger, cluster.events(1))
    assert json.loads(refused.body)["toast"]["type"] == "error", refused.body  # only the requester decides
    # whoever reaches the Temporal frontend may send the workflow's update by hand, with any role:
    # the role is the workers' permissions' (activities.py `decider_role`), never the request's
    assert await forged_decision(cluster, approval_id) == "approval_not_allowed"
    assert [s for s in cluster.steps() if s["kind"] == "transfer"] == [], "ran on a forged decision"
    click = feishu.card_action(payer, card.message_id, {"approval_id": approval_id, "decision": "approve"})
    await feishu.push(click, cluster.events(1))
    await eventually(lambda: len(feishu.messages_in(chat)) >= 2, 30, "the task's reply")
    assert feishu.messages_in(chat)[1].text == "done: transferred 42"
    await eventually(lambda: len(card.versions) >= 2, 10, "the card to show the decision")
    assert [s["arg"] for s in cluster.steps() if s["kind"] == "transfer"] == ["42"]


async def test_a_message_signalled_into_another_conversations_workflow_is_dropped(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu]
) -> None:
    """By hand at the frontend: a message naming conversation B, signalled into A's workflow, would be
    answered with A's history and tools; the workflow drops it (its conversation must be its own)."""
    from temporalio.client import Client

    _, feishu = platform
    chat, forged_chat = f"oc_{uuid.uuid4().hex[:6]}_m", f"oc_{uuid.uuid4().hex[:6]}_f"
    await feishu.push(
        feishu.user_message("call record one", chat_id=chat, sender=f"ou_{chat}"), cluster.events(0)
    )
    await eventually(lambda: len(feishu.messages_in(chat)) >= 1, 60, "the first reply")
    address = json.loads((cluster.folder / "hermes.yaml").read_text())["temporal"]["address"]
    handle = (await Client.connect(address)).get_workflow_handle(f"feishu:ou_{chat}")  # a p2p chat: its user
    forged = {
        "channel": "feishu", "conversation": "feishu:ou_intruder", "sender": "ou_intruder",
        "message_id": f"om_{uuid.uuid4().hex[:8]}", "text": "call record forged", "kind": "text",
        "chat_id": forged_chat, "chat_type": "p2p", "callback_url": None, "extra": {},
    }  # fmt: skip
    await handle.signal("message", forged)
    await feishu.push(
        feishu.user_message("call record two", chat_id=chat, sender=f"ou_{chat}"), cluster.events(1)
    )
    await eventually(lambda: len(feishu.messages_in(chat)) >= 2, 60, "the second reply")
    assert feishu.messages_in(forged_chat) == []
    assert [s["arg"] for s in cluster.steps() if s["kind"] == "record"] == ["one", "two"]


async def forged_decision(cluster: Cluster, approval_id: str) -> str:
    """The `decide` update sent straight to the frontend as a stranger claiming the admin role;
    the refusal's reason."""
    from temporalio.client import Client, WorkflowUpdateFailedError

    from hermes_core.engine.temporal.activities import conversation_of

    conversation = conversation_of(approval_id)
    assert conversation is not None
    address = json.loads((cluster.folder / "hermes.yaml").read_text())["temporal"]["address"]
    client = await Client.connect(address)
    forged = {
        "id": approval_id,
        "user_id": "ou_stranger",
        "channel": "feishu",
        "role": "admin",
        "approve": True,
    }
    try:
        await client.get_workflow_handle(conversation).execute_update("decide", forged)
    except WorkflowUpdateFailedError as refused:
        return str(getattr(refused.cause, "message", refused.cause))
    return "accepted"


def _approval_id(content: Any) -> str:
    text = json.dumps(content)
    start = text.index('"approval_id": "') + len('"approval_id": "')
    return text[start : text.index('"', start)]


def post(url: str, body: dict[str, Any], timeout: float = 60.0) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


async def test_webhook_answers_and_approvals_through_any_node(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu]
) -> None:
    model, _ = platform
    user, first = f"u{uuid.uuid4().hex[:6]}", cluster.nodes[0] + "/webhook"
    status, answer = await asyncio.to_thread(
        post, first, {"message": "hello there", "user_id": user, "message_id": "m1"}
    )
    assert (status, answer["reply"]) == (200, "ok: hello there")
    asked = len(model.requests)
    retry = {"message": "hello there", "user_id": user, "message_id": "m1"}
    again = await asyncio.to_thread(post, cluster.nodes[1] + "/webhook", retry)
    assert again == (200, {"message_id": "m1", "reply": "ok: hello there", "ok": True}), again
    assert len(model.requests) == asked, "a retry through another node ran the message again"
    status, answer = await asyncio.to_thread(post, first, {"message": "call transfer 7", "user_id": user})
    assert status == 200 and answer["approval"]["tool"] == "transfer", answer
    decisions = cluster.nodes[1] + "/webhook/approvals/" + answer["approval"]["id"]
    refused = await asyncio.to_thread(post, decisions, {"user_id": "someone-else", "decision": "approve"})
    assert refused == (403, {"error": "approval_not_allowed"}), refused
    status, decided = await asyncio.to_thread(post, decisions, {"user_id": user, "decision": "approve"})
    assert (status, decided["status"], decided["reply"]) == (200, "approved", "done: transferred 7"), decided
    twice = await asyncio.to_thread(post, decisions, {"user_id": user, "decision": "approve"})
    assert twice == (409, {"error": "approval_already_decided"}), twice
    assert [s["arg"] for s in cluster.steps() if s["kind"] == "transfer"] == ["7"]


@pytest.fixture
def short_runs(
    tmp_path: Path, temporal_dev: str, platform: tuple[FakeOpenAIServer, FakeFeishu], pg_url: str
) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path, temporal_dev, *platform, database=pg_url, turns_per_run=2)
    try:
        yield nodes
    finally:
        nodes.stop()


async def test_continue_as_new_keeps_order_dedup_and_the_conversation(
    short_runs: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu], temporal_dev: str
) -> None:
    from temporalio.client import Client

    model, feishu = platform
    chat = f"oc_{uuid.uuid4().hex[:6]}_c"
    envelopes = [feishu.user_message(f"note {i}", chat_id=chat, sender=f"ou_{chat}") for i in range(7)]
    for i, envelope in enumerate(envelopes[:6]):
        await feishu.push(envelope, short_runs.events(i % 2))
        await eventually(lambda n=i: len(feishu.messages_in(chat)) > n, 30, f"reply {i}")
    handle = (await Client.connect(temporal_dev)).get_workflow_handle(f"feishu:ou_{chat}")  # p2p: the sender

    async def fourth_run() -> dict[str, Any] | None:  # the 3rd continues as new after its reply
        status: dict[str, Any] = await handle.query("status")
        return status if status["runs"] >= 4 else None

    status = await eventually(fourth_run, what="the workflow's 4th run")
    assert status["runs"] == 4, status  # 6 turns at 2 per run: continued as new 3 times
    assert status["turns"] == 6 and status["recorded_turns"] == 6, status
    assert status["history_length"] < 150, status  # this run's history only
    last = model.requests[-1].messages
    assert [m["content"] for m in last if m["role"] == "user"] == [f"note {i}" for i in range(6)]
    await feishu.push(feishu.redelivery_of(envelopes[0], new_event_id=True), short_runs.events(1))
    await feishu.push(envelopes[6], short_runs.events(0))
    await eventually(lambda: len(feishu.messages_in(chat)) >= 7, 30, "the last reply")
    assert [m.text for m in feishu.messages_in(chat)] == [f"ok: note {i}" for i in range(7)]


@pytest.fixture
def paced(
    tmp_path: Path, temporal_dev: str, platform: tuple[FakeOpenAIServer, FakeFeishu], pg_url: str
) -> Iterator[Cluster]:
    sections = {"feishu": {"chat_send_rate": 2, "app_send_rate": 2}}
    nodes = Cluster(tmp_path, temporal_dev, *platform, sections=sections, database=pg_url)
    try:
        yield nodes
    finally:
        nodes.stop()


async def test_send_pacing_holds_across_nodes_and_workers(
    paced: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu]
) -> None:
    """A chat's replies at most 2 a second, the app's at most 2 a second (the task queue's limit,
    enforced by the server for all the sending workers together; each worker's own limiter would
    let 2 a second through each), with messages arriving on both nodes."""
    _, feishu = platform
    run = uuid.uuid4().hex[:6]
    chat = f"oc_{run}_p"
    burst = [feishu.user_message(f"say {i}", chat_id=chat, sender=f"ou_{chat}") for i in range(4)]
    for i, envelope in enumerate(burst):
        await feishu.push(envelope, paced.events(i % 2))
    await eventually(lambda: len(feishu.messages_in(chat)) >= 4, 30, "the chat's replies")
    times = [m.created_at for m in feishu.messages_in(chat)]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert min(gaps) >= 0.45, gaps  # 1 / chat_send_rate, the clocks' jitter aside
    chats = [f"oc_{run}_{n}" for n in range(16)]
    others = [feishu.user_message("hi all", chat_id=chat, sender=f"ou_{chat}") for chat in chats]
    await asyncio.gather(*(feishu.push(envelope, paced.events(n % 2)) for n, envelope in enumerate(others)))
    await eventually(lambda: all(feishu.messages_in(c) for c in chats), 60, "every reply")
    sent = sorted(feishu.messages_in(c)[0].created_at for c in chats)
    span = sent[-1] - sent[0]
    print(f"16 sends over {span:.2f} s: {[round(t - sent[0], 2) for t in sent]}")
    # 2/s after the server's initial burst (up to 3): at least 6.5 s; two workers' own limits: ~3.5 s
    assert span >= 5.0, [round(t - sent[0], 2) for t in sent]


async def test_a_question_is_answered_by_the_askers_next_message_on_another_node(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu]
) -> None:
    _, feishu = platform
    chat = f"oc_{uuid.uuid4().hex[:6]}_q"
    asked = feishu.user_message("call clarify which-city?", chat_id=chat, sender=f"ou_{chat}")
    await feishu.push(asked, cluster.events(0))
    await eventually(lambda: len(feishu.messages_in(chat)) >= 1, 60, "the question")
    assert feishu.messages_in(chat)[0].text == "which-city?"
    answer = feishu.user_message("Paris", chat_id=chat, sender=f"ou_{chat}")
    await feishu.push(answer, cluster.events(1))
    await eventually(lambda: len(feishu.messages_in(chat)) >= 2, 30, "the task's reply")
    reply = feishu.messages_in(chat)[1]
    assert reply.reply_to == answer["event"]["message"]["message_id"]  # it answers the answer
    assert json.loads(reply.text.removeprefix("done: ")) == {"question": "which-city?", "answer": "Paris"}
    later = feishu.user_message("thanks a lot", chat_id=chat, sender=f"ou_{chat}")
    await feishu.push(later, cluster.events(0))
    await eventually(lambda: len(feishu.messages_in(chat)) >= 3, 30, "the next turn")
    assert feishu.messages_in(chat)[2].text == "ok: thanks a lot"  # the answer started no turn of its own


@pytest.fixture
def restartable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Temporal dev server of this test alone, so it can be killed and started again on the same
    address and state file (tests/temporal_dev.py `kill`, `start`)."""
    pytest.importorskip("temporalio", reason="the temporal extra is not installed (temporalio)")
    from temporal_dev import DevServer, temporal_binary

    binary, why = temporal_binary()
    if binary is None:
        pytest.skip(why)
    server = DevServer(binary, tmp_path_factory.mktemp("temporal-restart"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def slow_retries() -> Iterator[tuple[FakeOpenAIServer, FakeFeishu]]:
    """The platform with Feishu's redelivery schedule (15 s, 5 min, 1 h, 6 h) at 1/500: a push
    refused while Temporal is down comes again 0.03 s, 0.6 s, 7.2 s and 43 s later."""
    model = FakeOpenAIServer(handler=steps, latency=0.05).start_in_thread()
    feishu = FakeFeishu(time_scale=0.002, seed=5).start_in_thread()
    try:
        yield model, feishu
    finally:
        feishu.stop()
        model.stop()


async def test_temporal_restarted_mid_run_nothing_lost_or_answered_twice(
    tmp_path: Path, restartable: Any, slow_retries: tuple[FakeOpenAIServer, FakeFeishu], pg_url: str
) -> None:
    """The Temporal server SIGKILLed while messages arrive on both nodes and turns run, then
    started again on the same address and state file: every push refused meanwhile got a 503 and
    was delivered again by the platform, every message answered exactly once, in each chat's
    order, each tool call run at most once; no node or worker exited."""
    _, feishu = slow_retries
    cluster = Cluster(tmp_path, restartable.address, *slow_retries, database=pg_url)
    chats = [f"oc_{uuid.uuid4().hex[:6]}_{n}" for n in range(4)]
    sent: dict[str, list[str]] = {chat: [] for chat in chats}
    per_chat, killed_at, down, in_flight = 6, [0.0], threading.Event(), [-1]

    def acked(message_id: str) -> bool:
        return any(a.ok and a.message_id == message_id for a in feishu.push_log)

    def given_up(message_id: str) -> bool:
        return sum(1 for a in feishu.push_log if a.message_id == message_id) > 4

    def answered(message_id: str) -> bool:
        return any(m.reply_to == message_id for m in feishu.sent)

    async def talk(number: int, chat: str) -> None:
        """The next message once the last one is acked and answered — or at once while the server
        is down, so pushes arrive during the outage."""
        for i in range(per_chat):
            if i:
                last = sent[chat][-1]
                await eventually(lambda m=last: answered(m) or down.is_set(), 120, f"{chat}-{i - 1} answered")
            envelope = feishu.user_message(f"call record {chat}-{i}", chat_id=chat, sender=f"ou_{chat}")
            message_id = envelope["event"]["message"]["message_id"]
            sent[chat].append(message_id)
            feishu.deliver(envelope, cluster.events((number + i) % 2))
            await eventually(lambda m=message_id: acked(m) or given_up(m), 120, f"{chat}-{i} acked")
            assert acked(message_id), f"{chat}-{i}: every delivery refused"

    async def outage() -> None:
        def running() -> int:
            return sum(1 for ids in sent.values() for mid in ids if acked(mid) and not answered(mid))

        # the server goes down after the first replies, while a turn is running (a condition, not a time)
        await eventually(
            lambda: len(feishu.sent) >= 5 and running() >= 1,
            60,
            "the first replies, a turn running",
        )
        restartable.kill()
        killed_at[0] = time.monotonic()
        in_flight[0] = running()
        down.set()

        def refused_meanwhile() -> int:
            return sum(1 for a in feishu.push_log if not a.ok and a.at >= killed_at[0])

        await eventually(lambda: refused_meanwhile() >= 3, 30, "pushes refused")
        restartable.start()
        await asyncio.to_thread(restartable.wait_ready)
        down.clear()

    try:
        await asyncio.gather(outage(), *(talk(n, chat) for n, chat in enumerate(chats)))
        everything = {mid for ids in sent.values() for mid in ids}
        await eventually(
            lambda: set(replies_by_message(feishu)) >= everything, 120, "a reply to every message"
        )
        assert in_flight[0] >= 1, "no turn was running when the server went down"
        failed = [a for a in feishu.push_log if not a.ok]
        assert failed and all(a.at + a.elapsed >= killed_at[0] for a in failed), "refused while up"
        assert {a.status for a in failed} == {503}, {(a.status, a.error) for a in failed}  # in time, no 500
        counts = replies_by_message(feishu)
        assert {mid: n for mid, n in counts.items() if n != 1} == {}, "a message answered more than once"
        for chat in chats:
            assert [m.reply_to for m in feishu.messages_in(chat)] == sent[chat], f"{chat}: out of order"
        executed = Counter(step["arg"] for step in cluster.steps() if step["kind"] == "record")
        assert max(executed.values()) == 1, executed
        assert set(executed) <= {f"{chat}-{i}" for chat in chats for i in range(per_chat)}
        assert all(p.poll() is None for p in cluster.processes), [p.poll() for p in cluster.processes]
    finally:
        codes = cluster.stop()
    assert set(codes) <= {0}, codes
