"""The Feishu/Lark bot channel: events in (HTTP callback or long connection), replies out.

Both inbound paths end in the same two steps — verify, then `gateway.accept` (a durable write) —
and only then acknowledge, so an acknowledged event is never lost, and the acknowledgement never
waits for the model.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

from ...gateway.messages import OutboundMessage
from ..base import Channel, read_body
from .events import MAX_BODY, FeishuEventVerifier, Ignored, inbound_from_event

if TYPE_CHECKING:
    from aiohttp import web

    from ...gateway.dispatcher import Gateway
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
            await self.on_event(check.envelope)
        return web.json_response(check.body)

    async def on_event(self, envelope: dict[str, Any]) -> None:
        """Persist a verified event (both modes). Returns once it is durable: then it may be acked."""
        message = inbound_from_event(envelope, self.bot_open_id)
        if isinstance(message, Ignored):
            log.debug("feishu event ignored: %s", message.reason)
            return
        await self.gateway.accept(message)

    async def send(self, message: OutboundMessage) -> str | None:
        return await self.api.send(message)

    async def stop(self) -> None:
        if self._longconn is not None:
            await self._longconn.stop()
            self._longconn = None
        await self.api.aclose()
