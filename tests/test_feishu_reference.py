"""The Feishu channel against the official SDK's side of the protocol (tests/lark_reference.py).

Each test runs a real gateway (tests/gateway_harness.py) whose Feishu channel talks to
`LarkReference`: FakeFeishu's open API, with a long connection whose frames are built and parsed
by lark-oapi's protobuf codec, whose ACKs are compared with the ones lark-oapi's own ws client
writes, and legacy card callbacks that lark-oapi's `CardActionHandler` accepts. The case each test
reproduces comes from reading the SDK's source (lark_oapi/ws/client.py, lark_oapi/card/).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway_harness import feishu_gateway, idle
from hermes_core import Agent
from hermes_core.channels.feishu.channel import FeishuChannel
from hermes_core.channels.feishu.longconn import FeishuLongConnection
from hermes_core.gateway.dispatcher import Gateway
from hermes_core.gateway.runner import AgentRunner
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.pending import SQLiteInteractions
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_feishu.cards import buttons
from invoicing import RAN, send_invoice
from waiting import eventually

lark_reference = pytest.importorskip("lark_reference", reason="needs lark-oapi (the test extra)")
LarkReference = lark_reference.LarkReference
AckPayload = lark_reference.AckPayload


@pytest.fixture(autouse=True)
def _reset() -> None:
    RAN.clear()


def approvals_agent(tmp_path: Path) -> Agent:
    model = ScriptedModel([call("send_invoice", {"customer": "ACME", "amount": 120}), reply("Invoice sent.")])
    database = tmp_path / "agent.db"
    return Agent(model=model, tools=[send_invoice], journal=SQLiteTaskJournal(database),
                 interactions=SQLiteInteractions(database),
                 permissions=Policy.from_lists(admins=["feishu:ou_boss"]))  # fmt: skip


Headers = dict[str, str]


def card_buttons(content: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {value["decision"]: value for value in buttons(content)}


def longconn(gateway: Gateway) -> FeishuLongConnection:
    channel = next(c for c in gateway.channels.values() if isinstance(c, FeishuChannel))
    assert channel._longconn is not None
    return channel._longconn


@asynccontextmanager
async def reference_gateway(
    tmp_path: Path, config: dict[str, float], *, runner: Any = None, mode: str = "longconn"
) -> AsyncIterator[tuple[LarkReference, Gateway, str]]:
    """A real gateway whose Feishu is `LarkReference`, handing out `config` as its ClientConfig."""
    async with LarkReference(time_scale=0.001) as feishu:
        feishu.client_config.update(config)
        kwargs = {"runner": runner} if runner is not None else {}
        async with feishu_gateway(tmp_path, feishu, mode=mode, **kwargs) as (gateway, url):
            if mode == "longconn":
                await eventually(lambda: len(feishu.live) == 1, timeout=20)
            yield feishu, gateway, url


async def test_card_click_toast_comes_back_in_the_long_connection_ack_as_the_sdk_sends_it(
    tmp_path: Path,
) -> None:
    """Attack: someone who may not decide clicks Approve on an approval card that reached the bot
    over the long connection. The SDK's ws client returns the handler's answer base64-encoded in
    the ACK's `data` (lark_oapi/ws/client.py `_handle_data_frame`); an ACK of a bare `{"code":200}`
    loses the error toast, so the clicker gets no feedback. The ACK is parsed with the SDK's Frame
    and compared with the ACK the SDK itself writes for the same frame and the same answer."""
    runner = AgentRunner(approvals_agent(tmp_path))
    async with reference_gateway(tmp_path, {"ReconnectNonce": 0}, runner=runner) as (feishu, gateway, _):
        ask = feishu.user_message("给 ACME 开 120 的发票", chat_id="oc_p2p", sender="ou_alice")
        asked = AckPayload.parse((await feishu.ack_of(await feishu.ws_push(ask))).payload)
        assert (asked.code, asked.answer) == (200, None)  # a message event has no answer to carry
        await eventually(lambda: len(feishu.sent) == 1)
        card = feishu.sent[0]
        buttons = card_buttons(card.content)

        click = feishu.card_action("ou_mallory", card.message_id, buttons["approve"])
        refused_frame = await feishu.ws_push(click)
        ack = await feishu.ack_of(refused_frame)
        refused = AckPayload.parse(ack.payload)
        toast = refused.toast()
        assert refused.code == 200 and toast is not None, f"no toast in the ACK: {refused.raw}"
        assert toast.type == "error" and "管理员" in toast.content
        expected = await lark_reference.sdk_ack(refused_frame, refused.answer)
        assert lark_reference.ack_without_timing(ack) == lark_reference.ack_without_timing(expected)
        await eventually(lambda: idle(gateway))  # a wrongly resumed task would have run by now
        assert RAN == [] and feishu.patches == []

        allowed = await feishu.ws_push(feishu.card_action("ou_alice", card.message_id, buttons["approve"]))
        answer = AckPayload.parse((await feishu.ack_of(allowed)).payload)
        toast = answer.toast()
        assert toast is not None and toast.type == "success" and "send_invoice" in toast.content
        decided = lark_reference.P2CardActionTriggerResponse(answer.answer).card  # read by the SDK's model
        assert decided.type == "raw" and card_buttons(decided.data) == {} and "已批准" in json.dumps(
            decided.data, ensure_ascii=False)  # fmt: skip
        await eventually(lambda: len(feishu.sent) == 2)
        await eventually(lambda: idle(gateway))
        assert feishu.patches == []  # the answer carries the card: no PATCH
    assert RAN == ["invoice ACME 120"]


@pytest.mark.slow  # several seconds of real time
async def test_a_silently_dead_connection_is_replaced_within_two_ping_intervals(tmp_path: Path) -> None:
    """Attack: the link dies without a FIN (a NAT or proxy drops it): the server stops answering
    pings and reading, but the TCP connection stays open. The SDK notices (its websockets
    keepalive) and reconnects; a client that never checks for a pong waits forever and every
    event is lost. The short PingInterval comes in the handshake's ClientConfig, as the platform
    sends it; the dead connection must be replaced within two ping intervals."""
    interval = 2.0
    config = {"PingInterval": interval, "ReconnectNonce": 0, "ReconnectInterval": 1}
    async with reference_gateway(tmp_path, config) as (feishu, gateway, _):
        await eventually(lambda: len(feishu.sockets[0].pings) >= 1)
        frozen_at = feishu.freeze()
        await eventually(lambda: len(feishu.live) == 1, timeout=4 * interval)
        replaced_after = feishu.live[0].opened_at - frozen_at
        assert replaced_after < 2 * interval, f"replaced after {replaced_after:.2f} s"
        assert feishu.sockets[0].frozen and longconn(gateway).dead_connections == 1
        message = feishu.user_message("still there?", chat_id="oc_p2p", sender="ou_alice")
        ack = AckPayload.parse((await feishu.ack_of(await feishu.ws_push(message))).payload)
        assert ack.code == 200
        await eventually(lambda: any(m.text == "echo: still there?" for m in feishu.sent))


@pytest.mark.slow  # several seconds of real time
async def test_reconnect_attempts_follow_the_platforms_nonce_and_interval(tmp_path: Path) -> None:
    """Attack: a platform outage. The SDK waits a random part of `ReconnectNonce` before its first
    attempt and `ReconnectInterval` (120 s from the real platform) between attempts
    (lark_oapi/ws/client.py `_reconnect`); a client that starts at 1 s and doubles, with the
    interval only as a cap, hammers the endpoint and comes back with the whole fleet at once.
    The numbers (scaled down) come in the handshake's ClientConfig; attempt times are measured
    at the endpoint."""
    nonce, interval = 0.5, 1.5
    config = {"ReconnectNonce": nonce, "ReconnectInterval": interval}
    async with reference_gateway(tmp_path, config) as (feishu, _, _):
        feishu.endpoint_busy = 3  # three failed attempts, then the fourth connects
        handshakes = len(feishu.endpoint_times)
        dropped_at = await feishu.drop()
        await eventually(lambda: len(feishu.live) == 1, timeout=20)
        attempts = feishu.endpoint_times[handshakes:]
    assert len(attempts) == 4
    first = attempts[0] - dropped_at
    assert 0 <= first <= nonce + 0.35, f"first attempt after {first:.2f} s (nonce {nonce} s)"
    gaps = [later - earlier for earlier, later in zip(attempts, attempts[1:], strict=False)]
    assert all(interval - 0.05 <= gap <= interval + 0.35 for gap in gaps), f"gaps {gaps}, interval {interval}"


async def test_first_reconnect_delays_are_spread_over_the_nonce(tmp_path: Path) -> None:
    """Attack: one outage drops a fleet of bots at once; if all come back in the same instant the
    endpoint is hammered again. The first attempt's delay is random within `ReconnectNonce`
    (the SDK's `random.random() * ReconnectNonce`), measured over several drops."""
    nonce = 0.6
    config = {"ReconnectNonce": nonce, "ReconnectInterval": 5}
    async with reference_gateway(tmp_path, config) as (feishu, _, _):
        delays = []
        for _ in range(5):
            handshakes = len(feishu.endpoint_times)
            dropped_at = await feishu.drop()
            await eventually(lambda: len(feishu.live) == 1, timeout=10)  # noqa: B023
            delays.append(feishu.endpoint_times[handshakes] - dropped_at)
    assert all(0 <= delay <= nonce + 0.35 for delay in delays), delays
    assert max(delays) - min(delays) > 0.05, f"no jitter: {delays}"


async def post_raw(url: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as response:
        return response.status, json.loads(await response.read() or b"null")


@pytest.mark.parametrize(
    ("encrypt_key", "encrypted"), [(None, False), ("card-key", False), ("card-key", True)]
)
async def test_legacy_card_callback_is_accepted_as_the_sdk_accepts_it(
    tmp_path: Path, encrypt_key: str | None, encrypted: bool
) -> None:
    """Attack (an operator's trap): an older app's card request URL receives card 1.0 callbacks —
    no envelope, signed with SHA-1 over timestamp + nonce + Verification Token + body. The URL
    challenge is answered, so the URL saves, and then every click got a 400. Each request here is
    first run through the SDK's own `CardActionHandler` (lark_oapi/card/action_handler.py), so it
    is one the SDK accepts; the gateway must take the same decision path as the v2 callback: a
    refused click gets an error toast, the starter's click runs the tool once and patches the
    card. A forged signature, one made with the wrong token, and a stale timestamp are refused.
    With an Encrypt Key the body may come encrypted; the signature still uses the token."""
    async with LarkReference(time_scale=0.001, encrypt_key=encrypt_key) as feishu:
        agent = approvals_agent(tmp_path)
        async with feishu_gateway(tmp_path, feishu, AgentRunner(agent)) as (gateway, url):
            challenge = {"challenge": "c-123", "token": feishu.verification_token, "type": "url_verification"}
            plain = {"Content-Type": "application/json"}
            status, answer = await post_raw(url, plain, json.dumps(challenge).encode())
            assert (status, answer) == (200, {"challenge": "c-123"})

            ask = feishu.user_message("给 ACME 开 120 的发票", chat_id="oc_p2p", sender="ou_alice")
            assert (await feishu.push(ask, url)).ok
            await eventually(lambda: len(feishu.sent) == 1)
            card = feishu.sent[0]
            buttons = card_buttons(card.content)

            token = feishu.verification_token

            def sdk_accepts(token: str, headers: Headers, body: bytes) -> Any:
                return lark_reference.sdk_card_handler_accepts(token, headers, body, encrypt_key)

            def legacy(open_id: str, signed_with: str = token, **options: Any) -> tuple[Headers, bytes]:
                return lark_reference.legacy_card_request(
                    signed_with, open_id=open_id, open_message_id=card.message_id,
                    value=buttons["approve"], encrypt_key=encrypt_key if encrypted else None, **options,
                )  # fmt: skip

            headers, body = legacy("ou_mallory")
            sdk_card = sdk_accepts(token, headers, body)
            assert sdk_card is not None and sdk_card.open_id == "ou_mallory"
            assert sdk_card.action.value == buttons["approve"]
            status, answer = await post_raw(url, headers, body)
            assert status == 200, answer
            assert answer["toast"]["type"] == "error" and "管理员" in answer["toast"]["content"]

            forged_headers, forged_body = legacy("ou_alice", signed_with="not-the-token")
            assert sdk_accepts(token, forged_headers, forged_body) is None
            assert (await post_raw(url, forged_headers, forged_body))[0] == 401
            tampered = dict(headers, **{"X-Lark-Signature": headers["X-Lark-Signature"][::-1]})
            assert (await post_raw(url, tampered, body))[0] == 401
            stale_headers, stale_body = legacy("ou_alice", timestamp=str(int(time.time()) - 3 * 24 * 3600))
            assert (await post_raw(url, stale_headers, stale_body))[0] == 401
            await eventually(lambda: idle(gateway))
            assert RAN == [] and feishu.patches == []

            headers, body = legacy("ou_alice")
            assert sdk_accepts(token, headers, body) is not None
            status, answer = await post_raw(url, headers, body)
            assert status == 200 and answer["toast"]["type"] == "success", answer
            await eventually(lambda: len(feishu.sent) == 2 and len(feishu.patches) == 1)
            assert (await post_raw(url, headers, body))[1]["toast"]["type"] == "error"  # already decided
            await eventually(lambda: idle(gateway))
    assert RAN == ["invoice ACME 120"]
    assert "已批准" in feishu.patches[0].text and "User alice" in feishu.patches[0].text


async def test_legacy_card_callback_without_a_verification_token_is_refused(tmp_path: Path) -> None:
    """Attack: a gateway configured with only an Encrypt Key cannot check a card 1.0 signature
    (it is made with the Verification Token); such a callback must be refused with a clear 403,
    never accepted unchecked (the SDK skips the check when it has no token)."""
    async with LarkReference(time_scale=0.001, encrypt_key="k", verification_token="") as feishu:
        async with feishu_gateway(tmp_path, feishu) as (_, url):
            value = {"approval_id": "a", "decision": "approve"}
            request = lark_reference.legacy_card_request
            headers, body = request("guess", open_id="ou_x", open_message_id="om_1", value=value)
            status, answer = await post_raw(url, headers, body)
    assert status == 403 and "Verification Token" in answer["error"]


async def test_fake_feishu_reads_the_toast_out_of_the_ack_as_the_platform_does(tmp_path: Path) -> None:
    """Attack: the same lost toast, seen from our own FakeFeishu, which used to read only `code`
    from an ACK and so could never tell a toast was missing. A click on an unknown approval over
    the long connection: the fake must record the answer decoded from `data`, equal to what the
    SDK's ws client would have put there."""
    from hermes_core.testing.fake_feishu import FakeFeishu

    async with FakeFeishu(time_scale=0.001) as feishu:
        async with feishu_gateway(tmp_path, feishu, AgentRunner(approvals_agent(tmp_path)), mode="longconn"):
            await eventually(lambda: feishu.ws_clients == 1)
            click = feishu.card_action("ou_alice", "om_gone", {"approval_id": "nope", "decision": "approve"})
            await feishu.ws_deliver(click)
            await feishu.drain(10)
    [ack] = feishu.ws_acks
    assert ack["code"] == 200 and ack["answer"] == {"toast": {"type": "error", "content": "找不到这个审批。"}}
