"""examples/team-lookups end to end: its own hermes.yaml and OpenAPI document, through the gateway
`serve` builds, against local fakes — the on-call API and the wiki on 127.0.0.1, the fake Feishu
platform, a scripted model that looks up what the answers lead to.

The cases come from article 000 ("the repetitive lookups" of a team in Feishu; its tool layer's
"HTTP APIs") and the issue's wording: a question answered through a declared API (its operations
from an OpenAPI 3 document, its token from the environment and never seen by the model) and
`web_fetch` (the runbook the API links to, on the one wiki host the example allows).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from example_harness import endpoints, example_gateway, example_settings
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from virtual_clock import Clock, utc
from waiting import eventually
from web_sites import local_site

TOKEN = "oncall-token-7f3a9c2e51d04b8b"
QUESTION = "checkout 报 502 了，现在谁值班？重启步骤是什么？"
RUNBOOK = """<!doctype html><html><head><title>Runbook: checkout</title></head><body>
<nav><a href="/wiki">Wiki home</a></nav>
<main><article><h1>Runbook: checkout</h1><p>When checkout answers 502:</p>
<ol><li>Check the payments gateway status page.</li>
<li>Restart with <code>deployctl restart checkout --region cn-east</code>.</li>
<li>Post in the incident channel.</li></ol></article></main>
<footer>Team wiki</footer></body></html>"""


class LookupModel:
    """A model that follows its answers: the service first, then who is on call for its team and
    the runbook its answer links to (together), then the reply from what they returned."""

    def __call__(self, request: RecordedRequest) -> FakeReply:
        results = {
            m["tool_call_id"]: json.loads(str(m["content"])) for m in request.messages if m["role"] == "tool"
        }
        if not results:
            return FakeReply.tool_call("getService", {"name": "checkout"})
        if len(results) == 1:
            [service] = results.values()
            return FakeReply.parallel_tool_calls(
                [("whoIsOnCall", {"team": service["team"]}), ("web_fetch", {"url": service["runbook_url"]})]
            )
        shift = next(r for r in results.values() if "primary" in r)
        page = next(r for r in results.values() if "content" in r)
        steps = [line for line in page["content"].splitlines() if line[:2] in ("1.", "2.", "3.")]
        return FakeReply.text(
            f"{shift['primary']['name']} 在值班（到 {shift['until']}）。重启步骤（{page['url']}）：\n"
            + "\n".join(steps)
        )


def on_call_api_and_wiki(wiki_url: list[str]) -> dict[str, Any]:
    """The on-call service (only with the token) and the wiki, as routes of one local server."""

    def authorised(request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {TOKEN}"

    async def service(request: web.Request) -> web.Response:
        if not authorised(request):
            return web.json_response({"error": "unauthorised"}, status=401)
        name = request.match_info["name"]
        return web.json_response({"name": name, "team": "payments", "runbook_url": f"{wiki_url[0]}/{name}"})

    async def shift(request: web.Request) -> web.Response:
        if not authorised(request):
            return web.json_response({"error": "unauthorised"}, status=401)
        return web.json_response({"team": request.match_info["team"], "until": "2026-12-01T18:00:00+08:00",
                                  "primary": {"name": "王芳", "feishu_open_id": "ou_wangfang"},
                                  "next": {"name": "Li Lei", "feishu_open_id": "ou_lilei"}})  # fmt: skip

    async def runbook(request: web.Request) -> web.Response:
        return web.Response(text=RUNBOOK, content_type="text/html", charset="utf-8")

    return {
        "/api/v1/services/{name}": service,
        "/api/v1/oncall/{team}": shift,
        "/wiki/runbooks/{name}": runbook,
    }


async def test_a_question_is_answered_through_the_declared_api_and_the_runbook_it_links_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wiki_url: list[str] = []
    async with (
        FakeOpenAIServer(handler=LookupModel()) as fake,
        FakeFeishu() as feishu,
        local_site(on_call_api_and_wiki(wiki_url)) as site,
    ):
        wiki_url.append(f"{site.url}/wiki/runbooks")
        monkeypatch.setenv("ONCALL_API_TOKEN", TOKEN)
        env = endpoints(fake, feishu, monkeypatch)
        settings = example_settings("team-lookups", env, tmp_path / "data", allow_hosts=("127.0.0.1",),
                                    apis={"oncall": f"{site.url}/api/v1"})  # fmt: skip
        async with example_gateway(settings, Clock(utc("2026-12-01T06:00:00"))) as (_, url):
            asked = feishu.user_message(QUESTION, chat_id="oc_dm_dev", sender="ou_dev")
            assert (await feishu.push(asked, f"{url}/feishu/events")).ok
            await eventually(lambda: any("3." in m.text for m in feishu.messages_in("oc_dm_dev")))

    [reply] = feishu.messages_in("oc_dm_dev")
    assert "王芳 在值班（到 2026-12-01T18:00:00+08:00）" in reply.text
    assert (
        "deployctl restart checkout --region cn-east" in reply.text
        and "/wiki/runbooks/checkout" in reply.text
    )
    assert site.hits == {
        "/api/v1/services/checkout": 1,
        "/api/v1/oncall/payments": 1,
        "/wiki/runbooks/checkout": 1,
    }
    offered = {t["function"]["name"]: t["function"] for t in fake.requests[0].tools}
    assert {"getService", "whoIsOnCall", "web_fetch"} <= set(offered)
    assert "e.g. payments" in json.dumps(offered["whoIsOnCall"]["parameters"])  # the document's schema
    assert TOKEN not in json.dumps([r.messages for r in fake.requests]) + json.dumps(offered)
