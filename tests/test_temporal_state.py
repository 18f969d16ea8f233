"""`engine: temporal` keeps its state in PostgreSQL, so the console of any `serve` node shows it:
two `serve` nodes and a `worker` (real processes, tests/test_temporal_engine.py's `Cluster`) on a
Temporal dev server and a private PostgreSQL server, the fake Feishu platform and the fake model.

- a turn answered through one node is in the shared store — the conversation's messages (what
  `hermes-kernel` and the next turn read), its long-term outcome, its trace — and the OTHER node's
  console (behind its token) lists the task and shows its trace;
- an approval waiting in a workflow is in the other node's approvals list, is decided there, the
  task goes on and the list shows the decision;
- a reply the platform refuses for good is a dead letter in the other node's console and /metrics,
  and its Resend — or `hermes-kernel deadletters resend ID` — delivers it (same uuid) and takes it
  off the list;
- /memory, /forget, /new, /help, /jobs and /stop answer as the embedded engine does (gateway/commands.py),
  in English and Chinese, and the model gets no request for any of them; after /new the next turn
  starts with an empty window.

One Temporal server, PostgreSQL database, platform and cluster for the whole module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from hermes_core import sessions  # before memory.conversation, which it imports
from hermes_core.kernel.replies import fixed_reply
from hermes_core.memory.conversation import describe_memory
from hermes_core.observe.traces import xray_path
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from pg_server import PostgresServer
from prompt_parts import without_context
from test_temporal_engine import Cluster, steps
from waiting import eventually

pytestmark = pytest.mark.slow  # real processes, a Temporal server, PostgreSQL

TOKEN = "console-" + uuid.uuid4().hex


def answers(request: RecordedRequest) -> FakeReply:
    """tests/test_temporal_engine.py's `steps`, and "remember <note>": the `remember` tool."""
    messages = request.messages
    user = next(m for m in reversed(messages) if m["role"] == "user")
    text = str(user["content"])
    done = any(m["role"] == "tool" for m in messages[messages.index(user) :])
    if text.startswith("remember ") and not done:
        return FakeReply.tool_call("remember", {"note": text.removeprefix("remember ")})
    if text == "refuse this":  # the provider refuses the request: the task fails
        return FakeReply.error(400, "this request is refused")
    return steps(request)


@pytest.fixture(scope="module")
def platform() -> Iterator[tuple[FakeOpenAIServer, FakeFeishu]]:
    model = FakeOpenAIServer(handler=answers, latency=0.01).start_in_thread()
    feishu = FakeFeishu(time_scale=0.01, seed=11).start_in_thread()
    try:
        yield model, feishu
    finally:
        feishu.stop()
        model.stop()


@pytest.fixture(scope="module")
def database(postgres: PostgresServer) -> str:
    return postgres.fresh_database()


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory,
    temporal_dev: str,
    platform: tuple[FakeOpenAIServer, FakeFeishu],
    database: str,
) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("cluster")
    sections = {"observe": {"xray_dir": str(folder / "xray")}}
    nodes = Cluster(
        folder, temporal_dev, *platform, sections=sections, database=database, workers=1,
        env={"HERMES_CONSOLE_TOKEN": TOKEN}, send_attempts=2,
    )  # fmt: skip
    try:
        yield nodes
    finally:
        nodes.stop()


def rows(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url) as connection:
        return connection.execute(sql, args).fetchall()


def console(node: str, path: str, body: dict[str, Any] | None = None, token: str | None = TOKEN) -> Any:
    """GET (or POST `body` to) the console of `node`: (status, JSON or text)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{node}{path}", data=data, method="POST" if body is not None else "GET")
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, raw, kind = response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        status, raw, kind = error.code, error.read(), error.headers.get("Content-Type", "")
    text = raw.decode()
    return status, json.loads(text) if "json" in kind else text


async def say(cluster: Cluster, feishu: FakeFeishu, chat: str, text: str, node: int = 0) -> str:
    """Push `text` in the p2p chat `chat` to `node`; the text of its reply."""
    before = len(feishu.messages_in(chat))
    envelope = feishu.user_message(text, chat_id=chat, sender=f"ou_{chat}")
    await feishu.push(envelope, cluster.events(node))
    await eventually(lambda: len(feishu.messages_in(chat)) > before, what=f"the reply to {text!r}")
    return str(feishu.messages_in(chat)[before].text)


async def test_a_turn_is_stored_in_postgresql_and_shown_by_the_other_nodes_console(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu], database: str
) -> None:
    _, feishu = platform
    chat = f"oc_{uuid.uuid4().hex[:6]}_t"
    conversation = f"feishu:ou_{chat}"
    assert await say(cluster, feishu, chat, "call record t1") == "done: recorded t1"
    await eventually(
        lambda: rows(database, "SELECT 1 FROM traces WHERE conversation = %s", conversation), what="the trace"
    )
    stored = [json.loads(m) for (m,) in rows(
        database, "SELECT message FROM session_messages WHERE conversation = %s ORDER BY seq", conversation
    )]  # fmt: skip
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "assistant"], stored
    assert stored[0]["content"] == "call record t1" and stored[-1]["content"] == "done: recorded t1"
    learned = rows(database, "SELECT task_type FROM longterm_outcomes WHERE owner = %s", conversation)
    assert learned == [("record",)]
    [(task_id, ok, tools)] = rows(
        database, "SELECT task_id, ok, tool_names FROM traces WHERE conversation = %s", conversation
    )
    assert ok and json.loads(tools) == ["record"]

    other = cluster.nodes[1]  # the message came in on node 0
    assert console(other, "/console/api/tasks/" + task_id, token=None)[0] == 401  # the token is asked
    status, trace = console(other, "/console/api/tasks/" + task_id)
    assert status == 200, trace
    assert (trace["conversation"], trace["input"], trace["reply"]) == (conversation, "call record t1",
                                                                        "done: recorded t1")  # fmt: skip
    assert [call["name"] for call in trace["tool_calls"]] == ["record"] and len(trace["model_calls"]) == 2
    assert trace["model_calls"][0]["response"]["tool_calls"][0]["name"] == "record"
    status, page = console(other, f"/console/tasks?conversation={conversation}")
    assert status == 200 and task_id in page, page

    # a failed task: listed as failed by the console, and its X-ray written by the worker
    apology = await say(cluster, feishu, chat, "refuse this")
    assert apology == fixed_reply("model_rejected", "en"), apology
    failed = "SELECT task_id FROM traces WHERE conversation = %s AND failed"
    await eventually(lambda: rows(database, failed, conversation), what="the failed task's trace")
    [(failed_id,)] = rows(database, failed, conversation)
    status, page = console(other, "/console/tasks?failed=1")
    assert status == 200 and failed_id in page and task_id not in page
    xray = json.loads(xray_path(cluster.folder / "xray", failed_id).read_text(encoding="utf-8"))
    assert (xray["input"], xray["stop_reason"]) == ("refuse this", "model_rejected"), xray

    # the next turn's window is the stored conversation
    model, _ = platform
    assert await say(cluster, feishu, chat, "call record t2", node=1) == "done: recorded t2"
    sent = [m["content"] for m in without_context(model.requests[-1].messages) if m["role"] == "user"]
    assert sent == ["call record t1", "refuse this", "call record t2"]


async def test_an_approval_is_listed_and_decided_in_the_other_nodes_console(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu], database: str
) -> None:
    _, feishu = platform
    chat = f"oc_{uuid.uuid4().hex[:6]}_a"
    conversation = f"feishu:ou_{chat}"
    envelope = feishu.user_message("call transfer 42", chat_id=chat, sender=f"ou_{chat}")
    await feishu.push(envelope, cluster.events(0))
    query = "SELECT id, status, decided_by FROM pending WHERE conversation = %s AND kind = 'approval'"
    await eventually(lambda: rows(database, query, conversation), what="the approval in PostgreSQL")
    [(approval, status, _)] = rows(database, query, conversation)
    assert status == "pending"
    other = cluster.nodes[1]
    code, page = console(other, "/console/approvals")
    assert code == 200 and approval in page and "transfer" in page, page
    code, answer = console(other, f"/console/api/approvals/{approval}", {"decision": "approve"})
    assert (code, answer["status"]) == (200, "approved"), answer
    await eventually(lambda: len(feishu.messages_in(chat)) >= 2, what="the task's reply")
    assert feishu.messages_in(chat)[1].text == "done: transferred 42"
    await eventually(
        lambda: rows(database, query, conversation)[0][1] != "pending", what="the decision in PostgreSQL"
    )
    assert rows(database, query, conversation) == [(approval, "approved", "console")]
    again = console(other, f"/console/api/approvals/{approval}", {"decision": "reject"})
    assert again == (409, {"error": "approval_already_decided"}), again
    code, trace = console(cluster.nodes[0], "/console/api/tasks/" + str(answer["task_id"]))
    assert code == 200 and [a["status"] for a in trace["approvals"]] == ["approved"], trace


def dead_letters(node: str, conversation: str) -> list[dict[str, Any]]:
    """The dead letters of `conversation` that the console of `node` lists."""
    code, body = console(node, "/console/api/deadletters")
    assert code == 200, body
    return [row for row in body["dead_letters"] if row["conversation"] == conversation]


async def test_a_reply_refused_for_good_is_a_dead_letter_in_the_other_console_and_is_resent(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu], database: str
) -> None:
    _, feishu = platform
    chat = f"oc_{uuid.uuid4().hex[:6]}_d"
    conversation = f"feishu:ou_{chat}"
    feishu.fail_next(1, code=230002)  # "the bot is not in the chat": permanent, not retried
    envelope = feishu.user_message("call record d1", chat_id=chat, sender=f"ou_{chat}")
    await feishu.push(envelope, cluster.events(0))
    other = cluster.nodes[1]
    listed = partial(dead_letters, other, conversation)
    await eventually(listed, what="the dead letter in the other node's console")
    [letter] = listed()
    assert "230002" in letter["error"] or "not in the chat" in letter["error"], letter
    assert feishu.messages_in(chat) == []
    code, metrics = console(other, "/metrics")  # the console's token guards it too
    assert code == 200, metrics
    assert any(line.startswith("hermes_dead_letters ") and float(line.split()[1]) >= 1 for line in
               metrics.splitlines()), metrics  # fmt: skip
    code, resent = console(other, f"/console/api/deadletters/{letter['id']}/resend", {})
    assert code == 200 and resent["conversation"] == conversation, resent
    await eventually(lambda: len(feishu.messages_in(chat)) >= 1, what="the resent reply")
    assert [m.text for m in feishu.messages_in(chat)] == ["done: recorded d1"]
    assert listed() == []
    sent = "SELECT status FROM outbox WHERE conversation = %s ORDER BY id"
    await eventually(
        lambda: rows(database, sent, conversation) == [("sent",)], what="the outbox row marked sent"
    )

    # the same through `hermes-kernel deadletters resend ID`: a request any serve node takes up
    feishu.fail_next(1, code=230002)
    envelope = feishu.user_message("call record d2", chat_id=chat, sender=f"ou_{chat}")
    await feishu.push(envelope, cluster.events(1))
    await eventually(listed, what="the second dead letter")
    [letter] = listed()
    command = [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "deadletters", "resend",
               str(letter["id"])]  # fmt: skip
    done = subprocess.run(
        command, cwd=cluster.folder, env=cluster.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "resend requested" in done.stdout, done.stderr
    await eventually(lambda: len(feishu.messages_in(chat)) >= 2, what="the reply resent on request")
    assert [m.text for m in feishu.messages_in(chat)] == ["done: recorded d1", "done: recorded d2"]
    await eventually(
        lambda: rows(database, sent, conversation) == [("sent",), ("sent",)], what="both marked sent"
    )
    assert listed() == []


async def test_a_reply_that_fails_every_attempt_is_a_dead_letter_with_the_last_error(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu], database: str
) -> None:
    """A send that fails with a retryable error is tried `send_attempts` times (2 here) by the
    send step — a local step since patch local-send, whose exhausted retries come back to the
    workflow otherwise than an activity's — then kept as a dead letter, never dropped."""
    _, feishu = platform
    chat = f"oc_{uuid.uuid4().hex[:6]}_r"
    conversation = f"feishu:ou_{chat}"
    # a server error: retried, not refused for good — by the API client 3 times within an attempt
    # (channels/feishu/api.py `max_retries`), so each of the 2 attempts fails 4 times
    feishu.fail_next(8, code=1, status=500)
    envelope = feishu.user_message("call record r1", chat_id=chat, sender=f"ou_{chat}")
    await feishu.push(envelope, cluster.events(0))
    listed = partial(dead_letters, cluster.nodes[1], conversation)
    await eventually(listed, what="the dead letter after both attempts")
    [letter] = listed()
    assert "500" in letter["error"] or "code 1" in letter["error"], letter
    assert feishu.messages_in(chat) == []
    failed = [call for call in feishu.requests if call.path.endswith("/reply") and call.status == 500]
    assert len(failed) == 8, failed


async def test_conversation_commands_answer_as_embedded_without_a_model_request(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu]
) -> None:
    model, feishu = platform
    chat = f"oc_{uuid.uuid4().hex[:6]}_c"
    assert await say(cluster, feishu, chat, "remember budget is 5000") == "done: noted (fact): budget is 5000"
    asked = len(model.requests)
    state = sessions.ConversationState(facts=["budget is 5000"])
    assert await say(cluster, feishu, chat, "/memory", node=1) == describe_memory(state, "en")
    forgot = fixed_reply("memory_forgot_one", "en").format(n=1, text="budget is 5000")
    assert await say(cluster, feishu, chat, "/forget 1") == forgot
    assert await say(cluster, feishu, chat, "/记忆", node=1) == fixed_reply("memory_empty", "zh")
    assert (await say(cluster, feishu, chat, "/help")).startswith(fixed_reply("help_header", "en"))
    assert await say(cluster, feishu, chat, "/jobs") == fixed_reply("jobs_none", "en")
    assert await say(cluster, feishu, chat, "/stop") == fixed_reply("stop_nothing", "en")
    assert await say(cluster, feishu, chat, "/new", node=1) == fixed_reply("conversation_new", "en")
    assert await say(cluster, feishu, chat, "/memory") == fixed_reply("memory_empty", "en")
    assert await say(cluster, feishu, chat, "/新对话") == fixed_reply("conversation_new", "zh")
    assert len(model.requests) == asked, [r.messages[-1] for r in model.requests[asked:]]
    assert await say(cluster, feishu, chat, "call record n1") == "done: recorded n1"
    window = [m["content"] for m in model.requests[asked].messages if m["role"] == "user"]
    assert window == ["call record n1"], "the turn after /new still sees the earlier turns"


async def test_stop_cancels_the_askers_turn_in_flight(
    cluster: Cluster, platform: tuple[FakeOpenAIServer, FakeFeishu], database: str
) -> None:
    _, feishu = platform
    chat = f"oc_{uuid.uuid4().hex[:6]}_s"
    envelope = feishu.user_message("call slow_write s1", chat_id=chat, sender=f"ou_{chat}")
    await feishu.push(envelope, cluster.events(0))
    await eventually(
        lambda: any((s["kind"], s["arg"]) == ("slow_write:start", "s1") for s in cluster.steps()),
        what="the slow step",
    )
    assert await say(cluster, feishu, chat, "/停止", node=1) == fixed_reply("stop_done", "zh")
    assert await say(cluster, feishu, chat, "call record s2") == "done: recorded s2"
    assert [m.text for m in feishu.messages_in(chat)] == [fixed_reply("stop_done", "zh"), "done: recorded s2"]
    # a turn waiting for an approval is stopped too: the approval leaves the list
    envelope = feishu.user_message("call transfer 9", chat_id=chat, sender=f"ou_{chat}")
    await feishu.push(envelope, cluster.events(1))
    query = "SELECT status FROM pending WHERE conversation = %s AND kind = 'approval'"
    await eventually(
        lambda: rows(database, query, f"feishu:ou_{chat}") == [("pending",)], what="the approval"
    )
    await eventually(lambda: len(feishu.messages_in(chat)) == 3, what="the approval request")
    assert await say(cluster, feishu, chat, "/stop") == fixed_reply("stop_done", "en")
    await eventually(
        lambda: rows(database, query, f"feishu:ou_{chat}") == [("expired",)], what="the approval withdrawn"
    )
    assert [s for s in cluster.steps() if (s["kind"], s["arg"]) == ("transfer", "9")] == []


async def test_the_consoles_chat_is_answered_through_the_workflows(cluster: Cluster, database: str) -> None:
    """A message typed in the console of a node: its turn runs on a worker, the reply comes back to
    the browser that waits on that node, and the turn is stored like any other."""
    body = json.dumps({"message": "call record w1", "conversation": "w1"}).encode()
    request = urllib.request.Request(f"{cluster.nodes[1]}/console/api/chat", data=body, method="POST")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=60) as response:
        events = [json.loads(line) for line in response.read().decode().splitlines() if line.strip()]
    assert events[0]["type"] == "accepted" and events[-1] == {
        "type": "reply", "text": "done: recorded w1", "approval": None,
    }, events  # fmt: skip
    task = "SELECT task_id FROM traces WHERE conversation = 'web:w1'"
    await eventually(
        lambda: rows(database, task) == [(events[0]["task_id"],)], what="the console turn's trace"
    )
