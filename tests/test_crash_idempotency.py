"""Crashes: nothing stored twice in a conversation's history, nothing answered twice or lost.

Attack (reported from outside): the session history was appended in its own transaction, before
the one that marks the message done and queues its replies; a SIGKILL between the two left the
turn in the history with the message still pending, so the message ran again after the restart
and its turn was stored a second time (10 turns of 246 across 40 SIGKILLs). Now the history is
written in the same transaction as the done mark and the replies, and keyed by the task id.

The kill loop (benchmarks/bench_crash_soak.py, 40+ kills there): `hermes-kernel serve` as a
subprocess with SQLite on disk, the fake Feishu platform pushing (and pushing again what was not
acknowledged) and the fake model answering after random delays, all on 127.0.0.1; 15 SIGKILLs at
random moments, half of them at the moment a turn's history is seen stored while its message is
not yet done (which cannot be seen any more). Then, for every conversation, each user turn is in
the stored history exactly once and in the order the messages were accepted, and every message
got exactly one reply.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from bench_crash_soak import soak  # noqa: E402

KILLS = 15


def test_sigkills_while_turns_are_in_flight_store_each_turn_once_and_answer_each_message_once(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    result = soak(tmp_path, KILLS, seed=20261201, deadline=30.0)
    print(f"\n{result.summary()}")
    assert result.messages == KILLS * 12
    assert result.duplicated_turns == 0, result.summary()
    assert result.missing_turns == 0 and result.out_of_order == [], result.summary()
    assert result.user_turns_stored == result.messages, result.summary()
    assert result.unanswered == 0 and result.answered_twice == 0, result.summary()
    assert time.monotonic() - started < 60
