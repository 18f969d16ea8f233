"""Dead letters end to end: what Feishu refuses for good is dead-lettered at once, logged, counted,
listed (`hermes-kernel deadletters`, the console) and sent again once the cause is fixed.

The gateway is the one `serve` builds (build_gateway, with the console mounted as `serve` does),
on 127.0.0.1, against the fake Feishu platform; the CLI runs as a separate process on the same
database while the gateway serves, as an operator would run it. Feishu's codes for a chat the bot
can no longer send to come from the send/reply APIs' error tables: 230002 (the bot is not in the
chat: it was removed) and 232009 (the chat was dissolved).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway_harness import echo, idle
from hermes_core import Agent
from hermes_core.channels.seam import OutboundMessage
from hermes_core.config import FeishuConfig, GatewayConfig, Settings
from hermes_core.console.app import mount_console
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.server import build_gateway
from hermes_core.testing import ScriptedModel
from hermes_core.testing.fake_feishu import FakeFeishu
from waiting import eventually


@asynccontextmanager
async def served(
    tmp_path: Path, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, str]]:
    """`serve`'s gateway and console on a free loopback port (echo runner: sending is under test)."""
    monkeypatch.setenv("FEISHU_APP_SECRET", feishu.app_secret)
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", feishu.verification_token)
    monkeypatch.delenv("HERMES_CONSOLE_TOKEN", raising=False)
    settings = Settings(
        gateway=GatewayConfig(data_dir=str(tmp_path)),
        feishu=FeishuConfig(app_id=feishu.app_id, base_url=feishu.base_url),
    )
    agent = Agent(model=ScriptedModel([]))
    gateway, routes = build_gateway(settings, agent)
    gateway.runner = echo
    gateway.resend_interval = 0.2
    app = web.Application()
    app.add_routes(routes)
    assert mount_console(app, gateway, settings, host="127.0.0.1", model=agent.model) is not None
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await gateway.start()
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield gateway, f"http://127.0.0.1:{port}"
    finally:
        await gateway.stop(grace=1)
        await runner.cleanup()


async def cli(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """`hermes-kernel --config <file> ARGS` in its own process, on the gateway's data directory."""
    config = tmp_path / "cli.yaml"
    config.write_text(f"gateway:\n  data_dir: {json.dumps(str(tmp_path))}\n", encoding="utf-8")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hermes_core.cli", "--config", str(config), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=30)
    return process.returncode or 0, out.decode(), err.decode()


async def dead_count(gateway: Gateway) -> int:
    return int((await gateway.store.counts())["dead_letters"])  # type: ignore[attr-defined]


async def wait_dead(gateway: Gateway, count: int) -> None:
    async def reached() -> bool:
        return await dead_count(gateway) == count

    await eventually(reached, what=f"{count} dead letter(s)")


def count_resend_looks(gateway: Gateway) -> list[int]:
    """Count the resend poller's looks at the store (`claim_resends`), in a list of one number."""
    looks = [0]
    claim = gateway.store.claim_resends

    async def counted() -> list[OutboundMessage]:
        found = await claim()
        looks[0] += 1
        return found

    gateway.store.claim_resends = counted  # type: ignore[method-assign]
    return looks


async def looked_again(gateway: Gateway, looks: list[int]) -> None:
    """Until the resend poller has looked at the store twice more (so once wholly after now) and the
    gateway is idle: a reply it would send twice has been sent by then."""
    seen = looks[0]
    await eventually(lambda: looks[0] >= seen + 2 and idle(gateway), what="the resend poller to look again")


def group_message(feishu: FakeFeishu, text: str, chat: str) -> dict[str, Any]:
    return feishu.user_message(text, chat_id=chat, chat_type="group", mention_bot=True)


@pytest.mark.slow
async def test_a_reply_to_a_chat_the_bot_was_removed_from_is_dead_lettered_listed_and_resent_by_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Attack: the bot is removed from a group while a reply to it is queued; Feishu answers 230002.
    That is a real, permanent refusal: the reply is dead-lettered after one attempt (no minutes of
    retries), logged once at ERROR on one redacted line, counted, and listed by `hermes-kernel
    deadletters` (run as its own process while the gateway serves). Once the bot is back in the
    group, `hermes-kernel deadletters resend ID` sends it — exactly once."""
    caplog.set_level(logging.INFO)
    async with FakeFeishu() as feishu, served(tmp_path, feishu, monkeypatch) as (gateway, url):
        looks = count_resend_looks(gateway)
        feishu.chats_without_bot.add("oc_gone")
        message = group_message(feishu, "still there?", "oc_gone")
        assert (await feishu.push(message, f"{url}/feishu/events")).ok
        await wait_dead(gateway, 1)
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name == "hermes_core.gateway"]
        assert len(errors) == 1
        line = errors[0].getMessage()
        assert "dead-lettered after 1 failed attempt" in line and "230002" in line
        assert "\n" not in line and feishu.app_secret not in line
        assert gateway.counters["dead_letters"] == 1

        status, listing, _ = await cli(tmp_path, "deadletters", "--json")
        assert status == 0
        [dead] = json.loads(listing)
        assert dead["attempts"] == 1 and dead["conversation"] == "feishu:oc_gone"
        assert "230002" in dead["error"] and "not in the chat" in dead["error"]
        assert dead["text"] == "echo: still there?"
        status, text, _ = await cli(tmp_path, "deadletters")
        assert status == 0 and f"{dead['id']}\t" in text and "230002" in text

        status, _, err = await cli(tmp_path, "deadletters", "resend", "999999")
        assert status == 1 and "no dead letter 999999" in err

        feishu.chats_without_bot.discard("oc_gone")  # the bot is added back
        status, out, _ = await cli(tmp_path, "deadletters", "resend", str(dead["id"]))
        assert status == 0 and "resend requested" in out
        await eventually(lambda: len(feishu.sent) == 1, timeout=20)
        await wait_dead(gateway, 0)
        await looked_again(gateway, looks)  # nothing is sent twice
        assert gateway.counters["dead_letters_resent"] == 1
    assert [(m.chat_id, m.text) for m in feishu.sent] == [("oc_gone", "echo: still there?")]


async def post(url: str, body: Any = None, **options: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=body if body is not None else {}, **options) as answer:
            return answer.status, await answer.json(content_type=None)


async def test_a_dissolved_chats_dead_letter_is_shown_in_the_console_and_resent_with_its_button(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: the group is dissolved (232009) before the reply goes out. The console's dead-letters
    page shows the reply and why, with a Resend button (same-origin JSON POST). A resend while the
    chat is still gone dies again (a real failure, counted again); a cross-site POST, a form POST,
    a malformed or unknown id change nothing and never give a 500; after the fix one click sends it."""
    async with FakeFeishu() as feishu, served(tmp_path, feishu, monkeypatch) as (gateway, url):
        feishu.dissolved_chats.add("oc_dissolved")
        assert (await feishu.push(group_message(feishu, "hello?", "oc_dissolved"), f"{url}/feishu/events")).ok
        await wait_dead(gateway, 1)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/console/deadletters") as page:
                html = await page.text()
            async with session.get(f"{url}/console/api/deadletters") as listing:
                [dead] = (await listing.json())["dead_letters"]
        assert page.status == 200 and "232009" in html and "dissolved" in html
        assert f'data-deadletter="{dead["id"]}"' in html and "echo: hello?" in html
        resend = f"{url}/console/api/deadletters/{dead['id']}/resend"

        foreign = await post(resend, headers={"Origin": "https://evil.example"})
        async with aiohttp.ClientSession() as session:
            async with session.post(resend, data={"x": "1"}) as form:
                form_status = form.status
        malformed = await post(f"{url}/console/api/deadletters/abc/resend")
        unknown = await post(f"{url}/console/api/deadletters/424242/resend")
        assert (foreign[0], form_status, malformed[0], unknown[0]) == (403, 403, 400, 404)
        assert await dead_count(gateway) == 1 and gateway.counters["dead_letters_resent"] == 0

        status, answer = await post(resend)  # the chat is still dissolved: it dies again
        assert status == 200 and answer["resent"] == dead["id"]
        await eventually(lambda: gateway.counters["dead_letters"] == 2, timeout=20)
        await wait_dead(gateway, 1)

        feishu.dissolved_chats.discard("oc_dissolved")
        status, _ = await post(resend)
        assert status == 200
        await eventually(lambda: len(feishu.sent) == 1, timeout=20)
        await wait_dead(gateway, 0)
        assert (await post(resend))[0] == 404  # gone from the dead letters: nothing to send twice
    assert [(m.chat_id, m.text) for m in feishu.sent] == [("oc_dissolved", "echo: hello?")]


@pytest.mark.slow
async def test_a_resend_asked_for_while_no_gateway_runs_is_sent_at_the_next_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: the operator runs `hermes-kernel deadletters resend ID` while the gateway is down (a
    deploy, a crash). The request is durable: the next gateway to start puts the reply back in its
    outbox and sends it once; nothing is left stuck in the dead-letter table."""
    async with FakeFeishu() as feishu:
        feishu.chats_without_bot.add("oc_later")
        async with served(tmp_path, feishu, monkeypatch) as (gateway, url):
            message = group_message(feishu, "after the deploy", "oc_later")
            assert (await feishu.push(message, f"{url}/feishu/events")).ok
            await wait_dead(gateway, 1)
        feishu.chats_without_bot.discard("oc_later")
        status, listing, _ = await cli(tmp_path, "deadletters", "--json")
        [dead] = json.loads(listing)
        status, out, _ = await cli(tmp_path, "deadletters", "resend", str(dead["id"]))
        assert status == 0
        async with served(tmp_path, feishu, monkeypatch) as (gateway, _):
            looks = count_resend_looks(gateway)
            await eventually(lambda: len(feishu.sent) == 1, timeout=20)
            await wait_dead(gateway, 0)
            await looked_again(gateway, looks)  # nothing is sent twice
    assert [(m.chat_id, m.text) for m in feishu.sent] == [("oc_later", "echo: after the deploy")]
