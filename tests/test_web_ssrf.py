"""The fetcher's SSRF guard (tools/safe_fetch.py): every spelling of an internal address is refused,
whatever the URL looks like, and every redirect is checked again.

Where the cases come from: OWASP's Server-Side Request Forgery Prevention Cheat Sheet (its
"application layer" checks: only http/https, resolve then judge the address, disable or re-check
redirects, beware DNS rebinding) and the IP-address bypass list of PayloadsAllTheThings, "Server Side
Request Forgery/README.md" (decimal, octal, hexadecimal, short and mixed forms of 127.0.0.1,
IPv6 and IPv4-mapped IPv6, `localhost` variants, cloud metadata addresses of AWS, GCP, Azure, Alibaba,
and DNS names that resolve to 127.0.0.1 such as `localtest.me` and `*.nip.io`). Names are resolved by
a stand-in resolver (there is no network here); every connection a test makes is to 127.0.0.1.
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path

import pytest
from aiohttp import web

from hermes_core.tools.safe_fetch import AddressGuard, FetchError, fetch_url, refusal
from web_sites import fake_dns, local_site, server_tls, signed_certificate

DNS = {
    "evil.example": ["127.0.0.1"],  # a public-looking name pointing home
    "localtest.me": ["127.0.0.1"],
    "127.0.0.1.nip.io": ["127.0.0.1"],
    "internal.example": ["10.0.0.5"],
    "router.example": ["192.168.1.1"],
    "corp.example": ["172.16.3.4"],
    "cgnat.example": ["100.64.0.1"],
    "v6loop.example": ["::1"],
    "ula.example": ["fd12:3456::1"],
    "linklocal6.example": ["fe80::1"],
    "mapped.example": ["::ffff:127.0.0.1"],
    "aws-meta.example": ["169.254.169.254"],
    "mixed.example": ["93.184.216.34", "127.0.0.1"],  # one public answer does not excuse a private one
    "zero.example": ["0.0.0.0"],
    "multicast.example": ["224.0.0.1"],
    "redirector.example": ["127.0.0.1"],  # the one host the redirect tests open with allow_hosts
    "rebind.example": ["127.0.0.1"],
    "public.example": ["93.184.216.34"],
}


def spellings(port: int) -> list[str]:
    """URLs that all mean an internal address (at least 40, the table the issue asks for)."""
    p = port
    return [
        f"http://127.0.0.1:{p}/",
        f"http://127.1:{p}/",  # short form
        f"http://127.0.1:{p}/",
        f"http://2130706433:{p}/",  # decimal
        f"http://0177.0.0.1:{p}/",  # octal
        f"http://0177.0000.0000.0001:{p}/",
        f"http://017700000001:{p}/",  # octal, one number
        f"http://0x7f.0.0.1:{p}/",  # hexadecimal
        f"http://0x7f000001:{p}/",
        f"http://0x7f.1:{p}/",
        f"http://127.000.000.001:{p}/",  # zero padding
        f"http://127.255.255.254:{p}/",  # anywhere in 127/8
        f"http://[::1]:{p}/",
        f"http://[0:0:0:0:0:0:0:1]:{p}/",
        f"http://[::ffff:127.0.0.1]:{p}/",  # IPv4-mapped IPv6
        f"http://[::ffff:7f00:1]:{p}/",
        f"http://[0:0:0:0:0:ffff:127.0.0.1]:{p}/",
        f"http://[64:ff9b::7f00:1]:{p}/",  # NAT64 of 127.0.0.1
        f"http://[2002:7f00:1::]:{p}/",  # 6to4 of 127.0.0.1
        f"http://[fe80::1%25eth0]:{p}/",  # link-local with a zone id
        f"http://[::1%25lo]:{p}/",  # loopback with a zone id
        f"http://0.0.0.0:{p}/",  # unspecified
        f"http://0:{p}/",
        f"http://[::]:{p}/",
        f"http://localhost:{p}/",
        f"http://LOCALHOST:{p}/",  # uppercase
        f"http://localhost.:{p}/",  # trailing dot
        f"http://LocalHost.:{p}/",
        f"http://app.localhost:{p}/",  # RFC 6761: *.localhost is loopback
        f"http://%31%32%37.0.0.1:{p}/",  # percent-encoded host
        f"http://①②⑦.0.0.1:{p}/",  # enclosed alphanumerics, folded to 127.0.0.1 by IDNA
        f"http://evil.example:{p}/",  # DNS pointing at 127.0.0.1
        f"http://EVIL.EXAMPLE.:{p}/",
        f"http://localtest.me:{p}/",
        f"http://127.0.0.1.nip.io:{p}/",
        f"http://mixed.example:{p}/",
        f"http://v6loop.example:{p}/",
        f"http://mapped.example:{p}/",
        "http://10.0.0.5/",  # private ranges
        "http://172.16.3.4/",
        "http://192.168.1.1/",
        "http://internal.example/",
        "http://router.example/",
        "http://corp.example/",
        "http://100.64.0.1/",  # carrier-grade NAT
        "http://cgnat.example/",
        "http://[fd12:3456::1]/",  # IPv6 unique local
        "http://ula.example/",
        "http://linklocal6.example/",
        "http://169.254.169.254/latest/meta-data/",  # AWS, Azure, GCP, DO, OpenStack metadata
        "http://2852039166/latest/meta-data/",  # the same, decimal
        "http://0xA9FEA9FE/",  # the same, hexadecimal
        "http://0251.0376.0251.0376/",  # the same, octal
        "http://[::ffff:a9fe:a9fe]/",  # the same, IPv4-mapped
        "http://aws-meta.example/",
        "http://[fd00:ec2::254]/latest/meta-data/",  # AWS IMDS over IPv6
        "http://metadata.google.internal/computeMetadata/v1/",  # GCP, by name
        "http://100.100.100.200/latest/meta-data/",  # Alibaba Cloud
        "http://169.254.170.2/v2/credentials",  # AWS ECS task credentials
        "http://224.0.0.1/",  # multicast
        "http://multicast.example/",
        "http://zero.example/",
        "http://240.0.0.1/",  # reserved
        "http://255.255.255.255/",  # broadcast
        "http://192.0.0.8/",  # IETF protocol assignments
        "http://198.18.0.1/",  # benchmarking
    ]


async def _secret(request: web.Request) -> web.Response:
    return web.Response(text="internal secret", content_type="text/plain")


async def test_every_spelling_of_an_internal_address_is_refused() -> None:
    """Each URL of the table is refused before any byte reaches the local server."""
    async with local_site({"/": _secret, "/{tail:.*}": _secret}) as site:
        urls = spellings(site.port)
        assert len(urls) >= 40
        guard = AddressGuard(resolver=fake_dns(DNS))
        for url in urls:
            with pytest.raises(FetchError, match="refused") as refused:
                await fetch_url(url, guard)
            assert "internal secret" not in str(refused.value)
        assert sum(site.hits.values()) == 0


async def test_loopback_is_reached_only_through_the_allow_list() -> None:
    """Without web.allow_hosts 127.0.0.1 is refused; naming it (or its network) opens it."""
    async with local_site({"/": _secret}) as site:
        with pytest.raises(FetchError, match="loopback; refused"):
            await fetch_url(site.url + "/", AddressGuard())
        assert site.hits["/"] == 0
        for allowed in ("127.0.0.1", "127.0.0.0/8"):
            fetched = await fetch_url(site.url + "/", AddressGuard(allow_hosts=(allowed,)))
            assert fetched.status == 200 and fetched.body == b"internal secret"
        assert site.hits["/"] == 2


def redirect_targets(port: int) -> list[str]:
    p = port
    return [
        f"http://127.0.0.1:{p}/secret",
        f"http://evil.example:{p}/secret",
        f"http://2130706433:{p}/secret",
        f"http://0x7f.1:{p}/secret",
        f"http://[::ffff:127.0.0.1]:{p}/secret",
        f"http://localhost.:{p}/secret",
        f"//127.0.0.1:{p}/secret",  # protocol-relative: the scheme of the page, the host internal
        f"http://[::]:{p}/secret",
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://[fd00:ec2::254]/",
        "file:///etc/passwd",
        "gopher://127.0.0.1:6379/_INFO",
        "dict://127.0.0.1:11211/stat",
        f"http://user:pass@redirector.example:{p}/secret",
    ]


async def test_every_redirect_is_checked_again() -> None:
    """A host the operator opened (redirector.example) redirects to internal addresses, odd schemes and
    URLs with credentials, with each redirect status: each hop is refused and /secret is never hit."""
    targets: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        status = int(request.query.get("status", "302"))
        return web.Response(status=status, headers={"Location": targets[int(request.query["n"])]})

    async with local_site({"/go": redirect, "/secret": _secret}) as site:
        targets.extend(redirect_targets(site.port))
        guard = AddressGuard(allow_hosts=("redirector.example",), resolver=fake_dns(DNS))
        for n in range(len(targets)):
            for status in (301, 302, 303, 307, 308):
                url = f"http://redirector.example:{site.port}/go?n={n}&status={status}"
                with pytest.raises(FetchError, match="refused|only http and https"):
                    await fetch_url(url, guard)
        assert site.hits["/secret"] == 0
        assert site.hits["/go"] == len(targets) * 5


async def test_a_redirect_chain_through_public_looking_hosts_is_stopped_where_it_turns_internal() -> None:
    """Two hops on the opened host, then evil.example (127.0.0.1): refused at the third hop."""

    async def hop(request: web.Request) -> web.Response:
        step = int(request.match_info["step"])
        following = f"/hop/{step + 1}" if step < 2 else f"http://evil.example:{request.url.port}/secret"
        return web.Response(status=302, headers={"Location": following})

    async with local_site({"/hop/{step}": hop, "/secret": _secret}) as site:
        guard = AddressGuard(allow_hosts=("redirector.example",), resolver=fake_dns(DNS))
        with pytest.raises(FetchError, match="evil.example resolves to 127.0.0.1, loopback; refused"):
            await fetch_url(f"http://redirector.example:{site.port}/hop/0", guard)
        assert [site.hits[f"/hop/{i}"] for i in range(3)] == [1, 1, 1] and site.hits["/secret"] == 0


async def test_the_name_is_resolved_once_and_the_connection_goes_to_that_address() -> None:
    """DNS rebinding (OWASP): the resolver answers 127.0.0.1 (allowed by its network) the first time
    and 10.1.2.3 after. The fetch asks it once, connects to the checked address, and sends the name
    in the Host header."""
    answers = iter([["127.0.0.1"], ["10.1.2.3"], ["10.1.2.3"]])
    calls: list[str] = []

    async def rebinding(host: str) -> list[str]:
        calls.append(host)
        return next(answers)

    async with local_site({"/": _secret}) as site:
        guard = AddressGuard(allow_hosts=("127.0.0.0/8",), resolver=rebinding)
        fetched = await fetch_url(f"http://rebind.example:{site.port}/", guard)
        assert fetched.body == b"internal secret"
        assert calls == ["rebind.example"]
        assert site.seen[0].headers["Host"] == f"rebind.example:{site.port}"


async def test_tls_checks_the_name_while_the_connection_goes_to_the_pinned_address(tmp_path: Path) -> None:
    """Pinning keeps HTTPS working: the certificate of secure.example (signed by a test CA) is
    verified against the URL's name, sent as SNI, though the socket goes to 127.0.0.1; the same server
    reached as 127.0.0.1 fails the check, since the certificate does not name that address."""
    ca, cert, key = signed_certificate(tmp_path, "secure.example")
    trusting = ssl.create_default_context(cadata=ca)
    async with local_site({"/": _secret}, ssl_context=server_tls(cert, key)) as site:
        guard = AddressGuard(
            allow_hosts=("127.0.0.0/8",), resolver=fake_dns({"secure.example": ["127.0.0.1"]})
        )
        fetched = await fetch_url(f"https://secure.example:{site.port}/", guard, ssl_context=trusting)
        assert fetched.body == b"internal secret"
        with pytest.raises(FetchError, match="TLS error talking to 127.0.0.1"):
            await fetch_url(f"https://127.0.0.1:{site.port}/", guard, ssl_context=trusting)
        with pytest.raises(FetchError, match="TLS error talking to secure.example"):
            await fetch_url(f"https://secure.example:{site.port}/", guard)  # the system's CAs: untrusted
        assert site.hits["/"] == 1


async def test_allow_list_mode_reaches_only_the_listed_hosts() -> None:
    """`web.fetch: allow_list`: a public address not listed is refused before any connection; `off`
    refuses everything."""
    async with local_site({"/": _secret}) as site:
        dns = fake_dns(DNS)
        listed = AddressGuard(mode="allow_list", allow_hosts=("127.0.0.1",), resolver=dns)
        assert (await fetch_url(site.url + "/", listed)).status == 200
        with pytest.raises(FetchError, match="not in web.allow_hosts"):
            await fetch_url("http://public.example/", listed)
        with pytest.raises(FetchError, match="turned off"):
            await fetch_url(site.url + "/", AddressGuard(mode="off", allow_hosts=("127.0.0.1",)))
        assert site.hits["/"] == 1


@pytest.mark.parametrize(
    "address", ["93.184.216.34", "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2001:4860:4860::8888"]
)
def test_public_addresses_are_not_refused(address: str) -> None:
    """The guard is not a blanket refusal: well-known public resolvers' addresses pass."""
    assert refusal(ipaddress.ip_address(address)) is None
