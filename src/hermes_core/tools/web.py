"""web_fetch and read_feed: a page or a feed the model names, read as text through the safe fetcher.

Both tools reach the network only through `safe_fetch.fetch_url` (the SSRF guard, size, time and
slow-drip limits, the decompression bound), so what they add is reading:

- **HTML** → the main content as Markdown: readability-lxml (the port of Mozilla Readability that
  Firefox's reader view comes from) drops navigation, footers and ads, then markdownify (MIT, on
  BeautifulSoup) writes headings, lists, links and tables as Markdown. Together with lxml they add a
  few MB; trafilatura extracts a little better but brings dateparser, htmldate, courlan and more
  (tens of MB), and html2text is GPL. A page readability cannot parse falls back to its plain text.
- **PDF** → its text through pypdf (the `pdf` extra's library).
- **text/*, JSON, XML** → as text (JSON pretty-printed).
- **Feeds** → feedparser (RSS 0.9x–2.0, RSS 1.0, Atom) and a small reader for JSON Feed 1.0/1.1
  (feedparser does not read it; the format is a plain JSON object: https://jsonfeed.org/version/1.1).

Bytes are decoded by the declared charset, then the page's own `<meta charset>` or BOM, then a
guess (BeautifulSoup's UnicodeDammit). A content type that lies (a PDF declared as HTML, binary
declared as text) is caught from the first bytes. Every failure is a ToolError the model reads.
The libraries are imported when a tool first runs: `pip install "hermes-kernel[web]"`.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import Field

from ..kernel.tools.declare import Tool, ToolError, tool
from .safe_fetch import AddressGuard, FetchError, FetchLimits, FetchResult, fetch_url

PAGE_TYPES = (
    "text/*", "application/xhtml+xml", "application/json", "application/xml", "application/pdf",
    "application/rss+xml", "application/atom+xml", "application/feed+json", "application/ld+json",
)  # fmt: skip
FEED_TYPES = (
    "application/rss+xml", "application/atom+xml", "application/xml", "application/rdf+xml", "text/xml",
    "application/feed+json", "application/json", "text/plain", "text/html",
)  # fmt: skip
HTML_TYPES = ("text/html", "application/xhtml+xml")
PAGE_ACCEPT = "text/html,application/xhtml+xml,application/pdf;q=0.9,text/*;q=0.8,*/*;q=0.5"
FEED_ACCEPT = "application/rss+xml,application/atom+xml,application/feed+json,application/xml;q=0.9,*/*;q=0.5"
SUMMARY_CHARS = 400
EXTRA_HINT = 'the web tools need the web extra: pip install "hermes-kernel[web]"'


@dataclass(frozen=True)
class WebOptions:
    """What the web tools may reach (`guard`), how much they read (`limits`) and show (`max_chars`)."""

    guard: AddressGuard
    limits: FetchLimits = FetchLimits()
    max_chars: int = 12_000  # characters of page text the model reads
    max_entries: int = 20  # feed entries at most


def web_tools(options: WebOptions) -> list[Tool]:
    """web_fetch and read_feed, bound to `options`."""
    page_limits = _with_types(options.limits, PAGE_TYPES)
    feed_limits = _with_types(options.limits, FEED_TYPES)

    @tool(name="web_fetch", level=0, idempotent=True, timeout=options.limits.timeout + 10, groups=("web",),
          keywords=("url", "link", "page", "网页", "链接"))  # fmt: skip
    async def web_fetch(
        url: Annotated[str, Field(description="The http(s) URL of the page, PDF or text to read")],
    ) -> dict[str, Any]:
        """Read a public web page (or PDF, or text file) and return its main content as Markdown, with its title and final URL. Use it for a URL the user gives or one found with web_search; do not guess URLs. 读取网页正文（Markdown）。"""  # noqa: E501
        fetched = await _fetch(url, options.guard, page_limits, PAGE_ACCEPT)
        title, text = await asyncio.to_thread(readable_text, fetched)
        return _page(fetched, title, text, options.max_chars)

    @tool(name="read_feed", level=0, idempotent=True, timeout=options.limits.timeout + 10, groups=("web",),
          keywords=("rss", "feed", "news", "订阅", "新闻"))  # fmt: skip
    async def read_feed(
        url: Annotated[str, Field(description="The http(s) URL of an RSS, Atom or JSON Feed")],
        limit: Annotated[int, Field(ge=1, le=100, description="How many of the newest entries")] = 10,
    ) -> dict[str, Any]:
        """Read an RSS, Atom or JSON Feed and return its newest entries (title, link, date, summary). 读取 RSS/Atom/JSON Feed 订阅源。"""  # noqa: E501
        fetched = await _fetch(url, options.guard, feed_limits, FEED_ACCEPT)
        feed = await asyncio.to_thread(parse_feed, fetched.body)
        entries = feed.pop("entries")[: min(limit, options.max_entries)]
        return {**feed, "url": fetched.final_url, "entries": entries, "truncated": fetched.truncated}

    for declared in (web_fetch, read_feed):
        declared.max_chars = options.max_chars + 2_000  # the page is capped here, with its own note
    return [web_fetch, read_feed]


def _with_types(limits: FetchLimits, types: tuple[str, ...]) -> FetchLimits:
    import dataclasses

    return dataclasses.replace(limits, content_types=limits.content_types or types)


async def _fetch(url: str, guard: AddressGuard, limits: FetchLimits, accept: str) -> FetchResult:
    try:
        fetched = await fetch_url(url, guard, limits, headers={"Accept": accept})
    except FetchError as exc:
        raise ToolError(str(exc)) from None
    if fetched.status >= 400:
        raise ToolError(f"{fetched.final_url} answered HTTP {fetched.status}{_status_text(fetched)}")
    if fetched.status >= 300:
        raise ToolError(f"{fetched.final_url} answered HTTP {fetched.status} without a usable Location")
    return fetched


def _status_text(fetched: FetchResult) -> str:
    snippet = fetched.body[:200].decode("utf-8", "replace").strip()
    return f": {snippet}" if snippet and "<" not in snippet[:1] else ""


def _page(fetched: FetchResult, title: str, text: str, max_chars: int) -> dict[str, Any]:
    page: dict[str, Any] = {"url": fetched.final_url, "title": title, "content_type": fetched.media_type}
    if fetched.redirects:
        page["redirected_from"] = fetched.redirects[0] if len(fetched.redirects) == 1 else fetched.redirects
    page["content"] = text[:max_chars]
    if len(text) > max_chars:
        page["content"] += f"\n[truncated: shown {max_chars} of {len(text)} chars]"
    if fetched.truncated:
        page["content"] += "\n[truncated: the page is larger than the download limit; this is its beginning]"
    return page


def readable_text(fetched: FetchResult) -> tuple[str, str]:
    """(title, text) of a fetched body, by what its bytes are (the declared type is checked)."""
    body, declared = fetched.body, fetched.media_type
    kind = sniffed_kind(body, declared)
    if kind == "pdf":
        return pdf_text(body, fetched.truncated)
    if kind == "binary":
        raise ToolError(
            f"the response is declared {declared or 'without a type'} but its bytes are binary; not read"
        )
    text = decoded(body, fetched.charset, html=kind == "html")
    if kind == "html":
        return html_markdown(text)
    if kind == "json":
        try:
            return "", json.dumps(json.loads(text), ensure_ascii=False, indent=1)
        except ValueError:
            return "", text
    return "", text


def sniffed_kind(body: bytes, declared: str) -> str:
    """pdf, html, json, binary or text: what the first bytes are, whatever the header said."""
    head = body[:1024]
    if head.startswith(b"%PDF-"):
        return "pdf"
    if declared == "application/pdf":
        raise ToolError("the response is declared a PDF but is not one (no %PDF- header)")
    if b"\x00" in head and not head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "binary"
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if declared in HTML_TYPES or start.startswith((b"<!doctype html", b"<html")):
        return "html"
    if declared.endswith("json"):
        return "json"
    return "text"


def decoded(body: bytes, charset: str | None, *, html: bool) -> str:
    """The body as text: the declared charset, the document's own declaration, then a guess."""
    if charset:
        try:
            return body.decode(charset)
        except (LookupError, UnicodeDecodeError):
            pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    dammit = _bs4().UnicodeDammit(body, is_html=html)
    return dammit.unicode_markup if dammit.unicode_markup is not None else body.decode("utf-8", "replace")


def html_markdown(html: str) -> tuple[str, str]:
    """The page's title and main content as Markdown (readability, then markdownify)."""
    try:
        from markdownify import markdownify
        from readability import Document
    except ImportError:
        raise ToolError(EXTRA_HINT) from None
    if not html.strip():
        return "", ""
    try:
        document = Document(html)
        title, main = document.title(), document.summary(html_partial=True)
    except Exception:  # readability raises on documents it cannot parse (Unparseable, lxml errors)
        return "", plain_text(html)
    text = markdownify(main, heading_style="ATX", strip=["img", "script", "style"])
    title = "" if title.strip() == "[no-title]" else title.strip()  # readability's word for none
    return title, _tidy(text) or plain_text(html)


def plain_text(html: str) -> str:
    soup = _bs4().BeautifulSoup(html, "html.parser")
    for hidden in soup(["script", "style", "noscript", "template"]):
        hidden.decompose()
    return _tidy(soup.get_text("\n"))


def _bs4() -> Any:
    try:
        import bs4
    except ImportError:
        raise ToolError(EXTRA_HINT) from None
    return bs4


def _tidy(text: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", "\n".join(line.rstrip() for line in text.splitlines())).strip()


def pdf_text(body: bytes, truncated: bool) -> tuple[str, str]:
    if truncated:
        raise ToolError("the PDF is larger than the download limit; it cannot be read in part")
    try:
        import io

        from pypdf import PdfReader
    except ImportError:
        raise ToolError(EXTRA_HINT) from None
    try:
        reader = PdfReader(io.BytesIO(body))
        title = str(reader.metadata.title or "") if reader.metadata else ""
        pages = [page.extract_text() or "" for page in reader.pages[:200]]
    except Exception as exc:  # pypdf raises many types on damaged files
        raise ToolError(f"the PDF cannot be read: {type(exc).__name__}: {str(exc)[:200]}") from None
    return title, _tidy("\n\n".join(pages))


def parse_feed(body: bytes) -> dict[str, Any]:
    """A feed's title and entries (title, link, date, summary), whatever its format."""
    start = body.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if start in (b"{", b"["):
        return json_feed(body)
    try:
        import feedparser
    except ImportError:
        raise ToolError(EXTRA_HINT) from None
    parsed = feedparser.parse(body, sanitize_html=True, resolve_relative_uris=True)
    if not parsed.entries and not parsed.version:  # an empty feed has a version; a page has neither
        problem = getattr(parsed, "bozo_exception", None) or "no feed elements"
        raise ToolError(f"not an RSS, Atom or JSON feed: {str(problem)[:200]}")
    entries = [
        {
            "title": entry.get("title", ""),
            "link": entry.get("link", ""),
            "date": _feed_date(entry.get("published_parsed") or entry.get("updated_parsed")),
            "summary": summary_text(entry.get("summary", "")),
        }
        for entry in parsed.entries
    ]
    return {"title": parsed.feed.get("title", ""), "format": parsed.version or "unknown", "entries": entries}


def json_feed(body: bytes) -> dict[str, Any]:
    """JSON Feed 1.0/1.1 (https://jsonfeed.org/version/1.1): `items` with title, url, date_published
    and content_html/content_text/summary."""
    try:
        document = json.loads(body.decode("utf-8-sig"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ToolError(f"not a JSON Feed: {str(exc)[:200]}") from None
    version = document.get("version", "") if isinstance(document, dict) else ""
    if not str(version).startswith("https://jsonfeed.org/version/") or not isinstance(
        document.get("items"), list
    ):
        raise ToolError("not a JSON Feed: no jsonfeed.org version and items list")
    entries = [
        {
            "title": str(item.get("title") or ""),
            "link": str(item.get("url") or item.get("external_url") or ""),
            "date": str(item.get("date_published") or item.get("date_modified") or ""),
            "summary": summary_text(
                str(item.get("summary") or item.get("content_text") or item.get("content_html") or "")
            ),
        }
        for item in document["items"]
        if isinstance(item, dict)
    ]
    return {
        "title": str(document.get("title") or ""),
        "format": "json" + str(version).rsplit("/", 1)[-1].replace(".", ""),
        "entries": entries,
    }  # noqa: E501


def summary_text(html: str) -> str:
    if "<" in html:  # blocks and line breaks become spaces, inline tags nothing ("<a>Star City</a>.")
        spaced = re.sub(r"(?i)<br\s*/?>|</(p|div|li|h[1-6]|tr|td|blockquote)>", " ", html)
        html = _bs4().BeautifulSoup(spaced, "html.parser").get_text()
    text = html.strip()
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS].rstrip() + "…"


def _feed_date(parsed: Any) -> str:
    if not parsed:
        return ""
    return datetime(*parsed[:6]).replace(tzinfo=timezone.utc).isoformat()


__all__ = ["WebOptions", "web_tools", "readable_text", "parse_feed"]
