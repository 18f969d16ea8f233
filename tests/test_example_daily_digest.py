"""examples/daily-digest end to end: its own hermes.yaml, through the gateway `serve` builds, against
local fakes — three feeds and a web page on 127.0.0.1, the fake Feishu platform, a scripted model
that reads what it is given — with the scheduler on a clock the test moves.

The cases come from article 001's daily job ("fetch a few sources every morning, rank them, keep
what matters and send a summary") and the issue's wording of it: a cron job at 09:00
Asia/Shanghai (01:00 UTC) reads three feeds (RSS 2.0, Atom, JSON Feed 1.1: the formats read_feed
names) and a web page, and posts one card to a group, once per day across restarts. The feeds
follow the formats' specifications (RSS 2.0 at rssboard.org, RFC 4287, jsonfeed.org/version/1.1).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from example_harness import endpoints, example_gateway, example_settings
from gateway_harness import scheduler_looked
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest, ToolArgs
from virtual_clock import Clock, utc
from waiting import eventually
from web_sites import Site, local_site

GROUP = "oc_team_news"  # the example's chat_id

RSS = """<?xml version="1.0" encoding="utf-8"?>
<rss version="2.0"><channel><title>Hacker News: Front Page</title><link>https://news.ycombinator.com/</link>
<description>front page</description>
<item><title>A tiny agent kernel you can read in one sitting</title><link>https://example.org/kernel</link>
<pubDate>Mon, 30 Nov 2026 22:10:00 +0000</pubDate><description>Points: 412</description></item>
<item><title>Show HN: a cat photo album</title><link>https://example.org/cats</link>
<pubDate>Mon, 30 Nov 2026 20:00:00 +0000</pubDate><description>Points: 35</description></item>
</channel></rss>"""

ATOM = """<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom"><title>The GitHub Blog</title><id>urn:gh-blog</id>
<updated>2026-11-30T18:00:00Z</updated>
<entry><title>Dependabot now opens security fixes for uv lock files</title><id>urn:gh-1</id>
<link href="https://example.org/dependabot-uv"/><updated>2026-11-30T18:00:00Z</updated>
<summary>Security updates for Python projects managed with uv.</summary></entry>
</feed>"""

JSON_FEED = {
    "version": "https://jsonfeed.org/version/1.1",
    "title": "JSON Feed",
    "items": [
        {"id": "1", "url": "https://example.org/jsonfeed-1-2", "title": "JSON Feed 1.2 adds translations",
         "content_text": "A draft of the next version.", "date_published": "2026-11-29T08:00:00Z"},
    ],
}  # fmt: skip

PAGE = """<!doctype html><html><head><title>Download Python | Python.org</title></head><body>
<nav><a href="/">Home</a> <a href="/about">About</a></nav>
<main><article><h1>Download the latest version of Python</h1>
<p>Python 3.14.2 is the newest release, out on 1 December 2026. It fixes a security issue in the
tarfile module and two crashes of the free-threaded build; every team on 3.14 should upgrade.</p>
<p>Looking for an older release? Python 3.13.9 and 3.12.12 are still supported.</p>
</article></main><footer>Copyright Python Software Foundation</footer></body></html>"""

FEEDS = {
    "https://hnrss.org/frontpage": ("/hn.rss", "application/rss+xml", RSS),
    "https://github.blog/feed/": ("/github.atom", "application/atom+xml", ATOM),
    "https://www.jsonfeed.org/feed.json": ("/feed.json", "application/feed+json", json.dumps(JSON_FEED)),
    "https://www.python.org/downloads/": ("/downloads/", "text/html", PAGE),
}
URL = re.compile(r"https?://\S+")
IMPORTANT = ("security", "python", "release", "agent")  # what the scripted model ranks by


class DigestModel:
    """A model that does the job as its prompt says: one read per address in the prompt (web_fetch
    where the line says so, read_feed otherwise), then the digest from what the reads returned —
    every feed entry and the page's first paragraph, ranked by the words the team cares about."""

    def __call__(self, request: RecordedRequest) -> FakeReply:
        last = request.messages[-1]
        if last["role"] == "tool":
            return FakeReply.text(digest(tool_results(request.messages)))
        prompt = str(last.get("content") or "")
        calls: list[tuple[str, ToolArgs]] = []
        for line in prompt.splitlines():
            for address in URL.findall(line):
                if "web_fetch" in line:
                    calls.append(("web_fetch", {"url": address}))
                else:
                    calls.append(("read_feed", {"url": address, "limit": 10}))
        return FakeReply.parallel_tool_calls(calls) if calls else FakeReply.text("ok")


def tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(str(m["content"])) for m in messages if m["role"] == "tool"]


def digest(results: list[dict[str, Any]]) -> str:
    items: list[tuple[str, str]] = []
    for result in results:
        if "entries" in result:
            items += [(entry["title"], entry["link"]) for entry in result["entries"]]
        else:
            first = next(line for line in result["content"].splitlines() if line.startswith("Python 3"))
            items.append((first.split(". ")[0], result["url"]))

    def weight(item: tuple[str, str]) -> int:
        return -sum(word in item[0].lower() for word in IMPORTANT)

    ranked = sorted(items, key=weight)[:5]
    return "## 每日简报\n\n" + "\n".join(
        f"{n}. [{title}]({link})" for n, (title, link) in enumerate(ranked, 1)
    )


@asynccontextmanager
async def sources() -> AsyncIterator[tuple[Site, dict[str, str]]]:
    """The four sources on one local server, and the example's address → the local one."""

    def serve(kind: str, body: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            return web.Response(text=body, content_type=kind, charset="utf-8")

        return handler

    async with local_site({path: serve(kind, body) for path, kind, body in FEEDS.values()}) as site:
        yield site, {public: site.url + path for public, (path, _, _) in FEEDS.items()}


def digest_requests(fake: FakeOpenAIServer) -> list[RecordedRequest]:
    return [r for r in fake.requests if r.messages[-1]["role"] == "tool"]


async def test_the_daily_digest_reads_its_sources_and_posts_one_card_a_day_across_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncExitStack() as stack:
        fake = await stack.enter_async_context(FakeOpenAIServer(handler=DigestModel()))
        feishu = await stack.enter_async_context(FakeFeishu())
        site, addresses = await stack.enter_async_context(sources())
        env = endpoints(fake, feishu, monkeypatch)
        settings = example_settings("daily-digest", env, tmp_path / "data", allow_hosts=("127.0.0.1",),
                                    addresses=addresses)  # fmt: skip
        clock = Clock(utc("2026-12-01T00:59:50"))  # 08:59:50 in Shanghai
        async with example_gateway(settings, clock) as (built, _):
            await scheduler_looked(built)
            assert not fake.requests, "the job ran before 09:00"
            clock.now = utc("2026-12-01T01:00:00")
            await eventually(
                lambda: bool(feishu.messages_in(GROUP)) and "5." in feishu.messages_in(GROUP)[-1].text
            )

        [card] = feishu.messages_in(GROUP)
        assert card.msg_type == "interactive" and card.reply_to is None
        lines = [line for line in card.text.splitlines() if line[:2] in ("1.", "2.", "3.", "4.", "5.")]
        assert "Python 3.14.2 is the newest release" in lines[0]  # read from the page, ranked first
        assert "A tiny agent kernel" in lines[1] and "Dependabot now opens security fixes" in lines[2]
        assert "每日简报" in card.text and len(lines) == 5 and "(https://example.org/kernel)" in card.text
        assert sum(site.hits.values()) == 4 and all(site.hits[path] == 1 for path, _, _ in FEEDS.values())
        [written] = digest_requests(fake)
        seen = " ".join(str(m["content"]) for m in written.messages if m["role"] == "tool")
        for text in ("A tiny agent kernel", "Dependabot now opens", "JSON Feed 1.2 adds", "tarfile module"):
            assert text in seen, f"the model did not see {text!r}"

        # restarted the same morning on the same data folder: today's digest is not posted again
        clock.now = utc("2026-12-01T01:02:00")
        async with example_gateway(settings, clock) as (built, _):
            await scheduler_looked(built)
            assert len(feishu.messages_in(GROUP)) == 1 and len(digest_requests(fake)) == 1
            clock.now = utc("2026-12-02T00:59:59")
            await scheduler_looked(built)
            assert len(feishu.messages_in(GROUP)) == 1
            clock.now = utc("2026-12-02T01:00:00")  # the next morning's
            await eventually(
                lambda: len(feishu.messages_in(GROUP)) == 2 and "5." in feishu.messages_in(GROUP)[-1].text
            )
        assert len(digest_requests(fake)) == 2 and sum(site.hits.values()) == 8
