"""web_fetch against real local servers: readable content, and a clear error the model reads (never
an exception, a hang or a crash) for every kind of bad input the issue lists.

Where the cases come from: the issue's "Bad input" list (unreachable hosts, TLS errors, 4xx/5xx,
slow drips, huge or endless bodies, compression bombs, wrong or lying content types, malformed
HTML, redirect loops, non-UTF-8 pages, URLs with userinfo or odd schemes); the compression bombs
are the classic gzip/deflate ones (megabytes of zeros, ~1000:1); the charsets are the WHATWG
Encoding Standard's legacy ones a Chinese or Russian site still serves (GBK, windows-1251), declared
in the header or only in `<meta charset>`. Each test runs the tool through `ToolRegistry.execute`, as
the agent does, and reads what the model would read.
"""

from __future__ import annotations

import asyncio
import gzip
import re
import socket
import zlib
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from documents import pdf as pdf_with_text
from hermes_core.tools.safe_fetch import AddressGuard, FetchLimits
from hermes_core.tools.web import WebOptions, web_tools
from web_sites import local_site, run_tool, server_tls, signed_certificate

ARTICLE = (
    "<!doctype html><html><head><title>Release notes | Example</title></head><body>"
    "<nav><a href='/'>Home</a> <a href='/about'>About</a></nav>"
    "<article><h1>Version 2.0</h1>"
    + "<p>The new version reads feeds, fetches pages and searches the web for the team. </p>"
    * 8
    + "<ul><li>faster start</li><li>smaller install</li></ul></article>"
    "<footer>© Example Corp · cookies · privacy</footer></body></html>"
)


def fetch_tool(**limits: Any) -> Any:
    options = WebOptions(AddressGuard(allow_hosts=("127.0.0.1",)), FetchLimits(**limits), max_chars=4000)
    return web_tools(options)[0]


async def page(body: bytes | str, content_type: str = "text/html", **headers: str) -> Any:
    async def handler(request: web.Request) -> web.Response:
        data = body.encode() if isinstance(body, str) else body
        return web.Response(body=data, headers={"Content-Type": content_type, **headers})

    return handler


async def fetched(handler: Any, path: str = "/", **limits: Any) -> tuple[bool, Any]:
    async with local_site({"/": handler, "/{tail:.*}": handler}) as site:
        return await run_tool(fetch_tool(**limits), url=site.url + path)


async def test_an_article_reads_as_markdown_with_its_title_and_final_url() -> None:
    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound("/notes")

    async with local_site({"/old": moved, "/notes": await page(ARTICLE)}) as site:
        ok, result = await run_tool(fetch_tool(), url=site.url + "/old")
    assert ok, result
    assert result["title"] == "Release notes | Example"
    assert result["url"] == site.url + "/notes" and result["redirected_from"] == site.url + "/notes"
    assert result["content"].startswith("# Version 2.0")
    assert "* faster start" in result["content"]
    assert "cookies" not in result["content"] and "About" not in result["content"]  # boilerplate gone


async def test_long_pages_are_capped_with_totals() -> None:
    ok, result = await fetched(await page("<html><body><pre>" + "word " * 5000 + "</pre></body></html>"))
    assert ok
    assert re.search(r"\n\[truncated: shown 4000 of 250\d\d chars\]$", result["content"])


async def test_plain_text_json_and_pdf_are_read() -> None:
    ok, text = await fetched(await page("line one\nline two\n", "text/plain"))
    assert ok and text["content"] == "line one\nline two\n"
    ok, data = await fetched(await page('{"a": [1, 2], "名": "值"}', "application/json"))
    assert ok and '"名": "值"' in data["content"] and "\n" in data["content"]
    ok, pdf = await fetched(await page(pdf_with_text("Quarterly report 2026"), "application/pdf"))
    assert ok, pdf
    assert "Quarterly report 2026" in pdf["content"]


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("<html><head><title>新闻</title></head><body><p>今天的新闻：团队发布了新版本。</p></body></html>".encode("gbk"),
         "text/html; charset=gbk"),
        ('<html><head><meta charset="gbk"><title>新闻</title></head>'
         "<body><p>今天的新闻：团队发布了新版本。</p>"
         "</body></html>".encode("gbk"), "text/html"),
        ("<html><head><meta http-equiv='Content-Type' content='text/html; charset=windows-1251'></head>"
         "<body><p>Новости команды: вышла новая версия.</p></body></html>".encode("cp1251"), "text/html"),
    ],
)  # fmt: skip
async def test_non_utf8_pages_are_decoded_by_their_declared_charset(body: bytes, content_type: str) -> None:
    ok, result = await fetched(await page(body, content_type))
    assert ok, result
    assert "团队发布了新版本" in result["content"] or "вышла новая версия" in result["content"]


async def test_malformed_html_still_gives_its_text() -> None:
    broken = "<html><body><div><p>unclosed <b>bold <table><tr><td>cell one<td>cell two</div></span></p>"
    ok, result = await fetched(await page(broken))
    assert ok and "cell one" in result["content"] and "bold" in result["content"]
    ok, empty = await fetched(await page(""))
    assert ok and empty["content"] == ""
    ok, junk = await fetched(await page("<<<>>><!--<html" + "\x01\x02" + "&#xffffffff;"))
    assert ok, junk


# -- errors the model reads ----------------------------------------------------------------


async def error_of(handler: Any, path: str = "/", **limits: Any) -> str:
    ok, result = await fetched(handler, path, **limits)
    assert not ok, result
    return str(result["error"])


@pytest.mark.parametrize(
    ("status", "expected"), [(404, "HTTP 404"), (403, "HTTP 403"), (500, "HTTP 500"), (503, "HTTP 503")]
)
async def test_http_errors_are_reported_with_their_status(status: int, expected: str) -> None:
    async def failing(request: web.Request) -> web.Response:
        return web.Response(status=status, text="nope")

    assert expected in await error_of(failing)


async def test_an_unreachable_host_is_reported() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ok, result = await run_tool(fetch_tool(), url=f"http://127.0.0.1:{port}/")
    assert not ok and "cannot connect to 127.0.0.1" in result["error"]
    ok, result = await run_tool(fetch_tool(), url="http://no-such-host.invalid/")
    assert not ok and "cannot resolve no-such-host.invalid" in result["error"]


async def test_a_tls_error_is_reported(tmp_path: Path) -> None:
    """A server whose certificate no system CA signed: the fetcher verifies and says why not."""
    _, cert, key = signed_certificate(tmp_path, "127.0.0.1")
    async with local_site({"/": await page(ARTICLE)}, ssl_context=server_tls(cert, key)) as site:
        ok, result = await run_tool(fetch_tool(), url=f"https://127.0.0.1:{site.port}/")
    assert not ok and "TLS error talking to 127.0.0.1" in result["error"]
    assert "certificate" in result["error"].lower()


async def test_a_slow_drip_is_cut_off() -> None:
    """One byte every 0.2 s: under the floor of 100 bytes a 0.5 s window."""

    async def drip(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        for _ in range(200):
            await response.write(b"x")
            await asyncio.sleep(0.2)
        return response

    started = asyncio.get_running_loop().time()
    error = await error_of(drip, interval=0.5, min_bytes_per_interval=100)
    assert "sends too slowly" in error
    assert asyncio.get_running_loop().time() - started < 5


async def test_a_server_that_never_answers_hits_the_total_time_limit() -> None:
    async def silent(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response(text="late")

    assert "took longer than 1 s" in await error_of(silent, timeout=1.0)


async def test_an_endless_body_is_cut_at_the_size_limit() -> None:
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        while True:
            await response.write(b"all work and no play " * 3000)

    ok, result = await fetched(endless, max_bytes=200_000)
    assert ok
    assert "[truncated: the page is larger than the download limit" in result["content"]


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),  # RFC 9110's deflate: the zlib format
        ("deflate", lambda data: zlib.compress(data)[2:-4]),  # the raw deflate some servers send
    ],
)
async def test_compression_bombs_are_refused(encoding: str, compress: Any) -> None:
    """50 MB of zeros, compressed to ~50 kB, against a 1 MB limit."""
    bomb = compress(b"\0" * 50_000_000)
    handler = await page(bomb, "text/html", **{"Content-Encoding": encoding})
    error = await error_of(handler, max_bytes=1_000_000)
    assert "compression bomb" in error


async def test_honest_compression_is_decoded() -> None:
    for encoding, compress in (("gzip", gzip.compress), ("deflate", zlib.compress)):
        ok, result = await fetched(
            await page(compress(ARTICLE.encode()), "text/html", **{"Content-Encoding": encoding})
        )
        assert ok and result["content"].startswith("# Version 2.0")


async def test_unknown_content_encodings_are_refused() -> None:
    handler = await page(b"\x1b\x00\x00", "text/html", **{"Content-Encoding": "br"})
    assert "content encoding this tool does not decode: br" in await error_of(handler)


@pytest.mark.parametrize(
    ("body", "content_type", "expected"),
    [
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 100, "image/png", "image/png is not a content type this tool reads"),
        (
            b"MZ\x90\x00" + b"\0" * 100,
            "application/octet-stream",
            "application/octet-stream is not a content type",
        ),
        (b"\0\x01\x02binary" * 50, "text/html", "declared text/html but its bytes are binary"),
        (ARTICLE.encode(), "application/pdf", "declared a PDF but is not one"),
        (b"%PDF-1.4 broken", "application/pdf", "the PDF cannot be read"),
    ],
)
async def test_wrong_or_lying_content_types_are_caught(body: bytes, content_type: str, expected: str) -> None:
    assert expected in await error_of(await page(body, content_type))


async def test_a_pdf_sent_as_html_is_read_as_the_pdf_it_is() -> None:
    ok, result = await fetched(await page(pdf_with_text("Not really HTML"), "text/html"))
    assert ok and "Not really HTML" in result["content"]


async def test_redirect_loops_and_long_chains_are_stopped() -> None:
    async def loop(request: web.Request) -> web.Response:
        raise web.HTTPFound("/b" if request.path == "/a" else "/a")

    assert "redirect loop" in await error_of(loop, "/a")

    async def chain(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"/n{int(request.path[2:] or 0) + 1}")

    assert "more than 3 redirects" in await error_of(chain, "/n0", max_redirects=3)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://user:secret@127.0.0.1/", "user name or password"),
        ("http://user@127.0.0.1/", "user name or password"),
        ("file:///etc/passwd", "only http and https"),
        ("ftp://127.0.0.1/file", "only http and https"),
        ("gopher://127.0.0.1:70/", "only http and https"),
        ("javascript:alert(1)", "only http and https"),
        ("data:text/html,<h1>hi</h1>", "only http and https"),
        ("//127.0.0.1/", "only http and https"),
        ("http:///nohost", "no host"),
        ("http://[::1/", "not a valid URL"),
        ("not a url at all", "only http and https"),
    ],
)
async def test_urls_with_userinfo_or_odd_schemes_are_refused(url: str, expected: str) -> None:
    ok, result = await run_tool(fetch_tool(), url=url)
    assert not ok and expected in result["error"]


# -- helpers -------------------------------------------------------------------------------


def test_the_readers_are_imported_when_a_tool_first_runs() -> None:
    """Building the web tools (what serve does at start-up) imports no HTML, feed or PDF library."""
    import subprocess
    import sys

    script = (
        "import sys; from hermes_core.tools.safe_fetch import AddressGuard;"
        "from hermes_core.tools.web import WebOptions, web_tools; web_tools(WebOptions(AddressGuard()));"
        "names = ('readability', 'markdownify', 'bs4', 'lxml', 'feedparser', 'pypdf');"
        "print(sorted(m for m in names if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
