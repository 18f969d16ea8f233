"""One HTTP request to a URL the model chose, made safe by construction (the web tools' fetcher).

A model that reads web pages can be told by one of them to fetch `http://169.254.169.254/…` or
`http://127.1:8080/admin`: server-side request forgery. `fetch_url` is the only way the web tools
(tools/web.py, tools/web_search.py) reach the network, and anything else that sends a request to a
URL it did not write itself should use it too. What it guarantees:

- **URLs**: http and https only; no user name or password in the URL; no percent-encoded host.
- **Addresses, not spellings**: the host is resolved once (an IP literal, a legacy IPv4 spelling
  such as `2130706433`, `0177.0.0.1`, `0x7f.1` or `127.1` read as `inet_aton` reads it, or a
  name through the resolver) and every address is judged with `ipaddress`: loopback, private,
  link-local, multicast, carrier-grade NAT (100.64.0.0/10), unique-local (fc00::/7), unspecified,
  reserved and the cloud metadata addresses are refused, also when wrapped in IPv6
  (IPv4-mapped `::ffff:127.0.0.1`, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`, Teredo). `localhost`
  and metadata host names are refused by name as well.
- **No rebinding**: the connection goes to the address that was checked. aiohttp's connector is
  given a resolver that only knows the checked answers (`PinnedResolver`), so the URL keeps its
  name (the Host header and TLS SNI are the name's) and no second DNS answer is ever used.
- **Redirects** are followed by hand (at most `max_redirects`, loops detected), each target
  checked again; credentials headers are dropped when a redirect leaves the origin.
- **Limits**: `max_bytes` of decoded body (read in chunks, then stopped), a total deadline, and a
  slow-drip floor (`min_bytes_per_interval` in every `interval` seconds). Bodies are decompressed
  here (gzip, deflate), never by aiohttp, with a bound on the output: a response that inflates more
  than `MAX_INFLATION` times past the size limit is a compression bomb and refused.
- **Content types**: an optional allow-list checked on the headers before the body is read.

The operator opens internal hosts with `allow_hosts` (names, addresses or networks, e.g.
`wiki.internal`, `10.0.0.0/8`); in `allow_list` mode nothing else may be fetched at all.
Every refusal and failure is a `FetchError` whose message is meant for the model to read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
import zlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

if TYPE_CHECKING:
    import aiohttp
    from aiohttp.abc import AbstractResolver
    from yarl import URL

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str], Awaitable[list[str]]]  # a host name → its addresses, as text
FetchMode = Literal["off", "allow_list", "public"]

REDIRECTS = (301, 302, 303, 307, 308)
MAX_INFLATION = 100  # decoded/encoded ratio past the size limit: a compression bomb, not a big page
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(text)
    for text in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254", "192.0.0.192")
)
REFUSED_NAMES = ("localhost", "metadata.google.internal", "metadata.goog", "metadata", "instance-data")
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"})
NAT64 = ipaddress.ip_network("64:ff9b::/96")
# IANA special-purpose blocks that older Pythons' `is_global` still calls global
SPECIAL_PURPOSE = tuple(
    ipaddress.ip_network(text) for text in ("192.0.0.0/24", "192.88.99.0/24", "100::/64", "2001::/23")
)


class FetchError(Exception):
    """A request refused or failed; the message says why, in words the model can act on."""


@dataclass(frozen=True)
class FetchLimits:
    """How much one fetch may take: bytes, seconds, redirects, and which content types it accepts."""

    max_bytes: int = 5_000_000  # decoded body bytes kept; past them the body is cut (`truncated`)
    timeout: float = 20.0  # seconds for the whole fetch, redirects included
    connect_timeout: float = 10.0
    interval: float = 5.0  # the slow-drip window, in seconds
    min_bytes_per_interval: int = 256  # fewer bytes in a window: the server is dripping
    max_redirects: int = 5
    content_types: tuple[str, ...] = ()  # allowed media types ("text/*" allowed); empty: any


@dataclass(frozen=True)
class AddressGuard:
    """Which hosts may be reached: `public` (any public address, plus `allow_hosts`), `allow_list`
    (only `allow_hosts`) or `off`. `resolver` turns a name into addresses (tests inject one)."""

    mode: FetchMode = "public"
    allow_hosts: tuple[str, ...] = ()
    resolver: Resolver | None = None

    def allows_name(self, host: str) -> bool:
        return normal_host(host) in {normal_host(h) for h in self.allow_hosts if not _is_network(h)}

    def allows_address(self, address: Address) -> bool:
        networks = [ipaddress.ip_network(h, strict=False) for h in self.allow_hosts if _is_network(h)]
        return any(address.version == net.version and address in net for net in networks)


@dataclass
class FetchResult:
    """What came back: the status, headers, body (decoded from its Content-Encoding), and where."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    final_url: str
    truncated: bool = False
    redirects: list[str] = field(default_factory=list)

    @property
    def media_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";")[0].strip().lower()

    @property
    def charset(self) -> str | None:
        for part in self.headers.get("Content-Type", "").split(";")[1:]:
            key, _, value = part.partition("=")
            if key.strip().lower() == "charset" and value.strip():
                return value.strip().strip('"').lower()
        return None


async def fetch_url(
    url: str,
    guard: AddressGuard,
    limits: FetchLimits | None = None,
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> FetchResult:
    """`method` `url` within `limits`, reaching only what `guard` allows; FetchError otherwise.

    Certificates are verified against the system's CAs, or `ssl_context`'s (an internal CA), and
    against the URL's host name, also when the connection goes to the pinned address."""
    limits = limits or FetchLimits()
    if guard.mode == "off":
        raise FetchError("fetching URLs is turned off in this configuration (web.fetch: off)")
    try:
        return await asyncio.wait_for(
            _follow(url, guard, limits, method, dict(headers or {}), body, ssl_context), limits.timeout
        )
    except asyncio.TimeoutError:
        raise FetchError(f"the fetch took longer than {limits.timeout:g} s and was stopped") from None


async def _follow(
    url: str,
    guard: AddressGuard,
    limits: FetchLimits,
    method: str,
    headers: dict[str, str],
    body: bytes | None,
    ssl_context: ssl.SSLContext | None,
) -> FetchResult:
    import aiohttp

    pins = PinnedResolver()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=limits.connect_timeout)
    resolver = cast("AbstractResolver", pins)  # aiohttp's resolver protocol, without importing it here
    connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False, limit=4, ssl=ssl_context or True)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    ) as session:  # fmt: skip
        target, seen = checked_url(url), [url]
        while True:
            pins.pin(target.raw_host or "", await checked_addresses(target, guard))
            response = await _send(session, target, method, headers, body)
            async with response:
                following = _next_hop(response, target, limits, seen)
                if following is None:
                    return await _result(response, target, limits, seen)
            if following.origin() != target.origin():
                headers = {k: v for k, v in headers.items() if k.lower() not in CREDENTIAL_HEADERS}
            if response.status == 303 or (response.status in (301, 302) and method == "POST"):
                method, body = "GET", None
            target = following


async def _send(
    session: aiohttp.ClientSession, target: URL, method: str, headers: dict[str, str], body: bytes | None
) -> aiohttp.ClientResponse:
    import aiohttp

    sent = {"User-Agent": "hermes-kernel (+web tools)", "Accept-Encoding": "gzip, deflate", **headers}
    try:
        return await session.request(method, target, headers=sent, data=body, allow_redirects=False)
    except aiohttp.ClientSSLError as exc:
        raise FetchError(f"TLS error talking to {target.host}: {_reason(exc)}") from None
    except aiohttp.ClientConnectorError as exc:
        raise FetchError(f"cannot connect to {target.host}: {_reason(exc)}") from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        raise FetchError(f"the request to {target.host} failed: {_reason(exc)}") from None


def _next_hop(
    response: aiohttp.ClientResponse, current: URL, limits: FetchLimits, seen: list[str]
) -> URL | None:
    """The checked URL a redirect points to; None when the response is not a redirect."""
    from yarl import URL

    location = response.headers.get("Location")
    if response.status not in REDIRECTS or not location:
        return None
    try:
        following = current.join(URL(location))
    except ValueError:
        raise FetchError(f"the server redirected to an invalid URL: {location[:200]!r}") from None
    if str(following) in seen:
        raise FetchError(f"redirect loop: {' -> '.join([*seen, str(following)][-4:])}")
    if len(seen) > limits.max_redirects:
        raise FetchError(f"more than {limits.max_redirects} redirects; stopped at {following}")
    seen.append(str(following))
    return checked_url(str(following))


async def _result(
    response: aiohttp.ClientResponse, target: URL, limits: FetchLimits, seen: list[str]
) -> FetchResult:
    media_type = response.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if limits.content_types and not media_type_allowed(media_type, limits.content_types):
        shown = media_type or "no content type"
        raise FetchError(f"{shown} is not a content type this tool reads ({', '.join(limits.content_types)})")
    from multidict import CIMultiDict

    data, truncated = await read_body(response, limits)
    headers = CIMultiDict(response.headers)  # looked up in any case, as HTTP names are
    return FetchResult(response.status, headers, data, str(target), truncated, seen[1:])


def media_type_allowed(media_type: str, allowed: tuple[str, ...]) -> bool:
    return any(media_type == a or (a.endswith("/*") and media_type.startswith(a[:-1])) for a in allowed)


async def read_body(response: aiohttp.ClientResponse, limits: FetchLimits) -> tuple[bytes, bool]:
    """The decoded body, at most `max_bytes` of it (and whether more was cut), read in chunks
    under the slow-drip floor; a compression bomb or an unknown encoding is a FetchError."""
    decoder = Inflater(response.headers.get("Content-Encoding", ""), limits.max_bytes)
    window_start, window_bytes = time.monotonic(), 0
    while not decoder.full:
        left = limits.interval - (time.monotonic() - window_start)
        try:
            chunk = await asyncio.wait_for(response.content.readany(), max(left, 0.001))
        except asyncio.TimeoutError:
            chunk = None
        except Exception as exc:  # a broken connection, a bad chunked encoding
            raise FetchError(f"the response broke off: {_reason(exc)}") from None
        if chunk == b"":
            break
        window_bytes += len(chunk or b"")
        if time.monotonic() - window_start >= limits.interval:
            if window_bytes < limits.min_bytes_per_interval:
                raise FetchError(
                    f"the server sends too slowly (under {limits.min_bytes_per_interval} bytes in "
                    f"{limits.interval:g} s) and was cut off"
                )
            window_start, window_bytes = time.monotonic(), 0
        if chunk:
            decoder.feed(chunk)
    return decoder.finish()


class Inflater:
    """Decodes a body's Content-Encoding (identity, gzip, deflate) with a bound on the output."""

    def __init__(self, encoding: str, max_bytes: int) -> None:
        names = [part.strip().lower() for part in encoding.split(",") if part.strip()]
        unknown = [name for name in names if name not in ("identity", "gzip", "x-gzip", "deflate")]
        if unknown or len(names) > 1:
            raise FetchError(f"the response uses a content encoding this tool does not decode: {encoding}")
        self.kind = names[0] if names else "identity"
        self._inflate: Any = (
            None
            if self.kind == "identity"
            else zlib.decompressobj(wbits=47 if self.kind in ("gzip", "x-gzip") else zlib.MAX_WBITS)
        )
        self.max_bytes, self.parts, self.size, self.encoded, self.full = max_bytes, [b""], 0, 0, False

    def feed(self, chunk: bytes) -> None:
        self.encoded += len(chunk)
        if self._inflate is None:
            self._keep(chunk)
            return
        if self.kind == "deflate" and self.encoded == len(chunk) and not _zlib_header(chunk):
            self._inflate = zlib.decompressobj(wbits=-zlib.MAX_WBITS)  # raw deflate, as some servers send
        try:
            while chunk and not self.full:
                self._keep(self._inflate.decompress(chunk, self.max_bytes - self.size + 1))
                chunk = self._inflate.unconsumed_tail
        except zlib.error as exc:
            raise FetchError(f"the {self.kind} body is corrupt: {exc}") from None
        consumed = self.encoded - len(chunk)  # input zlib had not reached when the output filled up
        if self.full and self.size > consumed * MAX_INFLATION:
            raise FetchError(
                f"the {self.kind} body inflates past {self.max_bytes} bytes from {consumed} "
                "(a compression bomb); refused"
            )

    def _keep(self, data: bytes) -> None:
        room = self.max_bytes - self.size
        self.parts.append(data[:room])
        self.size += len(data)
        self.full = self.size > self.max_bytes

    def finish(self) -> tuple[bytes, bool]:
        return b"".join(self.parts), self.full


def _zlib_header(chunk: bytes) -> bool:
    return len(chunk) >= 2 and chunk[0] & 0x0F == 8 and (chunk[0] << 8 | chunk[1]) % 31 == 0


def checked_url(url: str) -> URL:
    """`url` parsed, if it is one this fetcher may request: http(s), no userinfo, a plain host."""
    from yarl import URL

    try:
        parsed = URL(url.strip())
    except (ValueError, TypeError) as exc:
        raise FetchError(f"not a valid URL: {_reason(exc)}") from None
    if parsed.scheme not in ("http", "https"):
        shown = parsed.scheme or "no scheme"
        raise FetchError(f"only http and https URLs can be fetched, not {shown}: {url[:200]!r}")
    if parsed.raw_user is not None or parsed.raw_password is not None:
        raise FetchError("URLs with a user name or password (user:pass@host) are refused")
    host = parsed.raw_host or ""
    if not host:
        raise FetchError(f"the URL has no host: {url[:200]!r}")
    if "%" in host and ":" not in host:
        raise FetchError(f"percent-encoded host names are refused: {host!r}")
    return parsed


async def checked_addresses(target: URL, guard: AddressGuard) -> list[str]:
    """The addresses `target`'s host resolves to, once, if the guard allows every one of them."""
    host = target.raw_host or ""
    named = guard.allows_name(host)
    if guard.mode == "allow_list" and not named and not _literal_allowed(host, guard):
        raise FetchError(f"{target.host} is not in web.allow_hosts, the only hosts this bot may fetch")
    if not named and _refused_name(host):
        raise FetchError(f"{target.host} is a local or metadata host name; refused")
    addresses = await resolve(host, guard.resolver)
    for address in addresses:
        problem = refusal(address)
        if problem and not named and not guard.allows_address(address):
            raise FetchError(
                f"{target.host} resolves to {address}, {problem}; refused (not a public address)"
            )
        if guard.mode == "allow_list" and not named and not guard.allows_address(address):
            raise FetchError(f"{target.host} is not in web.allow_hosts, the only hosts this bot may fetch")
    return [str(address) for address in addresses]


def _literal_allowed(host: str, guard: AddressGuard) -> bool:
    address = literal_address(host)
    return address is not None and guard.allows_address(address)


async def resolve(host: str, resolver: Resolver | None) -> list[Address]:
    """The host's addresses: an IP literal or legacy IPv4 spelling as the OS reads it, else DNS."""
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    try:
        found = await (resolver or system_resolver)(host)
    except (OSError, UnicodeError, ValueError) as exc:
        raise FetchError(f"cannot resolve {host}: {_reason(exc)}") from None
    addresses = [ipaddress.ip_address(text.split("%")[0]) for text in found]
    if not addresses:
        raise FetchError(f"cannot resolve {host}: no address")
    return addresses


def literal_address(host: str) -> Address | None:
    """The address a host spells directly: IPv4 (also `2130706433`, `0177.1`, `0x7f.1`), IPv6 (a
    zone id `%eth0` ignored), or None for a name."""
    text = host.strip("[]").rstrip(".")
    try:
        return ipaddress.ip_address(text.split("%")[0]) if ":" in text else ipaddress.ip_address(text)
    except ValueError:
        pass
    if text and all(c in "0123456789abcdefxABCDEFX." for c in text) and text[0].isdigit():
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))  # inet_aton reads what URLs may mean
        except OSError:
            return None
    return None


async def system_resolver(host: str) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def refusal(address: Address) -> str | None:
    """Why an address may not be reached (None: a public address), judged on the address itself and
    on the IPv4 address an IPv6 one carries."""
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or (address.teredo or (None, None))[1]
        if embedded is None and address in NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return refusal(embedded) or None
    for reason, flag in (
        ("loopback", address.is_loopback),
        ("unspecified", address.is_unspecified),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
        ("site-local", isinstance(address, ipaddress.IPv6Address) and address.is_site_local),
        (
            "special-purpose",
            any(address.version == net.version and address in net for net in SPECIAL_PURPOSE),
        ),
        ("not globally routable (carrier-grade NAT, documentation or benchmarking)", not address.is_global),
    ):
        if flag:
            return reason
    return None


def _refused_name(host: str) -> bool:
    name = normal_host(host)
    return any(name == refused or name.endswith("." + refused) for refused in REFUSED_NAMES)


def normal_host(host: str) -> str:
    return host.strip("[]").rstrip(".").lower()


def _is_network(entry: str) -> bool:
    try:
        ipaddress.ip_network(entry.strip("[]"), strict=False)
    except ValueError:
        return False
    return True


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text[:300]


class PinnedResolver:
    """An aiohttp resolver that answers only with addresses already checked (no second lookup)."""

    def __init__(self) -> None:
        self.pins: dict[str, list[str]] = {}

    def pin(self, host: str, addresses: list[str]) -> None:
        self.pins[host] = addresses

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict[str, Any]]:
        if host not in self.pins:
            raise OSError(f"{host} was not checked before connecting")
        flags = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV
        return [
            {"hostname": host, "host": address, "port": port, "proto": 0, "flags": flags,
             "family": socket.AF_INET6 if ":" in address else socket.AF_INET}
            for address in self.pins[host]
        ]  # fmt: skip

    async def close(self) -> None:
        return None


__all__ = ["AddressGuard", "FetchError", "FetchLimits", "FetchResult", "fetch_url", "refusal", "checked_url"]
