"""Throttling end to end: a real gateway on 127.0.0.1 replies through the fake Feishu platform.

Two reports from outside are performed here:
1. an 80-second Feishu throttling storm (HTTP 429 / code 99991400 with `x-ogw-ratelimit-reset`)
   with one reply waiting: the reply was dead-lettered after 56 tries and never sent. A wait the
   platform asks for is not a failure: the reply must go out when the storm is over.
2. `send_rate: 5` capped the whole app at 5 messages/s (Feishu allows 50/s and 1,000/min per
   app, 5/s per chat): replies to many chats must go out at the platform's pace, each chat at
   most 5/s, and the app-wide limits must hold.
Time is scaled (FakeFeishu `time_scale`) so that each test takes seconds.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway_harness import echo, feishu_gateway, idle, serving
from hermes_core import Agent
from hermes_core.config import FeishuConfig, GatewayConfig, Settings
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.server import build_gateway
from hermes_core.testing import ScriptedModel
from hermes_core.testing.fake_feishu import FakeFeishu
from waiting import eventually

APP_RATE_LIMITED = 99991400


def most_in_window(times: list[float], window: float) -> int:
    """The largest number of `times` inside any half-open window [t, t + window)."""
    times = sorted(times)
    return max((sum(1 for u in times[i:] if u < t + window - 1e-9) for i, t in enumerate(times)), default=0)


async def sent_or_dead(gateway: Gateway, feishu: FakeFeishu, expected: int, timeout: float) -> int:
    """Wait until `expected` messages are on the platform or a reply was dead-lettered; the dead count."""

    async def settled() -> tuple[int] | None:
        dead = int((await gateway.store.counts())["dead_letters"])  # type: ignore[attr-defined]
        return (dead,) if dead or len(feishu.sent) >= expected else None

    (dead,) = await eventually(settled, timeout, f"{expected} sent or one dead-lettered", interval=0.05)
    return dead


def outbox_rows(tmp_path: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        return db.execute("SELECT status, attempts FROM outbox ORDER BY id").fetchall()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("legacy_status_400", "token_too"),
    [(False, False), (True, False), (False, True)],
    ids=["http-429", "legacy-http-400", "token-endpoint-too"],
)
async def test_an_80_second_throttling_storm_delays_the_reply_but_never_dead_letters_it(
    tmp_path: Path, legacy_status_400: bool, token_too: bool
) -> None:
    """Attack (reported from outside): Feishu answers every send with 99991400 — HTTP 429, or HTTP 400
    from older APIs — and `x-ogw-ratelimit-reset` for 80 s (scaled to 16 s) while one reply waits.
    Before, each call waited 6 times and the outbox counted it as a failed attempt: 8 x 7 = 56 tries
    (each retry also paced by the chat's 5/s: ~12 s here), then the dead-letter table. Now the
    reply waits as long as it is told to and goes out once, after the storm. In the third case the
    tenant token was revoked and the storm hits the token endpoint: fetching a new one waits too."""
    async with FakeFeishu(time_scale=0.2) as feishu:
        feishu.set_limits(legacy_status_400=legacy_status_400)
        async with feishu_gateway(tmp_path, feishu) as (gateway, url):
            paths = ("tenant_access_token",) if token_too else ("messages",)
            if token_too:
                feishu.expire_tokens()
            feishu.throttle_for(80, reset=1.0, paths=paths)  # 16 s of "wait", each asking for 0.2 s
            storm_over = time.monotonic() + 16.0
            message = feishu.user_message("are you there?", chat_id="oc_storm")
            assert (await feishu.push(message, url)).ok
            dead = await sent_or_dead(gateway, feishu, 1, timeout=40)
            await eventually(lambda: idle(gateway))  # nothing else may arrive
            counters = dict(getattr(gateway, "counters", {}))
    assert dead == 0, "the reply was dead-lettered during the storm"
    assert [m.text for m in feishu.sent] == ["echo: are you there?"]
    assert feishu.sent[0].created_at >= time.time() - (time.monotonic() - storm_over) - 0.05
    refusals = [c for c in feishu.requests if c.code == APP_RATE_LIMITED]
    assert len(refusals) > 56  # more "wait" answers than the old code survived
    assert all(c.status == (400 if legacy_status_400 else 429) for c in refusals)
    assert outbox_rows(tmp_path) == [("sent", 0)]  # no failed attempt was counted
    assert counters["send_waits"] >= 1 and counters["dead_letters"] == 0


@pytest.mark.slow  # several seconds of real time
async def test_only_real_failures_count_towards_dead_lettering(tmp_path: Path) -> None:
    """Attack: a storm of "wait" answers mixed with real failures (HTTP 500s, each exhausting one
    call's retries). With `send_attempts = 2`, one real failure plus any number of waits still
    delivers; the storm waits count for nothing, only the 500s do. Then real failures alone are
    still dead-lettered after `send_attempts` — waiting out storms must not make outages endless."""
    async with FakeFeishu(time_scale=0.1) as feishu:
        async with feishu_gateway(tmp_path, feishu) as (gateway, url):
            gateway.send_attempts, gateway.send_backoff = 2, 0.05
            feishu.throttle_for(30, reset=1.0)  # 3 s of waits first (storms are checked first) …
            feishu.fail_next(4, code=1, status=500)  # … then one call's worth of 500s: one attempt
            assert (await feishu.push(feishu.user_message("one", chat_id="oc_mixed"), url)).ok
            assert await sent_or_dead(gateway, feishu, 1, timeout=40) == 0
            assert outbox_rows(tmp_path) == [("sent", 1)]

            feishu.fail_next(1000, code=1, status=500)  # a real outage
            assert (await feishu.push(feishu.user_message("two", chat_id="oc_mixed"), url)).ok
            assert await sent_or_dead(gateway, feishu, 2, timeout=40) == 1
            dead = await gateway.store.dead_letters()  # type: ignore[attr-defined]
    assert [m.text for m in feishu.sent] == ["echo: one"]
    assert dead[0]["attempts"] == 2 and "HTTP 500" in dead[0]["error"]


# -- pacing: per chat, and the app as a whole --------------------------------------------------


@asynccontextmanager
async def served_gateway(
    tmp_path: Path, feishu: FakeFeishu, monkeypatch: pytest.MonkeyPatch, feishu_config: dict[str, Any]
) -> AsyncIterator[tuple[Gateway, str]]:
    """The gateway exactly as `serve` builds it from the configuration (build_gateway), with a fast
    echo runner in place of the agent: sending is what is measured here."""
    monkeypatch.setenv("FEISHU_APP_SECRET", feishu.app_secret)
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", feishu.verification_token)
    settings = Settings(
        gateway=GatewayConfig(data_dir=str(tmp_path)),
        feishu=FeishuConfig(app_id=feishu.app_id, base_url=feishu.base_url, **feishu_config),
    )
    gateway, routes = build_gateway(settings, Agent(model=ScriptedModel([])))
    gateway.runner = echo
    async with serving(gateway, routes) as url:
        yield gateway, f"{url}/feishu/events"


async def push_all(feishu: FakeFeishu, url: str, chats: int, per_chat: int) -> None:
    async def one_chat(n: int) -> None:
        for i in range(per_chat):
            envelope = feishu.user_message(f"c{n} #{i}", chat_id=f"oc_{n}", sender=f"ou_{n}")
            assert (await feishu.push(envelope, url)).ok

    await asyncio.gather(*(one_chat(n) for n in range(chats)))


async def test_replies_to_20_chats_go_out_faster_than_5_per_second_and_each_chat_at_most_5_per_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack (reported from outside): 20 chats write at once and the replies queue up. With the
    shipped configuration (no send keys: the defaults) the app as a whole went at 5 messages/s —
    at 200 events/s the outbox grew by ~19 minutes. Now each chat is paced at 5/s and the app at
    the platform's 50/s and 1,000/min: measured from the fake platform's own times, the replies go
    out at well over 5/s overall, while no chat ever gets more than 5 in any second."""
    chats, per_chat = 20, 3
    async with FakeFeishu() as feishu:
        async with served_gateway(tmp_path, feishu, monkeypatch, {}) as (gateway, url):
            await push_all(feishu, url, chats, per_chat)
            await eventually(lambda: len(feishu.sent) >= chats * per_chat, timeout=40)
            await eventually(lambda: idle(gateway))
    times = sorted(m.created_at for m in feishu.sent)
    assert len(times) == chats * per_chat
    overall = (len(times) - 1) / (times[-1] - times[0])
    assert overall > 10, f"{overall:.1f} messages/s overall"
    for n in range(chats):
        mine = feishu.messages_in(f"oc_{n}")
        assert [m.text for m in mine] == [f"echo: c{n} #{i}" for i in range(per_chat)]
        assert most_in_window([m.created_at for m in mine], 1.0) <= 5
    assert most_in_window(times, 1.0) <= 50


@pytest.mark.slow
async def test_the_app_wide_limits_hold_when_scaled_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: 40 chats' replies at once against an app allowed only 10/s and 30/min (scaled-down
    `feishu.app_send_rate` / `app_send_per_minute`, the platform set to the same limits). The
    gateway must keep under both by itself: the first replies go at 10/s, then the minute's
    budget paces the rest, and the platform never has to answer 99991400."""
    async with FakeFeishu() as feishu:
        feishu.set_limits(app_qps=10, app_qpm=30)
        config = {"app_send_rate": 10, "app_send_per_minute": 30}
        async with served_gateway(tmp_path, feishu, monkeypatch, config) as (_, url):
            await push_all(feishu, url, 40, 1)
            await eventually(lambda: len(feishu.sent) >= 10, timeout=20)
            await asyncio.sleep(5.0)  # the pace over 5 s of the platform's own (real) clock is measured
            in_five_seconds = len(feishu.sent)
    times = sorted(m.created_at for m in feishu.sent)
    assert most_in_window(times, 1.0) <= 10
    # the minute bucket: a burst of 10, then (30 + 1 - 10) / 60.1 s ≈ one every 2.9 s
    assert 10 <= in_five_seconds <= 14, in_five_seconds
    assert not [c for c in feishu.requests if c.code == APP_RATE_LIMITED]
