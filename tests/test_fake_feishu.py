"""Tests of the fake Feishu platform, spoken to over real HTTP and WebSocket with plain aiohttp."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from hermes_core.channels.feishu import crypto
from hermes_core.channels.feishu.frames import METHOD_CONTROL, METHOD_DATA, Frame
from hermes_core.testing.fake_feishu import FakeFeishu
from waiting import eventually

TOKEN = "/open-apis/auth/v3/tenant_access_token/internal"
MESSAGES = "/open-apis/im/v1/messages"
BOT_INFO = "/open-apis/bot/v3/info"
KEY = "fake-encrypt-key"


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


async def call(
    http: aiohttp.ClientSession,
    fake: FakeFeishu,
    method: str,
    path: str,
    body: Any = None,
    token: str | None = None,
) -> Reply:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.request(method, fake.base_url + path, json=body, headers=headers) as resp:
        return Reply(resp.status, await resp.json(), dict(resp.headers))


async def get_token(http: aiohttp.ClientSession, fake: FakeFeishu, secret: str = "fake-secret") -> Reply:
    return await call(http, fake, "POST", TOKEN, {"app_id": fake.app_id, "app_secret": secret})


async def bearer(http: aiohttp.ClientSession, fake: FakeFeishu) -> str:
    return str((await get_token(http, fake)).body["tenant_access_token"])


def text(value: str) -> str:
    return json.dumps({"text": value})


async def send(
    http: aiohttp.ClientSession, fake: FakeFeishu, token: str, chat: str = "oc_1", **fields: Any
) -> Reply:
    body = {"receive_id": chat, "msg_type": "text", "content": text("hi"), **fields}
    return await call(http, fake, "POST", f"{MESSAGES}?receive_id_type=chat_id", body, token)


# -- tokens ----------------------------------------------------------------------------------


async def test_token_is_reused_while_30_min_remain_then_renewed(
    feishu: FakeFeishu, http: aiohttp.ClientSession
) -> None:
    first = (await get_token(http, feishu)).body
    assert first["code"] == 0 and first["expire"] == 7200 and first["tenant_access_token"].startswith("t-")
    feishu.advance_time(5000)
    again = (await get_token(http, feishu)).body
    assert again["tenant_access_token"] == first["tenant_access_token"]
    assert 2195 <= again["expire"] <= 2200  # remaining seconds
    feishu.advance_time(500)  # 1700 s left: below 30 min
    renewed = (await get_token(http, feishu)).body
    assert renewed["tenant_access_token"] != first["tenant_access_token"] and renewed["expire"] == 7200
    for token in (first["tenant_access_token"], renewed["tenant_access_token"]):  # both still valid
        assert (await call(http, feishu, "GET", BOT_INFO, token=token)).body["code"] == 0
    feishu.advance_time(1800)  # the first one has expired
    expired = await call(http, feishu, "GET", BOT_INFO, token=first["tenant_access_token"])
    assert (expired.status, expired.body["code"]) == (400, 99991663)
    assert feishu.tokens_issued == [first["tenant_access_token"], renewed["tenant_access_token"]]


async def test_token_errors_revocation_and_expiry(feishu: FakeFeishu, http: aiohttp.ClientSession) -> None:
    wrong = await get_token(http, feishu, secret="nope")
    assert wrong.body["code"] == 10014 and "tenant_access_token" not in wrong.body
    token = await bearer(http, feishu)
    missing = await call(http, feishu, "GET", BOT_INFO)
    assert (missing.status, missing.body["code"]) == (400, 99991661)
    bogus = await call(http, feishu, "GET", BOT_INFO, token="t-bogus")
    assert (bogus.status, bogus.body["code"]) == (400, 99991663) and bogus.body["error"]["log_id"]
    info = await call(http, feishu, "GET", BOT_INFO, token=token)
    assert info.body["bot"]["open_id"] == "ou_bot" and "data" not in info.body
    feishu.revoke(token)
    assert (await call(http, feishu, "GET", BOT_INFO, token=token)).body["code"] == 99991663
    fresh = await bearer(http, feishu)
    assert fresh != token
    assert (await send(http, feishu, fresh)).body["code"] == 0
    feishu.expire_tokens()
    assert (await send(http, feishu, fresh)).body["code"] == 99991663
    assert len(feishu.sent) == 1


# -- sending ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "body", "why"),
    [
        (
            "receive_id_type=chat",
            {"receive_id": "oc_1", "msg_type": "text", "content": text("x")},
            "receive_id_type",
        ),
        ("", {"receive_id": "oc_1", "msg_type": "text", "content": text("x")}, "receive_id_type"),
        (
            "receive_id_type=chat_id",
            {"receive_id": "oc_1", "msg_type": "markdown", "content": text("x")},
            "msg_type",
        ),
        (
            "receive_id_type=chat_id",
            {"receive_id": "oc_1", "msg_type": "text", "content": {"text": "x"}},
            "string",
        ),
        (
            "receive_id_type=chat_id",
            {"receive_id": "oc_1", "msg_type": "text", "content": "not json"},
            "object",
        ),
        ("receive_id_type=chat_id", {"receive_id": "oc_1", "msg_type": "text", "content": "{}"}, "'text'"),
        ("receive_id_type=chat_id", {"msg_type": "text", "content": text("x")}, "receive_id"),
        (
            "receive_id_type=chat_id",
            {
                "receive_id": "oc_1",
                "msg_type": "post",
                "content": json.dumps({"title": "t", "content": [[]]}),
            },
            "locale",
        ),
        (
            "receive_id_type=chat_id",
            {"receive_id": "oc_1", "msg_type": "text", "content": text("x"), "uuid": "u" * 51},
            "uuid",
        ),
    ],
)
async def test_create_validation(
    feishu: FakeFeishu, http: aiohttp.ClientSession, query: str, body: Any, why: str
) -> None:
    reply = await call(http, feishu, "POST", f"{MESSAGES}?{query}", body, await bearer(http, feishu))
    assert (reply.status, reply.body["code"]) == (400, 230001)
    assert why in reply.body["msg"]
    assert feishu.sent == []


async def test_size_limits(feishu: FakeFeishu, http: aiohttp.ClientSession) -> None:
    token = await bearer(http, feishu)
    overhead = len(text(""))
    at_limit = text("a" * (150 * 1024 - overhead))
    assert (await send(http, feishu, token, content=at_limit)).body["code"] == 0
    too_big = await send(http, feishu, token, content=text("a" * (150 * 1024 - overhead + 1)))
    assert (too_big.status, too_big.body["code"]) == (400, 230025)
    post = {"zh_cn": {"title": "", "content": [[{"tag": "text", "text": "b" * 30 * 1024}]]}}
    big_post = await send(http, feishu, token, msg_type="post", content=json.dumps(post))
    assert big_post.body["code"] == 230025
    card = {"elements": [{"tag": "markdown", "content": "c" * 30 * 1024}]}
    assert (await send(http, feishu, token, msg_type="interactive", content=json.dumps(card))).body[
        "code"
    ] == 230025
    assert len(feishu.sent) == 1


async def test_create_records_text_of_each_type_and_dm_routing(
    feishu: FakeFeishu, http: aiohttp.ClientSession
) -> None:
    token = await bearer(http, feishu)
    feishu.user_message("hello", chat_id="oc_dm", sender="ou_alice")  # the p2p chat with alice
    reply = await call(
        http, feishu, "POST", f"{MESSAGES}?receive_id_type=open_id",
        {"receive_id": "ou_alice", "msg_type": "text", "content": text("hi alice")}, token,
    )  # fmt: skip
    data = reply.body["data"]
    assert data["chat_id"] == "oc_dm" and data["sender"]["sender_type"] == "app"
    assert data["body"]["content"] == text("hi alice") and data["message_id"].startswith("om_")
    post = {
        "zh_cn": {
            "title": "T",
            "content": [[{"tag": "text", "text": "a "}, {"tag": "a", "text": "link", "href": "x"}]],
        }
    }
    await send(http, feishu, token, chat="oc_g", msg_type="post", content=json.dumps(post))
    card = {
        "header": {"title": {"tag": "plain_text", "content": "Title"}},
        "elements": [{"tag": "markdown", "content": "**b**"}],
    }
    await send(http, feishu, token, chat="oc_g", msg_type="interactive", content=json.dumps(card))
    assert [m.text for m in feishu.messages_in("oc_dm")] == ["hi alice"]
    assert [m.text for m in feishu.messages_in("oc_g")] == ["T\na link", "Title\n**b**"]
    assert feishu.sent[0].receive_id_type == "open_id" and feishu.sent[0].reply_to is None
    assert isinstance(feishu.requests[-1].body, dict) and feishu.requests[-1].code == 0
    feishu.chats_without_bot.add("oc_left")
    feishu.unavailable_users.add("ou_outsider")
    assert (await send(http, feishu, token, chat="oc_left")).body["code"] == 230002
    outsider = {"receive_id": "ou_outsider", "msg_type": "text", "content": text("x")}
    assert (await call(http, feishu, "POST", f"{MESSAGES}?receive_id_type=open_id", outsider, token)).body[
        "code"
    ] == 230013
    assert len(feishu.sent) == 3


async def test_uuid_dedup_returns_the_original_within_an_hour(
    feishu: FakeFeishu, http: aiohttp.ClientSession
) -> None:
    token = await bearer(http, feishu)
    first = await send(http, feishu, token, uuid="u-1")
    again = await send(http, feishu, token, uuid="u-1", content=text("different"))
    assert again.body["code"] == 0
    assert again.body["data"]["message_id"] == first.body["data"]["message_id"]
    assert again.body["data"]["body"]["content"] == text("hi")
    assert len(feishu.sent) == 1
    await send(http, feishu, token, uuid="u-2")
    feishu.advance_time(3601)
    later = await send(http, feishu, token, uuid="u-1")
    assert later.body["data"]["message_id"] != first.body["data"]["message_id"]
    assert [m.uuid for m in feishu.sent] == ["u-1", "u-2", "u-1"]


async def test_reply_sets_parent_root_and_thread(feishu: FakeFeishu, http: aiohttp.ClientSession) -> None:
    token = await bearer(http, feishu)
    incoming = feishu.user_message("question", chat_id="oc_g", chat_type="group", mention_bot=True)
    user_msg = incoming["event"]["message"]["message_id"]
    body = {"msg_type": "text", "content": text("answer")}
    first = (await call(http, feishu, "POST", f"{MESSAGES}/{user_msg}/reply", body, token)).body["data"]
    assert (first["parent_id"], first["root_id"], first["chat_id"]) == (user_msg, user_msg, "oc_g")
    assert "thread_id" not in first
    second = (await call(http, feishu, "POST", f"{MESSAGES}/{first['message_id']}/reply", body, token)).body[
        "data"
    ]
    assert (second["parent_id"], second["root_id"]) == (first["message_id"], user_msg)
    threaded = {**body, "reply_in_thread": True}
    t1 = (await call(http, feishu, "POST", f"{MESSAGES}/{user_msg}/reply", threaded, token)).body["data"]
    t2 = (await call(http, feishu, "POST", f"{MESSAGES}/{user_msg}/reply", threaded, token)).body["data"]
    assert t1["thread_id"].startswith("omt_") and t2["thread_id"] == t1["thread_id"]
    assert [m.reply_to for m in feishu.messages_in("oc_g")] == [
        user_msg,
        first["message_id"],
        user_msg,
        user_msg,
    ]
    unknown = await call(http, feishu, "POST", f"{MESSAGES}/om_nope/reply", body, token)
    assert (unknown.status, unknown.body["code"]) == (400, 230001)
    feishu.recall(user_msg)
    recalled = await call(http, feishu, "POST", f"{MESSAGES}/{user_msg}/reply", body, token)
    assert recalled.body["code"] == 230011


async def test_patch_cards_and_edit_text(feishu: FakeFeishu, http: aiohttp.ClientSession) -> None:
    token = await bearer(http, feishu)

    def card(words: str, shared: bool = True) -> str:
        config = {"update_multi": True} if shared else {}
        return json.dumps({"config": config, "elements": [{"tag": "markdown", "content": words}]})

    card_id = (await send(http, feishu, token, msg_type="interactive", content=card("thinking"))).body[
        "data"
    ]["message_id"]
    patched = await call(http, feishu, "PATCH", f"{MESSAGES}/{card_id}", {"content": card("done")}, token)
    assert patched.body == {"code": 0, "msg": "success"}
    assert feishu.sent[0].text == "done" and feishu.sent[0].versions == ["thinking", "done"]
    assert [(p.method, p.text) for p in feishu.patches] == [("PATCH", "done")]
    unshared = await call(
        http, feishu, "PATCH", f"{MESSAGES}/{card_id}", {"content": card("x", shared=False)}, token
    )
    assert unshared.body["code"] == 230001 and "update_multi" in unshared.body["msg"]
    old_unshared = (await send(http, feishu, token, msg_type="interactive", content=card("a", False))).body[
        "data"
    ]
    refused = await call(
        http, feishu, "PATCH", f"{MESSAGES}/{old_unshared['message_id']}", {"content": card("b")}, token
    )
    assert refused.body["code"] == 230001
    text_id = (await send(http, feishu, token, chat="oc_2")).body["data"]["message_id"]
    not_card = await call(http, feishu, "PATCH", f"{MESSAGES}/{text_id}", {"content": card("y")}, token)
    assert not_card.body["code"] == 230001
    edited = await call(
        http, feishu, "PUT", f"{MESSAGES}/{text_id}", {"msg_type": "text", "content": text("fixed")}, token
    )
    assert edited.body["code"] == 0 and edited.body["data"]["updated"] is True
    assert feishu.messages_in("oc_2")[0].versions == ["hi", "fixed"]
    edit_card = await call(
        http, feishu, "PUT", f"{MESSAGES}/{card_id}", {"msg_type": "text", "content": text("z")}, token
    )
    assert edit_card.body["code"] == 230001
    codes = [
        (await call(http, feishu, "PATCH", f"{MESSAGES}/{card_id}", {"content": card(str(i))}, token)).body[
            "code"
        ]
        for i in range(6)
    ]
    assert codes[-1] == 230020 and codes.count(0) == 4  # 5 QPS per message, one patch earlier
    feishu.advance_time(15 * 86400)
    token = await bearer(http, feishu)
    too_old = await call(http, feishu, "PATCH", f"{MESSAGES}/{card_id}", {"content": card("late")}, token)
    assert (too_old.status, too_old.body["code"]) == (400, 230031) and "14 days" in too_old.body["msg"]


# -- throttling and injected failures ----------------------------------------------------------


async def test_app_rate_limit_burst_gives_429_with_headers(
    feishu: FakeFeishu, http: aiohttp.ClientSession
) -> None:
    token = await bearer(http, feishu)
    feishu.set_limits(app_qps=5)
    replies = await asyncio.gather(*(send(http, feishu, token, chat=f"oc_{i}") for i in range(8)))
    limited = [r for r in replies if r.status == 429]
    assert len(limited) == 3 and sum(r.body["code"] == 0 for r in replies) == 5
    assert limited[0].body["code"] == 99991400 and limited[0].body["error"]["log_id"]
    assert limited[0].headers["x-ogw-ratelimit-limit"] == "5"
    assert limited[0].headers["x-ogw-ratelimit-reset"] == "1"
    info = await call(http, feishu, "GET", BOT_INFO, token=token)  # another API: another bucket
    assert info.body["code"] == 0
    feishu.set_limits(app_qps=100, app_qpm=5, legacy_status_400=True)  # the 5 above count per minute
    legacy = await send(http, feishu, token, chat="oc_x")
    assert (legacy.status, legacy.body["code"]) == (400, 99991400)
    assert (
        legacy.headers["x-ogw-ratelimit-limit"] == "5"
        and 55 <= int(legacy.headers["x-ogw-ratelimit-reset"]) <= 60
    )
    assert len(feishu.sent) == 5


async def test_per_chat_limit_gives_230020(feishu: FakeFeishu, http: aiohttp.ClientSession) -> None:
    token = await bearer(http, feishu)
    replies = [await send(http, feishu, token, chat="oc_busy") for _ in range(6)]
    assert [r.body["code"] for r in replies] == [0] * 5 + [230020]
    assert replies[-1].status == 400
    assert (await send(http, feishu, token, chat="oc_quiet")).body["code"] == 0
    feishu.advance_time(1.0)
    assert (await send(http, feishu, token, chat="oc_busy")).body["code"] == 0


async def test_fail_next_injects_errors_on_matching_paths(
    feishu: FakeFeishu, http: aiohttp.ClientSession
) -> None:
    token = await bearer(http, feishu)
    feishu.fail_next(2, code=99991400, reset=0.5)
    assert (await call(http, feishu, "GET", BOT_INFO, token=token)).body["code"] == 0  # path does not match
    first, second, third = [await send(http, feishu, token, chat=f"oc_{i}") for i in range(3)]
    assert (first.status, first.body["code"], first.headers["x-ogw-ratelimit-reset"]) == (
        429,
        99991400,
        "0.5",
    )
    assert second.status == 429 and third.body["code"] == 0
    feishu.fail_next(1, code=1, status=500, paths=("bot/v3",))
    busy = await call(http, feishu, "GET", BOT_INFO, token=token)
    assert (busy.status, busy.body["code"]) == (500, 1)
    assert [r.status for r in feishu.requests[-5:]] == [200, 429, 429, 200, 500]
    assert len(feishu.sent) == 1


# -- events made by fake users ------------------------------------------------------------------


def test_user_message_envelope_shape() -> None:
    fake = FakeFeishu(verification_token="vt")
    dm = fake.user_message("hi")
    assert dm["schema"] == "2.0" and dm["header"]["event_type"] == "im.message.receive_v1"
    assert dm["header"]["token"] == "vt" and dm["header"]["app_id"] == "cli_fake"
    message = dm["event"]["message"]
    assert isinstance(message["content"], str) and json.loads(message["content"]) == {"text": "hi"}
    assert message["chat_type"] == "p2p" and "mentions" not in message and "parent_id" not in message
    assert message["create_time"].isdigit() and len(message["create_time"]) == 13
    assert dm["event"]["sender"]["sender_id"]["open_id"] == "ou_user1"
    assert dm["event"]["sender"]["sender_type"] == "user"

    group = fake.user_message(
        "look", chat_type="group", chat_id="oc_g", mention_bot=True, mentions=["ou_bob"]
    )
    message = group["event"]["message"]
    assert json.loads(message["content"]) == {"text": "@_user_1 @_user_2 look"}
    assert [(m["key"], m["id"]["open_id"]) for m in message["mentions"]] == [
        ("@_user_1", "ou_bot"),
        ("@_user_2", "ou_bob"),
    ]
    assert message["mentions"][0]["name"] == "hermes-bot"
    assert group["header"]["event_id"] != dm["header"]["event_id"]
    assert message["message_id"] != dm["event"]["message"]["message_id"]

    post = fake.user_message("p", message_type="post", mention_bot=True)
    nodes = json.loads(post["event"]["message"]["content"])["content"][0]
    assert nodes[0] == {"tag": "at", "user_id": "@_user_1", "user_name": "hermes-bot"}
    image = fake.user_message(
        message_type="image", content={"image_key": "img_1"}, event_id="e1", message_id="om_1"
    )
    assert image["header"]["event_id"] == "e1" and image["event"]["message"]["message_id"] == "om_1"
    assert json.loads(image["event"]["message"]["content"]) == {"image_key": "img_1"}
    reply = fake.user_message("and?", reply_to="om_1")
    assert (reply["event"]["message"]["parent_id"], reply["event"]["message"]["root_id"]) == ("om_1", "om_1")


def test_card_action_and_redelivery() -> None:
    fake = FakeFeishu()
    action = fake.card_action("ou_u", "om_card", {"approve": "yes"})
    assert action["header"]["event_type"] == "card.action.trigger"
    assert action["event"]["action"]["value"] == {"approve": "yes"}
    assert action["event"]["context"]["open_message_id"] == "om_card"
    original = fake.user_message("hi")
    same = fake.redelivery_of(original, new_event_id=False)
    fresh = fake.redelivery_of(original, new_event_id=True)
    assert same == original and same is not original
    assert fresh["header"]["event_id"] != original["header"]["event_id"]
    assert fresh["event"]["message"]["message_id"] == original["event"]["message"]["message_id"]


# -- webhook pushes ---------------------------------------------------------------------------


@dataclass
class Hit:
    headers: dict[str, str]
    raw: bytes
    at: float


class Receiver:
    """A bot's webhook endpoint: records each request; ``respond(n)`` gives (delay, status) for the n-th."""

    def __init__(self, respond: Callable[[int], tuple[float, int]] = lambda n: (0.0, 200)) -> None:
        self.hits: list[Hit] = []
        self.respond = respond
        app = web.Application()
        app.router.add_post("/webhook", self._handle)
        self.server = TestServer(app)

    @property
    def url(self) -> str:
        return str(self.server.make_url("/webhook"))

    async def _handle(self, request: web.Request) -> web.Response:
        self.hits.append(Hit(dict(request.headers), await request.read(), time.monotonic()))
        delay, status = self.respond(len(self.hits))
        await asyncio.sleep(delay)  # as slow as the test asked: the behaviour under test
        return web.json_response({"msg": "success"}, status=status)

    def envelopes(self, key: str | None = None) -> list[dict[str, Any]]:
        bodies = [json.loads(hit.raw) for hit in self.hits]
        return [json.loads(crypto.decrypt(b["encrypt"], key)) if key else b for b in bodies]


async def receiver(respond: Callable[[int], tuple[float, int]] = lambda n: (0.0, 200)) -> Receiver:
    bot = Receiver(respond)
    await bot.server.start_server()
    return bot


async def test_push_encrypts_and_signs() -> None:
    bot = await receiver()
    async with FakeFeishu(encrypt_key=KEY) as fake:
        envelope = fake.user_message("secret")
        result = await fake.push(envelope, bot.url, timestamp="1700000000")
        assert result.ok and result.status == 200 and result.error is None
        hit = bot.hits[0]
        assert set(json.loads(hit.raw)) == {"encrypt"}
        assert bot.envelopes(KEY)[0] == envelope
        assert hit.headers["X-Lark-Request-Timestamp"] == "1700000000"
        nonce = hit.headers["X-Lark-Request-Nonce"]
        assert hit.headers["X-Lark-Signature"] == crypto.signature("1700000000", nonce, KEY, hit.raw)
        assert hit.headers["Content-Type"].startswith("application/json")

        await fake.push(envelope, bot.url, bad_signature=True, token="wrong-vt")
        hit = bot.hits[1]
        claimed = hit.headers["X-Lark-Signature"]
        assert not crypto.signature_matches(
            hit.headers["X-Lark-Request-Timestamp"],
            hit.headers["X-Lark-Request-Nonce"],
            KEY,
            hit.raw,
            claimed,
        )
        assert bot.envelopes(KEY)[1]["header"]["token"] == "wrong-vt"

        await fake.push(envelope, bot.url, encrypt=False, sign=False)
        assert json.loads(bot.hits[2].raw) == envelope and "X-Lark-Signature" not in bot.hits[2].headers
        assert [a.kind for a in fake.push_log] == ["push"] * 3
    await bot.server.close()


async def test_push_plain_without_key_still_sends_all_headers() -> None:
    bot = await receiver(lambda n: (0.0, 500))
    async with FakeFeishu() as fake:
        envelope = fake.user_message("plain")
        result = await fake.push(envelope, bot.url)
        assert not result.ok and result.status == 500
        assert json.loads(bot.hits[0].raw) == envelope
        headers = bot.hits[0].headers
        assert {"X-Lark-Request-Timestamp", "X-Lark-Request-Nonce", "X-Lark-Signature"} <= set(headers)
    await bot.server.close()


async def test_url_verification_plain_and_encrypted() -> None:
    seen: list[dict[str, Any]] = []

    async def echo(request: web.Request) -> web.Response:
        body = await request.json()
        plain = json.loads(crypto.decrypt(body["encrypt"], KEY)) if "encrypt" in body else body
        seen.append(plain)
        if request.query.get("mode") == "slow":
            await asyncio.sleep(0.5)  # a callback that answers late: the behaviour under test
        if request.query.get("mode") == "wrong":
            return web.json_response({"challenge": "nope"})
        return web.json_response({"challenge": plain["challenge"]})

    app = web.Application()
    app.router.add_post("/cb", echo)
    server = TestServer(app)
    await server.start_server()
    url = str(server.make_url("/cb"))
    async with FakeFeishu(verification_token="vt") as fake:
        assert (await fake.url_verification(url)).ok
        assert seen[-1]["type"] == "url_verification" and seen[-1]["token"] == "vt"
        assert not (await fake.url_verification(url + "?mode=wrong")).ok
    async with FakeFeishu(encrypt_key=KEY) as fake:
        assert (await fake.url_verification(url)).ok
        fake.challenge_timeout = 0.2
        slow = await fake.url_verification(url + "?mode=slow")
        assert not slow.ok and slow.status is None
    await server.close()


async def test_slow_endpoint_fails_and_is_retried_on_the_scaled_schedule() -> None:
    bot = await receiver(lambda n: (0.6 if n == 1 else 0.0, 200))
    async with FakeFeishu(time_scale=0.01, encrypt_key=KEY) as fake:
        fake.ack_timeout = 0.2
        envelope = fake.user_message("hi")
        fake.deliver(envelope, bot.url)
        await fake.drain(5)
        first, retry = fake.push_log
        assert (first.attempt, first.ok, retry.attempt, retry.ok) == (0, False, 1, True)
        assert first.error is not None and first.event_id == envelope["header"]["event_id"]
        gap = bot.hits[1].at - bot.hits[0].at
        assert 0.2 + 0.15 - 0.02 <= gap < 0.9  # the deadline, then 15 s × 0.01
        assert bot.hits[1].raw == bot.hits[0].raw  # the same body on retry
        assert fake.pending_deliveries == 0
    await bot.server.close()


async def test_failing_endpoint_gets_four_retries_then_gives_up() -> None:
    bot = await receiver(lambda n: (0.0, 500))
    async with FakeFeishu(time_scale=1e-5) as fake:  # 0.15 ms, 3 ms, 36 ms, 216 ms
        fake.deliver(fake.user_message("x"), bot.url)
        await fake.drain(5)
        assert [a.attempt for a in fake.push_log] == [0, 1, 2, 3, 4]
        assert not any(a.ok for a in fake.push_log) and len(bot.hits) == 5
        assert bot.hits[4].at - bot.hits[3].at >= 0.2
    await bot.server.close()


async def test_duplicates_after_ack_and_new_event_ids() -> None:
    bot = await receiver()
    async with FakeFeishu(seed=1) as fake:
        fake.duplicate_after_ack = 1.0
        original = fake.user_message("once")
        fake.deliver(original, bot.url)
        await fake.drain(5)
        assert [e["header"]["event_id"] for e in bot.envelopes()] == [original["header"]["event_id"]] * 2
        assert [a.kind for a in fake.push_log] == ["event", "duplicate"]

        fake.duplicate_after_ack, fake.redeliver_new_event_id = 0.0, 1.0
        second = fake.user_message("twice")
        fake.deliver(second, bot.url)
        await fake.drain(5)
        first_copy, new_copy = bot.envelopes()[2:]
        assert first_copy == second and new_copy["header"]["event_id"] != second["header"]["event_id"]
        assert new_copy["event"]["message"]["message_id"] == second["event"]["message"]["message_id"]
        assert fake.push_log[-1].kind == "new_event_id"
    await bot.server.close()


async def test_shuffle_delivers_out_of_order() -> None:
    bot = await receiver()
    async with FakeFeishu(seed=7) as fake:
        fake.shuffle, fake.shuffle_window = True, 0.2
        sent = [fake.user_message(f"m{i}") for i in range(10)]
        for envelope in sent:
            fake.deliver(envelope, bot.url)
        await fake.drain(5)
        order = [sent.index(e) for e in bot.envelopes()]
        inversions = sum(a > b for i, a in enumerate(order) for b in order[i + 1 :])
        assert sorted(order) == list(range(10)) and inversions >= 8
    await bot.server.close()


async def test_closing_the_fake_cancels_retry_timers() -> None:
    with socket.socket() as sock:  # a port nobody listens on: connection refused at once
        sock.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{sock.getsockname()[1]}/webhook"
    started = time.monotonic()
    async with FakeFeishu() as fake:  # the first retry would come after 15 s
        fake.deliver(fake.user_message("x"), dead_url)
        await eventually(lambda: fake.push_log)
        assert fake.pending_deliveries == 1
    assert fake.pending_deliveries == 0 and time.monotonic() - started < 2


def test_runs_in_a_thread_and_serves_other_loops() -> None:
    with FakeFeishu() as fake:

        async def scenario() -> None:
            bot = await receiver()
            async with aiohttp.ClientSession() as http:
                token = await bearer(http, fake)
                assert (await send(http, fake, token)).body["code"] == 0
            assert (await fake.push(fake.user_message("hi"), bot.url)).ok
            fake.deliver(fake.user_message("again"), bot.url)
            await fake.drain(5)
            assert len(bot.hits) == 2
            await bot.server.close()

        asyncio.run(scenario())
        assert len(fake.sent) == 1
    assert fake._thread is None


# -- long connection --------------------------------------------------------------------------


async def endpoint(
    http: aiohttp.ClientSession, fake: FakeFeishu, secret: str = "fake-secret"
) -> dict[str, Any]:
    async with http.post(
        fake.base_url + "/callback/ws/endpoint", json={"AppID": fake.app_id, "AppSecret": secret}
    ) as r:
        return dict(await r.json())


async def connect(http: aiohttp.ClientSession, fake: FakeFeishu) -> aiohttp.ClientWebSocketResponse[bool]:
    return await http.ws_connect((await endpoint(http, fake))["data"]["URL"])


async def next_frame(ws: aiohttp.ClientWebSocketResponse[bool], timeout: float = 2.0) -> Frame:
    message = await ws.receive(timeout)
    assert message.type == WSMsgType.BINARY, message
    return Frame.decode(message.data)


def ack(frame: Frame, code: int = 200) -> bytes:
    reply = frame.with_header("biz_rt", "3")
    reply.payload = json.dumps({"code": code}).encode()
    return reply.encode()


async def test_ws_endpoint_handshake(feishu: FakeFeishu, http: aiohttp.ClientSession) -> None:
    refused = await endpoint(http, feishu, secret="wrong")
    assert refused["code"] != 0 and "data" not in refused
    good = await endpoint(http, feishu)
    assert good["code"] == 0 and good["data"]["ClientConfig"]["ReconnectNonce"] == 0
    url = good["data"]["URL"]
    assert (
        url.startswith(f"ws://127.0.0.1:{feishu.port}/ws?") and "device_id=" in url and "service_id=" in url
    )
    assert feishu.ws_endpoint_calls == 2
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused_upgrade:
        await http.ws_connect(f"ws://127.0.0.1:{feishu.port}/ws?device_id=d&service_id=1")
    assert refused_upgrade.value.status == 403
    feishu.max_ws_connections = 1
    ws = await http.ws_connect(url)
    assert feishu.ws_clients == 1
    assert (await endpoint(http, feishu))["code"] == 1000040350
    await ws.close()


async def test_ws_ping_pong_two_part_event_and_ack(http: aiohttp.ClientSession) -> None:
    async with FakeFeishu(time_scale=0.01) as fake:
        fake.pong_config = {"PingInterval": 5}
        ws = await connect(http, fake)
        await ws.send_bytes(Frame(service=1, method=METHOD_CONTROL, headers=[("type", "ping")]).encode())
        pong = await next_frame(ws)
        assert pong.method == METHOD_CONTROL and pong.header("type") == "pong"
        assert json.loads(pong.payload or b"") == {"PingInterval": 5} and fake.pings_received == 1

        envelope = fake.user_message("¡hola! 你好" * 20)
        await fake.ws_deliver(envelope, parts=2)
        parts = [await next_frame(ws), await next_frame(ws)]
        assert all(
            p.method == METHOD_DATA and p.header("type") == "event" and p.header("sum") == "2" for p in parts
        )
        assert {p.header("seq") for p in parts} == {"0", "1"} and parts[0].header("trace_id")
        assert parts[0].header("message_id") == parts[1].header("message_id")
        joined = b"".join(p.payload or b"" for p in sorted(parts, key=lambda p: int(p.header("seq") or 0)))
        assert json.loads(joined.decode()) == envelope
        await ws.send_bytes(ack(parts[0]))
        await fake.drain(2)
        assert fake.ws_acks[0]["code"] == 200 and fake.ws_acks[0]["biz_rt"] == "3"
        with pytest.raises(asyncio.TimeoutError):
            await ws.receive(0.4)  # the first retry would have come after 0.15 s
        assert [(a.transport, a.ok) for a in fake.push_log] == [("ws", True)]
        await ws.close()


async def test_ws_missing_or_failed_ack_is_retried(http: aiohttp.ClientSession) -> None:
    async with FakeFeishu(time_scale=0.001) as fake:  # retries after 15 ms, then 0.3 s
        fake.ack_timeout = 0.2
        ws = await connect(http, fake)
        envelope = fake.user_message("retry me")
        await fake.ws_deliver(envelope)
        first = await next_frame(ws)  # not acked
        second = await next_frame(ws)
        assert second.header("message_id") == first.header("message_id") and second.payload == first.payload
        await ws.send_bytes(ack(second, code=500))  # the handler raised: also a failure
        third = await next_frame(ws)
        await ws.send_bytes(ack(third))
        await fake.drain(2)
        assert [(a.attempt, a.ok) for a in fake.push_log] == [(0, False), (1, False), (2, True)]
        assert "ACK" in (fake.push_log[0].error or "") and fake.push_log[1].status == 500
        await ws.close()


async def test_ws_cluster_mode_and_disconnect_all(http: aiohttp.ClientSession) -> None:
    async with FakeFeishu(seed=3) as fake:
        clients = [await connect(http, fake), await connect(http, fake)]
        envelopes = [fake.user_message(f"e{i}") for i in range(10)]
        for envelope in envelopes:
            await fake.ws_deliver(envelope)
        received: list[list[str]] = [[], []]

        async def serve(index: int, ws: aiohttp.ClientWebSocketResponse[bool]) -> None:
            while sum(map(len, received)) < len(envelopes):
                try:
                    frame = await next_frame(ws, timeout=0.1)
                except asyncio.TimeoutError:
                    continue
                received[index].append(json.loads(frame.payload or b"")["header"]["event_id"])
                await ws.send_bytes(ack(frame))

        await asyncio.wait_for(asyncio.gather(*(serve(i, ws) for i, ws in enumerate(clients))), 5)
        await fake.drain(2)
        everything = received[0] + received[1]
        assert sorted(everything) == sorted(e["header"]["event_id"] for e in envelopes)  # each exactly once
        assert received[0] and received[1]

        await fake.disconnect_all()
        for ws in clients:
            assert (await ws.receive(1)).type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED)
        await eventually(lambda: fake.ws_clients == 0)
        assert fake.ws_clients == 0
        again = await connect(http, fake)
        await fake.ws_deliver(envelopes[0])
        assert json.loads((await next_frame(again)).payload or b"") == envelopes[0]
        await again.close()


async def test_ws_text_frame_closes_the_connection(feishu: FakeFeishu, http: aiohttp.ClientSession) -> None:
    ws = await connect(http, feishu)
    await ws.send_str('{"type": "ping"}')
    assert (await ws.receive(1)).type in (WSMsgType.CLOSE, WSMsgType.CLOSED)
    assert "only binary frames" in feishu.ws_errors[0]


async def test_a_lost_answer_still_creates_the_message_and_its_uuid_finds_it(
    feishu: FakeFeishu, http: aiohttp.ClientSession
) -> None:
    token = await bearer(http, feishu)
    feishu.lose_answers(1)
    lost = await send(http, feishu, token, uuid="u-lost")
    assert lost.status == 504 and len(feishu.sent) == 1  # done, but the caller never heard
    again = await send(http, feishu, token, uuid="u-lost")
    assert again.body["code"] == 0 and again.body["data"]["message_id"] == feishu.sent[0].message_id
    assert len(feishu.sent) == 1
