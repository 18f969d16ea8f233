"""A long conversation on `engine: temporal` does not stall: what a workflow carries across
continue-as-new stays under a byte bound however long its replies are.

The case is the one of issue 33 ("a long conversation stalls on Temporal"): a conversation whose
replies are about 6 KB each stopped at turn 343 because the continue-as-new input carried the texts
of its last 500 replies (2,115,179 bytes, over Temporal's 2 MB payload limit — the server's
`limit.blobSize.error`, docs.temporal.io "Temporal Platform limits"). Here the same shape, scaled
down through the configuration: a run continues as new every 3 turns (`temporal.turns_per_run`)
and may carry 16 KiB (`temporal.carry_bytes`, its lowest value), with 6 KB replies, over two
`serve` nodes and a worker (tests/test_temporal_engine.py's `Cluster`), a Temporal dev server and a
private PostgreSQL. Every message is answered once, with its own reply; the input of every run
(read from the server's history, not from the workflow's own account) stays under the bound; a
webhook retry of the first message, whose text is no longer carried, gets the same reply (read
back from the stored turn) without a second turn.

The trimming itself (workflow.py `carried`) is checked apart, on states built here: what is only a
cache goes first, oldest first, and work waiting to be answered is never dropped.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from test_temporal_engine import Cluster, post

REPLY_BYTES = 6000
CARRY_BYTES = 16 * 1024
MESSAGES = 16


def long_reply(request: RecordedRequest) -> FakeReply:
    """About 6 KB, different for every message (its text repeated)."""
    user = str(next(m for m in reversed(request.messages) if m["role"] == "user")["content"])
    return FakeReply.text(long_reply_text(user))


@pytest.fixture
def long_replies(
    tmp_path: Path, temporal_dev: str, pg_url: str
) -> Iterator[tuple[Cluster, FakeOpenAIServer]]:
    from hermes_core.testing.fake_feishu import FakeFeishu

    model = FakeOpenAIServer(handler=long_reply, latency=0.01).start_in_thread()
    feishu = FakeFeishu(time_scale=0.01, seed=7).start_in_thread()
    nodes = Cluster(
        tmp_path, temporal_dev, model, feishu, database=pg_url, workers=1,
        turns_per_run=3, carry_bytes=CARRY_BYTES,
    )  # fmt: skip
    try:
        yield nodes, model
    finally:
        nodes.stop()
        feishu.stop()
        model.stop()


async def carried_sizes(address: str, workflow_id: str) -> list[int]:
    """The bytes each run of the workflow was started with, newest first (its history's first event)."""
    from temporalio.client import Client

    client = await Client.connect(address)
    sizes, run_id = [], None
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        started = history.events[0].workflow_execution_started_event_attributes
        sizes.append(sum(len(payload.data) for payload in started.input.payloads))
        run_id = started.continued_execution_run_id or None
        if run_id is None:
            return sizes


@pytest.mark.slow  # real processes, a Temporal server, PostgreSQL
async def test_a_long_conversation_with_long_replies_carries_a_bounded_state(
    long_replies: tuple[Cluster, FakeOpenAIServer], temporal_dev: str
) -> None:
    cluster, model = long_replies
    user = f"u{uuid.uuid4().hex[:6]}"
    for i in range(MESSAGES):
        body = {"message": f"turn {i}", "user_id": user, "message_id": f"m{i}"}
        status, answer = await asyncio.to_thread(post, cluster.nodes[i % 2] + "/webhook", body)
        assert (status, answer.get("reply")) == (200, long_reply_text(f"turn {i}")), (i, status, answer)
    assert turns_asked(model) == Counter({f"turn {i}": 1 for i in range(MESSAGES)})

    sizes = await carried_sizes(temporal_dev, f"webhook:{user}")
    assert len(sizes) >= MESSAGES // 3, sizes  # continued as new every 3 turns
    assert max(sizes) <= CARRY_BYTES, sizes

    # the first reply's text is carried no longer: a retry reads it from the stored turn
    retry = {"message": "turn 0", "user_id": user, "message_id": "m0"}
    status, answer = await asyncio.to_thread(post, cluster.nodes[1] + "/webhook", retry)
    assert (status, answer.get("reply")) == (200, long_reply_text("turn 0")), answer
    assert turns_asked(model) == Counter({f"turn {i}": 1 for i in range(MESSAGES)})


def turns_asked(model: FakeOpenAIServer) -> Counter[str]:
    """The model's turn requests by the message they answer (the folds' summary calls are not turns)."""
    asked = [next(m for m in reversed(r.messages) if m["role"] == "user") for r in model.requests]
    return Counter(str(m["content"]) for m in asked if str(m["content"]).startswith("turn "))


def long_reply_text(user: str) -> str:
    return (f"{user}: " * (REPLY_BYTES // (len(user) + 2) + 1))[:REPLY_BYTES]


def sample_state(replies: int = 20, queued: int = 0) -> dict[str, Any]:
    """A run's state: `replies` answered messages with 1,000-character replies (the even ones stored
    with their turn), 50 remembered ids, `queued` waiting messages of 1,000 characters."""
    return {
        "queue": [{"channel": "webhook", "message_id": f"q{i}", "text": "w" * 1000} for i in range(queued)],
        "seen": {f"m:webhook:m{i}": float(i) for i in range(50)},
        "resends": [], "recorded": replies, "turns": replies, "last_sent": 0.0, "chat_rate": 5.0,
        "dead_letters": [{"uuid": "d1", "message_id": "m1", "error": "refused"}], "duplicates": 0, "runs": 2,
        "replies": {
            f"m{i}": [{"index": 0, "text": "x" * 1000, "approval": None, "error": None, "uuid": f"u{i}",
                       "stored": f"t{i}" if i % 2 == 0 else None}]
            for i in range(replies)
        },
    }  # fmt: skip


def test_the_carried_state_drops_stored_texts_then_old_entries_never_the_queue() -> None:
    pytest.importorskip("temporalio", reason="the temporal extra is not installed (temporalio)")
    from hermes_core.engine.temporal.workflow import carried, payload_size

    state = sample_state()
    assert payload_size(state) > 16_000
    bounded = carried(state, 16_000)
    assert bounded is not None and payload_size(bounded) <= 16_000
    dropped = [key for key, [reply] in bounded["replies"].items() if reply["text"] is None]
    assert dropped == [f"m{i}" for i in range(0, 2 * len(dropped), 2)] != []  # stored ones, oldest first
    assert list(bounded["replies"]) == list(state["replies"]) and bounded["seen"] == state["seen"]
    assert all(reply["text"] for [reply] in state["replies"].values()), "the run's own state was changed"

    smaller = carried(state, 8_000)  # every stored text is not enough: the oldest entries go
    assert smaller is not None and payload_size(smaller) <= 8_000
    kept = list(smaller["replies"])
    assert kept and kept == list(state["replies"])[-len(kept) :] and smaller["seen"] == state["seen"]

    assert carried(sample_state(queued=3), 2_500) is None  # the waiting messages alone do not fit
    assert carried(sample_state(queued=3), 5_000) is not None
