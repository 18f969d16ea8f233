"""FeishuLongConnection against a tiny in-test Feishu (exact frames, timings) and the FakeFeishu platform."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from hermes_core.channels.feishu.frames import METHOD_CONTROL, METHOD_DATA, Frame
from hermes_core.channels.feishu.longconn import ClientConfig, FeishuLongConnection, LongConnectionError
from virtual_clock import VirtualClock
from waiting import eventually

SECRET = "s3cret-never-logged"
SERVICE_ID = 7


class MiniFeishu:
    """Just enough of Feishu's long-connection side to check the client's frames byte by byte."""

    def __init__(self) -> None:
        self.config: dict[str, Any] = {"PingInterval": 60, "ReconnectInterval": 1, "ReconnectNonce": 0}
        self.endpoint_replies: list[dict[str, Any]] = []  # served first, then a normal reply
        self.endpoint_requests: list[tuple[dict[str, str], Any]] = []
        self.refuse_upgrade: dict[str, str] | None = None
        self.pong_payload: bytes | None = None
        self.sockets: list[web.WebSocketResponse] = []
        self.raw_pings: list[bytes] = []
        self.ping_times: list[float] = []
        self.clock: Callable[[], float] = time.monotonic  # what `ping_times` are read from
        self.acks: list[Frame] = []
        app = web.Application()
        app.router.add_post("/callback/ws/endpoint", self._endpoint)
        app.router.add_get("/ws", self._ws)
        self.server = TestServer(app)

    @property
    def domain(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def _endpoint(self, request: web.Request) -> web.Response:
        self.endpoint_requests.append((dict(request.headers), await request.json()))
        if self.endpoint_replies:
            return web.json_response(self.endpoint_replies.pop(0))
        url = f"ws://{request.host}/ws?device_id=dev-{len(self.endpoint_requests)}&service_id={SERVICE_ID}"
        return web.json_response({"code": 0, "msg": "ok", "data": {"URL": url, "ClientConfig": self.config}})

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        if self.refuse_upgrade is not None:
            return web.Response(status=403, headers=self.refuse_upgrade)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.sockets.append(ws)
        async for message in ws:
            if message.type != WSMsgType.BINARY:
                continue
            frame = Frame.decode(message.data)
            if frame.method == METHOD_CONTROL and frame.header("type") == "ping":
                self.raw_pings.append(message.data)
                self.ping_times.append(self.clock())
                pong = Frame(service=frame.service, method=METHOD_CONTROL, headers=[("type", "pong")])
                await ws.send_bytes(dataclasses.replace(pong, payload=self.pong_payload).encode())
            else:
                self.acks.append(frame)
        return ws

    async def push(self, payload: bytes, *, message_id: str = "m1", kind: str = "event",
                   total: int = 1, seq: int = 0) -> Frame:  # fmt: skip
        headers = [("type", kind), ("message_id", message_id), ("sum", str(total)), ("seq", str(seq)),
                   ("trace_id", "t-" + message_id)]  # fmt: skip
        frame = Frame(seq_id=11, log_id=22, service=SERVICE_ID, method=METHOD_DATA, headers=headers,
                      payload=payload)  # fmt: skip
        await self.sockets[-1].send_bytes(frame.encode())
        return frame


def envelope(text: str, message_id: str = "om_1") -> dict[str, Any]:
    header = {"event_id": "ev-" + message_id, "event_type": "im.message.receive_v1"}
    message = {"message_id": message_id, "content": json.dumps({"text": text})}
    return {"schema": "2.0", "header": header, "event": {"message": message}}


@pytest.fixture
async def feishu() -> AsyncIterator[MiniFeishu]:
    mini = MiniFeishu()
    await mini.server.start_server()
    yield mini
    await mini.server.close()


Received = list[dict[str, Any]]
Connect = Callable[..., Awaitable[tuple[FeishuLongConnection, Received]]]


@pytest.fixture
async def connect(feishu: MiniFeishu) -> AsyncIterator[Connect]:
    """Start a client whose handler records events (or runs `handler`); stopped after the test."""
    clients: list[FeishuLongConnection] = []

    async def _connect(handler: Callable[[dict], Awaitable[None]] | None = None, **options: Any) -> Any:
        received: Received = []

        async def on_event(event: dict) -> None:
            received.append(event)
            if handler is not None:
                await handler(event)

        client = FeishuLongConnection("cli_test", SECRET, on_event, domain=feishu.domain, **options)
        client.config.reconnect_nonce = 0  # Feishu's default jitter (up to 30 s) before any handshake
        client.config.reconnect_interval = 0.01  # and its 120 s between retries, until one succeeds
        clients.append(client)
        await client.start()
        return client, received

    yield _connect
    for client in clients:
        await client.stop()


def acked(frame: Frame, ack: Frame, code: int) -> None:
    """The ACK is the pushed frame echoed, plus `biz_rt`, with `{"code":…}` as the payload."""
    biz_rt = ack.header("biz_rt")
    assert biz_rt is not None and biz_rt.isdigit()
    assert ack == dataclasses.replace(frame.with_header("biz_rt", biz_rt), payload=b'{"code":%d}' % code)


async def test_handshake_posts_credentials_with_locale_and_no_authorization(
    feishu: MiniFeishu, connect: Connect
) -> None:
    client, _ = await connect()
    headers, body = feishu.endpoint_requests[0]
    assert body == {"AppID": "cli_test", "AppSecret": SECRET}
    assert headers["locale"] == "zh" and "Authorization" not in headers
    assert client.connected and len(feishu.sockets) == 1


async def test_bad_credentials_fail_start_with_code_and_msg_and_secret_not_logged(
    feishu: MiniFeishu, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    feishu.endpoint_replies = [{"code": 10014, "msg": "app secret invalid"}]

    async def on_event(event: dict) -> None: ...

    client = FeishuLongConnection("cli_test", SECRET, on_event, domain=feishu.domain)
    with pytest.raises(LongConnectionError, match="10014.*app secret invalid") as failure:
        await client.start()
    assert not failure.value.transient and len(feishu.endpoint_requests) == 1
    assert SECRET not in caplog.text and not client.connected
    assert asyncio.all_tasks() == {asyncio.current_task()} | _server_tasks()


async def test_transient_codes_are_retried_at_start(feishu: MiniFeishu, connect: Connect) -> None:
    feishu.endpoint_replies = [{"code": 1, "msg": "system busy"}, {"code": 1000040343, "msg": "internal"}]
    client, _ = await connect()
    assert client.connected and len(feishu.endpoint_requests) == 3


async def test_refused_upgrade_reports_the_handshake_headers(feishu: MiniFeishu) -> None:
    feishu.refuse_upgrade = {"handshake-status": "403", "handshake-msg": "forbidden"}

    async def on_event(event: dict) -> None: ...

    client = FeishuLongConnection("cli_test", SECRET, on_event, domain=feishu.domain)
    with pytest.raises(LongConnectionError, match="403.*forbidden"):
        await client.start()


async def test_endpoint_url_without_service_id_is_refused(feishu: MiniFeishu) -> None:
    feishu.endpoint_replies = [{"code": 0, "data": {"URL": f"ws://{feishu.server.host}/ws?device_id=d"}}]

    async def on_event(event: dict) -> None: ...

    with pytest.raises(LongConnectionError, match="service_id"):
        await FeishuLongConnection("cli_test", SECRET, on_event, domain=feishu.domain).start()


async def read_so_far(feishu: MiniFeishu, received: Received) -> None:
    """Until the client has read every frame the server sent before now: a whole event pushed after
    them is ACKed (frames arrive in order on the socket). That marker event and its ACK are then
    taken out of `received` and `feishu.acks` again."""
    marker_id = f"om_marker_{uuid.uuid4().hex[:8]}"
    marker = envelope("marker", marker_id)
    await feishu.push(json.dumps(marker).encode(), message_id=marker_id)
    acked = lambda: any(ack.header("message_id") == marker_id for ack in feishu.acks)  # noqa: E731
    await eventually(acked, what=f"the ACK of {marker_id}")
    feishu.acks[:] = [ack for ack in feishu.acks if ack.header("message_id") != marker_id]
    received.remove(marker)


async def test_pings_at_once_then_every_ping_interval(feishu: MiniFeishu, connect: Connect) -> None:
    """A ping at once on connecting, then one every PingInterval of the handshake's ClientConfig (60 s),
    on the connection's clock: the test moves it from one wake-up of the ping loop to the next, so
    the pings' times are exact and no wall-clock window is measured."""
    clock = VirtualClock()
    feishu.clock = clock

    async def settled() -> None:
        """The ping loop asleep again, its ping (if any) at the server and the pong read by the client
        (the first marker's ACK follows the ping on the socket, the second marker the pong)."""
        await eventually(lambda: clock.sleeping == 1, what="the ping loop asleep")
        await read_so_far(feishu, received)
        await read_so_far(feishu, received)

    _, received = await connect(clock=clock, sleep=clock.sleep)
    await settled()
    expected = Frame(service=SERVICE_ID, method=METHOD_CONTROL, headers=[("type", "ping")]).encode()
    assert expected == bytes.fromhex("08 00 10 00 18 07 20 00 2a 0c 0a 04") + b"type\x12\x04ping"
    assert feishu.raw_pings == [expected] and feishu.ping_times == [0]
    while len(feishu.raw_pings) < 5:
        clock.wake_next()
        await settled()
    assert feishu.ping_times == [0, 60, 120, 180, 240]  # none between: each ping is at a wake-up
    assert feishu.raw_pings == [expected] * 5


async def test_pong_client_config_is_applied_at_once(feishu: MiniFeishu, connect: Connect) -> None:
    feishu.pong_payload = json.dumps({"PingInterval": 0.05, "ReconnectCount": 3}).encode()
    client, _ = await connect()  # handshake said 60 s; the first pong says 0.05 s
    await eventually(lambda: len(feishu.raw_pings) >= 4)
    assert client.config.ping_interval == 0.05 and client.config.reconnect_count == 3


async def test_event_is_delivered_once_and_acked_with_biz_rt(feishu: MiniFeishu, connect: Connect) -> None:
    client, received = await connect()
    pushed = await feishu.push(json.dumps(envelope("hi")).encode())
    await eventually(lambda: len(feishu.acks) == 1)
    assert received == [envelope("hi")] and client.events_received == 1
    acked(pushed, feishu.acks[0], 200)


async def test_split_event_is_joined_in_seq_order(feishu: MiniFeishu, connect: Connect) -> None:
    _, received = await connect()
    raw = json.dumps(envelope("a long message " * 20)).encode()
    await feishu.push(raw[100:], total=2, seq=1)  # out of order on purpose
    await read_so_far(feishu, received)
    assert received == [] and feishu.acks == []  # half an event is neither delivered nor ACKed
    last = await feishu.push(raw[:100], total=2, seq=0)
    await eventually(lambda: len(feishu.acks) == 1)
    assert received == [envelope("a long message " * 20)]
    acked(last, feishu.acks[0], 200)


async def test_incomplete_parts_expire(feishu: MiniFeishu, connect: Connect) -> None:
    clock = VirtualClock()  # the connection's: the half event grows old without waiting
    _, received = await connect(part_timeout=0.05, clock=clock, sleep=clock.sleep)
    raw = json.dumps(envelope("late")).encode()
    await feishu.push(raw[:10], total=2, seq=0)
    await read_so_far(feishu, received)
    clock.now += 0.1
    await feishu.push(raw[10:], total=2, seq=1)  # its first half is gone: nothing to join
    await read_so_far(feishu, received)
    assert received == [] and feishu.acks == []


async def test_failing_handler_is_acked_500(feishu: MiniFeishu, connect: Connect) -> None:
    async def boom(event: dict) -> None:
        raise RuntimeError("disk full")

    await connect(boom)
    pushed = await feishu.push(json.dumps(envelope("x")).encode())
    await eventually(lambda: len(feishu.acks) == 1)
    acked(pushed, feishu.acks[0], 500)


async def test_card_frames_are_dropped_without_ack(feishu: MiniFeishu, connect: Connect) -> None:
    _, received = await connect()
    await feishu.push(b'{"action":{}}', message_id="card-1", kind="card")
    await feishu.push(json.dumps(envelope("after")).encode(), message_id="m2")
    await eventually(lambda: len(feishu.acks) == 1)  # m2's ACK: the card frame before it was read too
    assert received == [envelope("after")]
    assert [ack.header("message_id") for ack in feishu.acks] == ["m2"]


async def test_slow_handler_blocks_neither_pings_nor_other_events(
    feishu: MiniFeishu, connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    feishu.config["PingInterval"] = 0.02
    release = asyncio.Event()

    async def slow_for_first(event: dict) -> None:
        if event["event"]["message"]["message_id"] == "om_slow":
            await release.wait()

    _, received = await connect(slow_for_first, ack_timeout=0.05)
    await feishu.push(json.dumps(envelope("slow", "om_slow")).encode(), message_id="slow")
    await feishu.push(json.dumps(envelope("fast", "om_fast")).encode(), message_id="fast")
    await eventually(lambda: [ack.header("message_id") for ack in feishu.acks] == ["fast"])
    pings = len(feishu.raw_pings)
    await eventually(lambda: len(feishu.raw_pings) >= pings + 3)
    await eventually(lambda: "still running" in caplog.text)
    release.set()
    await eventually(lambda: len(feishu.acks) == 2)
    assert feishu.acks[1].header("message_id") == "slow" and feishu.acks[1].payload == b'{"code":200}'
    assert len(received) == 2


async def test_disconnect_reconnects_with_a_new_handshake(feishu: MiniFeishu, connect: Connect) -> None:
    client, received = await connect()
    await feishu.sockets[0].close()
    await eventually(lambda: client.reconnects == 1 and client.connected and len(feishu.sockets) == 2)
    assert len(feishu.endpoint_requests) == 2
    await feishu.push(json.dumps(envelope("again")).encode())
    await eventually(lambda: len(feishu.acks) == 1)
    assert received == [envelope("again")]


async def test_reconnect_gives_up_after_reconnect_count(
    feishu: MiniFeishu, connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    feishu.config.update(ReconnectCount=2, ReconnectInterval=0.05)
    client, _ = await connect()
    feishu.endpoint_replies = [{"code": 1, "msg": "system busy"}] * 5
    await feishu.sockets[0].close()
    await eventually(lambda: "gave up" in caplog.text)
    assert len(feishu.endpoint_requests) == 1 + 2 and not client.connected


def test_retry_delays_are_the_platforms_nonce_then_interval() -> None:
    async def on_event(event: dict) -> None: ...

    client = FeishuLongConnection("a", "b", on_event)
    assert (client.config.reconnect_nonce, client.config.reconnect_interval) == (30, 120)
    firsts = [client._retry_delay(0) for _ in range(50)]
    assert all(0 <= delay <= 30 for delay in firsts) and len(set(firsts)) > 1  # jittered
    assert [client._retry_delay(n) for n in range(1, 5)] == [120] * 4  # no faster backoff of our own
    client.config.update({"ReconnectNonce": 0, "ReconnectInterval": 5})
    assert [client._retry_delay(n) for n in range(3)] == [0, 5, 5]


def test_client_config_ignores_values_that_would_spin_or_break() -> None:
    config = ClientConfig()
    config.update({"PingInterval": 0, "ReconnectInterval": -1, "ReconnectNonce": 0, "ReconnectCount": 2})
    assert (config.ping_interval, config.reconnect_interval) == (120, 120)
    assert (config.reconnect_nonce, config.reconnect_count) == (0, 2)
    config.update({"PingInterval": "5", "ReconnectCount": True, "Unknown": 1})
    assert config == ClientConfig(reconnect_nonce=0, reconnect_count=2)


async def test_stop_is_clean_and_idempotent(feishu: MiniFeishu, connect: Connect) -> None:
    feishu.config["PingInterval"] = 0.01
    release = asyncio.Event()
    client, _ = await connect(lambda event: release.wait())
    await feishu.push(json.dumps(envelope("pending")).encode())  # a handler still running at stop()
    await eventually(lambda: client.events_received == 1 and len(feishu.raw_pings) >= 2)
    await client.stop()
    assert asyncio.all_tasks() == {asyncio.current_task()} | _server_tasks()
    assert not client.connected
    await eventually(lambda: feishu.sockets[0].closed)
    await client.stop()


async def test_stop_during_reconnect_backoff_is_prompt(feishu: MiniFeishu, connect: Connect) -> None:
    feishu.config["ReconnectInterval"] = 30
    client, _ = await connect()
    feishu.endpoint_replies = [{"code": 1, "msg": "system busy"}] * 3
    await feishu.sockets[0].close()
    await eventually(lambda: not client.connected and len(feishu.endpoint_requests) == 2)  # now waiting 30 s
    started = time.monotonic()
    await client.stop()
    assert time.monotonic() - started < 0.5
    assert asyncio.all_tasks() == {asyncio.current_task()} | _server_tasks()


def _server_tasks() -> set[asyncio.Task[Any]]:
    """The in-test server's own connection tasks (they end when it notices the client left)."""
    return {t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "") in _SERVER_CORO}


_SERVER_CORO = {"RequestHandler.start"}


# -- end to end, against the FakeFeishu platform -------------------------------------------------


@pytest.fixture
async def fake() -> AsyncIterator[Any]:
    from hermes_core.testing.fake_feishu import FakeFeishu

    async with FakeFeishu(time_scale=0.001, seed=1) as platform:
        yield platform


async def fake_client(
    fake: Any, handler: Callable[[dict], Awaitable[None]] | None = None
) -> tuple[FeishuLongConnection, Received]:
    received: Received = []

    async def on_event(event: dict) -> None:
        received.append(event)
        if handler is not None:
            await handler(event)

    client = FeishuLongConnection(fake.app_id, fake.app_secret, on_event, domain=fake.base_url)
    await client.start()
    return client, received


async def test_fake_delivers_whole_and_split_events_with_acks(fake: Any) -> None:
    client, received = await fake_client(fake)
    try:
        await eventually(lambda: fake.ws_clients == 1 and fake.pings_received == 1)
        whole, split = fake.user_message("hello"), fake.user_message("你好，" * 50)  # cuts inside characters
        await fake.ws_deliver(whole)
        await fake.ws_deliver(split, parts=3)
        await fake.drain(5)
        assert sorted(received, key=json.dumps) == sorted([whole, split], key=json.dumps)
        assert [ack["code"] for ack in fake.ws_acks] == [200, 200]
        assert all(ack["biz_rt"].isdigit() for ack in fake.ws_acks) and not fake.ws_errors
    finally:
        await client.stop()
    await eventually(lambda: fake.ws_clients == 0)


async def test_fake_rejects_a_wrong_secret_at_start(fake: Any) -> None:
    async def on_event(event: dict) -> None: ...

    client = FeishuLongConnection(fake.app_id, "wrong", on_event, domain=fake.base_url)
    with pytest.raises(LongConnectionError, match="514.*auth failed"):
        await client.start()


async def test_fake_pong_config_speeds_up_pings(fake: Any) -> None:
    fake.pong_config = {"PingInterval": 0.02}
    client, _ = await fake_client(fake)
    try:
        await eventually(lambda: fake.pings_received >= 5)
        assert client.config.ping_interval == 0.02
    finally:
        await client.stop()


async def test_fake_failed_handler_gets_500_then_the_retry_is_delivered(fake: Any) -> None:
    calls = 0

    async def fail_once(event: dict) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("database locked")

    client, received = await fake_client(fake, fail_once)
    try:
        message = fake.user_message("retry me")
        await fake.ws_deliver(message)
        await fake.drain(5)  # the retry comes 15 s × time_scale later
        assert [ack["code"] for ack in fake.ws_acks] == [500, 200] and received == [message, message]
    finally:
        await client.stop()


async def test_fake_disconnect_then_reconnect_and_keep_receiving(fake: Any) -> None:
    client, received = await fake_client(fake)
    try:
        await fake.disconnect_all()
        await eventually(lambda: client.reconnects == 1 and fake.ws_clients == 1)
        assert fake.ws_endpoint_calls == 2
        message = fake.user_message("after the drop")
        await fake.ws_deliver(message)
        await fake.drain(5)
        assert received == [message] and [ack["code"] for ack in fake.ws_acks] == [200]
    finally:
        await client.stop()
    assert asyncio.all_tasks() == {asyncio.current_task()} | _server_tasks()
