"""The gateway over real HTTP: webhook channel, durable inbox/outbox, per-conversation order.

The tests taking `new_store` run on both stores: SQLite, and PostgreSQL on a private server
(tests/pg_server.py; skipped where none can start)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway_harness import serving
from hermes_core.channels.base import Channel, DeliveryError
from hermes_core.channels.webhook import WebhookChannel, sign
from hermes_core.gateway.dispatcher import Gateway, reply_for
from hermes_core.gateway.messages import InboundMessage, OutboundMessage
from hermes_core.gateway.store import GatewayStore, SQLiteGatewayStore
from hermes_core.postgres.gateway import PostgresGatewayStore
from hermes_core.sessions.store import TurnAppend
from hermes_core.storage import StoreUnavailable
from virtual_clock import VirtualClock
from waiting import eventually

Runner = Callable[[InboundMessage], Awaitable[list[str]]]


async def echo(message: InboundMessage) -> list[str]:
    return [f"echo: {message.text}"]


NewStore = Callable[[], GatewayStore]


@pytest.fixture(params=["sqlite", "postgres"])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> NewStore:
    """Opens the test's store (each call a new handle on the same data): SQLite, or PostgreSQL."""
    if request.param == "sqlite":
        return lambda: SQLiteGatewayStore(tmp_path / "g.db")
    url = request.getfixturevalue("pg_url")
    return lambda: PostgresGatewayStore(url)


@asynccontextmanager
async def running_gateway(
    tmp_path: Path,
    runner: Runner = echo,
    *,
    secret: str | None = None,
    callback_hosts: tuple[str, ...] = (),
    store: GatewayStore | None = None,
    **options: float,
) -> AsyncIterator[tuple[Gateway, str]]:
    store = store or SQLiteGatewayStore(tmp_path / "gateway.db")
    gateway = Gateway(store, runner, **options)  # type: ignore[arg-type]
    webhook = WebhookChannel(gateway, secret=secret, reply_timeout=5, callback_hosts=callback_hosts)
    gateway.add_channel(webhook)
    async with serving(gateway, webhook.routes()) as url:
        yield gateway, url


async def post(url: str, body: bytes | dict, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode()
    async with aiohttp.ClientSession() as session, session.post(url, data=data, headers=headers) as response:
        return response.status, await response.json()


async def test_webhook_round_trip_in_utf8(tmp_path: Path, new_store: NewStore) -> None:
    async with running_gateway(tmp_path, store=new_store()) as (_, url):
        status, body = await post(f"{url}/webhook", {"message": "你好，世界", "user_id": "u1"})
    assert status == 200 and body["reply"] == "echo: 你好，世界"


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (b'{"message": "hi"', 400, "UTF-8 JSON"),
        (b"\xff\xfe", 400, "UTF-8 JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"message": "", "user_id": "u"}', 400, "'message'"),
        (b'{"message": "hi"}', 400, "'user_id'"),
        (b'{"message": "hi", "user_id": "u", "callback_url": "ftp://x"}', 400, "callback_url"),
        (b'{"message": "' + b"x" * (1024 * 1024) + b'", "user_id": "u"}', 413, "too large"),
    ],
    ids=["truncated", "not-utf8", "array", "empty-message", "no-user", "bad-callback", "oversized"],
)
async def test_bad_requests_get_clear_errors_and_nothing_runs(
    tmp_path: Path, body: bytes, status: int, error: str
) -> None:
    ran: list[str] = []

    async def runner(message: InboundMessage) -> list[str]:
        ran.append(message.text)
        return ["x"]

    async with running_gateway(tmp_path, runner) as (gateway, url):
        got, answer = await post(f"{url}/webhook", body)
        counts = await gateway.store.counts()  # type: ignore[attr-defined]
    assert got == status and error in answer["error"]
    assert ran == [] and counts["inbox_pending"] == 0


async def test_hmac_authentication(tmp_path: Path) -> None:
    secret = "webhook-secret-value"
    body = json.dumps({"message": "hi there", "user_id": "u1"}).encode()
    now = str(int(time.time()))
    async with running_gateway(tmp_path, secret=secret) as (_, url):
        unsigned = await post(f"{url}/webhook", body)
        forged = await post(
            f"{url}/webhook", body, {"X-Hermes-Timestamp": now, "X-Hermes-Signature": "sha256=00"}
        )
        stale_ts = str(int(time.time()) - 3600)
        stale = await post(
            f"{url}/webhook",
            body,
            {"X-Hermes-Timestamp": stale_ts, "X-Hermes-Signature": sign(secret, stale_ts, body)},
        )
        good = await post(
            f"{url}/webhook", body, {"X-Hermes-Timestamp": now, "X-Hermes-Signature": sign(secret, now, body)}
        )
    assert [unsigned[0], forged[0], stale[0]] == [401, 401, 401]
    assert good == (200, {"reply": "echo: hi there", "ok": True, "message_id": good[1]["message_id"]})


async def test_resent_message_id_is_answered_once(tmp_path: Path, new_store: NewStore) -> None:
    ran: list[str] = []

    async def runner(message: InboundMessage) -> list[str]:
        ran.append(message.message_id)
        return ["ok"]

    async with running_gateway(tmp_path, runner, store=new_store()) as (_, url):
        first = await post(f"{url}/webhook", {"message": "hi", "user_id": "u", "message_id": "m-1"})
        second = await post(f"{url}/webhook", {"message": "hi", "user_id": "u", "message_id": "m-1"})
    assert first[1] == {"reply": "ok", "ok": True, "message_id": "m-1"}
    # the resend is answered with the first reply (a client whose request was cut asks again)
    assert second[1] == {"reply": "ok", "ok": True, "duplicate": True, "message_id": "m-1"}
    assert ran == ["m-1"]


async def test_one_turn_per_conversation_in_order_and_conversations_concurrent(tmp_path: Path) -> None:
    """Each turn takes 0.1 s on a virtual clock (tests/virtual_clock.py): the window below is then
    the turns' own time, whatever the machine's load; the clock moves once every conversation
    with a message still to answer has its turn waiting on it."""
    running: dict[str, int] = {}
    overlap: list[str] = []
    order: list[tuple[str, str]] = []
    clock = VirtualClock()

    def every_busy_conversation_is_waiting() -> bool:
        busy = sum(
            1 for user in ("alice", "bob", "carol") if [c for c, _ in order].count(f"webhook:{user}") < 3
        )
        return clock.sleeping == busy

    async def runner(message: InboundMessage) -> list[str]:
        running[message.conversation] = running.get(message.conversation, 0) + 1
        if running[message.conversation] > 1:
            overlap.append(message.conversation)
        await clock.sleep(0.1)
        order.append((message.conversation, message.text))
        running[message.conversation] -= 1
        return [message.text]

    async with running_gateway(tmp_path, runner) as (gateway, url):
        started = clock()
        requests = [
            post(f"{url}/webhook", {"message": f"{user}-{i}", "user_id": user})
            for i in range(3)
            for user in ("alice", "bob", "carol")
        ]
        results = []
        for sent, request in enumerate(requests, 1):  # sent in this order, each accepted before the next
            results.append(asyncio.ensure_future(request))
            await eventually(lambda n=sent: sum(gateway.lanes()["turns"].values()) == n)  # type: ignore[misc]
        [answers] = await clock.run(asyncio.gather(*results), settled=every_busy_conversation_is_waiting)
        elapsed = clock() - started
    assert overlap == []
    for user in ("alice", "bob", "carol"):
        assert [text for conv, text in order if conv == f"webhook:{user}"] == [
            f"{user}-{i}" for i in range(3)
        ]
    assert (
        elapsed < 0.75
    )  # 3 conversations × 3 turns × 0.1 s: concurrent across conversations (serial: 0.9 s)
    assert all(status == 200 for status, _ in answers)


async def test_async_callback_variant_retries_until_delivered(tmp_path: Path) -> None:
    received: list[dict] = []
    failures = iter([500, 503])

    async def callback(request: web.Request) -> web.Response:
        status = next(failures, 200)
        if status == 200:
            received.append(
                {"body": await request.json(), "signature": request.headers.get("X-Hermes-Signature")}
            )
        return web.Response(status=status)

    app = web.Application()
    app.add_routes([web.post("/cb", callback)])
    callback_runner = web.AppRunner(app)
    await callback_runner.setup()
    site = web.TCPSite(callback_runner, "127.0.0.1", 0)
    await site.start()
    callback_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/cb"  # type: ignore[union-attr]
    secret = "s3cret"
    body = json.dumps({"message": "later please", "user_id": "u", "callback_url": callback_url}).encode()
    now = str(int(time.time()))
    headers = {"X-Hermes-Timestamp": now, "X-Hermes-Signature": sign(secret, now, body)}
    hosts = ("127.0.0.1",)  # callbacks go only to allowed hosts (tests/test_security_webhook.py)
    async with running_gateway(tmp_path, secret=secret, callback_hosts=hosts, send_backoff=0.05) as (
        gateway,
        url,
    ):
        status, answer = await post(f"{url}/webhook", body, headers)
        await eventually(lambda: bool(received))
    await callback_runner.cleanup()
    assert status == 202 and answer["accepted"] is True
    assert received and received[0]["body"]["reply"] == "echo: later please"
    assert received[0]["signature"].startswith("sha256=")


class FlakyChannel(Channel):
    """Fails the first `failures` sends of each reply; records what it delivered."""

    name = "flaky"

    def __init__(self, failures: int, permanent: bool = False) -> None:
        self.failures, self.permanent = failures, permanent
        self.tries: dict[str, int] = {}
        self.delivered: list[str] = []

    async def send(self, message: OutboundMessage) -> str | None:
        self.tries[message.uuid] = self.tries.get(message.uuid, 0) + 1
        if self.tries[message.uuid] <= self.failures:
            raise DeliveryError("platform busy", retry_after=0.01, permanent=self.permanent)
        self.delivered.append(message.text)
        return f"sent-{message.uuid[:6]}"


def inbound(conversation: str, text: str, message_id: str, channel: str = "flaky") -> InboundMessage:
    return InboundMessage(
        channel=channel, conversation=conversation, sender="u", text=text, message_id=message_id
    )


async def test_transient_send_failures_are_retried_in_order(new_store: NewStore) -> None:
    gateway = Gateway(new_store(), echo)
    channel = FlakyChannel(failures=2)
    gateway.add_channel(channel)
    await gateway.start()
    for i in range(5):
        await gateway.accept(inbound("c1", f"m{i}", f"id{i}"))
    await eventually(lambda: len(channel.delivered) == 5)
    await gateway.stop(grace=1)
    assert channel.delivered == [f"echo: m{i}" for i in range(5)]


async def test_undeliverable_reply_goes_to_the_dead_letter_table(new_store: NewStore) -> None:
    store = new_store()
    gateway = Gateway(store, echo, send_attempts=3)
    gateway.add_channel(FlakyChannel(failures=99))
    await gateway.start()
    await gateway.accept(inbound("c1", "hello", "id1"))

    async def dead_lettered() -> bool:
        return bool((await store.counts())["dead_letters"])

    await eventually(dead_lettered)
    dead = await store.dead_letters()
    await gateway.stop(grace=1)
    assert len(dead) == 1 and dead[0]["attempts"] == 3 and "platform busy" in dead[0]["error"]
    assert json.loads(dead[0]["payload"])["text"] == "echo: hello"


async def test_restart_finishes_accepted_messages_and_sends_unsent_replies(new_store: NewStore) -> None:
    store = new_store()
    # a previous process accepted two messages, completed one (its reply unsent), then died
    first = inbound("c1", "one", "id1")
    await store.accept(first)
    await store.accept(inbound("c1", "two", "id2"))
    assert first.id is not None
    await store.complete(first.id, [reply_for(first, "reply one", 0)])
    await store.close()

    channel = FlakyChannel(failures=0)
    gateway = Gateway(new_store(), echo)
    gateway.add_channel(channel)
    await gateway.start()
    await eventually(lambda: len(channel.delivered) == 2)
    await gateway.stop(grace=1)
    assert channel.delivered == ["reply one", "echo: two"]


class CommitThenLose(SQLiteGatewayStore):
    """A store whose first `complete` commits and then reports the database gone: the connection
    broke during the commit (seen with PostgreSQL stopped mid-run, tests/test_postgres_restart.py)."""

    lost = 0

    async def complete(
        self, inbound_id: int, replies: list[OutboundMessage], history: TurnAppend | None = None
    ) -> list[OutboundMessage]:
        queued = await super().complete(inbound_id, replies, history)
        if not self.lost:
            self.lost += 1
            raise StoreUnavailable("the connection broke during the commit")
        return queued


async def test_a_turn_whose_commit_was_not_confirmed_is_still_answered_at_once(tmp_path: Path) -> None:
    """The retry of `complete` finds the turn done and queues nothing; its replies, queued by the
    commit that did happen, are read back and sent by this process, not left for a restart."""
    store = CommitThenLose(tmp_path / "g.db")
    async with running_gateway(tmp_path, store=store) as (_, url):
        started = time.monotonic()
        status, body = await post(f"{url}/webhook", {"message": "hi", "user_id": "u1"})
        waited = time.monotonic() - started
        assert store.lost == 1
        assert status == 200 and body["reply"] == "echo: hi", body  # not 202 after the reply timeout
        assert waited < 4, waited
        assert (await store.counts())["outbox_pending"] == 0


async def test_duplicates_by_event_id_and_message_id(new_store: NewStore) -> None:
    store = new_store()
    original = InboundMessage("feishu", "c", "u", "hi", "om_1", event_id="ev_1")
    assert await store.accept(original) is not None
    assert await store.accept(InboundMessage("feishu", "c", "u", "hi", "om_1", event_id="ev_1")) is None
    assert await store.accept(InboundMessage("feishu", "c", "u", "hi", "om_1", event_id="ev_2")) is None
    assert await store.accept(InboundMessage("feishu", "c", "u", "hi", "om_2", event_id="ev_1")) is None
    assert await store.accept(InboundMessage("webhook", "c", "u", "hi", "om_1")) is not None  # other channel
    await store.close()


async def test_graceful_stop_lets_an_inflight_turn_finish(new_store: NewStore) -> None:
    started = asyncio.Event()

    async def slow(message: InboundMessage) -> list[str]:
        started.set()
        await asyncio.sleep(0.3)  # a turn still running when the stop comes: the behaviour under test
        return ["finished"]

    store = new_store()
    gateway = Gateway(store, slow)
    channel = FlakyChannel(failures=0)
    gateway.add_channel(channel)
    await gateway.start()
    await gateway.accept(inbound("c1", "work", "id1"))
    await eventually(started.is_set, what="the turn to start")
    await gateway.stop(grace=2)
    assert channel.delivered == ["finished"]
    reopened = new_store()
    assert await reopened.pending_inbound() == [] and await reopened.pending_outbound() == []
    await reopened.close()
