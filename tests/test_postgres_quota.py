"""Feishu's send limits held across processes: the app's quota and a chat's pace counted in PostgreSQL.

Each sending process has its own `SendLimiter` (channels/feishu/ratelimit.py); with `database.url`
it also takes every request's turn from `SharedSendQuota` (postgres/quota.py). Two real processes
(tests/quota_sender.py) send at once through `FeishuAPI` over HTTP to the fake Feishu platform, which
counts the app's requests per minute and a chat's per second for every client of the app together,
whichever process it is in, as the platform does — the minute shortened to `WINDOW` seconds on both
sides. Without the shared quota each process keeps the limit alone and the two together send twice
it (`test_each_process_alone_would_send_twice_the_quota` shows the fake refusing that).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hermes_core.channels.feishu.api import FeishuAPI
from hermes_core.channels.feishu.ratelimit import SendLimiter
from hermes_core.postgres.database import PostgresDatabase
from hermes_core.postgres.quota import SharedSendQuota
from hermes_core.testing.fake_feishu import FakeFeishu
from pg_server import PostgresServer
from pg_server import missing as postgres_missing
from serve_process import clean_environ

pytestmark = pytest.mark.slow  # real PostgreSQL, real processes

SENDER = Path(__file__).with_name("quota_sender.py")
K = 10  # the app's quota per WINDOW
WINDOW = 1.0  # the "minute", seconds
CREATE = "/open-apis/im/v1/messages"


def send_from_two_processes(url: str, feishu: FakeFeishu, count: int, chats: str, chat_rate: float) -> None:
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                str(SENDER),
                url,
                feishu.base_url,
                name,
                str(count),
                chats,
                str(K),
                str(WINDOW),
                str(chat_rate),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=clean_environ(),
        )  # fmt: skip
        for name in ("one", "two")
    ]
    try:
        for process in processes:
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        for process in processes:  # both at once
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        for process in processes:
            out, _ = process.communicate(timeout=40)
            assert process.returncode == 0 and out.strip() == f"sent {count}"
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()


def most_in_any_window(times: list[float], span: float) -> int:
    times = sorted(times)
    return max((sum(1 for t in times[i:] if t < start + span) for i, start in enumerate(times)), default=0)


def created(feishu: FakeFeishu, chat: str | None = None) -> list[float]:
    return [
        call.at for call in feishu.requests
        if call.method == "POST" and call.path == CREATE and call.code == 0
        and (chat is None or (call.body or {}).get("receive_id") == chat)
    ]  # fmt: skip


def refusals(feishu: FakeFeishu) -> list[int | None]:
    return [call.code for call in feishu.requests if call.path == CREATE and call.code not in (0, None)]


@pytest.fixture
def feishu() -> FakeFeishu:
    platform = FakeFeishu().start_in_thread()
    yield platform  # type: ignore[misc]
    platform.stop()


def test_two_processes_keep_one_app_quota_per_minute_between_them(pg_url: str, feishu: FakeFeishu) -> None:
    """3K messages from two processes, K a "minute" for the app: never more than K in any window
    at the platform, which never has to refuse one, and every message is there once."""
    feishu.set_limits(app_qpm=K, minute=WINDOW, chat_qps=1000)
    send_from_two_processes(pg_url, feishu, count=3 * K // 2, chats="oc_app:30", chat_rate=1000)
    texts = sorted(message.text for message in feishu.sent)
    assert texts == sorted(f"{name} {n}" for name in ("one", "two") for n in range(3 * K // 2))
    assert refusals(feishu) == []
    assert most_in_any_window(created(feishu), WINDOW) <= K


def test_two_processes_sending_into_one_chat_keep_its_pace_between_them(
    pg_url: str, feishu: FakeFeishu
) -> None:
    """A chat's 5 a second, counted for both processes: the platform never answers 230020."""
    feishu.set_limits(chat_qps=5)
    send_from_two_processes(pg_url, feishu, count=10, chats="oc_one:1", chat_rate=5)
    assert len(feishu.messages_in("oc_one0")) == 20
    assert refusals(feishu) == []
    assert most_in_any_window(created(feishu, "oc_one0"), 1.0) <= 5


def test_each_process_alone_would_send_twice_the_quota(feishu: FakeFeishu) -> None:
    """The same two processes without the shared quota ("-"): each keeps K a window, together
    they pass it and the platform refuses (they wait and send again: nothing is lost either)."""
    feishu.set_limits(app_qpm=K, minute=WINDOW, chat_qps=1000)
    send_from_two_processes("-", feishu, count=3 * K // 2, chats="oc_alone:30", chat_rate=1000)
    assert len(feishu.sent) == 3 * K
    assert 99991400 in refusals(feishu)


async def test_a_turn_moves_each_bucket_once_when_another_is_new_and_a_pruned_one_starts_full(
    pg_url: str,
) -> None:
    """The one statement that takes a turn (postgres/quota.py `_TAKE`) moves nothing unless every
    bucket's row is there: a request whose chat bucket is new moves the app's bucket once (not
    once for the try that found the chat's row missing and once more after it was created), from
    the moment the app's bucket allows; a pruned bucket starts full again."""
    from hermes_core.postgres.quota import _reserve

    database = PostgresDatabase(pg_url)
    quota = SharedSendQuota(database, "cli_q", chat_per_s=1.0, app_per_s=1.0, app_per_min=None)
    step = 1.1  # one request per second + the 0.1 s margin, no burst (ratelimit.py platform_limit)

    async def due(scope: str) -> float:
        async def read(db: Any) -> float:
            row = await (await db.execute("SELECT due FROM send_quota WHERE scope = %s", (scope,))).fetchone()
            return float(row[0])

        return await database.statement(read)

    try:
        app = quota.buckets(None)
        [scope] = app
        assert await _reserve(database, app) == 0.0  # a new bucket is full: at once
        first = await due(scope)
        both = quota.buckets("oc_new")
        wait = await _reserve(database, both)  # the chat's bucket is new
        assert await due(scope) == pytest.approx(first + step)  # its turn at `first`, moved once
        [chat] = set(both) - {scope}
        assert await due(chat) == pytest.approx(first + step)  # counted too, from the same moment
        assert step - 0.5 < wait <= step
        assert await quota.prune(idle=-3600) == 2  # both rows: "full again" an hour from now
        assert await _reserve(database, app) == 0.0
    finally:
        await quota.close()


async def test_sends_wait_while_the_database_is_down_and_go_out_once_it_is_back(
    feishu: FakeFeishu,
) -> None:
    """PostgreSQL stopped: the shared quota cannot be counted, so nothing is sent — and nothing is
    lost or failed: each send waits and goes out once the server is back."""
    reason = postgres_missing()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer().start()
    try:
        quota = SharedSendQuota(PostgresDatabase(server.fresh_database(), timeout=1.0), feishu.app_id)
        api = FeishuAPI(feishu.app_id, feishu.app_secret, base_url=feishu.base_url,
                        limiter=SendLimiter(shared=quota))  # fmt: skip
        await api.send_text("oc_db", "before")
        await asyncio.to_thread(server.shut_down)
        sends = [asyncio.create_task(api.send_text("oc_db", f"while down {n}")) for n in range(3)]
        done, _ = await asyncio.wait(sends, timeout=1.5)
        assert done == set() and [m.text for m in feishu.sent] == ["before"]  # waiting, not failed
        await asyncio.to_thread(server.start_again)
        await asyncio.wait_for(asyncio.gather(*sends), timeout=20)
        assert sorted(m.text for m in feishu.sent) == ["before"] + [f"while down {n}" for n in range(3)]
        await api.aclose()
    finally:
        server.stop()


async def test_serve_and_worker_share_the_limits_they_do_not_keep_elsewhere(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With database.url, serve's Feishu limiter counts all three limits in PostgreSQL; a Temporal
    worker's the app's two (it sends from a local step of the workflow, so the per-second limit is
    no task queue's any more; a chat's pace is its workflow's). Without database.url neither
    shares anything."""
    from hermes_core.config import load_settings
    from hermes_core.engine.temporal.worker import senders
    from hermes_core.gateway.server import channels_for

    monkeypatch.setenv("FEISHU_APP_SECRET", "s")
    for url, serve_scopes, worker_scopes in (
        (
            pg_url,
            {"cli_q:im.message.create:second", "cli_q:im.message.create:minute", "cli_q:chat:oc_1"},
            {"cli_q:im.message.create:second", "cli_q:im.message.create:minute"},
        ),
        (None, None, None),
    ):
        env = {"FEISHU_APP_ID": "cli_q", **({"HERMES_DATABASE_URL": url} if url else {})}
        settings = load_settings(None, env=env, dotenv=None)
        channels, _ = channels_for(settings, inbox=None)
        [feishu] = [channel for channel in channels if channel.name == "feishu"]
        api = senders(settings)["feishu"]
        for limiter, scopes in ((feishu.api.limiter, serve_scopes), (api.limiter, worker_scopes)):
            shared = limiter.shared
            assert (None if shared is None else set(shared.buckets("oc_1"))) == scopes
        await feishu.api.aclose()
        await api.aclose()
