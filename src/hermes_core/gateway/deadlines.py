"""Read deadlines for `serve`'s HTTP server: slow clients are cut off, not waited for.

aiohttp's server has no header or body timeout: its one timer closes connections that sit idle
between requests (`keepalive_timeout`). A client that sends one header byte a second keeps its
connection, and with a few hundred such clients the server, for as long as it likes (slowloris).

`ReadDeadlines` adds the two timeouts of `gateway.header_timeout` and `gateway.body_timeout`:

- a thin asyncio protocol in front of each connection's aiohttp protocol arms the header timer
  when the connection opens, and again at the first byte of a further request on a kept-alive
  connection; when it fires, the client gets `408 Request Timeout` and the connection is closed;
- the `middleware` disarms it when aiohttp hands the complete request to the application, and arms
  the body timer; if the body has not fully arrived by then, the connection is closed (the handler's
  read fails, as when a client goes away). A handler that is slow itself (an agent turn) is not
  affected: the body timer only looks at whether the client has sent the whole body.

`DeadlineSite` is aiohttp's TCP site with every connection passing through the deadlines first.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from ..config import ConfigError

log = logging.getLogger("hermes_core.server")

TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Connection(asyncio.Protocol):
    """One connection: forwards everything to aiohttp's protocol, and keeps the header timer."""

    def __init__(self, inner: Any, deadlines: ReadDeadlines) -> None:
        self.inner = inner
        self.deadlines = deadlines
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.idle = False  # between requests of a kept-alive connection: no timer until a byte comes
        self.draining: Any = None  # the body of an answered request that aiohttp still reads (lingering)
        self.cut = False  # closed for being too slow

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.deadlines.connections[transport] = self
        self.inner.connection_made(transport)
        self.arm(self.deadlines.header_timeout, "headers")

    def data_received(self, data: bytes) -> None:
        if self.idle:  # the first byte of the next request: its headers are due from now
            self.idle = False
            self.arm(self.deadlines.header_timeout, "headers")
        self.inner.data_received(data)
        if self.draining is not None and self.draining.is_eof():
            self.draining, self.idle = None, True

    def request_done(self, payload: Any) -> None:
        """The application answered; the next request's header clock starts with its first byte
        (once aiohttp has read what is left of this one's body, within its `lingering_time`)."""
        if payload.is_eof():
            self.idle = True
        else:
            self.draining = payload

    def eof_received(self) -> bool | None:
        keep_open: bool | None = self.inner.eof_received()
        return keep_open

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        self.deadlines.connections.pop(self.transport, None)  # type: ignore[arg-type]
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def arm(self, seconds: float, what: str) -> None:
        self.disarm()
        self.timer = asyncio.get_running_loop().call_later(seconds, self.cut_off, what)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def cut_off(self, what: str) -> None:
        """Close the connection: its request's `what` did not arrive in time. Before a request has
        reached the application nothing else writes to the connection, so it is told why (408)."""
        self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            log.debug("closing a connection whose %s did not arrive in time", what)
            self.cut = True
            if what == "headers":
                self.transport.write(TIMED_OUT)
            self.transport.close()


class ReadDeadlines:
    """The header and body deadlines of one server (see the module's docstring)."""

    def __init__(self, header_timeout: float, body_timeout: float) -> None:
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.connections: dict[asyncio.BaseTransport, _Connection] = {}

    def wrap(self, factory: Callable[[], Any]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory for `loop.create_server`: aiohttp's, behind the header timer."""
        return lambda: _Connection(factory(), self)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        connection = self.connections.get(request.transport) if request.transport is not None else None
        if connection is None:  # not one of ours (a test server): no deadlines
            return await handler(request)
        connection.disarm()  # the headers are in
        body_timer = None
        if not request.content.is_eof():
            body_timer = asyncio.get_running_loop().call_later(
                self.body_timeout, _body_late, request, connection
            )
        try:
            return await handler(request)
        except ConnectionError:
            if not connection.cut:
                raise
            return web.Response(status=408)  # not sent: the connection is closed; aiohttp lets it go
        finally:
            if body_timer is not None:
                body_timer.cancel()
            connection.request_done(request.content)


def _body_late(request: web.Request, connection: _Connection) -> None:
    if not request.content.is_eof():
        connection.cut_off(f"body ({request.method} {request.path})")


class DeadlineSite(web.BaseSite):
    """A TCP site whose connections pass through `deadlines` (aiohttp's TCPSite, otherwise)."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, deadlines: ReadDeadlines) -> None:
        super().__init__(runner)
        self.host, self.port, self.deadlines = host, port, deadlines

    @property
    def name(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        try:
            self._server = await loop.create_server(
                self.deadlines.wrap(server), self.host, self.port, reuse_address=True
            )
        except OSError as exc:  # a start-up error like the others: one line naming the fix, exit 2
            raise ConfigError(cannot_listen(self.host, self.port, exc)) from None


def cannot_listen(host: str, port: int, exc: OSError) -> str:
    """Why `host:port` cannot be listened on, and what to change."""
    where, choose = f"port {port} on {host}", "choose another port with --port or gateway.port"
    if exc.errno == errno.EADDRINUSE:
        return f"{where} is already in use: stop the process holding it, or {choose}"
    if exc.errno == errno.EACCES:
        return f"{where} needs privileges: {choose} (above 1023)"
    return f"cannot listen on {where} ({exc.strerror}): check --host/gateway.host and --port/gateway.port"
