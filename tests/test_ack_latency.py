"""Acknowledgements do not wait for turn work: not in the database writer, not in the event loop.

Feishu pushes an event again when its ack takes longer than 3 s, so an ack that waits behind turn
work adds load exactly when the gateway is behind. Each test serves a real gateway on 127.0.0.1
(tests/gateway_harness.py) with the Feishu channel, and pushes encrypted, signed events from
FakeFeishu while the gateway is busy.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from gateway_harness import feishu_gateway
from hermes_core.gateway.messages import InboundMessage
from hermes_core.testing.fake_feishu import FakeFeishu
from waiting import eventually

SLOW_WRITE = 0.05  # seconds each queued turn write holds the writer
QUEUED_WRITES = 60  # 3 s of writer work queued before the push


async def test_accept_overtakes_queued_turn_writes(tmp_path: Path) -> None:
    """Attack: fill the SQLite writer's queue with 3 s of turn writes (a turn's journal, session and
    trace writes, made slow), then push a Feishu event. The accept's inbox insert must jump that
    queue: the push is acked while most of the turn writes queued before it have not run yet.
    Before, the writer was first come first served and the ack waited the whole 3 s."""
    ran: list[int] = []
    began: list[int] = []

    async def echo(message: InboundMessage) -> list[str]:
        return [f"echo: {message.text}"]

    with FakeFeishu() as feishu:
        async with feishu_gateway(tmp_path, feishu, echo) as (gateway, url):
            db = gateway.store.db  # type: ignore[attr-defined]

            def slow_write(index: int):  # noqa: ANN202 - a job for the writer thread
                def write(connection: sqlite3.Connection) -> None:
                    began.append(index)
                    time.sleep(SLOW_WRITE)
                    ran.append(index)

                return write

            queued = [asyncio.ensure_future(db.transaction(slow_write(i))) for i in range(QUEUED_WRITES)]
            await eventually(lambda: began == [0])  # the writer is busy with the first of them
            result = await feishu.push(feishu.user_message("hello", chat_id="oc_1", sender="ou_1"), url)
            done_at_ack = len(ran)
            assert result.ok, result
            assert result.elapsed < 1.0, f"ack took {result.elapsed:.2f} s behind queued turn writes"
            assert done_at_ack < QUEUED_WRITES / 2, "the accept did not overtake the queued writes"
            await asyncio.gather(*queued)
            assert ran == list(range(QUEUED_WRITES)), "ordinary writes keep their order"
            await eventually(lambda: len(feishu.sent) == 1)
            assert feishu.sent[0].text == "echo: hello"


@pytest.mark.slow
async def test_acks_stay_fast_while_many_turns_burn_the_event_loop(tmp_path: Path) -> None:
    """Attack: queue 150 turns whose work is CPU on the event loop (JSON, redaction, pydantic: here
    10 ms slices, three per turn), then push events while they run. With every turn started at
    once, each loop iteration ran 150 slices (1.5 s) before an ack's next step; now turns start
    through adaptive slots that keep the loop's lag low, and every ack stays under 1 s. All turns
    still complete, once each, and each conversation's replies come in order."""

    async def busy(message: InboundMessage) -> list[str]:
        for _ in range(3):
            end = time.perf_counter() + 0.01
            while time.perf_counter() < end:
                pass
            await asyncio.sleep(0)  # a turn that yields between its busy slices
        return [f"done: {message.text}"]

    with FakeFeishu() as feishu:
        async with feishu_gateway(tmp_path, feishu, busy) as (gateway, url):
            backlog = [feishu.user_message(f"q{i}", chat_id=f"oc_q{i % 50}", sender=f"ou_q{i % 50}")
                       for i in range(150)]  # fmt: skip
            results = await asyncio.gather(*(feishu.push(e, url) for e in backlog))
            assert all(r.ok for r in results)
            probes = []
            for i in range(10):
                envelope = feishu.user_message(f"p{i}", chat_id=f"oc_p{i}", sender=f"ou_p{i}")
                probes.append(await feishu.push(envelope, url))
                await asyncio.sleep(0.05)  # probes spread over the backlog's run: time passing is the test
            assert all(p.ok for p in probes)
            slowest = max(p.elapsed for p in probes)
            assert slowest < 1.0, f"an ack took {slowest:.2f} s while turns ran"
            await eventually(lambda: len(feishu.sent) == 160, timeout=45)
            texts = [m.text for m in feishu.sent]
            assert sorted(texts) == sorted({*texts}), "a turn ran twice"
            for chat in range(50):
                mine = [t for t in texts if t.startswith("done: q") and int(t[7:]) % 50 == chat]
                assert mine == sorted(mine, key=lambda t: int(t[7:])), "replies out of order"
