"""The Feishu/Lark bot channel: events in (HTTP callback or long connection), replies out.

Both inbound paths end in the same two steps — verify, then `gateway.accept` (a durable write) —
and only then acknowledge, so an acknowledged event is never lost, and the acknowledgement never
waits for the model.

Approvals (tasks/pending.py) go out as a card with Approve / Reject buttons. A click arrives as a
`card.action.trigger` event, verified like every other event; the gateway takes the decision
(only the task's starter or an admin), the task runs on, and the card is patched to show who
decided what. A refused click (someone else, too late) changes nothing and gets an error toast.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Literal

from ...gateway.messages import OutboundMessage
from ...replies import Language, detect_language, fixed_reply
from ..base import Channel, read_body
from .events import MAX_BODY, FeishuEventVerifier, Ignored, inbound_from_event
from .formatting import approval_card

if TYPE_CHECKING:
    from aiohttp import web

    from ...gateway.dispatcher import Gateway
    from ...tasks.pending import Pending
    from .api import FeishuAPI
    from .longconn import FeishuLongConnection

log = logging.getLogger("hermes_core.feishu")


class FeishuChannel(Channel):
    name = "feishu"

    def __init__(
        self,
        gateway: Gateway,
        *,
        app_id: str,
        app_secret: str,
        verification_token: str | None = None,
        encrypt_key: str | None = None,
        base_url: str = "https://open.feishu.cn",
        mode: Literal["webhook", "longconn"] = "webhook",
        api: FeishuAPI | None = None,
    ) -> None:
        from .api import FeishuAPI

        self.gateway = gateway
        self.mode = mode
        self.app_id, self._app_secret, self.base_url = app_id, app_secret, base_url
        self.verifier = FeishuEventVerifier(verification_token, encrypt_key)
        self.api = api or FeishuAPI(app_id, app_secret, base_url=base_url)
        self.bot_open_id: str | None = None
        self._longconn: FeishuLongConnection | None = None
        self._background: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        bot = await self.api.bot_info()
        self.bot_open_id = bot.get("open_id")
        log.info("feishu bot %s (%s) ready in %s mode", bot.get("app_name"), self.bot_open_id, self.mode)
        if self.mode == "longconn":
            from .longconn import FeishuLongConnection

            self._longconn = FeishuLongConnection(
                self.app_id, self._app_secret, self.on_event, domain=self.base_url
            )
            await self._longconn.start()

    def routes(self) -> list[web.RouteDef]:
        from aiohttp import web

        return [web.post("/feishu/events", self.handle_callback)]

    async def handle_callback(self, request: web.Request) -> web.Response:
        from aiohttp import web

        body = await read_body(request, MAX_BODY)
        if body is None:
            return web.json_response({"error": "request body too large"}, status=413)
        check = self.verifier.check(request.headers, body)
        if not check.accepted:
            log.warning("feishu callback rejected (%d): %s", check.status, check.body.get("error"))
            return web.json_response(check.body, status=check.status)
        if check.envelope is not None:
            if not self.gateway.accepting:
                return web.json_response({"error": "shutting down"}, status=503)  # Feishu pushes again later
            answer = await self.on_event(check.envelope)
            if answer is not None:
                return web.json_response(answer)
        return web.json_response(check.body)

    async def on_event(self, envelope: dict[str, Any]) -> dict[str, Any] | None:
        """Persist a verified event (both modes). Returns once it is durable: then it may be acked.
        A card click returns the callback's answer (a toast)."""
        if _event_type(envelope) == "card.action.trigger":
            return await self.on_card_action(envelope)
        message = inbound_from_event(envelope, self.bot_open_id)
        if isinstance(message, Ignored):
            log.debug("feishu event ignored: %s", message.reason)
            return None
        await self.gateway.accept(message)
        return None

    async def on_card_action(self, envelope: dict[str, Any]) -> dict[str, Any]:
        """An Approve / Reject click: decide, patch the card, answer with a toast."""
        from ...tasks.pending import DecisionRefused

        event = envelope.get("event") or {}
        operator = (event.get("operator") or {}).get("open_id")
        value = (event.get("action") or {}).get("value") or {}
        card_message = (event.get("context") or {}).get("open_message_id")
        approval_id, decision = value.get("approval_id"), value.get("decision")
        if not (isinstance(operator, str) and isinstance(approval_id, str) and decision in DECISIONS):
            return _toast("error", "approval_unknown", "zh")
        try:
            pending, _ = await self.gateway.decide(approval_id, operator, self.name, decision == "approve")
        except DecisionRefused as refused:
            log.warning("feishu: %s may not decide %s: %s", operator, approval_id, refused.reason)
            return _toast("error", refused.reason, _language(refused.pending))
        language = _language(pending)
        if isinstance(card_message, str) and card_message:
            line = fixed_reply(f"approval_{pending.status}", language).format(tool=pending.tool, by=operator)
            task = asyncio.create_task(self._show_decision(card_message, pending, line))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        return _toast("success", f"approval_{pending.status}", language, tool=pending.tool, by=operator)

    async def _show_decision(self, card_message: str, pending: Pending, line: str) -> None:
        text = (pending.resume or {}).get("text", "")
        request = fixed_reply("approval_request", _language(pending)).format(
            tool=pending.tool, arguments=pending.arguments, id=pending.id
        )
        try:
            await self.api.patch_card(card_message, approval_card(request, pending.summary(), line))
        except Exception as exc:  # the decision stands; only its display is stale
            log.warning("feishu: could not update the approval card %s (%s): %s", card_message, text[:0], exc)

    async def send(self, message: OutboundMessage) -> str | None:
        return await self.api.send(message)

    async def stop(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=5)
        if self._longconn is not None:
            await self._longconn.stop()
            self._longconn = None
        await self.api.aclose()


DECISIONS = ("approve", "reject")


def _event_type(envelope: dict[str, Any]) -> str | None:
    header = envelope.get("header") or {}
    return header.get("event_type") or (envelope.get("event") or {}).get("type")


def _language(pending: Pending | None) -> Language:
    return detect_language(((pending.resume or {}).get("text", "") if pending else "") or "中")


def _toast(kind: str, key: str, language: Language, **fields: str) -> dict[str, Any]:
    return {"toast": {"type": kind, "content": fixed_reply(key, language).format(**fields)}}
