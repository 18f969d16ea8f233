"""The Feishu Open API calls the bot makes: tenant token, bot info, send (create or reply), patch,
and a user's name (the contact API) for the approval card's decision line.

The failure policy, in one place (FEISHU.md §5–§7). Every answer is one of three kinds, and only
the last one ever counts towards giving a reply up:
- **wait** — the platform asks us to slow down; nothing failed:
  HTTP 429 or 99991400 (app over its rate): pause every send for `x-ogw-ratelimit-reset` seconds
  (1 s when absent) in the `SendLimiter`, then retry; 230020 (chat over its 5/s) and 230049 (the
  message with this uuid is still being sent): pause that chat for `retry_base_delay`, doubling,
  then retry. After `MAX_THROTTLED` waits in one call: `FeishuError(throttled=True)`, which the
  outbox waits out again, however long the storm lasts, without counting an attempt;
- **transient** — 5xx, connection errors and timeouts: retry after `retry_base_delay`, doubling,
  `max_retries` times, then `FeishuError(retry_after=…)`: one failed attempt for the outbox.
  Any code of `TOKEN_CODES` (the token missing, invalid, malformed or expired): forget the token,
  fetch a new one, retry once; a scope the app lacks is not among them, and is not retried.
  Retrying a send is safe: every request carries a `uuid`, and Feishu creates at most one message
  per uuid within an hour (§6);
- **permanent** — the request itself cannot succeed: `FeishuError(permanent=True)` naming the code,
  the platform's msg and, for the codes in `PERMANENT_CODES`, what it means (230002 the bot was
  removed from the chat, 232009 the chat was dissolved, 230013 the user is outside the app's
  availability or has left, 230035 / 230018 the chat does not let the bot speak, 230006 / 230027
  the app lacks the bot ability or a permission, 230001 / 230025 / 230022 / 230028 / 230099 the
  content is refused). The outbox dead-letters such a reply at once; fix the cause and resend it
  (`hermes-kernel deadletters resend ID`, or the console).
  230011 or 231003 on a reply (the message replied to was recalled, or no longer exists) is not an
  error: the part is sent into the chat instead.

The app secret and tokens never appear in a log line or an exception message. aiohttp is imported
inside methods, so importing this module does not import it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid as uuidlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ...kernel.messages import JSON
from ...kernel.replies import detect_language
from ..base import DeliveryError
from ..seam import OutboundMessage
from .formatting import Part, approval_card, format_reply
from .ratelimit import MESSAGE_API, SendLimiter

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("hermes_core.feishu")

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
CARDS_PATH = "/open-apis/cardkit/v1/cards"
TOKEN_REFRESH_MARGIN = 600.0  # fetch a new token when less than 10 minutes remain (§5)
UUID_MAX = 50  # §6: a request uuid is at most 50 characters

# The tenant token itself was refused (the platform's generic error codes, open.feishu.cn/document/
# server-docs/api-call-guide/generic-error-code): forget it, fetch a new one, retry once. The bot
# sends nothing but its tenant token, so a code about "the access token" can only mean that one.
# Not here, on purpose: "the app lacks a scope" (99991672, 99991676), "the user has not granted it"
# (99991679), "the app is disabled" (99991662, 99991673), "IP not allowed" (99991401) — a new token
# changes none of them; they are permanent refusals like any other 4xx.
TOKEN_CODES: dict[int, str] = {
    99991661: "no access token in the request",
    99991663: "the tenant access token is invalid or expired",
    99991664: "the app access token is invalid",
    99991665: "the tenant access token is invalid",
    99991668: "the access token is invalid",
    99991671: "the access token is malformed",
    99991677: "the access token has expired",
}
APP_RATE_LIMITED = 99991400
CHAT_RATE_LIMITED = 230020
MESSAGE_BEING_SENT = 230049  # "the message is being sent, please wait": same uuid still in flight
REPLY_TARGET_RECALLED = 230011
REPLY_TARGET_GONE = 231003  # the reply API's error table: the message replied to does not exist
REPLY_TARGET_LOST = frozenset({REPLY_TARGET_RECALLED, REPLY_TARGET_GONE})  # send into the chat instead
CHAT_WAIT_CODES = frozenset({CHAT_RATE_LIMITED, MESSAGE_BEING_SENT})
MAX_THROTTLED = 6  # rate-limit answers one call waits out before handing back (throttled, no failure)
USER_NAME_TIMEOUT = 1.0  # seconds for a contact lookup made while a card callback waits (3 s in all)
NAME_TTL, NO_NAME_TTL, NAMES_KEPT = 3600.0, 900.0, 10_000  # the contact lookups' cache

# What a permanent refusal of a send means (the send and reply APIs' error tables, §6). Any other
# 4xx code is permanent too; these get a plain explanation in the error, the log and the dead letter.
PERMANENT_CODES: dict[int, str] = {
    230001: "the request was refused as invalid",
    230002: "the bot is not in the chat (it was removed, or never added)",
    230006: "the app's bot ability is not enabled",
    230013: "the user is outside the app's availability (or has left the organisation)",
    230018: "the chat's settings do not let the bot do this",
    230022: "the content contains sensitive information",
    230025: "the message is too long",
    230027: "the app lacks a permission for this",
    230028: "the content did not pass the data-leak audit",
    230031: "the message is older than 14 days and can no longer be changed",
    230035: "the bot may not send here (chat muted, bot blocked, or the tenant forbids it)",
    230038: "cross-tenant one-to-one chats cannot be sent to",
    230099: "the card content was refused",
    232009: "the chat was dissolved",
    99991672: "the app lacks a scope this API needs (grant it in the developer console, then publish)",
    # CardKit (card entities, streaming cards): the create / update pages' error tables
    200740: "the card entity does not exist",
    200750: "the card entity has expired (they live 14 days)",
    200850: "the card's streaming mode timed out (it closes 10 minutes after it was opened)",
    200860: "the card is larger than 30 KB",
    300305: "the card has more than 200 components",
    300309: "the card's streaming mode is closed",
    300317: "the sequence of a card operation did not increase",
}
STREAMING_CLOSED = frozenset({200850, 300309})  # re-open streaming, then update again
SEQUENCE_STALE = 300317


class FeishuError(DeliveryError):
    """A Feishu call failed; `code` is the platform's error code when it gave one."""

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        retry_after: float | None = None,
        permanent: bool = False,
        throttled: bool = False,
    ) -> None:
        super().__init__(message, retry_after=retry_after, permanent=permanent, throttled=throttled)
        self.code = code


class _Transient(Exception):
    """Worth another attempt after a backoff: 5xx, connection error, timeout."""


class _TokenRejected(Exception):
    def __init__(self, reason: str, token: str, code: int) -> None:
        super().__init__(reason)
        self.token, self.code = token, code


class _Throttled(Exception):
    """A rate limit answered: `wait` is the server's hint (app-wide), `chat` the chat to back off."""

    def __init__(self, reason: str, code: int, *, wait: float | None = None, chat: str | None = None) -> None:
        super().__init__(reason)
        self.code, self.wait, self.chat = code, wait, chat


@dataclass
class _Response:
    status: int
    headers: dict[str, str]  # names lower-cased: Feishu's header case is not to be relied on (§7)
    body: dict[str, JSON]


class FeishuAPI:
    """One app's client. Safe to share between tasks; `aclose()` when done.

    All calls go through `limiter` (shared with other clients of the same app if you pass one),
    so sends stay under the limits of §7 before the platform has to refuse them.
    """

    def __init__(
        self,
        app_id: str,
        app_secret: str,
        *,
        base_url: str = "https://open.feishu.cn",
        timeout: float = 10.0,
        max_retries: int = 3,
        retry_base_delay: float = 1.0,
        limiter: SendLimiter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app_id = app_id
        self._clock = clock  # when the token is due for renewal; tests pass a virtual one
        self._secret = app_secret
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_base_delay = retry_base_delay
        self.limiter = limiter if limiter is not None else SendLimiter()
        self._token: str | None = None
        self._token_refresh_at = 0.0
        self._token_lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._session: aiohttp.ClientSession | None = None
        self._chat_order = _ChatOrder()
        self._names: dict[str, tuple[str | None, float]] = {}  # open_id → (name or None, until)

    def __repr__(self) -> str:
        return f"FeishuAPI(app_id={self.app_id!r}, base_url={self.base_url!r})"

    async def __aenter__(self) -> FeishuAPI:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- the calls -------------------------------------------------------------------------

    async def bot_info(self, *, once: bool = False) -> dict[str, JSON]:
        """The bot's own profile (§4): `open_id`, `app_name`, … — the `bot` object, no `data` wrapper.

        `once`: a single attempt, no retry or backoff here (the channel's start-up retries in the
        background and must not hold `serve` up); any failure is a `FeishuError`."""
        path = "/open-apis/bot/v3/info"
        if once:
            try:
                body = await self._attempt("GET", path, None, None, None, "bot.info")
            except (_Transient, _Throttled, _TokenRejected) as exc:
                raise FeishuError(f"GET {path}: {exc}", retry_after=self.retry_base_delay) from None
        else:
            body = await self._call("GET", path, api="bot.info")
        bot = body.get("bot")
        return bot if isinstance(bot, dict) else {}

    async def send(self, message: OutboundMessage) -> str:
        """Deliver `message.text`, split into as many messages as the limits need (§6).

        Replies under `message.reply_to` when set (falling back to the chat if that message was
        recalled), else creates the message in `message.chat_id`. Each part's request uuid comes
        from `message.uuid` and the part's index, so sending the same message again creates
        nothing new. Parts go out in order, and sends to one chat are delivered in call order.
        Returns the Feishu message_id of the last part.
        """
        if message.approval is not None:  # Approve / Reject buttons: one card, never split
            card = approval_card(message.approval, detect_language(message.text))
            parts = [Part("interactive", json.dumps(card, ensure_ascii=False))]
        else:
            parts = format_reply(message.text)
        if not parts:
            raise FeishuError("nothing to send: the reply text is empty", permanent=True)
        target = message.chat_id or message.reply_to
        if target is None:
            raise FeishuError("the message has neither chat_id nor reply_to", permanent=True)
        reply_to = message.reply_to
        message_id = ""
        async with self._chat_order.hold(target):
            for index, part in enumerate(parts):
                request_uuid = part_uuid(message.uuid, index)
                message_id, reply_to = await self._send_part(
                    part, message.chat_id, reply_to, request_uuid, in_thread=message.thread_id is not None
                )
        return message_id

    async def send_text(
        self, chat_id: str, text: str, *, reply_to: str | None = None, uuid: str | None = None
    ) -> str:
        """`send` for callers without an `OutboundMessage`; a fresh uuid unless one is given."""
        message = OutboundMessage(
            channel="feishu",
            conversation=chat_id,
            text=text,
            uuid=uuid or uuidlib.uuid4().hex,
            chat_id=chat_id,
            reply_to=reply_to,
        )
        return await self.send(message)

    async def send_card(
        self, card: dict[str, Any], *, chat_id: str | None, reply_to: str | None, uuid: str,
        in_thread: bool = False,
    ) -> str:  # fmt: skip
        """Send one interactive card (under `reply_to` when set, else into `chat_id`); its
        message_id. The same `uuid` again within an hour returns the first card (§6). `in_thread`:
        the message replied to is in a topic, and the card stays there (`_send_part`)."""
        target = chat_id or reply_to
        if target is None:
            raise FeishuError("the message has neither chat_id nor reply_to", permanent=True)
        part = Part("interactive", json.dumps(card, ensure_ascii=False))
        async with self._chat_order.hold(target):
            message_id, _ = await self._send_part(
                part, chat_id, reply_to, uuid[:UUID_MAX], in_thread=in_thread
            )
        return message_id

    async def patch_card(self, message_id: str, card: dict[str, Any], *, patient: bool = True) -> None:
        """Replace an interactive message's card (§6, option A).

        The old and the new card must both set `config.update_multi: true`. Limited to 5 QPS per
        message, which is what the limiter's per-target bucket enforces here. `patient=False` (a
        streaming card's progress, soon out of date anyway): one attempt, no waiting out a rate
        limit or retrying a 5xx; the FeishuError says which it was.
        """
        content = json.dumps(card, ensure_ascii=False)
        path = f"/open-apis/im/v1/messages/{quote(message_id, safe='')}"
        await self._call("PATCH", path, body={"content": content}, chat=f"message:{message_id}",
                         patient=patient, api="im.message.patch")  # fmt: skip

    # --- CardKit card entities (FEISHU.md §6 option B, §11) ----------------------------------

    async def create_card(self, card: dict[str, Any]) -> str:
        """A card entity made from a JSON 2.0 card (`POST cardkit/v1/cards`): its card_id. The
        entity may be sent once (`send_card(card_reference(card_id), …)`) and lives 14 days."""
        body: dict[str, JSON] = {"type": "card_json", "data": json.dumps(card, ensure_ascii=False)}
        answer = await self._call("POST", CARDS_PATH, body=body, api="cardkit.card.create")
        data = answer.get("data")
        card_id = data.get("card_id") if isinstance(data, dict) else None
        if not isinstance(card_id, str) or not card_id:
            raise FeishuError("Feishu made the card entity but returned no card_id", retry_after=1.0)
        return card_id

    async def stream_text(
        self, card_id: str, element_id: str, text: str, sequence: int, *, patient: bool = True
    ) -> None:
        """The whole text so far into a markdown element of a streaming card entity: what extends
        the text shown before is typed out (`PUT …/elements/:element_id/content`)."""
        path = f"{_card_path(card_id)}/elements/{quote(element_id, safe='')}/content"
        body: dict[str, JSON] = {"content": text, "sequence": sequence, "uuid": _op_uuid(card_id, sequence)}
        await self._call("PUT", path, body=body, api="cardkit.card_element.content", patient=patient)

    async def card_settings(self, card_id: str, config: dict[str, JSON], sequence: int) -> None:
        """Change a card entity's `config` (`PATCH …/settings`): streaming_mode on or off."""
        body: dict[str, JSON] = {
            "settings": json.dumps({"config": config}), "sequence": sequence,
            "uuid": _op_uuid(card_id, sequence),
        }  # fmt: skip
        await self._call("PATCH", f"{_card_path(card_id)}/settings", body=body, api="cardkit.card.settings")

    async def update_card(self, card_id: str, card: dict[str, Any], sequence: int) -> None:
        """Replace a card entity's whole card (`PUT cardkit/v1/cards/:card_id`)."""
        body: dict[str, JSON] = {
            "card": {"type": "card_json", "data": json.dumps(card, ensure_ascii=False)},
            "sequence": sequence, "uuid": _op_uuid(card_id, sequence),
        }  # fmt: skip
        await self._call("PUT", _card_path(card_id), body=body, api="cardkit.card.update")

    async def user_name(self, open_id: str, *, timeout: float = USER_NAME_TIMEOUT) -> str | None:
        """A user's display name from the contact API, or None when it cannot be had quickly.

        `GET /open-apis/contact/v3/users/:user_id?user_id_type=open_id` (open.feishu.cn/document/
        server-docs/contact-v3/user/get; scope `contact:user.base:readonly`, and the user inside
        the app's contact range). One attempt within `timeout` (a card callback must be answered
        within 3 s), never retried; names and failures are cached (`NAME_TTL`, `NO_NAME_TTL`), so
        a missing scope costs one call per user per quarter hour, not one per click."""
        now = self._clock()
        cached = self._names.get(open_id)
        if cached is not None and now < cached[1]:
            return cached[0]
        path = f"/open-apis/contact/v3/users/{quote(open_id, safe='')}"
        try:
            body = await asyncio.wait_for(
                self._attempt("GET", path, {"user_id_type": "open_id"}, None, None), timeout
            )
            data = body.get("data")
            user = data.get("user") if isinstance(data, dict) else None
            name = user.get("name") if isinstance(user, dict) else None
            name = name.strip() if isinstance(name, str) and name.strip() else None
        except (FeishuError, _Transient, _Throttled, _TokenRejected, asyncio.TimeoutError) as exc:
            log.info("feishu: no name for %s from the contact API: %s", open_id, exc)
            name = None
        if len(self._names) >= NAMES_KEPT:
            self._names.clear()
        self._names[open_id] = (name, now + (NAME_TTL if name else NO_NAME_TTL))
        return name

    async def get_message(self, message_id: str) -> list[dict[str, Any]]:
        """A message by its id (`GET /open-apis/im/v1/messages/:message_id`, open.feishu.cn/document/
        server-docs/im-v1/message/get): `data.items`, the message itself and, for a merge_forward,
        every message it carries (each naming its forward in `upper_message_id`). Needs the bot in
        the chat and `im:message` or `im:message:readonly` (group chats also `im:message.group_msg`);
        any refusal is a `FeishuError`."""
        from urllib.parse import quote

        path = f"/open-apis/im/v1/messages/{quote(message_id, safe='')}"
        body = await self._call("GET", path, params={"user_id_type": "open_id"})
        data = body.get("data")
        items = data.get("items") if isinstance(data, dict) else None
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []

    async def aclose(self) -> None:
        session, self._session = self._session, None
        # A session can only be closed from its own loop; one left on a dead loop is just dropped.
        if session is not None and not session.closed and self._loop is asyncio.get_running_loop():
            await session.close()
        await self.limiter.close()  # a shared quota lets go of its database (postgres/quota.py)

    # --- sending ---------------------------------------------------------------------------

    async def _send_part(
        self,
        part: Part,
        chat_id: str | None,
        reply_to: str | None,
        request_uuid: str,
        *,
        in_thread: bool = False,
    ) -> tuple[str, str | None]:
        """Send one part; return its message_id and where the next part should reply to.
        `in_thread`: the message replied to is in a topic, and the reply says it stays there
        (`reply_in_thread`, open.feishu.cn/document/server-docs/im-v1/message/reply)."""
        body: dict[str, JSON] = {"msg_type": part.msg_type, "content": part.content, "uuid": request_uuid}
        if reply_to is not None:
            path = f"/open-apis/im/v1/messages/{quote(reply_to, safe='')}/reply"
            reply_body = {**body, "reply_in_thread": True} if in_thread else body  # a reply's field only
            try:
                replied = await self._call("POST", path, body=reply_body, chat=chat_id or reply_to,
                                           api="im.message.reply")  # fmt: skip
                return _message_id(replied), reply_to
            except FeishuError as exc:
                if exc.code not in REPLY_TARGET_LOST or chat_id is None:
                    raise
                log.info("feishu: message %s was recalled or deleted (code %s); sending to chat %s instead",
                         reply_to, exc.code, chat_id)  # fmt: skip
        assert chat_id is not None  # send() checked that there is a chat_id or a reply_to
        created = await self._call(
            "POST",
            "/open-apis/im/v1/messages",
            params={"receive_id_type": "open_id" if chat_id.startswith("ou_") else "chat_id"},  # a user
            body={"receive_id": chat_id, **body},
            chat=chat_id,
            api="im.message.create",
        )
        return _message_id(created), None

    # --- one call, with the failure policy -------------------------------------------------

    async def _call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        body: dict[str, JSON] | None = None,
        chat: str | None = None,
        patient: bool = True,
        api: str = MESSAGE_API,
    ) -> dict[str, Any]:
        """Make one API call, retried per the policy in the module docstring; return the body.
        Not `patient`: a rate limit or a transient failure is raised at once (a token is renewed)."""
        failures = throttled = 0
        waits, tries = (MAX_THROTTLED, self.max_retries) if patient else (0, 0)
        token_renewed = False
        while True:
            try:
                return await self._attempt(method, path, params, body, chat, api)
            except _TokenRejected as exc:
                self._forget_token(exc.token)
                if token_renewed:
                    reason = f"{method} {path}: {exc}, even just after renewal"
                    raise FeishuError(reason, code=exc.code, retry_after=self.retry_base_delay) from None
                token_renewed = True
                log.info("feishu %s %s: %s; fetching a new token", method, path, exc)
            except _Throttled as exc:
                throttled += 1
                wait = exc.wait if exc.wait is not None else self.retry_base_delay * 2 ** (throttled - 1)
                if throttled > waits:  # handed back as a wait, never as a failure
                    reason = f"{method} {path}: still {exc} after {waits} waits"
                    raise FeishuError(reason, code=exc.code, retry_after=wait, throttled=True) from None
                if exc.code in CHAT_WAIT_CODES and exc.chat is not None:
                    self.limiter.pause_chat(exc.chat, self.limiter.now() + wait)
                else:
                    self.limiter.pause_until(self.limiter.now() + wait)
                log.warning("feishu %s %s: %s; waiting %.2fs", method, path, exc, wait)
            except _Transient as exc:
                failures += 1
                delay = self.retry_base_delay * 2 ** (failures - 1)
                if failures > tries:
                    reason = f"{method} {path}: {exc} (gave up after {failures} attempts)"
                    raise FeishuError(reason, retry_after=delay) from None
                retries = f"{failures}/{self.max_retries}"
                log.warning("feishu %s %s: %s; retry %s in %.2fs", method, path, exc, retries, delay)
                await asyncio.sleep(delay)

    async def _attempt(
        self,
        method: str,
        path: str,
        params: dict[str, str] | None,
        body: dict[str, JSON] | None,
        chat: str | None,
        api: str = MESSAGE_API,
    ) -> dict[str, JSON]:
        token = await self._tenant_token()
        async with self.limiter.slot(chat, api):
            response = await self._http(method, path, token=token, params=params, body=body)
        status, code = response.status, response.body.get("code")
        reason = self._describe(response)
        if status == 429 or code == APP_RATE_LIMITED:
            raise _Throttled(reason, APP_RATE_LIMITED, wait=_reset_seconds(response.headers))
        if code in CHAT_WAIT_CODES:
            raise _Throttled(reason, code, chat=chat)
        if code in TOKEN_CODES:
            raise _TokenRejected(reason, token, code)
        if status >= 500 or (status < 400 and code is None):
            raise _Transient(reason)
        if code != 0 or status >= 400:
            meaning = PERMANENT_CODES.get(code) if isinstance(code, int) else None
            reason = f"{reason} — {meaning}" if meaning else reason
            raise FeishuError(f"{method} {path}: {reason}", code=code, permanent=True)
        return response.body

    def _describe(self, response: _Response) -> str:
        """`HTTP 400, code 230002: <msg> (log_id …)`, with any secret blanked out."""
        body = response.body
        text = f"HTTP {response.status}"
        if "code" in body:
            text += f", code {body['code']}: {body.get('msg', '')}"
        error = body.get("error")
        if isinstance(error, dict) and error.get("log_id"):
            text += f" (log_id {error['log_id']})"
        return self._redact(text)

    # --- the tenant_access_token (§5) ------------------------------------------------------

    async def _tenant_token(self) -> str:
        token = self._valid_token()
        if token is None:
            self._bind_to_running_loop()
            async with self._token_lock:  # single flight: whoever waited here finds the new token
                token = self._valid_token() or await self._fetch_token()
        return token

    def _valid_token(self) -> str | None:
        return self._token if self._clock() < self._token_refresh_at else None

    def _forget_token(self, token: str) -> None:
        if self._token == token:  # a token already replaced by a concurrent call stays replaced
            self._token = None
            self._token_refresh_at = 0.0

    async def _fetch_token(self) -> str:
        credentials = {"app_id": self.app_id, "app_secret": self._secret}
        async with self.limiter.slot(None):  # app-wide: a pause the platform asked for holds this too
            response = await self._http("POST", TOKEN_PATH, token=None, body=credentials)
        body, code = response.body, response.body.get("code")
        if response.status == 429 or code == APP_RATE_LIMITED:  # a wait, like any other call's
            reason = f"tenant_access_token: {self._describe(response)}"
            raise _Throttled(reason, APP_RATE_LIMITED, wait=_reset_seconds(response.headers))
        if response.status >= 500:
            raise _Transient(f"tenant_access_token: {self._describe(response)}")
        token, expire = body.get("tenant_access_token"), body.get("expire")
        if code != 0 or not isinstance(token, str) or not token:
            raise FeishuError(
                f"Feishu refused the credentials of app {self.app_id} ({self._describe(response)}): "
                "check app_id and app_secret",
                code=code if isinstance(code, int) else None,
                permanent=True,
            )
        lifetime = max(0.0, float(expire)) if isinstance(expire, (int, float)) else 7200.0
        self._token = token
        # Renew 10 minutes early; a token issued with little time left is renewed half-way instead.
        self._token_refresh_at = self._clock() + lifetime - min(TOKEN_REFRESH_MARGIN, lifetime / 2)
        log.info("feishu: new tenant_access_token for app %s, valid %.0fs", self.app_id, lifetime)
        return token

    def _redact(self, text: str) -> str:
        for secret in (self._secret, self._token):
            if secret:
                text = text.replace(secret, "***")
        return text

    # --- HTTP ------------------------------------------------------------------------------

    async def _http(
        self,
        method: str,
        path: str,
        *,
        token: str | None,
        params: Mapping[str, str] | None = None,
        body: dict[str, JSON] | None = None,
    ) -> _Response:
        import aiohttp

        session = self._bind_to_running_loop()
        headers = {"Content-Type": "application/json; charset=utf-8"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        data = json.dumps(body, ensure_ascii=False).encode("utf-8") if body is not None else None
        request = session.request(
            method,
            self.base_url + path,
            params=params,
            data=data,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self.timeout),
        )
        try:
            async with request as reply:
                raw = await reply.read()
                reply_headers = {name.lower(): value for name, value in reply.headers.items()}
                return _Response(reply.status, reply_headers, _json_object(raw))
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            # Only the exception's type and text: aiohttp errors can carry the request headers.
            raise _Transient(self._redact(f"{type(exc).__name__}: {exc}".rstrip(": "))) from None

    def _bind_to_running_loop(self) -> aiohttp.ClientSession:
        """The session (and token lock) of the running loop: asyncio objects belong to one loop."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._session, self._token_lock = loop, None, asyncio.Lock()
        if self._session is None or self._session.closed:
            import aiohttp

            self._session = aiohttp.ClientSession()
        return self._session


def card_reference(card_id: str) -> dict[str, Any]:
    """The content of a message that shows card entity `card_id` (FEISHU.md §6 B.2)."""
    return {"type": "card", "data": {"card_id": card_id}}


def _card_path(card_id: str) -> str:
    return f"{CARDS_PATH}/{quote(card_id, safe='')}"


def _op_uuid(card_id: str, sequence: int) -> str:
    """The idempotency key of one operation on a card entity: a retry of it is the same request."""
    return f"{card_id[:40]}-{sequence}"


def part_uuid(message_uuid: str, index: int) -> str:
    """The request uuid of part `index` of a message: at most 50 characters, the same every time."""
    suffix = f"-{index}"
    base = message_uuid
    if len(base) + len(suffix) > UUID_MAX:
        base = hashlib.sha256(base.encode("utf-8")).hexdigest()[: UUID_MAX - len(suffix)]
    return base + suffix


class _ChatOrder:
    """One FIFO lock per chat, dropped as soon as nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, chat: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(chat) or (asyncio.Lock(), 0)
        self._locks[chat] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[chat]
            if users == 1:
                del self._locks[chat]
            else:
                self._locks[chat] = (lock, users - 1)


def _reset_seconds(headers: Mapping[str, str]) -> float:
    """`x-ogw-ratelimit-reset` (seconds until the app's bucket refills, §7), 1 s when absent."""
    try:
        return max(0.0, float(headers.get("x-ogw-ratelimit-reset", "1")))
    except ValueError:
        return 1.0


def _json_object(raw: bytes) -> dict[str, JSON]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _message_id(body: dict[str, JSON]) -> str:
    data = body.get("data")
    message_id = data.get("message_id") if isinstance(data, dict) else None
    if not isinstance(message_id, str):
        raise FeishuError("Feishu accepted the message but returned no message_id", retry_after=1.0)
    return message_id
