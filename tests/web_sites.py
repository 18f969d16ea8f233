"""Local web sites for the web tools' tests: aiohttp servers on 127.0.0.1 that count their hits,
a DNS stand-in the fetcher takes instead of the system resolver, and a registry runner that shows
what the model would read."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from hermes_core.kernel.messages import ToolCall
from hermes_core.tools import Tool, ToolRegistry

Handler = Callable[[web.Request], Any]


class Site:
    """A running local server: its base URL, port and how often each path was asked for."""

    def __init__(self, port: int, hits: Counter[str], seen: list[web.Request]) -> None:
        self.port, self.hits, self.seen = port, hits, seen
        self.url = f"http://127.0.0.1:{port}"


@asynccontextmanager
async def local_site(routes: Mapping[str, Handler], *, ssl_context: Any = None) -> AsyncIterator[Site]:
    """Serve `routes` (path → handler) on 127.0.0.1 until the block ends."""
    hits: Counter[str] = Counter()
    seen: list[web.Request] = []

    @web.middleware
    async def count(request: web.Request, handler: Handler) -> Any:
        hits[request.path] += 1
        seen.append(request)
        return await handler(request)

    app = web.Application(middlewares=[count])
    for path, handler in routes.items():
        app.router.add_route("*", path, handler)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Site(port, hits, seen)
    finally:
        await runner.cleanup()


def fake_dns(table: Mapping[str, list[str]]) -> Callable[[str], Any]:
    """A resolver answering from `table` as DNS would (a name it lacks does not exist); it counts
    its calls in `.calls`."""
    calls: list[str] = []

    async def resolve(host: str) -> list[str]:
        calls.append(host)
        name = host.rstrip(".").lower()
        if name not in table:
            raise OSError(f"[Errno -2] Name or service not known: {host}")
        return list(table[name])

    resolve.calls = calls  # type: ignore[attr-defined]
    return resolve


async def run_tool(tool: Tool, **arguments: Any) -> tuple[bool, Any]:
    """Run `tool` as the agent does (ToolRegistry.execute): (ok, what the model reads, parsed)."""
    outcome = await ToolRegistry([tool]).execute(
        ToolCall(id="c1", name=tool.name, arguments=json.dumps(arguments)), timeout=60, max_chars=100_000
    )
    assert outcome.error in (None, "tool_error"), outcome.content  # never an exception or a timeout
    try:
        return outcome.ok, json.loads(outcome.content)
    except ValueError:
        return outcome.ok, outcome.content


def signed_certificate(folder: Path, host: str) -> tuple[str, str, str]:
    """A test CA (PEM text, trusted by no system) and a certificate for `host` (a name or an IP
    address) it signed, with its key: (CA, certificate file, key file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def signed(subject: str, key: Any, issuer: str, issuer_key: Any, *, ca: bool) -> x509.Certificate:
        now, day = datetime.datetime.now(datetime.timezone.utc), datetime.timedelta(days=1)
        builder = (
            x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - day).not_valid_after(now + day)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )  # fmt: skip
        if not ca:
            try:
                alt: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
            except ValueError:
                alt = x509.DNSName(host)
            builder = builder.add_extension(x509.SubjectAlternativeName([alt]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = signed("hermes test CA", ca_key, "hermes test CA", ca_key, ca=True)
    leaf = signed(host, leaf_key, "hermes test CA", ca_key, ca=False)
    cert_path, key_path = folder / f"{host}.pem", folder / f"{host}.key"
    cert_path.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    plain = serialization.NoEncryption()
    key_path.write_bytes(
        leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, plain)
    )
    return ca.public_bytes(serialization.Encoding.PEM).decode(), str(cert_path), str(key_path)


def server_tls(cert_path: str, key_path: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    return context
