"""Tools from MCP servers (tools/mcp.py), against a real server the tests start themselves:
tests/mcp_demo_server.py, as a stdio subprocess and as a streamable-HTTP server on a free port."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
)

from hermes_core import Agent, ToolError
from hermes_core.config import ConfigError, build_agent, load_settings, mcp_toolset
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.tools import ToolRegistry, tool
from hermes_core.tools.mcp import (
    MCPConnection,
    MCPConnectionError,
    MCPToolset,
    attach_mcp,
    tool_result,
)
from serve_process import listening
from waiting import wait_for

DEMO_SERVER = Path(__file__).with_name("mcp_demo_server.py")


def demo(log: Path, **options: Any) -> MCPConnection:
    """The demo server over stdio, recording its calls in `log`."""
    env = {"DEMO_CALL_LOG": str(log), **options.pop("env", {})}
    return MCPConnection("demo", command=sys.executable, args=[str(DEMO_SERVER)], env=env, **options)


def calls_seen(log: Path) -> list[dict[str, Any]]:
    """The calls that reached the server."""
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def errors(result: Any) -> list[str]:
    return [json.loads(o.content)["error"] for o in result.tool_calls if not o.ok]


def offered(model: ScriptedModel, index: int = 0) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in model.calls[index].tools or []}


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "calls.jsonl"


@pytest.fixture
def http_server(log: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The demo server on a free local port, speaking streamable HTTP: (its URL, its process)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "DEMO_CALL_LOG": str(log)}
    process = subprocess.Popen(
        [sys.executable, str(DEMO_SERVER), "--port", str(port)], env=env, stderr=subprocess.DEVNULL
    )
    try:
        wait_for(lambda: process.poll() is not None or listening(port), what="the demo server to listen")
        assert process.poll() is None, "the demo server exited before it was ready"
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        process.terminate()
        process.wait(timeout=10)


# --- listing -------------------------------------------------------------------------------------


async def test_stdio_server_tools_become_tools_with_the_servers_schemas(log: Path) -> None:
    async with demo(log) as server:
        tools = {t.name: t for t in server.tools}
    assert {"add", "echo", "greet", "slow", "fail", "crash", "delete_everything"} <= set(tools)
    add = tools["add"]
    assert add.description == "Add two integers."
    assert add.parameters["properties"]["a"]["type"] == "integer"
    assert add.parameters["required"] == ["a", "b"]
    assert add.is_async and add.level == 1 and add.timeout is None
    # a name the model's API would reject ("delete.everything") is made valid
    assert tools["delete_everything"].schema()["function"]["name"] == "delete_everything"


async def test_allow_list_prefix_and_levels_shape_the_offered_tools(log: Path) -> None:
    server = demo(log, allowed_tools=["add", "slow"], prefix="demo_", level=0, levels={"slow": 1})
    async with server:
        tools = {t.name: t for t in server.tools}
        assert set(tools) == {"demo_add", "demo_slow"}
        assert (tools["demo_add"].level, tools["demo_slow"].level) == (0, 1)
        assert await tools["demo_add"].handler(a=2, b=3) == "5"  # the server's own name is called
    assert calls_seen(log) == [{"tool": "add", "arguments": {"a": 2, "b": 3}}]


# --- calls through an agent ----------------------------------------------------------------------


async def test_an_agent_calls_an_mcp_tool_over_stdio(log: Path) -> None:
    model = ScriptedModel([call("add", {"a": 40, "b": 2}), reply("42")])
    async with demo(log) as server:
        result = await Agent(model=model, tools=server.tools).run("40 + 2?")
    assert result.reply == "42"
    assert [(o.call.name, o.ok, o.content) for o in result.tool_calls] == [("add", True, "42")]
    assert offered(model)["add"]["parameters"]["required"] == ["a", "b"]
    assert calls_seen(log) == [{"tool": "add", "arguments": {"a": 40, "b": 2}}]


async def test_an_agent_calls_an_mcp_tool_over_streamable_http(
    log: Path, http_server: tuple[str, Any]
) -> None:
    url, _ = http_server
    model = ScriptedModel([call("echo", {"text": "你好"}), reply("done")])
    async with MCPConnection("web", url=url) as server:
        result = await Agent(model=model, tools=server.tools).run("say 你好")
    assert [(o.call.name, o.ok, o.content) for o in result.tool_calls] == [("echo", True, "你好")]
    assert calls_seen(log) == [{"tool": "echo", "arguments": {"text": "你好"}}]


async def test_arguments_are_checked_at_the_registry_before_the_server_is_asked(log: Path) -> None:
    model = ScriptedModel([call("add", {"a": 1}), reply("sorry")])
    async with demo(log) as server:
        result = await Agent(model=model, tools=server.tools).run("1 + ?")
    assert result.tool_calls[0].error == "bad_arguments"
    assert "'b' is required" in errors(result)[0]
    assert calls_seen(log) == []


async def test_a_level_2_mcp_tool_not_allowed_is_refused_and_never_reaches_the_server(log: Path) -> None:
    model = ScriptedModel([call("delete_everything", {"confirm": True}), reply("I may not.")])
    async with demo(log, levels={"delete.everything": 2}) as server:
        result = await Agent(model=model, tools=server.tools).run("delete everything")
    assert result.tool_calls[0].error == "permission_denied"
    assert "you do not have permission to call delete_everything" in errors(result)[0]
    assert "delete_everything" not in offered(model) and "add" in offered(model)
    assert calls_seen(log) == []


async def test_an_mcp_tool_named_in_confirm_waits_for_approval_before_reaching_the_server(
    log: Path, tmp_path: Path
) -> None:
    from hermes_core.tasks import SQLiteTaskJournal
    from hermes_core.tasks.pending import SQLiteInteractions

    model = ScriptedModel([call("add", {"a": 2, "b": 3}), reply("5")])
    database = tmp_path / "agent.db"
    async with demo(log, confirm=["add"]) as server:
        interactions = SQLiteInteractions(database)
        agent = Agent(model=model, tools=server.tools, journal=SQLiteTaskJournal(database),
                      interactions=interactions)  # fmt: skip
        alice = agent.permissions.caller("alice", "webhook")
        paused = await agent.run("add 2 and 3", task_id="t1", caller=alice)
        assert paused.stop_reason == "awaiting_approval" and calls_seen(log) == []
        [pending] = await interactions.open_for_task("t1")
        await interactions.decide(pending.id, alice, approve=True)
        done = await agent.run("add 2 and 3", task_id="t1", caller=alice)
    assert done.reply == "5" and [c["tool"] for c in calls_seen(log)] == ["add"]


async def test_the_per_server_timeout_bounds_a_call_and_the_connection_survives(log: Path) -> None:
    model = ScriptedModel([call("slow", {"seconds": 30}), call("add", {"a": 1, "b": 1}), reply("ok")])
    async with demo(log, timeout=0.5) as server:
        started = time.monotonic()
        result = await Agent(model=model, tools=server.tools, tool_timeout=60).run("be slow")
    slow, add = result.tool_calls
    # the per-server timeout restarts with each progress notification; none came: cut after 0.5 s
    assert slow.error == "tool_error" and "no answer or progress in 0.5 s" in slow.content
    assert time.monotonic() - started < 10
    assert (add.ok, add.content) == (True, "2")


async def test_an_is_error_answer_becomes_an_error_result(log: Path) -> None:
    model = ScriptedModel([call("fail", {"reason": "no disk"}), reply("it failed")])
    async with demo(log) as server:
        result = await Agent(model=model, tools=server.tools).run("try")
    assert result.reply == "it failed"
    assert result.tool_calls[0].error == "tool_error"
    assert "cannot do that: no disk" in errors(result)[0]


async def test_a_stdio_server_that_dies_gives_error_results_and_is_reconnected(log: Path) -> None:
    model = ScriptedModel([call("crash"), call("add", {"a": 1, "b": 2}), reply("the server is gone")])
    agent = Agent(model=model)
    async with MCPToolset([demo(log)], retry_after=0) as toolset:
        await toolset.attach(agent.registry)
        result = await agent.run("crash it")
        assert result.reply == "the server is gone"
        (crash,) = errors(result)  # crash is not marked read-only or idempotent: not repeated
        assert "MCP server 'demo' lost the connection during the call" in crash
        assert "may or may not have taken effect" in crash
        assert result.tool_calls[1].content == "3"  # the next call started the server again
    assert [c["tool"] for c in calls_seen(log)] == ["crash", "add"]


async def test_an_http_server_that_dies_gives_error_results_not_a_crash(
    log: Path, http_server: tuple[str, subprocess.Popen[bytes]]
) -> None:
    url, process = http_server

    def stop_the_server_then_call(messages: Any, tools: Any) -> Any:
        process.kill()
        process.wait()
        return call("add", {"a": 3, "b": 4})

    model = ScriptedModel([call("add", {"a": 1, "b": 2}), stop_the_server_then_call, reply("down")])
    async with MCPConnection("web", url=url) as server:
        result = await Agent(model=model, tools=server.tools).run("add twice")
    assert result.reply == "down"
    assert [o.ok for o in result.tool_calls] == [True, False]
    assert re.search(r"MCP server 'web' (lost the connection|is not connected)", errors(result)[0])
    assert calls_seen(log) == [{"tool": "add", "arguments": {"a": 1, "b": 2}}]


# --- connecting ----------------------------------------------------------------------------------


async def test_concurrent_first_uses_share_one_server(log: Path, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    toolset = MCPToolset([demo(log, env={"DEMO_START_LOG": str(starts)})])
    registry = ToolRegistry()
    async with toolset:
        await asyncio.gather(*(toolset.attach(registry) for _ in range(4)))  # four conversations at once
        assert "add" in registry.names
    assert len(starts.read_text().splitlines()) == 1


async def test_a_server_that_cannot_start_raises_a_clear_error(tmp_path: Path) -> None:
    broken = MCPConnection("broken", command=sys.executable, args=["-c", "pass"], connect_timeout=10)
    with pytest.raises(MCPConnectionError, match="cannot connect to MCP server 'broken'"):
        await broken.connect()
    assert not broken.connected


async def test_a_toolset_leaves_out_what_it_cannot_attach_and_never_raises(
    log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two integers (the local one)."""
        return a + b

    registry = ToolRegistry([add])
    broken = MCPConnection("broken", command=sys.executable, args=["-c", "pass"])
    async with MCPToolset([demo(log), broken]) as toolset:
        with caplog.at_level(logging.WARNING, logger="hermes_core.mcp"):
            await toolset.attach(registry, wait=30)
            await toolset.attach(registry)  # a second run: nothing twice, the broken one not retried yet
    assert registry.get("add") is add  # the local tool keeps its name
    assert "echo" in registry.names and "add_demo" in registry.names  # the server's add, renamed
    messages = [record.getMessage() for record in caplog.records]
    assert sum("cannot connect to MCP server 'broken'" in m for m in messages) == 1
    renamed = "'add' is already registered by a local tool; offered as 'add_demo'"
    assert sum(renamed in m for m in messages) == 1


# --- configuration -------------------------------------------------------------------------------


async def test_configured_servers_reach_the_agent_built_from_settings(
    tmp_path: Path, log: Path, http_server: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = http_server
    config = tmp_path / "hermes.yaml"
    config.write_text(
        f"""
mcp:
  - name: local
    command: {json.dumps(sys.executable)}
    args: [{json.dumps(str(DEMO_SERVER))}]
    env: [DEMO_GREETING, DEMO_CALL_LOG]
    tools: [greet]
  - name: web
    url: {url}
    headers: {{X-Demo-Key: DEMO_KEY}}
    prefix: web_
    levels: {{add: 0}}
    timeout: 5
""",
        encoding="utf-8",
    )
    monkeypatch.setenv("DEMO_GREETING", "bonjour")
    monkeypatch.setenv("DEMO_CALL_LOG", str(log))
    monkeypatch.setenv("DEMO_KEY", "a-secret-from-the-environment")
    settings = load_settings(config, dotenv=None)
    calls = call(
        "greet", {"name": "Ada"}, ("web_add", {"a": 1, "b": 2}), ("web_header", {"name": "X-Demo-Key"})
    )
    model = ScriptedModel([calls, reply("done")])
    agent = build_agent(settings, model=model)
    toolset = mcp_toolset(settings.mcp)
    try:
        await toolset.attach(agent.registry)
        result = await agent.run("greet Ada, then add")
    finally:
        await toolset.aclose()
    assert [o.content for o in result.tool_calls] == ["bonjour, Ada", "3", "a-secret-from-the-environment"]
    web_add = agent.registry.get("web_add")
    assert (web_add.level, web_add.timeout) == (0, 20)  # 5 s, restarted by progress up to 4×
    assert "echo" not in agent.registry.names and "web_echo" in agent.registry.names


def test_no_mcp_section_means_no_toolset() -> None:
    assert mcp_toolset(load_settings(None, env={}, dotenv=None).mcp) is None


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x"}, "give either command"),
        ({"name": "x", "command": "srv", "url": "http://127.0.0.1:1/mcp"}, "give either command"),
        ({"name": "x", "command": "srv", "level": 3}, "mcp.0.level"),
        ({"name": "x y", "command": "srv"}, "mcp.0.name"),
    ],
)
def test_invalid_server_entries_are_configuration_errors(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    config = tmp_path / "hermes.yaml"
    config.write_text(json.dumps({"mcp": [entry]}), encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        load_settings(config, env={}, dotenv=None)


def test_env_and_headers_name_variables_and_never_hold_values(tmp_path: Path) -> None:
    config = tmp_path / "hermes.yaml"
    config.write_text(
        json.dumps({"mcp": [{"name": "web", "url": "http://127.0.0.1:1/mcp", "env": ["NOT_SET_ANYWHERE"]}]}),
        encoding="utf-8",
    )
    settings = load_settings(config, env={}, dotenv=None)
    with pytest.raises(ConfigError, match="variable NOT_SET_ANYWHERE, which is not set"):
        MCPToolset.from_config(settings.mcp, environ={})
    settings.mcp[0].env = []
    settings.mcp[0].headers = {"Authorization": "Bearer abc123secret"}
    with pytest.raises(ConfigError, match="must be the name of an environment variable") as raised:
        MCPToolset.from_config(settings.mcp, environ={})
    assert "abc123secret" not in str(raised.value)
    settings.mcp[0].headers = {"Authorization": "TOKEN_VAR"}
    connection = MCPToolset.from_config(settings.mcp, environ={"TOKEN_VAR": "Bearer v"}).connections[0]
    assert connection.headers == {"Authorization": "Bearer v"} and "Bearer v" not in repr(connection)


async def test_attach_mcp_adds_the_tools_of_connections_to_an_agent(log: Path) -> None:
    agent = Agent(model=ScriptedModel([reply("hi")]))
    toolset = await attach_mcp(agent, [demo(log, allowed_tools=["echo"])])
    try:
        assert "echo" in agent.registry.names and "add" not in agent.registry.names
    finally:
        await toolset.aclose()
    assert not toolset.connections[0].connected


# --- results -------------------------------------------------------------------------------------


def test_results_read_text_then_structured_content_and_errors_raise() -> None:
    text = CallToolResult(content=[TextContent(text="3")], structured_content={"result": 3})
    assert tool_result(text) == "3"
    structured = CallToolResult(content=[], structured_content={"rows": [1, 2]})
    assert tool_result(structured) == {"rows": [1, 2]}
    mixed = CallToolResult(
        content=[
            TextContent(text="see"),
            ImageContent(data="aGk=", mime_type="image/png"),
            EmbeddedResource(
                type="resource", resource=TextResourceContents(uri="file:///a.txt", text="inside")
            ),
        ]
    )
    assert tool_result(mixed) == "see\n[image: image/png, 2 bytes, not shown to a text model]\ninside"
    with pytest.raises(ToolError, match="quota exceeded"):
        tool_result(CallToolResult(content=[TextContent(text="quota exceeded")], is_error=True))


# --- optional dependency -------------------------------------------------------------------------


def test_only_the_mcp_module_imports_the_sdk() -> None:
    code = (
        "import sys, hermes_core\n"
        "from hermes_core import Agent, tool\n"
        "from hermes_core.config import build_agent, load_settings\n"
        "build_agent(load_settings(None, env={}, dotenv=None))\n"
        "print('mcp' in sys.modules)\n"
        "import hermes_core.tools.mcp\n"
        "print('mcp' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_without_the_extra_the_import_error_names_it() -> None:
    code = (
        "import sys\n"
        "sys.modules['mcp'] = None  # as if the package were not installed\n"
        "try:\n"
        "    import hermes_core.tools.mcp\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 'pip install "hermes-kernel[mcp]"' in out.stdout


# --- as servers really answer --------------------------------------------------------------------


async def test_media_and_structured_only_answers_never_hand_base64_to_the_model(log: Path) -> None:
    """Attack: a tool answering with structured content only that carries an image block (`snapshot`,
    a 1×1 PNG), and one answering with image and audio blocks mirrored in its structured content
    (`recording`, like the reference "everything" server's media tools), from the real demo server
    over stdio. The model read the base64 as text; it must read a one-line note (type, mime type,
    size) in its place, the rest of the structured content kept."""
    from mcp_demo_server import PIXEL, SOUND

    model = ScriptedModel([call("snapshot", {}), call("recording", {}), reply("seen")])
    async with demo(log) as server:
        result = await Agent(model=model, tools=server.tools).run("what is on the screen?")
    snapshot, recording = (json.loads(outcome.content) for outcome in result.tool_calls)
    assert snapshot == {
        "caption": "the screen",
        "image": "[image: image/png, 70 bytes, not shown to a text model]",
    }
    assert recording["items"][0].startswith("[image: image/png, ")
    assert recording["items"][1] == "[audio: audio/wav, 604 bytes, not shown to a text model]"
    sent = json.dumps(model.calls[-1].messages)
    assert PIXEL[:40] not in sent and SOUND[:40] not in sent


async def test_concurrent_first_runs_all_see_the_mcp_tools(log: Path) -> None:
    """Attack: eight conversations start at once while the server is still starting. The first
    run waited for it; the others found the toolset already "attached" and ran without its tools
    (1 of 8 answered). Every run started within the first wait must be offered the server's tools."""
    model = ScriptedModel([reply("ok")] * 8)
    async with MCPToolset([demo(log)], first_wait=30) as toolset:  # a loaded machine starts it slowly
        agent = Agent(model=model, mcp=toolset)
        results = await asyncio.gather(*(agent.run(f"hello {i}") for i in range(8)))
    assert [r.reply for r in results] == ["ok"] * 8
    assert all("add" in offered(model, i) for i in range(8)), [sorted(offered(model, i)) for i in range(8)]


async def test_a_changed_tool_list_is_seen_at_once(log: Path) -> None:
    """Attack: the server withdraws `echo` during a call and says so (`tools/list_changed`, the demo
    server's `retire`). The refresh was not awaited: the model's next call in the same run, and a run
    started right after, were still offered `echo`. Both must get the new list, without waiting."""
    model = ScriptedModel([call("retire", {"name": "echo"}), reply("gone"), reply("second run")])
    async with MCPToolset([demo(log)], first_wait=30) as toolset:
        agent = Agent(model=model, mcp=toolset)
        await agent.run("withdraw echo")
        await agent.run("again")
    assert "echo" in offered(model, 0)
    assert "echo" not in offered(model, 1) and "echo" not in offered(model, 2)
    assert "add" in offered(model, 1) and "add" in offered(model, 2)


def test_run_starts_an_mcp_server_that_needs_more_than_two_seconds(tmp_path: Path, log: Path) -> None:
    """Attack: `hermes-kernel run` with a configured server that takes 3 s to start (DEMO_START_DELAY)
    went on without its tools: a run waited only the toolset's 2 s `first_wait`. `run` and `chat`
    now start the servers first, each within its `connect_timeout` (30 s by default), as `serve`
    does; the model is offered the server's tools and the call reaches the server."""
    from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

    config = tmp_path / "hermes.yaml"
    config.write_text(
        f"mcp:\n  - name: slow\n    command: {json.dumps(sys.executable)}\n"
        f"    args: [{json.dumps(str(DEMO_SERVER))}]\n    env: [DEMO_START_DELAY, DEMO_CALL_LOG]\n",
        encoding="utf-8",
    )
    fake = FakeOpenAIServer().start_in_thread()
    try:
        fake.script(FakeReply.tool_call("add", {"a": 1, "b": 2}), FakeReply.text("It is 3."))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
        src = str(Path(__file__).resolve().parents[1] / "src")
        env |= {"HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "fake", "DEMO_START_DELAY": "3",
                "DEMO_CALL_LOG": str(log), "PYTHONPATH": src}  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "hermes_core", "--config", str(config), "run", "--json", "1 + 2?"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
    finally:
        fake.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["reply"] == "It is 3."
    assert "add" in {t["function"]["name"] for t in fake.requests[0].tools}
    assert calls_seen(log) == [{"tool": "add", "arguments": {"a": 1, "b": 2}}]
