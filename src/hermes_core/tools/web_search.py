"""web_search: one tool, the search provider chosen by configuration (`web.search.provider`).

Each provider is a small function from a query to the provider's documented JSON, and a reader
from that JSON to results of one shape: title, url, snippet.

- `searxng` — self-hostable; `GET {base_url}/search?q=…&format=json` answers
  `{"results": [{"title", "url", "content"}]}` (https://docs.searxng.org/dev/search_api.html; the
  instance must list `json` in `search.formats`). No key.
- `brave` — Brave Web Search API: `GET https://api.search.brave.com/res/v1/web/search?q=…&count=N`
  with the key in `X-Subscription-Token`; answers `{"web": {"results": [{"title", "url",
  "description"}]}}` (https://api-dashboard.search.brave.com/docs, the WebSearchApiResponse model).
- `tavily` — `POST https://api.tavily.com/search` with `{"query", "max_results"}` and
  `Authorization: Bearer <key>`; answers `{"results": [{"title", "url", "content", "score"}]}`
  (https://docs.tavily.com/documentation/api-reference/endpoint/search).

Keys come from the environment only (`web.search.api_key_env`, by default BRAVE_SEARCH_API_KEY or
TAVILY_API_KEY) and never reach the model: a failure names the variable, not its value. The request
goes through the safe fetcher (tools/safe_fetch.py) with the configured base URL's host allowed —
the operator chose it, so a SearXNG on the team's network works — and its size and time limits.
"""

from __future__ import annotations

import html
import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlencode

from pydantic import Field

from ..kernel.tools.declare import Tool, ToolError, tool
from .safe_fetch import AddressGuard, FetchError, FetchLimits, FetchResult, fetch_url

SNIPPET_CHARS = 300
DEFAULT_BASE_URLS = {"brave": "https://api.search.brave.com", "tavily": "https://api.tavily.com"}
DEFAULT_KEY_ENV = {"brave": "BRAVE_SEARCH_API_KEY", "tavily": "TAVILY_API_KEY"}
PROVIDERS = ("searxng", "brave", "tavily")


class SearchError(Exception):
    """A search that could not be made or read; the message is for the model (and `doctor`)."""


@dataclass(frozen=True)
class SearchProvider:
    """A configured provider: its name, base URL, the key's variable and how many results to ask for."""

    name: str
    base_url: str
    api_key_env: str | None = None
    max_results: int = 5
    limits: FetchLimits = FetchLimits(max_bytes=2_000_000, timeout=15.0)

    def key(self, environ: Mapping[str, str] | None = None) -> str | None:
        if self.api_key_env is None:
            return None
        value = (os.environ if environ is None else environ).get(self.api_key_env, "").strip()
        if not value:
            raise SearchError(
                f"web search ({self.name}) needs an API key in the environment variable {self.api_key_env}"
            )
        return value


async def search(provider: SearchProvider, query: str, count: int | None = None) -> list[dict[str, str]]:
    """The provider's results for `query` as [{title, url, snippet}]; SearchError otherwise."""
    if not query.strip():
        raise SearchError("the search query is empty")
    wanted = max(1, min(count or provider.max_results, 20))
    method, url, headers, body = REQUESTS[provider.name](provider, query.strip(), wanted, provider.key())
    guard = AddressGuard(mode="public", allow_hosts=(_host(provider.base_url),))
    try:
        fetched = await fetch_url(url, guard, provider.limits, method=method, headers=headers, body=body)
    except FetchError as exc:
        raise SearchError(f"web search ({provider.name}): {exc}") from None
    document = _json(fetched, provider)
    results = READERS[provider.name](document)
    return [_result(item) for item in results if isinstance(item, dict)][:wanted]


Request = tuple[str, str, dict[str, str], bytes | None]


def _searxng(provider: SearchProvider, query: str, count: int, key: str | None) -> Request:
    url = f"{provider.base_url.rstrip('/')}/search?{urlencode({'q': query, 'format': 'json'})}"
    return "GET", url, {"Accept": "application/json"}, None


def _brave(provider: SearchProvider, query: str, count: int, key: str | None) -> Request:
    url = f"{provider.base_url.rstrip('/')}/res/v1/web/search?{urlencode({'q': query, 'count': count})}"
    return "GET", url, {"Accept": "application/json", "X-Subscription-Token": key or ""}, None


def _tavily(provider: SearchProvider, query: str, count: int, key: str | None) -> Request:
    body = json.dumps({"query": query, "max_results": count}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    return "POST", f"{provider.base_url.rstrip('/')}/search", headers, body


REQUESTS: dict[str, Callable[[SearchProvider, str, int, str | None], Request]] = {
    "searxng": _searxng, "brave": _brave, "tavily": _tavily,
}  # fmt: skip
READERS: dict[str, Callable[[Any], list[Any]]] = {
    "searxng": lambda doc: _list(doc.get("results")),
    "brave": lambda doc: _list((doc.get("web") or {}).get("results")),
    "tavily": lambda doc: _list(doc.get("results")),
}


def _json(fetched: FetchResult, provider: SearchProvider) -> dict[str, Any]:
    if fetched.status in (401, 403):
        raise SearchError(
            f"web search ({provider.name}) refused the API key in {provider.api_key_env} "
            f"(HTTP {fetched.status})"
        )
    if fetched.status == 429:
        raise SearchError(f"web search ({provider.name}) is rate limited (HTTP 429); try again later")
    if fetched.status >= 300:
        raise SearchError(f"web search ({provider.name}) answered HTTP {fetched.status}")
    try:
        document = json.loads(fetched.body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        hint = (
            " (SearXNG: enable the json format in settings.yml search.formats)"
            if provider.name == "searxng"
            else ""
        )
        raise SearchError(f"web search ({provider.name}) did not answer with JSON{hint}") from None
    if not isinstance(document, dict):
        raise SearchError(f"web search ({provider.name}) answered JSON without results")
    return document


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _result(item: dict[str, Any]) -> dict[str, str]:
    snippet = str(item.get("content") or item.get("description") or item.get("snippet") or "")
    snippet = html.unescape(re.sub(r"<[^>]+>", "", snippet))  # Brave marks matches with <strong>
    snippet = re.sub(r"\s+", " ", snippet).strip()
    if len(snippet) > SNIPPET_CHARS:
        snippet = snippet[:SNIPPET_CHARS].rstrip() + "…"
    title = html.unescape(str(item.get("title") or ""))
    return {"title": title, "url": str(item.get("url") or ""), "snippet": snippet}


def _host(url: str) -> str:
    from yarl import URL

    return URL(url).raw_host or ""


def web_search_tool(provider: SearchProvider) -> Tool:
    """The web_search tool for a configured provider."""

    @tool(name="web_search", level=0, idempotent=True, timeout=provider.limits.timeout + 5, groups=("web",),
          keywords=("search", "look up", "搜索", "查一下"))  # fmt: skip
    async def web_search(
        query: Annotated[str, Field(min_length=1, description="What to search the web for")],
        count: Annotated[int, Field(ge=1, le=20, description="How many results")] = provider.max_results,
    ) -> dict[str, Any]:
        """Search the web and return results as title, URL and snippet. Use it for current facts and to find pages; read a result with web_fetch. 网络搜索。"""  # noqa: E501
        try:
            results = await search(provider, query, count)
        except SearchError as exc:
            raise ToolError(str(exc)) from None
        return {"query": query, "provider": provider.name, "results": results}

    return web_search


__all__ = ["PROVIDERS", "SearchError", "SearchProvider", "search", "web_search_tool"]
