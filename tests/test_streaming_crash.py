"""Streaming keeps exactly-once: `serve` killed (SIGKILL) while a reply streams into its card.

The user must end up with one complete reply: the same card (a CardKit card entity, the default
way), written to the whole text by the restarted process — not a frozen half card and a second
message. The CardKit pages followed: "流式更新卡片" (sequence strictly increasing, streaming closed
10 minutes after it was opened) and "创建卡片实体" (an entity is sent once). Real processes, the fake Feishu
platform (which keeps every message and every patch) and the fake model streaming slowly.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import clean_environ, idle_at
from waiting import wait_for

pytestmark = pytest.mark.slow  # real processes and a kill

ANSWER = (
    "Here is the week in Hangzhou, day by day. Monday and Tuesday stay dry with a light breeze "
    "from the east. On Wednesday clouds move in from the sea, and by Thursday afternoon there is "
    "steady rain that lasts into Friday morning. The weekend clears up again, warm enough for a "
    "long walk around the West Lake. Take an umbrella midweek, and sunglasses for Saturday."
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def slow_answer(request: RecordedRequest) -> FakeReply:
    return FakeReply.text(ANSWER, chunk_delay=0.04)  # about 70 chunks: 3 s of streaming


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_a_kill_mid_stream_leaves_one_card_patched_to_the_complete_reply(tmp_path: Path) -> None:
    port = free_port()
    model = FakeOpenAIServer(handler=slow_answer).start_in_thread()
    feishu = FakeFeishu(time_scale=0.002).start_in_thread()
    env = clean_environ(
        HERMES_BASE_URL=model.base_url, HERMES_MODEL="m", FEISHU_APP_ID=feishu.app_id,
        FEISHU_APP_SECRET=feishu.app_secret, FEISHU_VERIFICATION_TOKEN=feishu.verification_token,
        FEISHU_BASE_URL=feishu.base_url,
    )  # fmt: skip
    command = [sys.executable, "-m", "hermes_core", "serve", "--port", str(port)]
    health = f"http://127.0.0.1:{port}/healthz"

    def start() -> subprocess.Popen[bytes]:
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)  # fmt: skip
        wait_for(lambda: healthy(health) or process.poll() is not None, 30, "serve to start")
        assert process.poll() is None, f"serve exited with {process.returncode}"
        return process

    first = second = None
    try:
        first = start()
        ask = feishu.user_message("What is the weather in Hangzhou this week?", chat_id="oc_p2p")
        feishu.deliver(ask, f"http://127.0.0.1:{port}/feishu/events")
        wait_for(lambda: len(feishu.sent) == 1 and ANSWER[:60] in feishu.sent[0].text, 30, "a partial card")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        card = feishu.sent[0]
        frozen = card.text
        assert frozen != ANSWER and ANSWER[:60] in frozen  # killed mid-stream: half a card
        patches_before = len(feishu.patches)
        feishu.advance_time(2 * 3600)  # past the platform's 1 h uuid window: only the stored card id
        # keeps the restarted process from sending a second card

        second = start()  # runs the message again from its inbox row
        wait_for(lambda: card.text == ANSWER, 60, "the card to hold the complete reply")
        # once serve is idle, a second message would have been sent
        wait_for(lambda: idle_at(f"http://127.0.0.1:{port}"), what="serve to be idle")
        assert [m.message_id for m in feishu.sent] == [card.message_id]  # one message: the same card
        assert card.text == ANSWER and card.reply_to == ask["event"]["message"]["message_id"]
        later = [p for p in feishu.patches[patches_before:] if p.message_id == card.message_id]
        assert later and later[-1].text == ANSWER  # the restarted process wrote into that card
        assert len(model.requests) >= 2  # the turn did run again
        # CardKit (the default): one card entity, typed into by both processes; the restarted one
        # numbered its operations above the first one's (a new epoch), re-opened the streaming the
        # platform had closed in the 2 h that passed (200850), and closed it at the end
        [entity] = feishu.cards.values()
        assert entity.message_id == card.message_id and not entity.streaming
        sequences = [sequence for _, sequence, _ in entity.operations]
        assert sequences == sorted(set(sequences)) and max(sequences) < 2**31
        assert any(r.code == 200850 for r in feishu.requests)
        assert ("settings", sequences[-1]) == entity.operations[-1][:2]
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
        feishu.stop()
        model.stop()
