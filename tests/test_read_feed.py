"""read_feed against a local feed server: RSS 2.0, RSS 1.0, Atom and JSON Feed read alike, and
malformed feeds, wrong content types and internal addresses answered with a clear error.

Where the cases come from: the RSS 2.0 specification's sample channel (rssboard.org/rss-specification,
"Sample files"), the Atom example of RFC 4287 section 1.1, the RSS 1.0 specification's example
(web.resource.org/rss/1.0/spec, section 7) and JSON Feed 1.1's example (jsonfeed.org/version/1.1),
each trimmed to what the tool reads.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from hermes_core.tools.safe_fetch import AddressGuard, FetchLimits
from hermes_core.tools.web import WebOptions, web_tools
from web_sites import local_site, run_tool

RSS2 = """<?xml version="1.0"?>
<rss version="2.0"><channel>
<title>Liftoff News</title><link>http://liftoff.msfc.nasa.gov/</link>
<description>Liftoff to Space Exploration.</description>
<item><title>Star City</title><link>http://liftoff.msfc.nasa.gov/news/2003/news-starcity.asp</link>
<description>How do Americans get ready to work with Russians aboard the International Space Station? They
take a crash course in culture, language and protocol at Russia's &lt;a href="http://howe.iki.rssi.ru/GCTC/gctc_e.htm"&gt;Star
City&lt;/a&gt;.</description><pubDate>Tue, 03 Jun 2003 09:39:21 GMT</pubDate></item>
<item><title>The Engine That Does More</title><link>http://liftoff.msfc.nasa.gov/news/2003/news-VASIMR.asp</link>
<description>Before man travels to Mars, NASA hopes to design new engines.</description>
<pubDate>Tue, 27 May 2003 08:37:32 GMT</pubDate></item>
</channel></rss>"""

ATOM = """<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom">
  <title>Example Feed</title><link href="http://example.org/"/><updated>2003-12-13T18:30:02Z</updated>
  <author><name>John Doe</name></author><id>urn:uuid:60a76c80-d399-11d9-b93C-0003939e0af6</id>
  <entry><title>Atom-Powered Robots Run Amok</title><link href="http://example.org/2003/12/13/atom03"/>
    <id>urn:uuid:1225c695-cfb8-4ebb-aaaa-80da344efa6a</id><updated>2003-12-13T18:30:02Z</updated>
    <summary>Some text.</summary></entry>
</feed>"""

RSS1 = """<?xml version="1.0"?>
<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" xmlns="http://purl.org/rss/1.0/">
  <channel rdf:about="http://www.xml.com/xml/news.rss"><title>XML.com</title><link>http://xml.com/pub</link>
    <description>XML.com features a rich mix of information and services for the XML community.</description>
    <items><rdf:Seq><rdf:li resource="http://xml.com/pub/2000/08/09/xslt/xslt.html" /></rdf:Seq></items>
  </channel>
  <item rdf:about="http://xml.com/pub/2000/08/09/xslt/xslt.html">
    <title>Processing Inclusions with XSLT</title>
    <link>http://xml.com/pub/2000/08/09/xslt/xslt.html</link>
    <description>Processing document inclusions with general XML tools can be problematic.</description>
  </item>
</rdf:RDF>"""

JSON_FEED = """{
  "version": "https://jsonfeed.org/version/1.1", "title": "My Example Feed",
  "home_page_url": "https://example.org/", "feed_url": "https://example.org/feed.json",
  "items": [
    {"id": "2", "content_text": "This is a second item.", "url": "https://example.org/second-item",
     "date_published": "2010-02-07T14:04:00-05:00"},
    {"id": "1", "title": "Hello", "content_html": "<p>Hello, world!</p>", "url": "https://example.org/initial-post"}
  ]
}"""


def feed_tool(max_entries: int = 20) -> Any:
    options = WebOptions(AddressGuard(allow_hosts=("127.0.0.1",)), FetchLimits(), max_entries=max_entries)
    return web_tools(options)[1]


def serving(body: str | bytes, content_type: str) -> Any:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body.encode() if isinstance(body, str) else body, content_type=content_type)

    return handler


async def read(body: str | bytes, content_type: str, **arguments: Any) -> tuple[bool, Any]:
    async with local_site({"/feed": serving(body, content_type)}) as site:
        return await run_tool(feed_tool(), url=site.url + "/feed", **arguments)


async def test_rss2_entries_have_title_link_date_and_plain_summary() -> None:
    ok, feed = await read(RSS2, "application/rss+xml")
    assert ok, feed
    assert feed["title"] == "Liftoff News" and feed["format"] == "rss20"
    first = feed["entries"][0]
    assert first["title"] == "Star City"
    assert first["link"] == "http://liftoff.msfc.nasa.gov/news/2003/news-starcity.asp"
    assert first["date"] == "2003-06-03T09:39:21+00:00"
    assert "<a" not in first["summary"] and "Star City." in first["summary"]


async def test_atom_rss1_and_json_feed_read_alike() -> None:
    ok, atom = await read(ATOM, "application/atom+xml")
    assert ok and atom["format"] == "atom10"
    assert atom["entries"] == [{"title": "Atom-Powered Robots Run Amok", "link": "http://example.org/2003/12/13/atom03",
                                "date": "2003-12-13T18:30:02+00:00", "summary": "Some text."}]  # fmt: skip
    ok, rss1 = await read(RSS1, "application/rdf+xml")
    assert ok and rss1["entries"][0]["title"] == "Processing Inclusions with XSLT"
    ok, jf = await read(JSON_FEED, "application/feed+json")
    assert ok and jf["title"] == "My Example Feed" and jf["format"] == "json11"
    second = {"title": "", "link": "https://example.org/second-item", "date": "2010-02-07T14:04:00-05:00"}
    assert jf["entries"][0] == {**second, "summary": "This is a second item."}
    assert jf["entries"][1]["summary"] == "Hello, world!"


async def test_entries_are_capped_by_the_limit_and_the_configuration() -> None:
    items = "".join(f"<item><title>n{i}</title><link>http://e.org/{i}</link></item>" for i in range(150))
    body = f'<?xml version="1.0"?><rss version="2.0"><channel><title>many</title>{items}</channel></rss>'
    ok, feed = await read(body, "application/rss+xml", limit=3)
    assert ok and [e["title"] for e in feed["entries"]] == ["n0", "n1", "n2"]
    async with local_site({"/feed": serving(body, "text/xml")}) as site:
        ok, capped = await run_tool(feed_tool(max_entries=5), url=site.url + "/feed", limit=50)
    assert ok and len(capped["entries"]) == 5


async def test_malformed_feeds_are_reported() -> None:
    ok, result = await read("<html><body>Just a page</body></html>", "text/html")
    assert not ok and "not an RSS, Atom or JSON feed" in result["error"]
    ok, result = await read('{"version": "1", "items": []}', "application/json")
    assert not ok and "not a JSON Feed" in result["error"]
    ok, result = await read("{not json", "application/feed+json")
    assert not ok and "not a JSON Feed" in result["error"]
    ok, result = await read(b"\x00\x01\x02\x03", "application/rss+xml")
    assert not ok and "not an RSS" in result["error"]


async def test_a_truncated_feed_still_gives_the_entries_it_has() -> None:
    """feedparser's lenient mode reads a feed cut off mid-item (a broken connection, a size limit)."""
    ok, feed = await read(RSS2[: RSS2.index("<item><title>The Engine")], "application/rss+xml")
    assert ok and [e["title"] for e in feed["entries"]] == ["Star City"]


async def test_wrong_content_types_and_internal_addresses_are_refused() -> None:
    ok, result = await read(b"\x89PNG\r\n", "image/png")
    assert not ok and "image/png is not a content type this tool reads" in result["error"]
    async with local_site({"/feed": serving(RSS2, "application/rss+xml")}) as site:
        tool = web_tools(WebOptions(AddressGuard()))[1]
        ok, result = await run_tool(tool, url=site.url + "/feed")
        assert not ok and "loopback; refused" in result["error"] and site.hits["/feed"] == 0


LAUGHS = "".join(
    f'<!ENTITY lol{n} "{f"&lol{n - 1};" * 10}">' for n in range(2, 10)
)  # the "billion laughs" of OWASP's XML External Entity Prevention Cheat Sheet: 10^9 "lol"s
ENTITY_FEEDS = {
    "billion laughs": f'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol1 "lol">{LAUGHS}]>'
    '<rss version="2.0"><channel><title>&lol9;</title><item><title>x</title></item></channel></rss>',
    "external entity": '<?xml version="1.0"?><!DOCTYPE r [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>'
    '<rss version="2.0"><channel><title>&xxe;</title><item><title>a</title></item></channel></rss>',
}


async def test_entity_expansion_and_external_entities_are_not_followed() -> None:
    """Neither feed expands: the title stays short and holds no line of /etc/passwd."""
    for body in ENTITY_FEEDS.values():
        ok, feed = await read(body, "application/rss+xml")
        assert ok, feed
        assert len(feed["title"]) < 100 and "root:" not in feed["title"]
