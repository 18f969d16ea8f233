"""The fake's open API: tenant tokens, bot info, send, reply, card patch, edit (FEISHU.md §4–§7, §10).

What is modelled, and from where:

- §5 ``tenant_access_token/internal``: ``expire`` is the remaining lifetime in seconds; the same
  token comes back while at least 30 min remain, a new one below that (the old one stays valid
  until it expires). Wrong secret → code 10014 (**UNCONFIRMED** in FEISHU.md; HTTP 400 chosen).
- §10 every other ``/open-apis`` call needs ``Authorization: Bearer <token>``: missing → 99991661,
  unknown / expired / revoked → 99991663, both HTTP 400 (status **UNCONFIRMED**, 400 as advised).
- §6 send and reply: ``receive_id_type``, ``msg_type`` and ``content`` (a JSON *string* holding an
  object) are validated → HTTP 400 code 230001; text over 150 KB and post/card over 30 KB → 230025;
  a repeated ``uuid`` within 1 h returns the ORIGINAL message with code 0 and creates nothing
  (what a duplicate returns is **UNCONFIRMED**); a reply sets ``parent_id``/``root_id``, and
  ``reply_in_thread: true`` a ``thread_id`` (the parent starts a topic). A reply to a message
  already in a topic stays in it with or without the flag, as the reply page's ``reply_in_thread``
  row says ("如果要回复的消息已经是话题形式的消息，则默认以话题形式进行回复":
  open.feishu.cn/document/server-docs/im-v1/message/reply).
- §6 PATCH (cards only, ``update_multi`` on old and new card, < 14 days, 5 QPS per message) and PUT
  (edit text/post). From the PATCH page's error table (open.feishu.cn/document/server-docs/im-v1/
  message-card/patch, "更新已发送的消息卡片": "单条消息更新频控为 5 QPS"): a sixth patch of one
  message within a second → HTTP 400 code 230020 "This operation triggers the frequency limit.";
  a message older than 14 days → HTTP 400 code 230031 "Message can only be modified within 14 days
  after sending."; a recalled one → 230011. The codes for "not a card", "not shared" and "not your
  message" are **UNCONFIRMED**: 230001 with a message saying which rule failed. Every successful
  PATCH/PUT is kept in ``patches`` (with its monotonic time), every call in ``requests``.
- §7 throttling: per-(API, app) sliding windows, 50/s and 1000/min (the minute shortened by
  ``set_limits(minute=…)`` for tests), counted for every client of the app together, whichever
  process it is in → HTTP 429 code 99991400 with
  ``x-ogw-ratelimit-limit`` / ``x-ogw-ratelimit-reset`` (HTTP 400 in legacy mode); 5 QPS per chat
  or user → HTTP 400 code 230020. Every error body carries ``"error": {"log_id": …}``.
  ``throttle_for(seconds)`` is a storm: every matching call answers 429 / 99991400 (or 230020)
  until it is over, with ``x-ogw-ratelimit-reset`` counting down (durations scaled by time_scale).
  ``lose_answers(n)``: the call is carried out but its answer lost in transit (HTTP 504), the
  case the request ``uuid`` exists for.
- send/reply refusals a chat's state causes: ``chats_without_bot`` → 230002 (the bot was removed),
  ``dissolved_chats`` → 232009 (the chat was dissolved), ``unavailable_users`` → 230013; a reply
  to a ``recall``-ed message → 230011, to a ``delete``-d one → 231003.
- token refusals (``fail_next(code=…)`` with any code of the generic error-code page: 99991661,
  99991663, 99991664, 99991665, 99991668, 99991671, 99991677 for the token; 99991672 for a scope
  the app lacks), each with its own msg.

- message resources, ``GET /open-apis/im/v1/messages/:message_id/resources/:file_key?type=image|file``
  (the SDK's ``MessageResource.get``): the bytes with ``Content-Type``, ``Content-Length`` (unless
  ``chunked``) and ``Content-Disposition: attachment; filename*=UTF-8''…``; errors as JSON
  ``{"code", "msg"}``: a ``type`` other than image/file, or the wrong one for the key → 234001;
  a key not in that message (or an unknown message) → 234003; the chat in ``chats_without_bot``
  → 234004; ``resources_forbidden`` → 234002 (a missing permission); over 100 MB → 234037; all
  HTTP 400. The codes come from the API's documented error table; the HTTP statuses, and which
  code an unknown message_id gets, are **UNCONFIRMED**. ``resource_reads`` records what was served.

- the contact API's user (``_contact_user``, for a decider's name) and what the platform does with
  a card callback's answer (``apply_card_answer``: a ``raw`` card replaces the clicked card).

- reading a message back, ``GET /open-apis/im/v1/messages/:message_id`` ("获取指定消息的内容",
  open.feishu.cn/document/server-docs/im-v1/message/get): ``data.items``, each a message object
  (``message_id``, ``msg_type``, ``body.content``, ``sender{id, id_type, sender_type}``,
  ``create_time``, ``deleted``, ``mentions``); for a merge_forward the message and then every
  message inside it, nested forwards included, each with ``upper_message_id`` naming its forward
  (as lark_oapi/channel/normalize/merge_forward.py reads it). The page's preconditions: the bot in
  the chat (``chats_without_bot`` → 230002), a message-read permission (``resources_forbidden``
  → 230027); an unknown id → 230001 "invalid message_id" (the 230001 troubleshooting page, open.
  larkoffice.com/…/trouble-shooting/how-to-resolve-error-230001; which code the get API gives is
  **UNCONFIRMED**). Resources of a message inside a forward → 234043 (FEISHU.md §11).

CardKit card entities and the JSON 2.0 rules are in cards.py. Not modelled: uploads, listing a
chat's history.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
import uuid as uuid_module
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from aiohttp import web
from multidict import CIMultiDict

from ...kernel.messages import JSON

RECEIVE_ID_TYPES = frozenset({"open_id", "union_id", "user_id", "email", "chat_id"})
SENDABLE_TYPES = frozenset(
    {"text", "post", "image", "file", "audio", "media", "sticker", "interactive", "share_chat", "share_user"}
)
EDITABLE_TYPES = frozenset({"text", "post"})
TEXT_LIMIT = 150 * 1024  # bytes of the content string (§6)
RICH_LIMIT = 30 * 1024  # post and interactive
UUID_WINDOW = 3600.0
TOKEN_REUSE_MIN = 1800.0
PATCH_MAX_AGE = 14 * 86400.0

_REQUIRED_KEYS = {
    "text": "text", "image": "image_key", "file": "file_key", "audio": "file_key", "media": "file_key",
    "sticker": "file_key", "share_chat": "chat_id", "share_user": "user_id",
}  # fmt: skip
_LOCALE = re.compile(r"^[a-z]{2}_[a-z]{2}$")
_AT_TAG = re.compile(r'<at user_id="([^"]*)">([^<]*)</at>')
_MESSAGES = {
    1: "system busy",
    234001: "Invalid request param.",
    234002: "Unauthorized.",
    234003: "File not in msg.",
    234004: "App not in chat.",
    234037: "Downloaded file size exceeds limit.",
    234043: "Unsupported message type for resource download.",
    230027: "Lack of necessary permissions.",
    230001: "Your request contains an invalid request parameter.",
    230002: "The bot can not be outside the group.",
    41050: "no user authority error",
    230011: "The message was withdrawn.",
    231003: "The message is not found.",  # UNCONFIRMED text; the code: the reply page's error table
    230013: "Bot has NO availability to this user.",
    230020: "This operation triggers the frequency limit.",
    230025: "The length of the message content reaches its limit.",
    230031: "Message can only be modified within 14 days after sending.",
    230035: "Send Message Permission deny.",
    230049: "The message is being sent.",
    232009: "Your request specifies a chat which has already been dissolved.",
    99991400: "request trigger frequency limit",
    99991661: "Missing access token for authorization. Please make a request with token attached.",
    99991663: "Invalid access token for authorization. Please make a request with token attached.",
    99991664: "Invalid app access token.",  # 9999166x/7x texts UNCONFIRMED; codes: generic-error-code page
    99991665: "Invalid tenant access token.",
    99991668: "Invalid access token.",
    99991671: "Invalid token format.",
    99991672: "Access denied. One of the following scopes is required.",
    99991677: "Authentication token expired.",
}


@dataclass
class SentMessage:
    """A message in a chat: created by the bot (``sender == "app"``) or by a fake user (an open_id).

    ``content`` and ``text`` are the *current* version: a PATCH or PUT replaces them, and
    ``versions`` keeps the plain text of every version, the first one as created. ``text`` is the
    plain text of a text, post or card message (see ``plain_text``), for assertions.
    """

    message_id: str
    chat_id: str
    msg_type: str
    content: dict[str, JSON]
    text: str
    reply_to: str | None = None  # parent_id
    root_id: str | None = None
    thread_id: str | None = None
    uuid: str | None = None
    sender: str = "app"
    created_at: float = 0.0  # time.time() (plus any advance_time)
    receive_id: str | None = None
    receive_id_type: str | None = None
    raw_content: str = ""  # the content JSON string of the current version
    updated: bool = False
    recalled: bool = False
    deleted: bool = False  # gone from the chat (``delete``): a reply to it answers 231003
    versions: list[str] = field(default_factory=list)
    mentions: list[dict[str, JSON]] = field(default_factory=list)  # a user's message: as the event had them
    upper_message_id: str | None = None  # the merge_forward this message was forwarded inside


@dataclass(frozen=True)
class Patch:
    """One successful update of a message: ``PATCH`` (card) or ``PUT`` (edit text/post)."""

    message_id: str
    method: str
    msg_type: str
    content: dict[str, JSON]
    text: str
    at: float  # time.monotonic()


@dataclass(frozen=True)
class RecordedCall:
    """One HTTP call to the fake (open API and ``/callback/ws/endpoint``), valid or not."""

    method: str
    path: str
    query: dict[str, str]
    headers: Mapping[str, str]  # case-insensitive
    body: Any  # the parsed JSON body; None if absent or not JSON
    status: int
    code: int | None  # the ``code`` of the answer
    at: float  # time.monotonic()


@dataclass
class Resource:
    """A picture or file held with a user's message, served by the message resource API."""

    data: bytes
    kind: str  # "image" or "file": the `type` the API must be asked with
    content_type: str
    file_name: str
    chunked: bool = False  # no Content-Length: the body is streamed, its size unknown in advance
    delay: float = 0.0  # real seconds before the answer starts
    chunk_size: int = 64 * 1024


@dataclass
class ResourceRead:
    """One download: how many bytes were written before it ended, and whether the client took all."""

    message_id: str
    file_key: str
    served: int = 0
    complete: bool = False
    cut_off: bool = False  # the client closed the connection before the end


RESOURCE_LIMIT = 100 * 1024 * 1024  # the API serves resources up to 100 MB (234037 beyond)


@dataclass
class Answer:
    """What a route handler returns: HTTP status, JSON body, extra headers."""

    status: int
    body: dict[str, JSON]
    headers: dict[str, str] = field(default_factory=dict)


ApiHandler = Callable[[web.Request, Any], Answer]


def error(status: int, code: int, msg: str | None = None, headers: dict[str, str] | None = None) -> Answer:
    """A Feishu error body: ``{"code", "msg", "error": {"log_id"}}``."""
    log_id = time.strftime("%Y%m%d%H%M%S") + os.urandom(8).hex().upper()
    body = {"code": code, "msg": msg or _MESSAGES.get(code, "error"), "error": {"log_id": log_id}}
    return Answer(status, body, headers or {})


def _invalid(why: str) -> Answer:
    return error(400, 230001, f"{_MESSAGES[230001]} {why}")


@dataclass
class _Storm:
    until: float  # time.monotonic()
    code: int
    reset: float  # the longest x-ogw-ratelimit-reset announced, real seconds
    paths: tuple[str, ...]


@dataclass
class _InjectedFailure:
    remaining: int
    code: int
    status: int | None
    reset: float
    paths: tuple[str, ...]


class OpenApi:
    """State and handlers of the open API; mixed into ``FakeFeishu``, which wires the routes."""

    # Set by FakeFeishu.__init__.
    app_id: str
    app_secret: str
    tenant_key: str
    bot_open_id: str
    bot_name: str
    token_ttl: float

    def _init_api(self) -> None:
        self.sent: list[SentMessage] = []
        self.patches: list[Patch] = []
        self.requests: list[RecordedCall] = []
        self.tokens_issued: list[str] = []
        self.record_requests = True
        self.chats_without_bot: set[str] = set()  # sending there → 230002
        self.dissolved_chats: set[str] = set()  # sending there → 232009
        self.unavailable_users: set[str] = set()  # sending to them → 230013
        self.resources: dict[tuple[str, str], Resource] = {}  # (message_id, file_key) → the bytes
        self.resource_reads: list[ResourceRead] = []
        self.resources_forbidden = False  # the app lacks the permission to read messages → 234002
        self.users: dict[str, str] = {}  # open_id → name: the contact directory (users seen, by default)
        self.contact_forbidden = False  # the app lacks contact:user.base:readonly → 99991672
        self.callback_errors: list[str] = []  # card-callback answers the platform could not apply
        self.set_limits()
        self._token_expiry: dict[str, float] = {}
        self._current_token: str | None = None
        self._messages: dict[str, SentMessage] = {}  # every message, by id (bot's and users')
        self._by_uuid: dict[str, tuple[float, SentMessage]] = {}
        self._p2p_chats: dict[str, str] = {}  # user open_id → their p2p chat with the bot
        self._app_windows: dict[str, tuple[deque[float], deque[float]]] = {}
        self._target_windows: dict[str, deque[float]] = {}
        self._failures: list[_InjectedFailure] = []
        self._lost: list[_InjectedFailure] = []  # done, but the answer lost (lose_answers)
        self._storms: list[_Storm] = []
        self._clock_offset = 0.0

    # -- knobs -------------------------------------------------------------------------------

    def set_limits(
        self,
        app_qps: int = 50,
        app_qpm: int = 1000,
        chat_qps: int = 5,
        legacy_status_400: bool = False,
        message_qps: int = 5,
        minute: float = 60.0,
    ) -> None:
        """Throttling (§7): per-(API, app) QPS/QPM, per chat/user QPS, per-message card-patch QPS.
        ``minute``: the length of the QPM window in seconds (a test shortens it, not the count)."""
        self.app_qps, self.app_qpm, self.chat_qps = app_qps, app_qpm, chat_qps
        self.legacy_status_400, self.message_qps = legacy_status_400, message_qps
        self.minute = minute

    def fail_next(
        self,
        n: int,
        *,
        code: int,
        status: int | None = None,
        reset: float = 1.0,
        paths: Iterable[str] = ("messages",),
    ) -> None:
        """Fail the next ``n`` calls whose path contains one of ``paths`` with ``code``.

        ``status`` defaults to 429 for 99991400 (400 in legacy mode, with the rate-limit headers,
        ``x-ogw-ratelimit-reset`` = ``reset``) and 400 otherwise. Checked before authentication.
        A fractional ``reset`` is written as is (the gateway sends whole seconds) to keep tests fast.
        """
        self._failures.append(_InjectedFailure(n, code, status, reset, tuple(paths)))

    def lose_answers(self, n: int, *, status: int = 504, paths: Iterable[str] = ("messages",)) -> None:
        """The next ``n`` calls whose path contains one of ``paths`` are carried out (a message is
        created, a card patched) but their answer is lost: the caller gets HTTP ``status`` (a
        proxy's 504 after the platform did the work), as when a response times out in transit."""
        self._lost.append(_InjectedFailure(n, 0, status, 0.0, tuple(paths)))

    def throttle_for(
        self,
        seconds: float,
        *,
        code: int = 99991400,
        reset: float = 1.0,
        paths: Iterable[str] = ("messages",),
    ) -> None:
        """A throttling storm: for ``seconds`` (times ``time_scale``) every call whose path contains
        one of ``paths`` is refused with ``code`` — 99991400 as HTTP 429 (400 in legacy mode) with
        ``x-ogw-ratelimit-reset`` = the smaller of ``reset`` and what is left of the storm (scaled),
        or 230020 as HTTP 400. Checked before authentication, like ``fail_next``."""
        scale = getattr(self, "time_scale", 1.0)
        until = time.monotonic() + seconds * scale
        self._storms.append(_Storm(until, code, reset * scale, tuple(paths)))

    def expire_tokens(self) -> None:
        """Make every tenant token expire now; the next token call issues a new one."""
        self._token_expiry.clear()

    def revoke(self, token: str) -> None:
        """Invalidate one token (it answers 99991663 from now on)."""
        self._token_expiry.pop(token, None)

    def advance_time(self, seconds: float) -> None:
        """Move the API clock forward: token lifetimes, the uuid window, the 14-day patch limit."""
        self._clock_offset += seconds

    def recall(self, message_id: str) -> None:
        """Mark a message recalled: replying to or patching it then fails with 230011."""
        self._messages[message_id].recalled = True

    def delete(self, message_id: str) -> None:
        """The message no longer exists (deleted, or its chat's history cleared): replying to it
        fails with 231003, the reply API's "the message replied to does not exist" (the reply
        page's error table, open.feishu.cn/document/server-docs/im-v1/message/reply; the HTTP
        status, 400, and the msg text are **UNCONFIRMED**)."""
        self._messages[message_id].deleted = True

    def add_resource(
        self,
        message_id: str,
        file_key: str,
        data: bytes,
        *,
        kind: str = "image",
        content_type: str | None = None,
        file_name: str | None = None,
        chunked: bool = False,
        delay: float = 0.0,
    ) -> Resource:
        """Hold ``data`` as the resource ``file_key`` of message ``message_id``."""
        default_type = "image/png" if kind == "image" else "application/octet-stream"
        resource = Resource(
            data, kind, content_type or default_type, file_name or file_key, chunked=chunked, delay=delay
        )
        self.resources[(message_id, file_key)] = resource
        return resource

    def apply_card_answer(self, envelope: Any, answer: Any) -> None:
        """What the platform does with the answer to a ``card.action.trigger`` callback (the
        card-callback page, open.feishu.cn/document/uAjLw4CM/ukzMukzMukzM/feishu-cards/
        card-callback-communication): ``{"toast": …}`` is shown to the clicker only;
        ``"card": {"type": "raw", "data": <card>}`` replaces the clicked card at once (for every
        viewer of a shared card), recorded in ``patches`` with method ``"CALLBACK"``. Anything else
        under ``card`` changes nothing and is recorded in ``callback_errors`` (the platform's
        answer to a malformed card, and template cards, are **UNCONFIRMED** here)."""
        event = envelope.get("event") if isinstance(envelope, dict) else None
        header = envelope.get("header") if isinstance(envelope, dict) else None
        if not (isinstance(header, dict) and header.get("event_type") == "card.action.trigger"):
            return
        card = answer.get("card") if isinstance(answer, dict) else None
        if card is None:
            return
        message_id = ((event or {}).get("context") or {}).get("open_message_id")
        message = self._messages.get(message_id) if isinstance(message_id, str) else None
        data = card.get("data") if isinstance(card, dict) and card.get("type") == "raw" else None
        if message is None or not isinstance(data, dict):
            self.callback_errors.append(f"card answer not applied to {message_id}: {str(card)[:200]}")
            return
        self._update(message, "CALLBACK", "interactive", data, json.dumps(data, ensure_ascii=False))

    def messages_in(self, chat_id: str) -> list[SentMessage]:
        """The bot's messages in one chat, in order."""
        return [message for message in self.sent if message.chat_id == chat_id]

    def _card_check(self, msg_type: str, content: dict[str, JSON], *, patch: bool = False) -> Answer | None:
        """The refusal of a card the platform would not take (cards.py overrides: JSON 2.0 rules)."""
        return None

    def _card_shown(self, message: SentMessage) -> None:
        """A message was made; if it shows a card entity, link them (cards.py overrides)."""

    # -- the route wrapper -------------------------------------------------------------------

    def _route(
        self, api: str, handler: ApiHandler, *, authed: bool = True
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """An aiohttp handler: injected failures, auth, the app rate limit, ``handler``, recording."""

        async def serve(request: web.Request) -> web.Response:
            raw = await request.read()
            body = _parse_json(raw) if raw else None
            answer = self._injected_failure(request.path)
            if answer is None and authed:
                answer = self._auth_error(request.headers) or self._app_limit(api)
            if answer is None:
                answer = handler(request, body)
                answer = self._lost_answer(request.path, answer)
            self._record(request, body, answer)
            headers = {"Content-Type": "application/json; charset=utf-8", **answer.headers}
            return web.Response(status=answer.status, body=json.dumps(answer.body).encode(), headers=headers)

        return serve

    async def _resource(self, request: web.Request) -> web.StreamResponse:
        """``GET …/messages/:message_id/resources/:file_key?type=``: the bytes, or a JSON error."""
        message_id, file_key = request.match_info["message_id"], request.match_info["file_key"]
        answer = self._injected_failure(request.path)
        if answer is None:
            answer = self._auth_error(request.headers) or self._app_limit("im.message_resource.get")
        resource = self.resources.get((message_id, file_key))
        if answer is None:
            answer = self._resource_refusal(request.query.get("type"), message_id, resource)
        self._record(request, None, answer or Answer(200, {"code": 0}))
        if answer is not None or resource is None:
            answer = answer or error(400, 234003)
            headers = {"Content-Type": "application/json; charset=utf-8", **answer.headers}
            return web.Response(status=answer.status, body=json.dumps(answer.body).encode(), headers=headers)
        if resource.delay:
            await asyncio.sleep(resource.delay)
        return await self._serve_resource(request, message_id, file_key, resource)

    def _resource_refusal(
        self, kind: str | None, message_id: str, resource: Resource | None
    ) -> Answer | None:
        if kind not in ("image", "file"):
            return error(400, 234001, f"{_MESSAGES[234001]} type must be image or file")
        message = self._messages.get(message_id)
        if self.resources_forbidden:
            return error(400, 234002)
        if message is not None and message.chat_id in self.chats_without_bot:
            return error(400, 234004)
        if resource is None:
            return error(400, 234003)
        if resource.kind != kind:
            return error(400, 234001, f"{_MESSAGES[234001]} the key is not of type {kind}")
        if message is not None and message.upper_message_id is not None:
            return error(400, 234043)  # inside a merge_forward: not downloadable (FEISHU.md §11)
        if len(resource.data) > RESOURCE_LIMIT:
            return error(400, 234037)
        return None

    async def _serve_resource(
        self, request: web.Request, message_id: str, file_key: str, resource: Resource
    ) -> web.StreamResponse:
        read = ResourceRead(message_id, file_key)
        self.resource_reads.append(read)
        quoted = quote(resource.file_name, safe="")
        headers = {
            "Content-Type": resource.content_type,
            "Content-Disposition": f"attachment; filename=\"{quoted}\"; filename*=UTF-8''{quoted}",
        }
        response = web.StreamResponse(status=200, headers=headers)
        if not resource.chunked:
            response.content_length = len(resource.data)
        try:
            await response.prepare(request)
            for start in range(0, len(resource.data), resource.chunk_size):
                await response.write(resource.data[start : start + resource.chunk_size])
                read.served = min(len(resource.data), start + resource.chunk_size)
            await response.write_eof()
            read.complete = True
        except ConnectionError:  # the client hung up before the end
            read.cut_off = True
        except asyncio.CancelledError:
            read.cut_off = True
            raise
        return response

    def _record(self, request: web.Request, body: Any, answer: Answer) -> None:
        if self.record_requests:
            call = RecordedCall(
                request.method, request.path, dict(request.query), CIMultiDict(request.headers),
                body, answer.status, answer.body.get("code"), time.monotonic(),
            )  # fmt: skip
            self.requests.append(call)

    def _now(self) -> float:
        return time.monotonic() + self._clock_offset

    def _injected_failure(self, path: str) -> Answer | None:
        now = time.monotonic()
        self._storms = [storm for storm in self._storms if storm.until > now]
        for storm in self._storms:
            if any(part in path for part in storm.paths):
                if storm.code == 99991400:
                    return self._rate_limited(self.app_qps, min(storm.reset, storm.until - now))
                return error(400, storm.code)
        for failure in self._failures:
            if failure.remaining > 0 and any(part in path for part in failure.paths):
                failure.remaining -= 1
                if failure.code == 99991400:
                    return self._rate_limited(self.app_qps, failure.reset, failure.status)
                return error(failure.status or 400, failure.code)
        return None

    def _lost_answer(self, path: str, answer: Answer) -> Answer:
        for lost in self._lost:
            if lost.remaining > 0 and any(part in path for part in lost.paths):
                lost.remaining -= 1
                return Answer(lost.status or 504, {"error": "upstream timed out"})
        return answer

    def _auth_error(self, headers: Mapping[str, str]) -> Answer | None:
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer" or not token.strip():
            return error(400, 99991661)
        expiry = self._token_expiry.get(token.strip())
        if expiry is None or expiry <= self._now():
            return error(400, 99991663)
        return None

    def _app_limit(self, api: str) -> Answer | None:
        """Per-(API, app) QPS and QPM (§7); a rejected call does not count."""
        now = self._now()
        per_second, per_minute = self._app_windows.setdefault(api, (deque(), deque()))
        for times, limit, span in ((per_second, self.app_qps, 1.0), (per_minute, self.app_qpm, self.minute)):
            wait = _window_wait(times, now, limit, span)
            if wait:
                return self._rate_limited(limit, math.ceil(wait))
        per_second.append(now)
        per_minute.append(now)
        return None

    def _rate_limited(self, limit: int, reset: float, status: int | None = None) -> Answer:
        headers = {"x-ogw-ratelimit-limit": str(limit), "x-ogw-ratelimit-reset": f"{reset:g}"}
        return error(status or (400 if self.legacy_status_400 else 429), 99991400, headers=headers)

    def _target_limit(self, key: str, limit: int) -> Answer | None:
        """5 QPS per chat, per user (§7) or per patched message (§6) → 400 / 230020."""
        now = self._now()
        times = self._target_windows.setdefault(key, deque())
        if _window_wait(times, now, limit, 1.0):
            return error(400, 230020)
        times.append(now)
        return None

    # -- auth and bot info -------------------------------------------------------------------

    def _token(self, request: web.Request, body: Any) -> Answer:
        """§5: the same token while ≥ 30 min remain, else a new one (the old one stays valid)."""
        if not isinstance(body, dict) or body.get("app_id") != self.app_id:
            return error(400, 10003, "invalid param: app_id")  # UNCONFIRMED code
        if body.get("app_secret") != self.app_secret:
            return error(400, 10014, "app secret invalid")  # UNCONFIRMED code and status
        now = self._now()
        token = self._current_token
        if token is None or self._token_expiry.get(token, now) - now < TOKEN_REUSE_MIN:
            token = "t-" + uuid_module.uuid4().hex
            self._token_expiry[token] = now + self.token_ttl
            self._current_token = token
            self.tokens_issued.append(token)
        expire = round(self._token_expiry[token] - now)
        return Answer(200, {"code": 0, "msg": "ok", "tenant_access_token": token, "expire": expire})

    def _contact_user(self, request: web.Request, body: Any) -> Answer:
        """``GET /open-apis/contact/v3/users/:user_id?user_id_type=open_id`` (open.feishu.cn/document/
        server-docs/contact-v3/user/get): ``{"data": {"user": {"open_id", "union_id", "name", …}}}``.
        Without the scope ``contact:user.base:readonly`` (``contact_forbidden``) → 99991672; a user
        not in ``users`` (outside the app's contact range) → 41050 (code from that page's error
        table; both HTTP statuses **UNCONFIRMED**, 400)."""
        user_id_type = request.query.get("user_id_type", "open_id")
        if user_id_type not in ("open_id", "union_id", "user_id"):
            return error(400, 40001, f"invalid user_id_type {user_id_type!r}")  # UNCONFIRMED code
        if self.contact_forbidden:
            return error(400, 99991672)
        open_id = request.match_info["user_id"]
        name = self.users.get(open_id) if user_id_type == "open_id" else None
        if name is None:
            return error(400, 41050, "no user authority error")
        user = {"open_id": open_id, "union_id": "on_" + open_id.removeprefix("ou_"), "name": name,
                "en_name": name}  # fmt: skip
        return Answer(200, {"code": 0, "msg": "success", "data": {"user": user}})

    def _bot_info(self, request: web.Request, body: Any) -> Answer:
        """§4: note the ``bot`` object sits at the top level, without a ``data`` wrapper."""
        bot = {
            "activate_status": 2, "app_name": self.bot_name, "avatar_url": "https://example.invalid/avatar.png",
            "ip_white_list": [], "open_id": self.bot_open_id,
        }  # fmt: skip
        return Answer(200, {"code": 0, "msg": "ok", "bot": bot})

    # -- send, reply, patch, edit ------------------------------------------------------------

    def _create(self, request: web.Request, body: Any) -> Answer:
        """``POST /open-apis/im/v1/messages?receive_id_type=…`` (§6)."""
        id_type = request.query.get("receive_id_type", "")
        if id_type not in RECEIVE_ID_TYPES:
            return _invalid(f"receive_id_type must be one of {sorted(RECEIVE_ID_TYPES)}, got {id_type!r}")
        if not isinstance(body, dict):
            return _invalid("the body must be a JSON object")
        receive_id = body.get("receive_id")
        if not isinstance(receive_id, str) or not receive_id:
            return _invalid("receive_id is required")
        checked = _checked_content(body, SENDABLE_TYPES)
        if isinstance(checked, Answer):
            return checked
        if id_type == "chat_id" and receive_id in self.dissolved_chats:
            return error(400, 232009)
        if id_type == "chat_id" and receive_id in self.chats_without_bot:
            return error(400, 230002)
        if id_type != "chat_id" and receive_id in self.unavailable_users:
            return error(400, 230013)
        duplicate = self._duplicate(body.get("uuid"))
        if duplicate is not None:
            return duplicate
        refused = self._card_check(checked[0], checked[1])
        if refused is not None:
            return refused
        is_chat = id_type == "chat_id"
        limited = self._target_limit(("chat:" if is_chat else "user:") + receive_id, self.chat_qps)
        if limited is not None:
            return limited
        chat_id = receive_id if is_chat else self._p2p_chats.get(receive_id, f"oc_p2p_{receive_id}")
        message = self._store(chat_id, *checked, body.get("uuid"))
        message.receive_id, message.receive_id_type = receive_id, id_type
        self._card_shown(message)
        return self._message_answer(message)

    def _reply(self, request: web.Request, body: Any) -> Answer:
        """``POST /open-apis/im/v1/messages/:message_id/reply`` (§6)."""
        parent = self._messages.get(request.match_info["message_id"])
        if parent is None:
            return _invalid("message_id not found")  # UNCONFIRMED code
        if parent.chat_id in self.dissolved_chats:
            return error(400, 232009)
        if parent.chat_id in self.chats_without_bot:
            return error(400, 230002)
        if parent.recalled:
            return error(400, 230011)
        if parent.deleted:
            return error(400, 231003)
        if not isinstance(body, dict):
            return _invalid("the body must be a JSON object")
        checked = _checked_content(body, SENDABLE_TYPES)
        if isinstance(checked, Answer):
            return checked
        in_thread = body.get("reply_in_thread", False)
        if not isinstance(in_thread, bool):
            return _invalid("reply_in_thread must be a boolean")
        duplicate = self._duplicate(body.get("uuid"))
        if duplicate is not None:
            return duplicate
        refused = self._card_check(checked[0], checked[1])
        if refused is not None:
            return refused
        limited = self._target_limit("chat:" + parent.chat_id, self.chat_qps)
        if limited is not None:
            return limited
        if in_thread and parent.thread_id is None:
            parent.thread_id = "omt_" + uuid_module.uuid4().hex[:16]  # the parent becomes the topic root
        message = self._store(parent.chat_id, *checked, body.get("uuid"))
        message.reply_to, message.root_id = parent.message_id, parent.root_id or parent.message_id
        message.thread_id = parent.thread_id
        self._card_shown(message)
        return self._message_answer(message)

    def _patch(self, request: web.Request, body: Any) -> Answer:
        """``PATCH /open-apis/im/v1/messages/:message_id``: replace a shared card (§6)."""
        message = self._updatable(request.match_info["message_id"])
        if isinstance(message, Answer):
            return message
        if message.msg_type != "interactive":
            return _invalid("only interactive (card) messages can be patched; use PUT to edit text/post")
        if not isinstance(body, dict):
            return _invalid("the body must be a JSON object")
        checked = _checked_content(
            {"msg_type": "interactive", "content": body.get("content")}, {"interactive"}
        )
        if isinstance(checked, Answer):
            return checked
        refused = self._card_check("interactive", checked[1], patch=True)
        if refused is not None:
            return refused
        if not (_is_shared_card(message.content) and _is_shared_card(checked[1])):
            return _invalid("both the old and the new card must set config.update_multi: true")
        # 5 QPS per message, over it HTTP 400 / 230020: the PATCH page (module docstring)
        limited = self._target_limit("message:" + message.message_id, self.message_qps)
        if limited is not None:
            return limited
        self._update(message, "PATCH", *checked)
        return Answer(200, {"code": 0, "msg": "success"})

    def _edit(self, request: web.Request, body: Any) -> Answer:
        """``PUT /open-apis/im/v1/messages/:message_id``: edit a text or post message (§6)."""
        message = self._updatable(request.match_info["message_id"])
        if isinstance(message, Answer):
            return message
        if message.msg_type not in EDITABLE_TYPES:
            return _invalid("only text and post messages can be edited; use PATCH for cards")
        if not isinstance(body, dict):
            return _invalid("the body must be a JSON object")
        checked = _checked_content(body, EDITABLE_TYPES)
        if isinstance(checked, Answer):
            return checked
        self._update(message, "PUT", *checked)
        return self._message_answer(message)

    def _get_message(self, request: web.Request, body: Any) -> Answer:
        """``GET /open-apis/im/v1/messages/:message_id``: the message, and a forward's contents."""
        message = self._messages.get(request.match_info["message_id"])
        if message is None:
            return error(400, 230001, f"{_MESSAGES[230001]} ext=invalid message_id.")
        if message.chat_id in self.chats_without_bot:
            return error(400, 230002)
        if self.resources_forbidden:
            return error(400, 230027)
        items = [self._message_item(message)]
        if message.msg_type == "merge_forward":
            items += [self._message_item(inner) for inner in self._forwarded_in(message.message_id)]
        return Answer(200, {"code": 0, "msg": "success", "data": {"items": items}})

    def _forwarded_in(self, forward_id: str) -> list[SentMessage]:
        """Every message inside a forward, nested forwards' contents included, in order."""
        found: list[SentMessage] = []
        for inner in self._messages.values():
            if inner.upper_message_id == forward_id:
                found.append(inner)
                if inner.msg_type == "merge_forward":
                    found += self._forwarded_in(inner.message_id)
        return found

    def _message_item(self, message: SentMessage) -> dict[str, JSON]:
        """A message as the get API lists it: the bot's with an app sender, a user's with its open_id."""
        millis = str(int(message.created_at * 1000))
        by_app = message.sender == "app"
        sender = {
            "id": self.app_id if by_app else message.sender, "id_type": "app_id" if by_app else "open_id",
            "sender_type": "app" if by_app else "user", "tenant_key": self.tenant_key,
        }  # fmt: skip
        raw = message.raw_content or json.dumps(message.content, ensure_ascii=False)
        item: dict[str, JSON] = {
            "message_id": message.message_id, "msg_type": message.msg_type, "create_time": millis,
            "update_time": millis, "deleted": message.recalled, "updated": message.updated,
            "chat_id": message.chat_id, "sender": sender, "body": {"content": raw},
        }  # fmt: skip
        if message.reply_to is not None:
            item["parent_id"], item["root_id"] = message.reply_to, message.root_id
        if message.upper_message_id is not None:
            item["upper_message_id"] = message.upper_message_id
        mentions = _mentions_of(message, self.tenant_key)  # as the get page lists them: `id` a string
        if mentions:
            item["mentions"] = mentions
        return item

    def _updatable(self, message_id: str) -> SentMessage | Answer:
        message = self._messages.get(message_id)
        if message is None:
            return _invalid("message_id not found")
        if message.recalled:
            return error(400, 230011)
        if message.sender != "app":
            return _invalid("only messages sent by this app can be updated")
        if (time.time() + self._clock_offset) - message.created_at > PATCH_MAX_AGE:
            return error(400, 230031)  # the PATCH page's error table (module docstring)
        return message

    def _duplicate(self, uuid: Any) -> Answer | None:
        """§6: a uuid seen within 1 h returns the original message; nothing new is created."""
        if not isinstance(uuid, str):
            return None
        seen = self._by_uuid.get(uuid)
        if seen is not None and self._now() - seen[0] < UUID_WINDOW:
            return self._message_answer(seen[1])
        return None

    def _store(
        self, chat_id: str, msg_type: str, content: dict[str, JSON], raw: str, uuid: Any
    ) -> SentMessage:
        text = plain_text(msg_type, content)
        message = SentMessage(
            "om_" + uuid_module.uuid4().hex, chat_id, msg_type, content, text,
            uuid=uuid if isinstance(uuid, str) else None, created_at=time.time() + self._clock_offset,
            raw_content=raw, versions=[text],
        )  # fmt: skip
        self.sent.append(message)
        self._messages[message.message_id] = message
        if message.uuid is not None:
            self._by_uuid[message.uuid] = (self._now(), message)
        return message

    def _update(
        self, message: SentMessage, method: str, msg_type: str, content: dict[str, JSON], raw: str
    ) -> None:
        message.msg_type, message.content, message.raw_content = msg_type, content, raw
        message.text, message.updated = plain_text(msg_type, content), True
        message.versions.append(message.text)
        self.patches.append(
            Patch(message.message_id, method, msg_type, content, message.text, time.monotonic())
        )

    def _message_answer(self, message: SentMessage) -> Answer:
        """The §6 message object."""
        millis = str(int(message.created_at * 1000))
        data: dict[str, JSON] = {
            "message_id": message.message_id, "msg_type": message.msg_type,
            "create_time": millis, "update_time": millis, "deleted": message.recalled,
            "updated": message.updated, "chat_id": message.chat_id,
            "sender": {"id": self.app_id, "id_type": "app_id", "sender_type": "app",
                       "tenant_key": self.tenant_key},
            "body": {"content": message.raw_content},
        }  # fmt: skip
        if message.reply_to is not None:
            data["parent_id"], data["root_id"] = message.reply_to, message.root_id
        if message.thread_id is not None:
            data["thread_id"] = message.thread_id
        mentions = _mentions_of(message, self.tenant_key)
        if mentions:
            data["mentions"] = mentions
        return Answer(200, {"code": 0, "msg": "success", "data": data})

    def _remember_inbound(self, message: SentMessage, chat_type: str) -> None:
        """A fake user's message: the bot may reply to it; a p2p chat becomes the user's DM."""
        self._messages[message.message_id] = message
        if chat_type == "p2p":
            self._p2p_chats[message.sender] = message.chat_id


def plain_text(msg_type: str, content: dict[str, JSON]) -> str:
    """The readable text of a message, for assertions: text, post (title + paragraphs), card strings.

    A card's text is every string under a ``content`` key (plain_text, lark_md, markdown, titles) in
    document order, one per line. Other types give "".
    """
    if msg_type == "text":
        return str(content.get("text", ""))
    if msg_type == "post":
        post = _post_body(content) or content
        lines = [str(post["title"])] if post.get("title") else []
        for paragraph in post.get("content") or []:
            lines.append("".join(_node_text(node) for node in paragraph if isinstance(node, dict)))
        return "\n".join(lines)
    if msg_type == "interactive":  # not the config: a summary is what the chat list shows
        return "\n".join(_card_strings({key: value for key, value in content.items() if key != "config"}))
    return ""


def _node_text(node: dict[str, JSON]) -> str:
    if node.get("tag") == "at":
        return "@" + str(node.get("user_name") or node.get("user_id", ""))
    return str(node.get("text", ""))


def _card_strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        found: list[str] = []
        for key, item in value.items():
            if key == "content" and isinstance(item, str):
                found.append(item)
            else:
                found.extend(_card_strings(item))
        return found
    if isinstance(value, list):
        return [text for item in value for text in _card_strings(item)]
    return []


def _post_body(content: dict[str, JSON]) -> dict[str, JSON] | None:
    """The first locale's post body (``{"zh_cn": {"title", "content"}}``) when sending requires one."""
    for key, value in content.items():
        if _LOCALE.match(key) and isinstance(value, dict) and isinstance(value.get("content"), list):
            return value
    return None


def _is_shared_card(card: dict[str, JSON]) -> bool:
    """``config.update_multi: true``. JSON 2.0 cards are always shared; templates and CardKit entities
    cannot be inspected here and are accepted (**UNCONFIRMED**)."""
    if card.get("schema") == "2.0" or card.get("type") in ("template", "card"):
        return True
    config = card.get("config")
    return isinstance(config, dict) and config.get("update_multi") is True


def _checked_content(
    body: dict[str, JSON], allowed: frozenset[str] | set[str]
) -> tuple[str, dict[str, JSON], str] | Answer:
    """``(msg_type, parsed content, content string)``, or the 230001 / 230025 answer (§6)."""
    msg_type, raw = body.get("msg_type"), body.get("content")
    if not isinstance(msg_type, str) or msg_type not in allowed:
        return _invalid(f"msg_type must be one of {sorted(allowed)}, got {msg_type!r}")
    if not isinstance(raw, str):
        return _invalid("content must be a JSON-encoded string, not a JSON value")
    uuid = body.get("uuid")
    if uuid is not None and (not isinstance(uuid, str) or len(uuid) > 50):
        return _invalid("uuid must be a string of at most 50 characters")
    limit = TEXT_LIMIT if msg_type == "text" else RICH_LIMIT
    if len(raw.encode()) > limit:
        return error(400, 230025)
    content = _parse_json(raw.encode())
    if not isinstance(content, dict):
        return _invalid("content is not a JSON object")
    required = _REQUIRED_KEYS.get(msg_type)
    if required is not None and not isinstance(content.get(required), str):
        return _invalid(f"{msg_type} content needs a string {required!r}")
    if msg_type == "post" and _post_body(content) is None:
        return _invalid('post content needs a locale key, e.g. {"zh_cn": {"title": "", "content": [[...]]}}')
    if msg_type == "interactive" and not content:
        return _invalid("the card is empty")
    return msg_type, content, raw


def _mentions_of(message: SentMessage, tenant_key: str) -> list[dict[str, JSON]]:
    """A user's message: its mentions as the event had them (key, id, name); the bot's text message:
    its ``<at user_id="ou_…">Name</at>`` tags, as the response lists them."""
    if message.mentions:
        return [{"key": m.get("key"), "id": (m.get("id") or {}).get("open_id"), "id_type": "open_id",
                 "name": m.get("name"), "tenant_key": tenant_key} for m in message.mentions]  # fmt: skip
    if message.msg_type != "text" or "<at" not in message.text:
        return []
    return [
        {"key": f"@_user_{n}", "id": user_id, "id_type": "open_id", "name": name, "tenant_key": tenant_key}
        for n, (user_id, name) in enumerate(_AT_TAG.findall(message.text), 1)
    ]


def _window_wait(times: deque[float], now: float, limit: int, span: float) -> float:
    """Seconds until a sliding window of ``span`` s has room for one more call (0.0: room now)."""
    while times and times[0] <= now - span:
        times.popleft()
    return times[0] + span - now if len(times) >= limit else 0.0


def _parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
