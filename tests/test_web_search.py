"""web_search against local servers that answer as each provider documents, its configuration, the
`doctor` line, and the errors the model reads (missing or refused key, rate limit, not JSON, down).

Where the responses come from (trimmed to the fields read, field names as documented):
- SearXNG, https://docs.searxng.org/dev/search_api.html: `GET /search?q=…&format=json` →
  `{"query", "number_of_results", "results": [{"url", "title", "content", "engine", …}]}`;
- Brave, https://api-dashboard.search.brave.com/docs (Web Search API, WebSearchApiResponse):
  `GET /res/v1/web/search?q=…&count=…` with `X-Subscription-Token` →
  `{"type": "search", "web": {"type": "search", "results": [{"title", "url", "description", …}]}}`,
  matches marked with `<strong>` in descriptions;
- Tavily, https://docs.tavily.com/documentation/api-reference/endpoint/search: `POST /search` with
  `{"query", "max_results"}` and `Authorization: Bearer tvly-…` →
  `{"query", "answer", "results": [{"title", "url", "content", "score"}], "response_time"}`.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from hermes_core.config import ConfigError, build_agent, load_settings
from hermes_core.doctor import check_web_fetch, check_web_search
from hermes_core.tools.web_search import SearchProvider, web_search_tool
from web_sites import Site, local_site, run_tool

KEY = "test-key-7d1c0f"  # a made-up key: checked on the wire, never in what the model reads

SEARXNG_ANSWER = {
    "query": "hermes agent",
    "number_of_results": 0,
    "results": [
        {"url": "https://example.org/hermes", "title": "Hermes agents", "content": "A small agent kernel.",
         "engine": "duckduckgo", "parsed_url": ["https", "example.org", "/hermes", "", "", ""],
         "engines": ["duckduckgo"], "positions": [1], "score": 1.0, "category": "general"},
        {"url": "https://example.org/feeds", "title": "Reading feeds", "content": "RSS, Atom and JSON Feed.",
         "engine": "bing", "score": 0.5, "category": "general"},
    ],
    "answers": [], "corrections": [], "infoboxes": [], "suggestions": [], "unresponsive_engines": [],
}  # fmt: skip
BRAVE_ANSWER = {
    "type": "search",
    "query": {"original": "hermes agent"},
    "web": {
        "type": "search",
        "results": [
            {"type": "search_result", "title": "Hermes agents", "url": "https://example.org/hermes",
             "description": "A <strong>small</strong> agent kernel.", "language": "en"},
            {"type": "search_result", "title": "Feeds &amp; pages", "url": "https://example.org/feeds",
             "description": "RSS &amp; Atom, <strong>JSON</strong> Feed.", "language": "en"},
        ],
        "family_friendly": True,
    },
}  # fmt: skip
TAVILY_ANSWER = {
    "query": "hermes agent",
    "answer": None,
    "images": [],
    "results": [
        {"title": "Hermes agents", "url": "https://example.org/hermes", "content": "A small agent kernel.",
         "score": 0.81, "raw_content": None},
    ],
    "response_time": 1.09,
}  # fmt: skip


class Provider:
    """A local server answering like one provider, and what it was asked."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = 200

    def routes(self) -> dict[str, Any]:
        async def searxng(request: web.Request) -> web.Response:
            self.requests.append({"query": dict(request.query)})
            if request.query.get("format") != "json":
                return web.Response(status=403, text="Forbidden")  # what SearXNG answers without json enabled
            return web.json_response(SEARXNG_ANSWER, status=self.status)

        async def brave(request: web.Request) -> web.Response:
            self.requests.append(
                {"query": dict(request.query), "token": request.headers.get("X-Subscription-Token")}
            )
            if request.headers.get("X-Subscription-Token") != KEY:
                return web.json_response({"type": "ErrorResponse", "error": {"status": 401}}, status=401)
            return web.json_response(BRAVE_ANSWER, status=self.status)

        async def tavily(request: web.Request) -> web.Response:
            body = await request.json()
            self.requests.append({"body": body, "auth": request.headers.get("Authorization")})
            if request.headers.get("Authorization") != f"Bearer {KEY}":
                return web.json_response(
                    {"detail": {"error": "Unauthorized: missing or invalid API key."}}, status=401
                )
            if self.status == 429:
                return web.json_response({"detail": {"error": "rate limit"}}, status=429)
            return web.json_response(TAVILY_ANSWER)

        return {"/search": self._by_method(searxng, tavily), "/res/v1/web/search": brave}

    @staticmethod
    def _by_method(get: Any, post: Any) -> Any:
        async def handler(request: web.Request) -> web.Response:
            return await (post(request) if request.method == "POST" else get(request))

        return handler


def provider(name: str, site: Site, **options: Any) -> SearchProvider:
    key_env = None if name == "searxng" else "TEST_SEARCH_KEY"
    return SearchProvider(name, site.url, options.pop("api_key_env", key_env), **options)


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_SEARCH_KEY", KEY)


@pytest.mark.parametrize("name", ["searxng", "brave", "tavily"])
async def test_each_provider_answers_as_title_url_snippet(name: str, key: None) -> None:
    fake = Provider()
    async with local_site(fake.routes()) as site:
        ok, result = await run_tool(web_search_tool(provider(name, site)), query="hermes agent", count=1)
    assert ok, result
    assert result["provider"] == name
    assert result["results"] == [
        {"title": "Hermes agents", "url": "https://example.org/hermes", "snippet": "A small agent kernel."}
    ]
    assert KEY not in json.dumps(result)
    asked = fake.requests[0]
    if name == "searxng":
        assert asked["query"] == {"q": "hermes agent", "format": "json"}
    elif name == "brave":
        assert asked["query"] == {"q": "hermes agent", "count": "1"} and asked["token"] == KEY
    else:
        assert (
            asked["body"] == {"query": "hermes agent", "max_results": 1} and asked["auth"] == f"Bearer {KEY}"
        )


async def test_markup_in_titles_and_snippets_becomes_text(key: None) -> None:
    async with local_site(Provider().routes()) as site:
        ok, result = await run_tool(web_search_tool(provider("brave", site)), query="feeds")
    assert ok and result["results"][1] == {
        "title": "Feeds & pages",
        "url": "https://example.org/feeds",
        "snippet": "RSS & Atom, JSON Feed.",
    }


async def test_a_missing_or_refused_key_names_the_variable_not_the_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = Provider()
    async with local_site(fake.routes()) as site:
        ok, result = await run_tool(web_search_tool(provider("brave", site)), query="x")
        assert not ok and "environment variable TEST_SEARCH_KEY" in result["error"]
        assert fake.requests == []  # nothing sent without a key
        monkeypatch.setenv("TEST_SEARCH_KEY", "wrong-key-123")
        for name in ("brave", "tavily"):
            ok, result = await run_tool(web_search_tool(provider(name, site)), query="x")
            assert not ok and "refused the API key in TEST_SEARCH_KEY (HTTP 401)" in result["error"]
            assert "wrong-key-123" not in json.dumps(result)


async def test_rate_limits_server_errors_and_non_json_answers_are_reported(key: None) -> None:
    fake = Provider()
    async with local_site(fake.routes()) as site:
        fake.status = 429
        ok, result = await run_tool(web_search_tool(provider("tavily", site)), query="x")
        assert not ok and "rate limited" in result["error"]
        fake.status = 502
        ok, result = await run_tool(web_search_tool(provider("searxng", site)), query="x")
        assert not ok and "answered HTTP 502" in result["error"]

    async def html_page(request: web.Request) -> web.Response:
        return web.Response(text="<html>search page</html>", content_type="text/html")

    async with local_site({"/search": html_page}) as site:
        ok, result = await run_tool(web_search_tool(provider("searxng", site)), query="x")
        assert (
            not ok and "did not answer with JSON" in result["error"] and "search.formats" in result["error"]
        )


async def test_an_unreachable_provider_is_reported() -> None:
    async with local_site({}) as site:
        gone = provider("searxng", site)
    ok, result = await run_tool(web_search_tool(gone), query="x")
    assert not ok and "cannot connect to 127.0.0.1" in result["error"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "hermes.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_the_web_tools_are_off_until_configured(tmp_path: Path) -> None:
    """Default: no web tool. `web.fetch` adds web_fetch and read_feed, a provider adds web_search;
    a half configuration stops the start with one line naming the fix."""
    default = build_agent(load_settings(None, env={}, dotenv=None), model_required=False)
    assert not {"web_fetch", "read_feed", "web_search"} & set(default.registry.names)
    config = write(
        tmp_path, "web: {fetch: public, search: {provider: searxng, base_url: 'http://127.0.0.1:9'}}"
    )
    agent = build_agent(load_settings(config, env={}, dotenv=None), model_required=False)
    assert {"web_fetch", "read_feed", "web_search"} <= set(agent.registry.names)
    assert all(agent.registry.get(n).level == 0 for n in ("web_fetch", "read_feed", "web_search"))
    for text, message in (
        ("web: {search: {provider: searxng}}", "provider searxng needs base_url"),
        ("web: {fetch: allow_list}", "allow_hosts names no host"),
        ("web: {fetch: everything}", "web.fetch"),
        ("web: {search: {provider: brave, api_key_env: 'not a name'}}", "web.search.api_key_env"),
    ):
        with pytest.raises(ConfigError, match=message):
            load_settings(write(tmp_path, text), env={}, dotenv=None)


def test_hermes_core_tools_lists_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hermes_core.cli import main

    config = write(tmp_path, "web: {fetch: public, search: {provider: brave}}")
    assert main(["--config", str(config), "tools"]) == 0
    listed = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    assert {"web_fetch", "read_feed", "web_search"} <= set(listed)


async def test_doctor_checks_the_search_provider(tmp_path: Path, key: None) -> None:
    fake = Provider()
    async with local_site(fake.routes()) as site:
        ok = load_settings(
            write(tmp_path, f"web: {{search: {{provider: searxng, base_url: '{site.url}'}}}}"),
            env={},
            dotenv=None,
        )
        check = await check_web_search(ok)
        assert check.status == "OK" and "answered a query (1 result(s))" in check.detail  # asked for one
        brave = write(
            tmp_path,
            f"web: {{search: {{provider: brave, base_url: '{site.url}', api_key_env: NO_SUCH_VAR}}}}",
        )
        check = await check_web_search(load_settings(brave, env={}, dotenv=None))
        assert check.status == "FAIL" and "NO_SUCH_VAR" in check.detail
    fetch = load_settings(
        write(tmp_path, "web: {fetch: allow_list, allow_hosts: [wiki.internal]}"), env={}, dotenv=None
    )
    assert check_web_fetch(fetch).status == "OK" and "wiki.internal" in check_web_fetch(fetch).detail


async def test_doctor_adds_the_web_lines_when_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hermes_core.doctor import diagnose

    monkeypatch.chdir(tmp_path)  # no `.env` of the repository
    fake = Provider()
    async with local_site(fake.routes()) as site:
        plain = write(tmp_path, f"gateway: {{data_dir: '{tmp_path / 'data'}'}}")
        assert not [c for c in await diagnose(str(plain)) if c.name.startswith("web ")]
        web_on = f"web: {{fetch: public, search: {{provider: searxng, base_url: '{site.url}'}}}}"
        configured = write(tmp_path, f"gateway: {{data_dir: '{tmp_path / 'data'}'}}\n{web_on}")
        lines = {c.name: c for c in await diagnose(str(configured))}
    assert lines["web fetch"].status == "OK" and lines["web search (searxng)"].status == "OK"
