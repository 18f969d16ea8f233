"""Declared HTTP APIs as tools (tools/http_api.py, `apis:` in config.py): real local servers only.

Cases come from the OpenAPI 3.1 specification (path and query parameters, `$ref` to
components/parameters and components/schemas, request bodies by media type, `+json` suffixes per
RFC 6839), from the OpenAPI Initiative's own sample `petstore-expanded.yaml` (tests/data/openapi/,
whose `find pet by id` operationId is not a valid tool name) and from the issue's list of bad input
(4xx/5xx, unreachable hosts, slow answers, huge bodies, invalid declarations). A team API is served
by aiohttp on 127.0.0.1; the model is the fake OpenAI-compatible server, whose recorded requests
show what the model was sent.
"""

from __future__ import annotations

import asyncio
import json
import socket
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from hermes_core import Agent
from hermes_core.config import APIConfig, ConfigError, build_agent, load_settings
from hermes_core.kernel.messages import ToolCall
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.kernel.tools.registry import ToolRegistry
from hermes_core.tasks.pending import InlineInteractions, Pending
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from hermes_core.tools.http_api import api_tools

DATA = Path(__file__).parent / "data" / "openapi"
SECRET = "team-api-credential-7f3a9c2e41"


@dataclass
class TeamAPI:
    url: str
    seen: list[dict[str, Any]] = field(default_factory=list)


API = web.AppKey("api", TeamAPI)


async def _handle(request: web.Request) -> web.StreamResponse:
    api = request.app[API]
    body = await request.text()
    api.seen.append(
        {
            "method": request.method,
            "path": request.raw_path.partition("?")[0],
            "query": list(request.query.items()),
            "headers": dict(request.headers),
            "body": json.loads(body) if body else None,
        }
    )
    allowed = request.headers.get("Authorization") == f"Bearer {SECRET}" or request.query.get("key") == SECRET
    if not allowed:
        return web.json_response({"error": "unauthorized"}, status=401)
    path = request.path
    if path == "/echo":
        return web.json_response({"headers": dict(request.headers), "query": dict(request.query)})
    if path == "/broken":
        return web.Response(status=500, text="database down\n" + "x" * 5000)
    if path == "/everything":
        return web.json_response([{"id": i, "name": f"person {i}"} for i in range(5000)])
    if path == "/slow":
        await asyncio.sleep(5)  # an API slower than the call may wait: the behaviour under test
    if path == "/endless":  # a body that never ends (the client must stop reading)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        try:
            for _ in range(10_000):
                await response.write(b"1," * 30_000)
        except ConnectionError:
            pass  # the client stopped reading, as it should
        return response
    if path == "/lying":  # says JSON, is not; and not UTF-8
        return web.Response(body=b"caf\xe9 <html>", content_type="application/json")
    if path == "/text":
        return web.Response(text="plain words")
    if request.method == "DELETE":
        return web.Response(status=204)
    if path.startswith("/people/"):
        return web.json_response({"id": int(path.rsplit("/", 1)[1]), "name": "Ada"})
    if path == "/people":
        return web.json_response([{"name": "Ada", "team": request.query["team"]}])
    return web.json_response({"id": "r1", "received": json.loads(body) if body else None}, status=201)


@pytest.fixture
async def team_api() -> AsyncIterator[TeamAPI]:
    app, api = web.Application(), TeamAPI("")
    app[API] = api
    app.router.add_route("*", "/{tail:.*}", _handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    api.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield api
    await runner.cleanup()


@pytest.fixture(autouse=True)
def _credential(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEAM_API_CREDENTIAL", SECRET)


def team_config(url: str, **extra: Any) -> APIConfig:
    auth = {"header": "Authorization", "prefix": "Bearer ", "env": "TEAM_API_CREDENTIAL"}
    return APIConfig.model_validate(
        {"name": "team", "base_url": url, "openapi": "team-api.yaml", "auth": auth, **extra}
    )


async def run(registry: ToolRegistry, name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
    outcome = await registry.execute(ToolCall("c1", name, json.dumps(arguments)))
    try:
        return outcome.ok, json.loads(outcome.content)
    except ValueError:
        return outcome.ok, outcome.content


def test_operations_become_tools_with_their_schemas(team_api: TeamAPI) -> None:
    """OpenAPI 3.1 §4.8.9/§4.8.12/§4.8.13: path-item and operation parameters, `$ref`s resolved,
    header parameters not offered, a JSON (or `+json`) body as `body`, a form body left out."""
    tools = {t.name: t for t in api_tools(team_config(team_api.url), DATA)}
    assert sorted(tools) == sorted(
        [
            "getPerson",
            "findPeople",
            "createReminder",
            "replaceReminder",
            "snoozeReminder",
            "deleteReminder",
            "echoRequest",
            "brokenReport",
            "everything",
        ]
    )
    levels = {name: t.level for name, t in tools.items()}
    assert levels["getPerson"] == levels["findPeople"] == 0
    assert levels["createReminder"] == levels["replaceReminder"] == levels["snoozeReminder"] == 1
    assert levels["deleteReminder"] == 2
    people = tools["findPeople"].parameters
    assert set(people["properties"]) == {"team", "limit"} and people["required"] == ["team"]
    assert tools["findPeople"].description == "People of a team. Filter by team name; at most `limit` people."
    person = tools["getPerson"].parameters
    assert person["properties"]["id"] == {"type": "integer", "description": "the person's id"}
    body = tools["createReminder"].parameters["properties"]["body"]
    assert body["required"] == ["text", "at"] and body["properties"]["owner"]["properties"]["manager"]
    assert tools["createReminder"].parameters["required"] == ["body"]
    assert "body" not in tools["replaceReminder"].parameters["required"]
    assert SECRET not in json.dumps([t.schema() for t in tools.values()])


def test_the_petstore_sample_document() -> None:
    """The OpenAPI Initiative's petstore-expanded.yaml: `find pet by id` becomes a valid name, the
    `allOf` of `$ref`s is resolved, DELETE is level 2."""
    config = APIConfig.model_validate(
        {"name": "pets", "base_url": "http://127.0.0.1:9", "openapi": "petstore-expanded.yaml"}
    )
    tools = {t.name: t for t in api_tools(config, DATA)}
    assert sorted(tools) == ["addPet", "deletePet", "findPets", "find_pet_by_id"]
    assert tools["addPet"].parameters["properties"]["body"]["required"] == ["name"]
    assert tools["findPets"].parameters["properties"]["tags"]["items"] == {"type": "string"}
    assert [tools[n].level for n in ("findPets", "addPet", "find_pet_by_id", "deletePet")] == [0, 1, 0, 2]


async def test_petstore_calls_reach_a_server(team_api: TeamAPI) -> None:
    """The sample's operations sent as its paths say (a real server on loopback)."""
    config = APIConfig.model_validate(
        {
            "name": "pets",
            "base_url": team_api.url,
            "openapi": "petstore-expanded.yaml",
            "auth": {"query": "key", "env": "TEAM_API_CREDENTIAL"},
        }
    )
    registry = ToolRegistry(api_tools(config, DATA))
    assert await run(registry, "findPets", {"tags": ["cat", "dog"], "limit": "2"}) == (
        True,
        {"id": "r1", "received": None},
    )
    assert team_api.seen[-1]["query"] == [("tags", "cat"), ("tags", "dog"), ("limit", "2"), ("key", SECRET)]
    ok, _ = await run(registry, "addPet", {"body": {"name": "Rex"}})
    assert ok and team_api.seen[-1]["body"] == {"name": "Rex"} and team_api.seen[-1]["method"] == "POST"


async def test_each_method_reaches_the_server_with_its_arguments(team_api: TeamAPI) -> None:
    """GET (path and query), POST, PUT, PATCH (an `application/merge-patch+json` body), DELETE."""
    registry = ToolRegistry(api_tools(team_config(team_api.url), DATA))
    assert await run(registry, "getPerson", {"id": "7"}) == (True, {"id": 7, "name": "Ada"})
    assert await run(registry, "findPeople", {"team": "a b&c"}) == (True, [{"name": "Ada", "team": "a b&c"}])
    reminder = {"text": "stand-up", "at": "2026-12-07T09:00:00+08:00"}
    ok, created = await run(registry, "createReminder", {"body": reminder})
    assert ok and created == {"id": "r1", "received": reminder}
    assert (await run(registry, "replaceReminder", {"id": "r/1", "body": reminder}))[0]
    assert (await run(registry, "snoozeReminder", {"id": "r1", "body": {"at": "10:00"}}))[0]
    allowed = ToolRegistry(
        api_tools(team_config(team_api.url), DATA), Policy.from_lists(allow_irreversible=["deleteReminder"])
    )
    allowed.interactions = InlineInteractions(_approve, _no_question)
    assert await run(allowed, "deleteReminder", {"id": "r1"}) == (True, {"status": 204})
    sent = [(s["method"], s["path"], s["query"]) for s in team_api.seen]
    assert sent == [
        ("GET", "/people/7", []),
        ("GET", "/people", [("team", "a b&c")]),
        ("POST", "/reminders", []),
        ("PUT", "/reminders/r%2F1", []),
        ("PATCH", "/reminders/r1", []),
        ("DELETE", "/reminders/r1", []),
    ]
    assert all(s["headers"]["Authorization"] == f"Bearer {SECRET}" for s in team_api.seen)


async def _approve(pending: Pending) -> bool:
    return True


async def _no_question(question: str) -> str:
    raise AssertionError(question)


async def test_bad_answers_are_error_results(team_api: TeamAPI) -> None:
    """The issue's bad input: a 5xx (status and the start of the body), a 401, a huge answer (cut),
    an unreachable host, a slow answer (timeout) — each an error result, never an exception."""
    registry = ToolRegistry(api_tools(team_config(team_api.url, timeout=0.5), DATA))
    ok, result = await run(registry, "brokenReport", {})
    assert not ok and result["error"].startswith("team API answered HTTP 500 to brokenReport: database down")
    assert len(result["error"]) < 700
    ok, result = await run(registry, "everything", {})
    assert ok and "[truncated: shown" in result and result.startswith('[{"id":0,"name":"person 0"}')
    slow = api_tools(
        team_config(
            team_api.url,
            timeout=0.5,
            operations=[{"name": "slow", "method": "GET", "path": "/slow", "description": "A slow report."}],
            openapi=None,
        ),
        DATA,
    )
    ok, result = await run(ToolRegistry(slow), "slow", {})
    assert not ok and result["error"] == "team API: no answer within 0.5 s"
    odd = api_tools(
        team_config(
            team_api.url,
            timeout=5,
            operations=[
                {"name": "endless", "method": "GET", "path": "/endless", "description": "An endless body."},
                {"name": "lying", "method": "GET", "path": "/lying", "description": "A lying type."},
            ],
            openapi=None,
        ),
        DATA,
    )
    ok, result = await run(ToolRegistry(odd), "endless", {})
    assert ok and "[truncated: shown 3000 of" in result and result.startswith("1,1,1,")
    assert await run(ToolRegistry(odd), "lying", {}) == (True, "caf\ufffd <html>")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    ok, result = await run(
        ToolRegistry(api_tools(team_config(f"http://127.0.0.1:{port}"), DATA)), "getPerson", {"id": 1}
    )
    assert not ok and result["error"].startswith("team API unreachable: ClientConnectorError")
    monkey_free = api_tools(team_config(team_api.url, auth=None), DATA)
    ok, result = await run(ToolRegistry(monkey_free), "getPerson", {"id": 1})
    assert not ok and result["error"] == 'team API answered HTTP 401 to getPerson: {"error": "unauthorized"}'


async def test_hand_written_operations(team_api: TeamAPI) -> None:
    """`operations:` written in the configuration: `{id}` is a path parameter, the rest query; HEAD
    (no body, RFC 9110 §9.3.2) answers with its status."""
    config = team_config(
        team_api.url,
        openapi=None,
        levels={"plain": 1},
        operations=[
            {
                "name": "person",
                "method": "GET",
                "path": "/people/{id}",
                "description": "One person.",
                "parameters": {"id": {"type": "integer"}, "verbose": {"type": "boolean", "required": True}},
            },
            {"name": "plain", "method": "GET", "path": "/text", "description": "Some text."},
            {
                "name": "exists",
                "method": "HEAD",
                "path": "/people/{id}",
                "description": "Whether one exists.",
                "parameters": {"id": {"type": "integer"}},
            },
        ],
    )
    tools = {t.name: t for t in api_tools(config, DATA)}
    assert tools["person"].parameters["required"] == ["id", "verbose"] and tools["plain"].level == 1
    registry = ToolRegistry(list(tools.values()))
    assert await run(registry, "person", {"id": 3, "verbose": "true"}) == (True, {"id": 3, "name": "Ada"})
    assert team_api.seen[-1]["query"] == [("verbose", "true")]
    assert await run(registry, "plain", {}) == (True, "plain words")
    assert await run(registry, "exists", {"id": 4}) == (True, {"status": 200}) and tools["exists"].level == 0
    assert team_api.seen[-1]["method"] == "HEAD"


async def test_the_model_never_sees_the_credential(team_api: TeamAPI, tmp_path: Path) -> None:
    """The credential is added when the request is sent: the server gets it, the model's requests
    (tool schemas, the echoed answer) never hold it — the echo shows `[REDACTED]`."""
    (tmp_path / "team-api.yaml").write_text((DATA / "team-api.yaml").read_text())
    async with FakeOpenAIServer() as fake:
        path = tmp_path / "hermes.yaml"
        path.write_text(
            textwrap.dedent(f"""
            model: {{name: m, base_url: {fake.base_url}}}
            tools: []
            apis:
              - name: team
                base_url: {team_api.url}
                openapi: team-api.yaml
                auth: {{header: Authorization, prefix: "Bearer ", env: TEAM_API_CREDENTIAL}}
        """)
        )
        agent = build_agent(load_settings(path, env={}, dotenv=None))
        fake.script(FakeReply.tool_call("echoRequest", {}), FakeReply.text("done"))
        result = await agent.run("what does the API see?")
        assert result.reply == "done"
        assert team_api.seen[-1]["headers"]["Authorization"] == f"Bearer {SECRET}"
        sent = b"".join(r.raw for r in fake.requests)
        assert SECRET.encode() not in sent and b"[REDACTED]" in sent
        assert "echoRequest" in {t["function"]["name"] for t in fake.requests[0].tools}


async def test_delete_needs_allow_irreversible_and_approval(team_api: TeamAPI) -> None:
    """Level 2 (DELETE) as every level-2 tool: off unless allowed, then a person approves each call."""
    tools = api_tools(team_config(team_api.url), DATA)
    model = ScriptedModel([call("deleteReminder", {"id": "r1"}), reply("no")])
    result = await Agent(model=model, tools=tools).run("delete r1")
    assert "irreversible tools are disabled" in result.tool_calls[0].content
    allowed = Policy.from_lists(allow_irreversible=["deleteReminder"])
    model = ScriptedModel([call("deleteReminder", {"id": "r1"}), reply("deleted")])
    agent = Agent(
        model=model, tools=tools, permissions=allowed, interactions=InlineInteractions(_approve, _no_question)
    )
    await agent.run("delete r1")
    assert [(s["method"], s["path"]) for s in team_api.seen] == [("DELETE", "/reminders/r1")]


BAD_DECLARATIONS = [
    ({"openapi": "missing.yaml"}, "apis.team.openapi: cannot read"),
    ({"openapi": "broken.yaml"}, "is not valid YAML or JSON"),
    ({"openapi": "swagger2.yaml"}, "is not an OpenAPI 3 document"),
    ({"openapi": "remote-ref.yaml"}, "points outside the document; inline it"),
    ({"openapi": "dangling-ref.yaml"}, "points at nothing in the document"),
    ({"openapi": "bad-schema.yaml"}, "are not a valid JSON Schema"),
    ({"auth": {"header": "X-Key", "env": "NOT_SET_ANYWHERE_42"}}, "NOT_SET_ANYWHERE_42 is not set"),
    ({"base_url": "ftp://files.example"}, "base_url must be an http:// or https:// URL"),
    ({"levels": {"nope": 0}}, "no operation named 'nope'"),
    (
        {"operations": [{"name": "x", "method": "GET", "path": "/", "description": "d"}]},
        "give either openapi",
    ),
]


@pytest.mark.parametrize(("change", "message"), BAD_DECLARATIONS)
def test_a_bad_declaration_stops_the_start_in_one_line(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    """Each declaration the issue calls invalid: a ConfigError, one line, naming the fix."""
    (tmp_path / "team-api.yaml").write_text((DATA / "team-api.yaml").read_text())
    (tmp_path / "broken.yaml").write_text("openapi: [3.1\n")
    (tmp_path / "swagger2.yaml").write_text("swagger: '2.0'\npaths: {}\n")
    (tmp_path / "remote-ref.yaml").write_text(
        "openapi: 3.0.3\npaths:\n  /a:\n    get:\n      parameters: [{$ref: 'other.yaml#/p'}]\n"
    )
    (tmp_path / "dangling-ref.yaml").write_text(
        "openapi: 3.0.3\npaths:\n  /a:\n    get:\n      parameters: [{$ref: '#/components/nothing'}]\n"
    )
    (tmp_path / "bad-schema.yaml").write_text(
        "openapi: 3.0.3\npaths:\n  /a:\n    get:\n      parameters: [{name: q, in: query, schema: {type: 5}}]"
    )
    api = {
        "name": "team",
        "base_url": "http://127.0.0.1:9",
        "openapi": "team-api.yaml",
        "auth": {"header": "Authorization", "env": "TEAM_API_CREDENTIAL"},
        **change,
    }
    path = tmp_path / "hermes.yaml"
    path.write_text(json.dumps({"tools": [], "apis": [api]}))
    with pytest.raises(ConfigError) as raised:
        build_agent(load_settings(path, env={}, dotenv=None), model_required=False)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_two_tools_with_one_name_stop_the_start(tmp_path: Path) -> None:
    """The same document declared twice without a prefix: one name, two tools."""
    (tmp_path / "team-api.yaml").write_text((DATA / "team-api.yaml").read_text())
    api = {"name": "a", "base_url": "http://127.0.0.1:9", "openapi": "team-api.yaml"}
    path = tmp_path / "hermes.yaml"
    path.write_text(json.dumps({"tools": [], "apis": [api, {**api, "name": "b"}]}))
    with pytest.raises(ConfigError, match="more than one tool is named .*getPerson.*give the API a prefix"):
        build_agent(load_settings(path, env={}, dotenv=None), model_required=False)
    path.write_text(json.dumps({"tools": [], "apis": [api, {**api, "name": "b", "prefix": "b_"}]}))
    agent = build_agent(load_settings(path, env={}, dotenv=None), model_required=False)
    assert agent.registry.get("b_getPerson") is not None and agent.registry.get("getPerson") is not None


def test_openapi_30_keywords_become_json_schema(tmp_path: Path) -> None:
    """OpenAPI 3.0 §4.7.24: `nullable` and boolean `exclusiveMinimum` are 3.0's own (JSON Schema
    2020-12, which 3.1 and the tool schemas use, has a `"null"` type and numeric bounds instead)."""
    (tmp_path / "v30.yaml").write_text(
        "openapi: 3.0.3\npaths:\n  /items:\n    get:\n      operationId: listItems\n      parameters:\n"
        "        - {name: above, in: query, schema: {type: integer, minimum: 0, exclusiveMinimum: true}}\n"
        "        - {name: owner, in: query, schema: {type: string, nullable: true}}\n"
    )
    config = APIConfig.model_validate(
        {"name": "v30", "base_url": "http://127.0.0.1:9", "openapi": "v30.yaml"}
    )
    (listed,) = api_tools(config, tmp_path)
    assert listed.parameters["properties"] == {
        "above": {"type": "integer", "exclusiveMinimum": 0},
        "owner": {"type": ["string", "null"]},
    }
