"""The one extension point for channels: deliver an outbound message, start and stop; and the HTTP
helpers the HTTP channels share (a bounded body read, who is on this machine). A channel imports
this module and channels/seam.py (the messages and the gateway's `Inbox`), nothing of gateway/."""

from __future__ import annotations

import ipaddress
import json
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .seam import InboundMessage, OutboundMessage, TurnWatcher

if TYPE_CHECKING:
    from aiohttp import web


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

    def watch(self, message: InboundMessage) -> TurnWatcher | None:
        """Whoever wants to see `message`'s turn as it runs (a streamed reply), told as it starts;
        None (the default): the channel only sends the finished replies."""
        return None

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


FAILED_LOGIN_DELAY = 0.2  # seconds a refused token waits (the console's, /metrics'): guessing stays slow


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`; False for 0.0.0.0, ::, names and other addresses."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_local(request: web.Request) -> bool:
    """From this machine, to this machine by a loopback name, and not forwarded by a proxy."""
    if any(name in request.headers for name in ("Forwarded", "X-Forwarded-For", "X-Real-IP")):
        return False
    host = urlsplit(f"//{request.host}").hostname or ""
    return is_loopback(request.remote or "") and is_loopback(host)


def json_object(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; ValueError saying why not (never RecursionError or a decode error):
    the one reader of request bodies for every channel (hostile input: tests/test_fuzz_edges.py)."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("the body is not UTF-8") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError, or an integer with too many digits
        raise ValueError(f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data
