"""Who may open the console: the rules, and the middleware that applies them to every request.

Whether the console may go without a token is decided by the address `serve` listens on, never by
a request: a request's remote address and its forwarding headers are whatever the last hop (a
relay, a proxy, a client) makes them.

- Served on a loopback address (127.0.0.1, ::1, localhost) without a token (HERMES_CONSOLE_TOKEN,
  or the variable `console.token_env` names), the console is open to whatever reaches that
  loopback port, and answers only requests that name this machine (`Host: 127.0.0.1`,
  `localhost`, `[::1]`) and carry no forwarding header: a page on another site cannot reach it
  through DNS rebinding, and a reverse proxy in front of the port does not open it. A plain TCP
  relay on the machine (socat, `ssh -R`, a container's port forward) does: set the token before
  relaying anything to the port.
- Served on any other address, the console needs the token (without one it is off, or with
  `console.enabled: true` serve refuses to start), and every request must carry it, whatever its
  remote address or headers: `Authorization: Bearer <token>`, or the cookie that the login page
  sets (HttpOnly, SameSite=Strict, a keyed hash of the token, never the token).
- Changes (POST) must come from the console's own pages: JSON bodies only (a form on another site
  cannot send one without the browser asking first) and no foreign `Origin`.

Every answer gets a Content-Security-Policy that allows only the console's own script and style:
even text that escaped escaping could not run.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

# declared with the channels: the webhook asks too, and /metrics waits as long after a refused token
from ..channels.base import FAILED_LOGIN_DELAY, is_local, is_loopback
from ..config import ConfigError, ConsoleConfig

log = logging.getLogger("hermes_core.console")

COOKIE = "hermes_console"
OPEN_PATHS = ("/console/login", "/console/static/")  # no secret behind them; the token check skips them
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def console_token(config: ConsoleConfig, host: str, environ: Mapping[str, str]) -> tuple[bool, str | None]:
    """Whether to serve the console on `host`, and the token it then requires (None: none).

    Raises ConfigError for `enabled: true` on a non-loopback address without a token."""
    token = environ.get(config.token_env) or None
    if config.enabled is False:
        return False, None
    if is_loopback(host) or token is not None:
        return True, token
    if config.enabled:
        raise ConfigError(
            f"console: refusing to serve the console on {host} without a token; set {config.token_env} "
            "(or serve on 127.0.0.1, or set console.enabled: false)"
        )
    log.info("console off: %s is not a loopback address and %s is not set", host, config.token_env)
    return False, None


class Access:
    """The token check (or the local-only check without one) as an aiohttp middleware, for a
    console served on `bind`: without a token, only a loopback `bind` is accepted."""

    def __init__(self, token: str | None, bind: str = "127.0.0.1") -> None:
        if token is None and not is_loopback(bind):
            raise ConfigError(f"console: a console served on {bind} needs a token; none is set")
        self.token = token
        self.cookie = _cookie_value(token) if token else None

    @property
    def required(self) -> bool:
        return self.token is not None

    def allows(self, request: web.Request) -> bool:
        """A request carrying the token (header or cookie), or a local one when there is no token."""
        if self.token is None:
            return is_local(request)
        assert self.cookie is not None
        header = request.headers.get("Authorization", "")
        bearer = header[7:].strip() if header[:7].lower() == "bearer " else ""
        by_header = bool(bearer) and hmac.compare_digest(bearer.encode(), self.token.encode())
        by_cookie = hmac.compare_digest(request.cookies.get(COOKIE, "").encode(), self.cookie.encode())
        return by_header or by_cookie

    def login(self, response: web.StreamResponse, request: web.Request) -> None:
        """Set the session cookie on `response` (after the right token was typed)."""
        assert self.cookie is not None
        secure = request.secure or request.headers.get("X-Forwarded-Proto") == "https"
        response.set_cookie(
            COOKIE, self.cookie, path="/console", httponly=True, samesite="Strict", secure=secure
        )

    def token_matches(self, typed: str) -> bool:
        return self.token is not None and hmac.compare_digest(typed.encode(), self.token.encode())

    async def refuse_guess(self) -> None:
        await asyncio.sleep(FAILED_LOGIN_DELAY)

    def middleware(self, denied: Callable[[web.Request, int], web.StreamResponse]) -> Middleware:
        """The middleware; `denied(request, status)` renders a refusal (a login page, or JSON)."""

        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            open_path = request.path.startswith(OPEN_PATHS)
            if self.token is None and not is_local(request):
                response = denied(request, 403)
            elif not open_path and not self.allows(request):
                if "Authorization" in request.headers:  # a wrong token: guessing stays slow
                    await self.refuse_guess()
                response = denied(request, 401)
            elif request.method == "POST" and not same_origin(request, allow_form=open_path):
                response = web.json_response({"error": "cross-site request refused"}, status=403)
            else:
                response = await handler(request)
            return response

        return guard


async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: the headers above, on every answer, streamed ones included."""
    response.headers.update(HEADERS)


def same_origin(request: web.Request, *, allow_form: bool = False) -> bool:
    """A POST from the console's own pages: a JSON body (or the login form), no foreign Origin."""
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        return False
    form = request.content_type == "application/x-www-form-urlencoded"
    return request.content_type == "application/json" or (allow_form and form)


def _cookie_value(token: str) -> str:
    return hmac.new(token.encode(), b"hermes-console-session", hashlib.sha256).hexdigest()
