"""The one extension point for channels: deliver an outbound message, start and stop."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from ..gateway.messages import OutboundMessage


class DeliveryError(Exception):
    """A send failed. `retry_after` (seconds) is set when trying again later may succeed.

    `permanent`: trying again cannot help (the bot was removed from the chat, the content is
    refused). `throttled`: nothing failed, the platform asked us to wait (rate limited); the outbox
    waits and tries again without counting it as a failed attempt.
    """

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        permanent: bool = False,
        throttled: bool = False,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.permanent = permanent
        self.throttled = throttled


class Channel(ABC):
    name: str = "channel"

    @abstractmethod
    async def send(self, message: OutboundMessage) -> str | None:
        """Deliver one message; return the platform's id for it. Raise DeliveryError on failure."""

    async def start(self) -> None:
        """Connect, fetch what the channel needs (e.g. the bot's own id). Default: nothing."""
        return None

    async def stop(self) -> None:
        """Close connections. Safe to call more than once."""
        return None


async def read_body(request: Any, limit: int) -> bytes | None:
    """An HTTP request's body, or None when it is larger than `limit` bytes (read no further; a
    compressed body counts decompressed, so a gzip bomb stops at `limit`). A body that cannot be
    decoded (a Content-Encoding it does not have) raises a 400 with a one-line JSON error."""
    from aiohttp import web
    from aiohttp.web_protocol import RequestPayloadError

    if request.content_length is not None and request.content_length > limit:
        return None
    body = bytearray()
    try:
        async for chunk in request.content.iter_chunked(64 * 1024):
            body += chunk
            if len(body) > limit:
                return None
    except RequestPayloadError as exc:
        request.content.feed_eof()  # the rest cannot be decoded either: the server must not read on
        error = " ".join(str(exc).split()).removeprefix("400, message: ")[:200]
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"undecodable body: {error}"}),
            content_type="application/json",
            headers={"Connection": "close"},
        ) from None
    return bytes(body)
