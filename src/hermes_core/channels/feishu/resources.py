"""Downloading a message's picture or file: the message resource API (docs/media.md).

    GET /open-apis/im/v1/messages/{message_id}/resources/{file_key}?type=image|file
    Authorization: Bearer <tenant_access_token>

Success is HTTP 200 with the bytes as the body, the type in `Content-Type` and the name in
`Content-Disposition` (`filename`, or RFC 2231 `filename*`), as the official SDK reads them
(`lark_oapi` `MessageResource.get`: any 2xx is the file, else a JSON error body). A failure is a
JSON body `{"code", "msg"}`: the documented codes get a plain reason (`REFUSALS`); an invalid or
missing token (any of api.py's `TOKEN_CODES`) is renewed once, as for every other call. A rate limit
(HTTP 429 or code 99991400) is no failure: every call of the client pauses for
`x-ogw-ratelimit-reset` seconds (api.py's limiter, FEISHU.md §7) and the download is tried again,
at most `MAX_WAITS` times and within its `timeout`.

Bounded on every side: one `timeout` for headers and body together; a `Content-Length` above the
limit is refused before a byte is read, and a body without one is read in chunks and the
connection closed as soon as it passes the limit; an error body is read to 64 KB at most.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from email.message import Message
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from ..media import Fetched, MediaRefused, megabytes
from .api import TOKEN_CODES

if TYPE_CHECKING:
    from .api import FeishuAPI

RESOURCE_PATH = "/open-apis/im/v1/messages/{message_id}/resources/{file_key}"
CHUNK = 64 * 1024
ERROR_BODY_MAX = 64 * 1024
# the resource API's error table (open.feishu.cn …/im-v1/message-resource/get): what each means
REFUSALS: dict[int, str] = {
    234001: "the request was refused as invalid",
    234002: "the bot may not read this message (a permission is missing)",
    234003: "the file does not belong to this message",
    234004: "the bot is not in this chat",
    234037: "the file is larger than Feishu serves (100 MB)",
    234043: "files inside forwarded or card messages cannot be downloaded",
}
RATE_LIMITED = 99991400
MAX_WAITS = 6  # rate-limit answers one download waits out


class _Throttled(Exception):
    def __init__(self, wait: float) -> None:
        super().__init__(f"rate limited for {wait:g} s")
        self.wait = wait


class _TokenRefused(Exception):
    def __init__(self, token: str) -> None:
        super().__init__("the tenant token was refused")
        self.token = token


async def download_resource(
    api: FeishuAPI, message_id: str, file_key: str, kind: str, *, limit: int, timeout: float
) -> Fetched:
    """The resource's bytes; `MediaRefused` (`too_large`, `timeout`, `unavailable`) otherwise."""
    renewed, waits, waited = False, 0, 0.0
    while True:
        token = await api._tenant_token()
        try:
            return await _get(api, token, message_id, file_key, kind, limit, timeout)
        except _TokenRefused as refused:  # renewed once, as for every other call
            if renewed:
                raise MediaRefused(
                    "unavailable", "token refused twice", why="Feishu refused the bot's token"
                ) from None
            renewed = True
            api._forget_token(refused.token)
        except _Throttled as throttled:  # a wait, shared with every call of the client
            waits, waited = waits + 1, waited + throttled.wait
            if waits > MAX_WAITS or waited > timeout:
                raise MediaRefused(
                    "timeout", f"{kind} {file_key}: still rate limited after {waited:g} s"
                ) from None
            api.limiter.pause_until(api.limiter.now() + throttled.wait)
            await asyncio.sleep(throttled.wait)


async def _get(
    api: FeishuAPI, token: str, message_id: str, file_key: str, kind: str, limit: int, timeout: float
) -> Fetched:
    import aiohttp

    path = RESOURCE_PATH.format(message_id=quote(message_id, safe=""), file_key=quote(file_key, safe=""))
    session = api._bind_to_running_loop()
    request = session.get(
        api.base_url + path,
        params={"type": kind},
        headers={"Authorization": f"Bearer {token}"},
        timeout=aiohttp.ClientTimeout(total=timeout),
    )
    try:
        async with request as reply:
            content_type = reply.headers.get("Content-Type", "")
            if not 200 <= reply.status < 300:
                raise _refusal(reply.status, await reply.content.read(ERROR_BODY_MAX), token, reply.headers)
            if reply.content_length is not None and reply.content_length > limit:
                reply.close()  # not a byte of the body is read
                raise _too_large(megabytes(reply.content_length), limit)
            data = bytearray()
            async for chunk in reply.content.iter_chunked(CHUNK):
                data += chunk
                if len(data) > limit:
                    reply.close()  # stop here: the rest is never read
                    raise _too_large(f"more than {megabytes(limit)}", limit)
            return Fetched(bytes(data), content_type, _file_name(reply.headers.get("Content-Disposition")))
    except asyncio.TimeoutError:
        raise MediaRefused("timeout", f"{kind} {file_key}: no answer within {timeout:g} s") from None
    except aiohttp.ClientError as exc:
        reason = api._redact(f"{type(exc).__name__}: {exc}")
        raise MediaRefused("unavailable", reason, why="Feishu could not be reached") from None


def _refusal(status: int, raw: bytes, token: str, headers: Mapping[str, str]) -> Exception:
    try:
        body: Any = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        body = {}
    code = body.get("code") if isinstance(body, dict) else None
    if status == 429 or code == RATE_LIMITED:
        return _Throttled(_reset_seconds(headers))
    if code in TOKEN_CODES:
        return _TokenRefused(token)
    if code == 234037:
        return _too_large("more than 100 MB", None)
    meaning = REFUSALS.get(code) if isinstance(code, int) else None
    why = meaning or (f"Feishu answered HTTP {status}" + (f", code {code}" if code is not None else ""))
    return MediaRefused("unavailable", f"HTTP {status}, code {code}: {why}", why=why)


def _too_large(size: str, limit: int | None) -> MediaRefused:
    shown = megabytes(limit) if limit is not None else "100 MB"
    return MediaRefused("too_large", f"attachment of {size} over {shown}", size=size, limit=shown)


def _reset_seconds(headers: Mapping[str, str]) -> float:
    """`x-ogw-ratelimit-reset` (seconds, FEISHU.md §7; any case), 1 s when absent or odd."""
    try:
        return min(60.0, max(0.0, float(headers.get("x-ogw-ratelimit-reset", "1"))))
    except ValueError:
        return 1.0


def _file_name(disposition: str | None) -> str | None:
    """The `filename` (or RFC 2231 `filename*`) of a Content-Disposition header."""
    if not disposition:
        return None
    header = Message()
    header["Content-Disposition"] = disposition
    name = header.get_filename()
    return str(name) if name else None


__all__ = ["REFUSALS", "RESOURCE_PATH", "download_resource"]
