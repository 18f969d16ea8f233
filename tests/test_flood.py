"""Per-sender limits at the door (gateway/flood.py): one member's flood costs neither the model
account nor the others' turns.

The attack is the one reported from outside: 300 messages from one user became 300 turns on the
operator's model account, with everyone else's messages queued behind them. Through the gateway
`serve` builds (webhook, SQLite), against the fake OpenAI server over HTTP.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gateway_harness import gateway_for
from hermes_core.kernel.replies import fixed_reply
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

POLITE = fixed_reply("throttled", "en")


def config(tmp_path: Path, fake: FakeOpenAIServer, **gateway: Any) -> Path:
    path = tmp_path / "hermes.yaml"
    settings = {
        "model": {"name": "m", "base_url": fake.base_url, "max_retries": 0},
        "gateway": {"data_dir": str(tmp_path / "data"), **gateway},
    }
    path.write_text(yaml.safe_dump(settings), encoding="utf-8")
    return path


async def say(url: str, user: str, text: str, message_id: str) -> str:
    async with aiohttp.ClientSession() as session:
        body = {"message": text, "user_id": user, "message_id": message_id}
        async with session.post(f"{url}/webhook", json=body) as response:
            assert response.status == 200, await response.text()
            return str((await response.json())["reply"])


async def test_a_sender_over_the_rate_gets_the_fixed_reply_and_no_turn(tmp_path: Path) -> None:
    async with FakeOpenAIServer(handler=lambda request: FakeReply.text("answered")) as fake:
        async with gateway_for(config(tmp_path, fake, user_messages_per_minute=3)) as url:
            replies = [await say(url, "flooder", f"message {k}", f"f{k}") for k in range(6)]
            again = await say(url, "flooder", "message 5", "f5")  # a retry of a throttled message
            other = await say(url, "colleague", "hello there, a question", "c1")
            stop = await say(url, "flooder", "/stop", "f-stop")  # never limited
        asked = [r for r in fake.requests if r.body.get("max_tokens") != 1]
    assert replies == ["answered"] * 3 + [POLITE] * 3
    assert again == POLITE  # answered once: the retry gets the stored reply, not a second count
    assert other == "answered"  # another sender is not limited by the first one's flood
    assert stop != POLITE
    assert len(asked) == 4  # three turns of the flooder, one of the colleague


async def test_messages_over_the_conversation_queue_get_the_fixed_reply(tmp_path: Path) -> None:
    async with FakeOpenAIServer(handler=lambda request: FakeReply.text("answered"), latency=0.5) as fake:
        settings = config(tmp_path, fake, conversation_queue=2, user_messages_per_minute=None)
        async with gateway_for(settings) as url:
            burst = [say(url, "flooder", f"message {k}", f"q{k}") for k in range(6)]
            replies = await asyncio.gather(*burst)
    assert sorted(replies).count(POLITE) >= 3 and replies.count("answered") >= 2, replies
    assert len([r for r in fake.requests if r.body.get("max_tokens") != 1]) == replies.count("answered")
