"""The MCP client (tools/mcp.py) against the protocol's reference servers, run as real processes:
`@modelcontextprotocol/server-everything`, `-filesystem` and `-memory` (npm, installed once per
machine by the `node_servers` fixture, pinned below) and `mcp-server-time`, `mcp-server-git`
(PyPI, the test extra), over stdio and, where the server offers it, streamable HTTP and the legacy
HTTP+SSE transport. Each test performs one failure a real server showed against the client.

Without node/npm (or when the pinned packages cannot be installed) the npm tests skip, naming why.
The npm packages go to $HERMES_MCP_NODE_DIR, default .cache/mcp-reference-<pins> inside the repository
(ignored by git): the project never writes outside its own tree.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_core import Agent
from hermes_core.config import load_settings
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.tools import ToolRegistry
from hermes_core.tools.mcp import MCPConnection, MCPToolset, connection_from_config
from serve_process import listening
from waiting import eventually, wait_for

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")

NODE_PACKAGES = {  # exact pins: what these tests were written against
    "@modelcontextprotocol/server-everything": "2026.8.31",
    "@modelcontextprotocol/server-filesystem": "2026.8.31",
    "@modelcontextprotocol/server-memory": "2026.8.31",
}
DEMO_SERVER = Path(__file__).with_name("mcp_demo_server.py")
BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def node_servers() -> Path:
    """The folder of the npm reference servers' executables (installed on first use)."""
    pins = "-".join(version for version in NODE_PACKAGES.values())
    default = Path(__file__).resolve().parents[1] / ".cache" / f"mcp-reference-{pins}"
    folder = Path(os.environ.get("HERMES_MCP_NODE_DIR") or default)
    bins = folder / "node_modules" / ".bin"
    if all(
        (bins / name).exists()
        for name in ("mcp-server-everything", "mcp-server-filesystem", "mcp-server-memory")
    ):
        return bins
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("the npm reference MCP servers need node and npm")
    folder.mkdir(parents=True, exist_ok=True)
    specs = [f"{name}@{version}" for name, version in NODE_PACKAGES.items()]
    done = subprocess.run(
        [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--save-exact", *specs],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot install the npm reference MCP servers: {done.stderr.strip()[-300:]}")
    return bins


def python_server(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed (pip install '.[test]')")
    return str(path)


def with_pid(pidfile: Path, command: str, *args: str) -> tuple[str, list[str]]:
    """`command` started through a shell that writes its pid first, so a test can kill it."""
    return "sh", ["-c", 'echo $$ > "$0"; exec "$@"', str(pidfile), command, *args]


def kill(pidfile: Path) -> None:
    os.kill(int(pidfile.read_text()), signal.SIGKILL)


def dead(pidfile: Path) -> bool:
    """The process is gone or a zombie (killed, not yet reaped by the client that started it)."""
    try:
        status = Path(f"/proc/{int(pidfile.read_text())}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_everything(bins: Path, mode: str, port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [str(bins / "mcp-server-everything"), mode],
        env={**os.environ, "PORT": str(port)}, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: listening(port), what="server-everything to listen")
    except AssertionError:
        process.kill()
        raise
    return process


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def everything_http(node_servers: Path) -> Iterator[tuple[int, list[subprocess.Popen[bytes]]]]:
    """server-everything speaking streamable HTTP on a free port: (port, [its process])."""
    port = free_port()
    processes = [start_everything(node_servers, "streamableHttp", port)]
    yield port, processes
    for process in processes:
        stop(process)


def everything(bins: Path, **options: Any) -> MCPConnection:
    return MCPConnection("everything", command=str(bins / "mcp-server-everything"), **options)


def contents(result: Any) -> list[str]:
    return [outcome.content for outcome in result.tool_calls]


def error_of(outcome: Any) -> str:
    return str(json.loads(outcome.content)["error"])


# ---------------------------------------------------------------------------------------- reconnect


async def test_memory_server_killed_while_idle_is_reopened_for_the_next_call(
    node_servers: Path, tmp_path: Path
) -> None:
    """Attack: the server process dies between two runs (killed while idle). Before, the next call
    failed ("not connected"); now the connection is opened again first (nothing was sent)."""
    pidfile = tmp_path / "pid"
    command, args = with_pid(pidfile, str(node_servers / "mcp-server-memory"))
    memory = MCPConnection(
        "memory", command=command, args=args, env={"MEMORY_FILE_PATH": str(tmp_path / "m.jsonl")}
    )
    entity = {"entities": [{"name": "Ada", "entityType": "person", "observations": ["wrote notes"]}]}
    model = ScriptedModel(
        [call("create_entities", entity), reply("saved"), call("read_graph", {}), reply("read")]
    )
    async with MCPToolset([memory]) as toolset:
        agent = Agent(model=model, mcp=toolset)
        assert (await agent.run("remember Ada")).tool_calls[0].ok
        kill(pidfile)
        await eventually(lambda: dead(pidfile), what="the killed server to die")
        second = await agent.run("what do you know?")
    assert second.tool_calls[0].ok, second.tool_calls[0].content
    assert "Ada" in second.tool_calls[0].content  # the graph was kept in its file


async def test_time_server_killed_while_idle_is_reopened(tmp_path: Path) -> None:
    """Attack: mcp-server-time killed while idle; the next call must still answer."""
    pidfile = tmp_path / "pid"
    command, args = with_pid(pidfile, python_server("mcp-server-time"), "--local-timezone", "UTC")
    async with MCPConnection("time", command=command, args=args) as clock:
        tool = next(t for t in clock.tools if t.name == "get_current_time")
        assert "UTC" in await tool.handler(timezone="UTC")
        kill(pidfile)
        await eventually(lambda: dead(pidfile), what="the killed server to die")
        assert "UTC" in await tool.handler(timezone="UTC")


async def test_eight_first_runs_at_once_all_get_the_time_servers_tools() -> None:
    """Attack: eight conversations start together while mcp-server-time is still starting. The first
    run waited for it, the seven others found the toolset "attached" and ran without its tools
    (1 of 8 answered with the time). Each of the eight must be offered `get_current_time`."""
    clock = MCPConnection("time", command=python_server("mcp-server-time"), args=["--local-timezone", "UTC"])
    model = ScriptedModel([reply("ok")] * 8)
    async with MCPToolset([clock], first_wait=30) as toolset:  # a loaded machine starts it slowly
        agent = Agent(model=model, mcp=toolset)
        await asyncio.gather(*(agent.run(f"what time is it? ({i})") for i in range(8)))
    offered = [{t["function"]["name"] for t in c.tools or []} for c in model.calls]
    assert len(offered) == 8 and all("get_current_time" in names for names in offered), offered


async def test_an_http_server_restarted_loses_its_session_and_a_safe_call_is_repeated(
    node_servers: Path, everything_http: tuple[int, list[subprocess.Popen[bytes]]]
) -> None:
    """Attack: the streamable-HTTP server restarts (its sessions are gone: 400/404 per the spec).
    Before, every later call failed; now a read-only/idempotent call reconnects and is repeated once,
    and a call not marked safe (toggle-simulated-logging) is reported, not repeated."""
    port, processes = everything_http
    url = f"http://127.0.0.1:{port}/mcp"
    async with MCPConnection("everything", url=url) as server:
        tools = {t.name: t for t in server.tools}
        assert "hello" in await tools["echo"].handler(message="hello")
        for restart in range(2):
            stop(processes[-1])
            processes.append(start_everything(node_servers, "streamableHttp", port))
            assert f"again {restart}" in await tools["echo"].handler(message=f"again {restart}")
        stop(processes[-1])
        processes.append(start_everything(node_servers, "streamableHttp", port))
        with pytest.raises(Exception, match="not repeated|may or may not have taken effect"):
            await tools["toggle-simulated-logging"].handler()
        assert "after" in await tools["echo"].handler(message="after")


# ------------------------------------------------------------------------------ start-up, down servers


async def test_a_server_that_never_answers_does_not_hold_runs(tmp_path: Path) -> None:
    """Attack: a configured server that starts but never answers the handshake. Before, every run
    waited the 30 s connect timeout, every 30 s; now the first run waits at most `first_wait` and
    the next ones not at all, while the connection is tried in the background with backoff."""
    hung = MCPConnection("hung", command=sys.executable, args=["-c", "import time; time.sleep(120)"])
    model = ScriptedModel([reply("one"), reply("two"), reply("three")])
    async with MCPToolset([hung]) as toolset:
        agent = Agent(model=model, mcp=toolset)
        started = time.monotonic()
        assert (await agent.run("hi")).reply == "one"
        first = time.monotonic() - started
        started = time.monotonic()
        assert (await agent.run("hi")).reply == "two"
        assert (await agent.run("hi")).reply == "three"
        later = time.monotonic() - started
    assert first < 5 and later < 1, (first, later)


def test_connect_timeout_transport_and_confirm_destructive_are_configurable(tmp_path: Path) -> None:
    """Attack: `connect_timeout` could not be set (a slow server always got 30 s); now per server."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "mcp:\n"
        "  - {name: slow, command: python, connect_timeout: 2.5}\n"
        "  - {name: legacy, url: 'http://127.0.0.1:9/sse', transport: sse, confirm_destructive: false}\n",
        encoding="utf-8",
    )
    slow, legacy = (connection_from_config(entry) for entry in load_settings(config).mcp)
    assert slow.connect_timeout == 2.5 and slow.transport == "stdio"
    assert legacy.transport == "sse" and legacy.confirm_destructive is False


async def test_a_prompts_only_server_is_connected_not_down(caplog: pytest.LogCaptureFixture) -> None:
    """Attack: a server without the tools capability (prompts only) answers tools/list with
    "method not found"; it was treated as down and retried for ever. It is up: its prompts are offered."""
    prompts = MCPConnection("prompts", command=sys.executable, args=[str(DEMO_SERVER), "--prompts-only"])
    registry = ToolRegistry()
    async with MCPToolset([prompts]) as toolset:
        with caplog.at_level(logging.ERROR, logger="hermes_core.mcp"):
            await toolset.attach(registry, wait=30)
        assert prompts.connected and not caplog.records
        assert sorted(registry.names) == ["mcp_prompts_get_prompt", "mcp_prompts_list_prompts"]
        text = await registry.get("mcp_prompts_get_prompt").handler(name="haiku")  # type: ignore[union-attr]
    assert "haiku about the sea" in text


# ------------------------------------------------------------------------------------------- content


async def test_images_reach_a_text_model_as_a_description_and_annotations_are_kept(
    node_servers: Path,
) -> None:
    """Attack: get-tiny-image / get-annotated-message answer with an image and annotations. Before,
    the model read a bare placeholder with no size and lost the annotations; now it reads type, mime
    type and size (never base64), the annotations, and the image parts reach the `on_media` seam."""
    seen: list[Any] = []
    model = ScriptedModel([
        call("get-tiny-image", {}),
        call("get-annotated-message", {"messageType": "error", "includeImage": True}),
        reply("seen"),
    ])  # fmt: skip
    async with everything(node_servers, on_media=lambda *media: seen.append(media)) as server:
        result = await Agent(model=model, tools=server.tools).run("show me")
    image, annotated = contents(result)
    assert "[image: image/png, " in image and " bytes" in image and "iVBOR" not in image
    assert "annotations: audience=['user', 'assistant'], priority=1.0" in annotated
    assert seen and seen[0][1] == "get-tiny-image" and seen[0][2][0]["mime_type"] == "image/png"


async def test_a_resource_link_is_followed_with_the_read_resource_tool(node_servers: Path) -> None:
    """Attack: get-resource-links answers with links the model could not open (no tool read them);
    now `mcp_everything_read_resource` reads one, and the resources and prompts are listed."""
    model = ScriptedModel([
        call("get-resource-links", {"count": 2}),
        call("mcp_everything_read_resource", {"uri": "demo://resource/dynamic/text/2"}),
        call("mcp_everything_list_resources", {}),
        call("mcp_everything_get_prompt", {"name": "simple-prompt"}),
        reply("read"),
    ])  # fmt: skip
    async with everything(node_servers) as server:
        levels = {t.name: t.level for t in server.tools}
        result = await Agent(model=model, tools=server.tools).run("follow the links")
    links, read, listed, prompt = result.tool_calls
    assert "demo://resource/dynamic/text/2" in links.content and "read_resource" in links.content
    assert read.ok and "Resource 2" in read.content, read.content
    assert listed.ok and "architecture.md" in listed.content
    assert prompt.ok and prompt.content.startswith("user: ")
    assert levels["mcp_everything_read_resource"] == levels["mcp_everything_get_prompt"] == 0


# ------------------------------------------------------------------------------------------ progress


async def test_a_long_tool_reporting_progress_is_not_cut_at_its_timeout(node_servers: Path) -> None:
    """Attack: trigger-long-running-operation runs 3 s and reports progress each 0.5 s; with a 1.5 s
    timeout it was cut (no progressToken was even sent). Now progress restarts the timeout (bounded
    at 4×) and each notification reaches the progress hook."""
    heard: list[tuple[str, float]] = []
    hook = lambda server, tool, done, total, message: heard.append((tool, done))  # noqa: E731
    model = ScriptedModel(
        [call("trigger-long-running-operation", {"duration": 3, "steps": 6}), reply("done")]
    )
    async with everything(node_servers, timeout=1.5, on_progress=hook) as server:
        result = await Agent(model=model, tools=server.tools, tool_timeout=60).run("go")
    assert result.tool_calls[0].ok, result.tool_calls[0].content
    assert len(heard) >= 4 and heard[0][0] == "trigger-long-running-operation"


# ------------------------------------------------------------------------------- protocol features


async def test_a_tool_the_server_withdraws_is_no_longer_offered(tmp_path: Path) -> None:
    """Attack: the server withdraws a tool and says so (tools/list_changed); the client ignored it
    and went on offering the removed tool. Now the registry follows the server's list."""
    demo = MCPConnection("demo", command=sys.executable, args=[str(DEMO_SERVER)])
    model = ScriptedModel([call("retire", {"name": "echo"}), reply("gone"), reply("second run")])
    async with MCPToolset([demo]) as toolset:
        agent = Agent(model=model, mcp=toolset)
        await agent.run("withdraw echo")
        await eventually(lambda: "echo" not in agent.registry.names, what="echo withdrawn from the registry")
        await agent.run("again")
    names = {t["function"]["name"] for t in model.calls[-1].tools or []}
    assert "echo" not in names and "add" in names


async def test_task_only_tools_are_not_offered_and_logged_once(
    node_servers: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Attack: simulate-research-query has `taskSupport: required`; it was offered and every call
    failed. Now it is left out, with one log line."""
    server = everything(node_servers)
    with caplog.at_level(logging.WARNING, logger="hermes_core.mcp"):
        async with server:
            names = {t.name for t in server.tools}
            await server.aclose()
            await server.connect()
    assert "simulate-research-query" not in names and "echo" in names
    assert sum("simulate-research-query runs only as a task" in r.getMessage() for r in caplog.records) == 1


async def test_the_legacy_sse_transport_is_supported(node_servers: Path) -> None:
    """Attack: a server speaking only the 2024-11-05 HTTP+SSE transport could not be used;
    `transport: sse` selects the SDK's SSE client."""
    port = free_port()
    process = start_everything(node_servers, "sse", port)
    try:
        async with MCPConnection("everything", url=f"http://127.0.0.1:{port}/sse", transport="sse") as server:
            echo = next(t for t in server.tools if t.name == "echo")
            assert "over sse" in await echo.handler(message="over sse")
    finally:
        stop(process)


# -------------------------------------------------------------------------------------------- safety


async def test_destructive_filesystem_tools_wait_for_approval(node_servers: Path, tmp_path: Path) -> None:
    """Attack: write_file, edit_file and move_file (destructiveHint) ran at level 1 with no approval;
    now they need a person unless `levels` names them; read-only tools run as before."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("keep me", encoding="utf-8")
    fs = MCPConnection("fs", command=str(node_servers / "mcp-server-filesystem"), args=[str(root)])
    model = ScriptedModel([
        call("write_file", {"path": str(root / "a.txt"), "content": "overwritten"}),
        call("read_text_file", {"path": str(root / "a.txt")}),
        reply("ok"),
    ])  # fmt: skip
    async with fs:
        confirm = {t.name for t in fs.tools if t.confirm}
        result = await Agent(model=model, tools=fs.tools).run("overwrite it")
    assert {"write_file", "edit_file", "move_file"} <= confirm and "read_text_file" not in confirm
    write, read = result.tool_calls
    assert write.error == "permission_denied" and read.ok and "keep me" in read.content
    assert (root / "a.txt").read_text(encoding="utf-8") == "keep me"
    overridden = MCPConnection("fs", command=str(node_servers / "mcp-server-filesystem"), args=[str(root)],
                               levels={"write_file": 1})  # fmt: skip
    async with overridden:
        assert not next(t for t in overridden.tools if t.name == "write_file").confirm


async def test_git_reset_and_memory_deletes_wait_for_approval(node_servers: Path, tmp_path: Path) -> None:
    """Attack: git_reset and memory's delete_* are destructive and ran without approval."""
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    git = MCPConnection(
        "git", command=python_server("mcp-server-git"), args=["--repository", str(tmp_path / "repo")]
    )
    memory = MCPConnection("memory", command=str(node_servers / "mcp-server-memory"),
                           env={"MEMORY_FILE_PATH": str(tmp_path / "m.jsonl")})  # fmt: skip
    async with git, memory:
        confirmed = {t.name for t in [*git.tools, *memory.tools] if t.confirm}
    assert {"git_reset", "delete_entities", "delete_observations", "delete_relations"} <= confirmed
    assert not {"git_status", "git_log", "read_graph"} & confirmed


async def test_same_named_tools_of_two_servers_are_both_offered_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Attack: two mcp-server-time servers (two time zones) both offer get_current_time; the second
    was dropped. Now it is offered with a deterministic suffix, and a WARNING names both servers."""
    time_server = python_server("mcp-server-time")
    tokyo = MCPConnection("tokyo", command=time_server, args=["--local-timezone", "Asia/Tokyo"])
    paris = MCPConnection("paris", command=time_server, args=["--local-timezone", "Europe/Paris"])
    registry = ToolRegistry()
    with caplog.at_level(logging.WARNING, logger="hermes_core.mcp"):
        async with MCPToolset([tokyo, paris]) as toolset:
            await toolset.attach(registry, wait=60)
            names = sorted(registry.names)
    assert names == ["convert_time", "convert_time_paris", "get_current_time", "get_current_time_paris"]
    warned = [r.getMessage() for r in caplog.records if "get_current_time" in r.getMessage()]
    assert warned and "'paris'" in warned[0] and "'tokyo'" in warned[0]


async def test_names_equal_after_the_64_character_cut_are_disambiguated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Attack: two tool names identical in their first 64 characters: one was unreachable, silently."""
    demo = MCPConnection(
        "demo", command=sys.executable, args=[str(DEMO_SERVER)], env={"DEMO_LONG_NAMES": "1"}
    )
    with caplog.at_level(logging.WARNING, logger="hermes_core.mcp"):
        async with demo:
            tools = {t.name: t for t in demo.tools if t.name.startswith("summarise")}
            answers = {name: await t.handler() for name, t in tools.items()}
    assert len(tools) == 2 and all(len(name) <= 64 for name in tools)
    assert sorted(answers.values()) == ["draft", "final"]
    assert any("both map to" in r.getMessage() for r in caplog.records)


async def test_huge_errors_are_capped(node_servers: Path, tmp_path: Path) -> None:
    """Attack: errors that echo a huge argument (a 200,000-character path for filesystem, a huge
    revision for git_show) reached the model whole; now every MCP error is capped like a result."""
    fs = MCPConnection("fs", command=str(node_servers / "mcp-server-filesystem"), args=[str(tmp_path)])
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    git = MCPConnection(
        "git", command=python_server("mcp-server-git"), args=["--repository", str(tmp_path / "repo")]
    )
    long = "x" * 200_000
    model = ScriptedModel([
        call("read_text_file", {"path": str(tmp_path / long)}),
        call("git_show", {"repo_path": str(tmp_path / "repo"), "revision": long}),
        reply("failed"),
    ])  # fmt: skip
    async with fs, git:
        result = await Agent(model=model, tools=[*fs.tools, *git.tools]).run("read")
    assert [o.ok for o in result.tool_calls] == [False, False]
    for outcome in result.tool_calls:
        assert len(outcome.content) < 4000 and "truncated" in outcome.content, len(outcome.content)
