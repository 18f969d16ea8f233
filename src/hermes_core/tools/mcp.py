"""Tools from MCP servers (Model Context Protocol), through the official `mcp` SDK (version 2).

    async with MCPConnection("demo", command="python", args=["server.py"]) as demo:
        agent = Agent(tools=demo.tools)
        result = await agent.run("what is 40 + 2?")

Each tool a server lists becomes an ordinary `Tool` whose handler calls the server, so every call
passes `ToolRegistry.execute` like any other: permissions (levels, roles, allowed models), the
server's input schema (checked when listed, then lax coercion and validation of every call,
kernel/tools/schema.py), the timeout, result capping and redaction apply unchanged. An MCP tool
is level 1 unless configured (`level` per server, `levels` per tool): the server's own hints are
not trusted to lower it, but they raise it: a tool marked destructive waits for approval unless
configured. The server's answer becomes the tool's result: its text (or, without text, its
structured content), images and audio described in one line (also inside structured content:
no base64 reaches a text model; the parts themselves go to `on_media`, for a channel that can show
them or a vision model); `isError` and a lost connection
become error results, capped like results. Beside its tools, a server with resources or prompts
gets level-0 tools that reach them (`feature_tools`). docs/mcp.md has the configuration and what
the reference servers showed.

Why the connection handling is as it is: a server may crash while idle or restart and lose its
HTTP session, so a call first reopens a lost connection and repeats a call lost mid-way only when
the tool is marked read-only or idempotent; a server that is down must not hold agent runs, so
`MCPToolset` connects in the background with backoff; a long tool reports progress, so a call's
timeout restarts with each notification (bounded by `progress_extension`).

The SDK's connections are task-scoped (anyio), so each connection lives in a task of its own and
may be opened by one task (an agent's first run) and closed by another (shutdown).
`MCPToolset` groups the servers of a configuration and adds their tools to a registry on first use.

Optional: `pip install "hermes-kernel[mcp]"`. Only `config.mcp_toolset` imports this module, and only
when servers are configured: the kernel never loads the SDK.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..agent import Agent
    from ..config import MCPServerConfig

try:
    import anyio
    import httpx2
    from mcp import Client, StdioServerParameters
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.client.subscriptions import ListenNotSupportedError
    from mcp.shared.exceptions import MCPError
    from mcp.types import (
        CONNECTION_CLOSED,
        AudioContent,
        BlobResourceContents,
        CallToolResult,
        EmbeddedResource,
        ImageContent,
        Implementation,
        ResourceLink,
        TextContent,
        TextResourceContents,
        ToolListChangedNotification,
    )
    from mcp.types import Tool as MCPToolSpec
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f'MCP tools need the mcp extra: pip install "hermes-kernel[mcp]" ({exc})', name=exc.name
    ) from exc

from .. import __version__
from ..kernel.tools.declare import Tool, ToolDefinitionError, ToolError, schema_checks
from ..kernel.tools.registry import ToolRegistry
from ..kernel.tools.results import DEFAULT_MAX_CHARS, cap
from ..kernel.tools.schema import wire_name

log = logging.getLogger("hermes_core.mcp")

_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CLOSE_GRACE = 10.0  # seconds a server gets to shut down before its connection task is cancelled
_CLIENT_INFO = Implementation(name="hermes-kernel", version=__version__)
_TRANSPORTS = ("stdio", "http", "sse")
_MAX_BACKOFF = 600.0  # seconds: the longest wait between two attempts to reach a server that is down
ProgressHook = Callable[
    [str, str, float, "float | None", "str | None"], None
]  # server, tool, done, total, message
MediaHook = Callable[[str, str, list[dict[str, Any]]], None]  # server, tool, image/audio parts


def log_progress(server: str, tool: str, progress: float, total: float | None, message: str | None) -> None:
    """The default progress hook: one log line per notification (a channel may show them instead)."""
    of = f"/{total:g}" if total is not None else ""
    log.info(
        "MCP server %r: %s progress %g%s%s", server, tool, progress, of, f" ({message})" if message else ""
    )


class MCPConnectionError(ConnectionError):
    """An MCP server could not be started, reached or listed."""


class MCPNameError(MCPConnectionError):
    """`levels` or `confirm` names a tool the server does not have: a configuration mistake that
    would otherwise leave that tool at the default level, or without its approval, silently."""


class MCPSchemaError(MCPNameError):
    """One of the server's tools has parameters that are not a JSON Schema, or two of its tools
    would reach the model under one name: reported at start-up naming the tool, like a `levels`
    mistake, and none of the server's tools is offered until it is fixed."""


@dataclass(eq=False)
class MCPConnection:
    """One MCP server: how to reach it, which of its tools to offer and how, and the connection.

    Give `command` (and `args`, `env`, `cwd`) to start the server as a subprocess speaking stdio,
    or `url` (and `headers`) for a streamable-HTTP server. The subprocess gets only the SDK's safe
    default environment (PATH, HOME, …) plus `env`: the agent's own secrets are not inherited.
    """

    name: str
    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    level: int = 1  # every tool's level, unless `levels` names it (kernel/tools/permissions.py)
    # Tools are named as the server names them (`pay.out`) or as `hermes-kernel tools` shows them
    # (`pay_out`, with the prefix): both match. A `levels` or `confirm` name matching none is an error.
    levels: Mapping[str, int] = field(default_factory=dict)  # tool → level
    allowed_tools: Sequence[str] | None = None  # offer only these; None: all
    confirm: Sequence[str] = ()  # tools whose every call a person approves (tasks/pending.py)
    prefix: str = ""  # put before every tool name, e.g. "github_": avoids collisions between servers
    timeout: float | None = None  # per call; None: the agent's tool_timeout
    connect_timeout: float = 30.0  # seconds to start or reach the server and list its tools
    transport: str | None = None  # "stdio" (command), "http" (streamable HTTP, url) or "sse" (legacy, url)
    # A tool the server marks destructive waits for approval unless `levels` or `confirm` names it.
    confirm_destructive: bool = True
    progress_extension: float = 4.0  # a call that reports progress may run up to this × `timeout`
    on_progress: ProgressHook | None = field(default=log_progress, repr=False)
    on_media: MediaHook | None = field(default=None, repr=False)  # images/audio, for a vision channel

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(
                f"MCP server {self.name!r}: give either command (stdio) or url (streamable HTTP)"
            )
        if self.transport is None:
            self.transport = "stdio" if self.command is not None else "http"
        if self.transport not in _TRANSPORTS or (self.transport == "stdio") != (self.command is not None):
            raise ValueError(
                f"MCP server {self.name!r}: transport {self.transport!r} does not fit "
                f"{'command' if self.command is not None else 'url'} (stdio: command; http, sse: url)"
            )
        if self.connect_timeout <= 0:
            raise ValueError(f"MCP server {self.name!r}: connect_timeout must be positive")
        for level in (self.level, *self.levels.values()):
            if level not in (0, 1, 2):
                raise ValueError(f"MCP server {self.name!r}: levels are 0, 1 or 2, got {level!r}")
        self.tools: list[Tool] = []
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._opening: asyncio.Future[list[Tool]] | None = None
        self._lost = ""  # why the last connection ended, for the error results that follow
        self._specs: dict[str, MCPToolSpec] = {}  # the offered tools, by the server's names
        self._display: dict[str, str] = {}  # server's name → the name the model sees (collisions resolved)
        self._skipped: set[str] = set()  # task-only tools already logged as left out
        self._features: set[str] = set()  # "resources", "prompts": offered through tools of their own
        self._refreshing: asyncio.Task[None] | None = None
        self.listeners: list[Callable[[MCPConnection], None]] = []  # told when the tool list changes

    @property
    def connected(self) -> bool:
        return self._client is not None and self._task is not None and not self._task.done()

    async def connect(self) -> list[Tool]:
        """Start or reach the server and list its tools; concurrent callers share one attempt."""
        if self._opening is None or (self._opening.done() and not self.connected):
            self._opening = asyncio.ensure_future(self._open())
        return await asyncio.shield(self._opening)

    async def aclose(self) -> None:
        """Close the connection (a stdio server is stopped). `connect` may open it again."""
        self._opening = None
        await self._stop()

    async def __aenter__(self) -> MCPConnection:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        """Call one of the server's tools by its own name; every failure raises `ToolError`, its
        message capped like any tool result.

        A connection found lost before the call is opened again first (nothing was sent). A connection
        lost during the call (a crash, an HTTP server restarted and its session gone) is opened again
        and the call repeated once if the server marks the tool read-only or idempotent; otherwise the
        model reads that the call may or may not have taken effect."""
        try:
            result = await self._call(tool, arguments)
        except ToolError as exc:
            raise ToolError(cap(str(exc), DEFAULT_MAX_CHARS)) from None
        await self.settled()  # a call that changed the tool list: the model's next call sees the new one
        return result

    async def settled(self) -> None:
        """Wait for the new tool list a server announced (`tools/list_changed`) while it is fetched,
        so that the next model call, and a run starting now, are offered that list, not the old one."""
        refreshing = self._refreshing
        if refreshing is not None and not refreshing.done():
            await asyncio.wait({refreshing})  # bounded: the listing has `connect_timeout`

    async def _call(self, tool: str, arguments: dict[str, Any]) -> Any:
        if not self.connected:
            await self._reopen()
        try:
            return await self._call_once(tool, arguments)
        except _Lost as lost:
            if not self.safe_to_repeat(tool):
                raise ToolError(
                    f"MCP server {self.name!r} lost the connection during the call ({lost}); the call "
                    "was not repeated because the tool is not marked read-only or idempotent: it may or "
                    "may not have taken effect"
                ) from None
            log.warning(
                "MCP server %r: connection lost during %s (%s); reconnecting, repeating once",
                self.name,
                tool,
                lost,
            )
            await self._reopen()
            try:
                return await self._call_once(tool, arguments)
            except _Lost as again:
                raise ToolError(f"MCP server {self.name!r} lost the connection again ({again})") from None

    async def list_resources(self) -> str:
        """The server's resources, one line each."""
        page = await self._request(lambda client: client.list_resources())
        lines = [f"{r.uri}  {r.name}" + (f" ({r.mime_type})" if r.mime_type else "") for r in page.resources]
        return "\n".join(lines) or "no resources"

    async def read_resource(self, uri: str) -> str:
        """One resource's contents as text (binaries described)."""
        result = await self._request(lambda client: client.read_resource(uri))
        return "\n".join(_contents_text(contents) for contents in result.contents)

    async def list_prompts(self) -> str:
        page = await self._request(lambda client: client.list_prompts())
        lines = []
        for prompt in page.prompts:
            arguments = ", ".join(a.name + ("" if a.required else "?") for a in prompt.arguments or [])
            lines.append(f"{prompt.name}({arguments}): {prompt.description or ''}".strip())
        return "\n".join(lines) or "no prompts"

    async def get_prompt(self, name: str, arguments: dict[str, str] | None = None) -> str:
        result = await self._request(lambda client: client.get_prompt(name, arguments or None))
        return "\n".join(f"{m.role}: {_block_text(m.content)}" for m in result.messages)

    async def _request(self, send: Callable[[Client], Any]) -> Any:
        """A read-only request (resources, prompts): reopened and repeated once on a lost connection."""
        for attempt in (1, 2):
            if not self.connected:
                await self._reopen()
            client = self._client
            assert client is not None
            try:
                return await send(client)
            except MCPError as exc:
                if (
                    exc.code != CONNECTION_CLOSED and not await self._session_gone(client, exc)
                ) or attempt == 2:
                    raise ToolError(
                        cap(f"MCP server {self.name!r} refused: {exc.message}", DEFAULT_MAX_CHARS)
                    ) from None
                self._connection_lost(exc.message)
            except (httpx2.HTTPError, OSError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
                self._connection_lost(_describe(exc))
                if attempt == 2:
                    raise ToolError(f"MCP server {self.name!r}: connection lost ({self._lost})") from None
        raise AssertionError("unreachable")

    async def _session_gone(self, client: Client, exc: MCPError) -> bool:
        """Whether an HTTP error means the server lost our session (it restarted): it answers 404,
        or 400 for a session id it does not know. The SDK says so only for 404; for a bare HTTP
        error a probe (tools/list) tells: a server that still knows the session answers it."""
        if self.transport == "stdio":
            return False
        if _names_lost_session(exc):
            return True
        if exc.message != "Server returned an error response":
            return False
        try:
            await asyncio.wait_for(client.list_tools(cache_mode="bypass"), self.connect_timeout)
        except Exception:
            return True
        return False

    def safe_to_repeat(self, tool: str) -> bool:
        """Whether the server marks `tool` read-only or idempotent (a repeat does no harm)."""
        spec = self._specs.get(tool)
        hints = spec.annotations if spec is not None else None
        return hints is not None and bool(hints.read_only_hint or hints.idempotent_hint)

    async def _reopen(self) -> None:
        try:
            await self.connect()
        except MCPConnectionError as exc:
            reason = f"; before that: {self._lost}" if self._lost else ""
            raise ToolError(
                f"MCP server {self.name!r} is not connected ({exc}{reason}); try again later"
            ) from None

    async def _call_once(self, tool: str, arguments: dict[str, Any]) -> Any:
        client = self._client
        if client is None or not self.connected:
            raise _Lost(self._lost or "not connected")
        try:
            result = await self._with_progress(client, tool, arguments)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED and not await self._session_gone(client, exc):
                raise ToolError(f"MCP server {self.name!r} refused the call: {exc.message}") from None
            self._connection_lost(f"it closed the connection ({exc.message})")
            raise _Lost(exc.message) from None
        except (httpx2.HTTPError, OSError, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            self._connection_lost(_describe(exc))
            raise _Lost(_describe(exc)) from None
        if self.on_media is not None and (parts := media_parts(result)):
            self.on_media(self.name, tool, parts)
        return tool_result(result)

    async def _with_progress(self, client: Client, tool: str, arguments: dict[str, Any]) -> CallToolResult:
        """`tools/call` with a progress token: each notification is reported and, with a `timeout`,
        restarts it (the registry's cut at `progress_extension` × `timeout` bounds the whole call)."""
        loop = asyncio.get_running_loop()
        heard = [loop.time()]

        async def progressed(progress: float, total: float | None, message: str | None) -> None:
            heard[0] = loop.time()
            if self.on_progress is not None:
                self.on_progress(self.name, tool, progress, total, message)

        call = asyncio.ensure_future(client.call_tool(tool, arguments, progress_callback=progressed))
        try:
            while self.timeout is not None:
                left = heard[0] + self.timeout - loop.time()
                if left <= 0:
                    raise ToolError(
                        f"MCP tool {tool} of server {self.name!r} sent no answer or progress "
                        f"in {self.timeout:g} s"
                    )
                done, _ = await asyncio.wait({call}, timeout=left)
                if done:
                    break
            return await call
        finally:
            if not call.done():
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)

    async def _open(self) -> list[Tool]:
        await self._stop()
        self._closing, self._lost = asyncio.Event(), ""
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready), name=f"mcp-{self.name}")
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout)
            specs = await asyncio.wait_for(self._list(client), self.connect_timeout)
            self._features = await asyncio.wait_for(self._offered_features(client), self.connect_timeout)
        except Exception as exc:
            await self._stop()
            raise MCPConnectionError(f"cannot connect to MCP server {self.name!r}: {_describe(exc)}") from exc
        except BaseException:
            await self._stop()
            raise
        try:
            names = self._resolve([spec.name for spec in specs])
            for spec in self._offered(specs, names):  # every schema checked before any tool is offered
                self._declare(spec, names)
        except MCPNameError:
            await self._stop()  # none of its tools is offered: one of them may be the mistyped one
            raise
        self._client = client
        self._adopt(client, specs, names)
        return self.tools

    async def _offered_features(self, client: Client) -> set[str]:
        """`resources` and `prompts` if the server has some (and the allow-list, if any, names
        `resources` or `prompts`): only then are the tools that reach them offered."""
        capabilities, found = client.server_capabilities, set()
        wanted = None if self.allowed_tools is None else set(self.allowed_tools)
        if capabilities.resources is not None and (wanted is None or "resources" in wanted):
            if (await client.list_resources()).resources:
                found.add("resources")
        if capabilities.prompts is not None and (wanted is None or "prompts" in wanted):
            if (await client.list_prompts()).prompts:
                found.add("prompts")
        return found

    async def _list(self, client: Client) -> list[MCPToolSpec]:
        """The server's tools: none for a server without the tools capability (prompts only, say),
        which is connected all the same; tools that only run as tasks are left out (logged once)."""
        if client.server_capabilities.tools is None:
            return []
        specs = []
        for spec in await _list_tools(client):
            if spec.execution is not None and spec.execution.task_support == "required":
                if spec.name not in self._skipped:
                    self._skipped.add(spec.name)
                    log.warning(
                        "MCP server %r: tool %s runs only as a task, which is not supported; "
                        "it is not offered",
                        self.name,
                        spec.name,
                    )
                continue
            specs.append(spec)
        return specs

    def _adopt(self, client: Client, specs: list[MCPToolSpec], names: _Names) -> None:
        """Make `specs` the offered tools: unique names, the destructive ones confirmed, the call's
        timeout room for progress, and the tools that reach resources and prompts."""
        offered = self._offered(specs, names)
        self._specs = {spec.name: spec for spec in offered}
        self._display = _unique_names(self.name, [spec.name for spec in offered], self._base_name)
        tools = [self._declare(spec, names) for spec in offered]
        for declared, spec in zip(tools, offered, strict=True):
            if self._destructive(spec, names):
                declared.confirm = True
            if self.timeout is not None:
                declared.timeout = self.timeout * self.progress_extension
        self.tools = tools + feature_tools(self, self._features)

    def _destructive(self, spec: MCPToolSpec, names: _Names) -> bool:
        hints = spec.annotations
        if not self.confirm_destructive or spec.name in names.levels or hints is None:
            return False
        # the spec's default for a tool that is not read-only is destructive
        return not hints.read_only_hint and hints.destructive_hint is not False

    async def _refresh(self) -> None:
        """`notifications/tools/list_changed`: list the tools again and tell the listeners."""
        client = self._client
        if client is None:
            return
        try:
            specs = await asyncio.wait_for(self._list(client), self.connect_timeout)
            names = self._resolve([spec.name for spec in specs])
        except Exception as exc:
            log.warning("MCP server %r: cannot list its changed tools: %s", self.name, _describe(exc))
            return
        self._adopt(client, specs, names)
        log.info("MCP server %r: tool list changed, now %d tools", self.name, len(self.tools))
        for listener in list(self.listeners):
            listener(self)

    async def _listen(self, client: Client) -> None:
        """On a 2026-07-28 connection, change events come on a `subscriptions/listen` stream
        (earlier ones send `notifications/tools/list_changed`, see `_on_message`)."""
        tools = client.server_capabilities.tools
        if tools is None or not tools.list_changed:
            return
        try:
            async with client.listen(tools_list_changed=True) as events:
                async for _event in events:
                    # set before any wait, so a call returning now finds it (`settled`)
                    self._refreshing = asyncio.ensure_future(self._refresh())
                    await asyncio.wait({self._refreshing})
        except ListenNotSupportedError:
            return  # a handshake-era server: its notifications reach `_on_message`
        except Exception as exc:  # the stream ended with the connection; nothing to refresh
            log.debug("MCP server %r: change events ended: %s", self.name, _describe(exc))

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, ToolListChangedNotification):
            self._refreshing = asyncio.ensure_future(self._refresh())

    def displayed(self, remote: str) -> str:
        """The name the model and `hermes-kernel tools` see for the server's tool `remote`."""
        return self._display.get(remote) or self._base_name(remote)

    def _base_name(self, remote: str) -> str:
        """`wire_name` of kernel/tools/schema.py: the one mapping every schema tool's name goes through."""
        return wire_name(f"{self.prefix}{remote}")

    def _named(self, entry: str, remotes: list[str]) -> list[str]:
        """The server's tools that `entry` names: its own name first, else the displayed one (with or
        without the prefix)."""
        if entry in remotes:
            return [entry]
        plain = wire_name(entry)
        return [r for r in remotes if entry == self.displayed(r) or plain == wire_name(r)]

    def _resolve(self, remotes: list[str]) -> _Names:
        """`levels`, `confirm` and the allow-list in the server's own names; MCPNameError for a
        `levels` or `confirm` entry that names none of its tools (an allow-list entry is a warning)."""
        unknown = [
            f"{key} names {entry!r}"
            for key, entries in (("levels", self.levels), ("confirm", self.confirm))
            for entry in entries
            if not self._named(entry, remotes)
        ]
        if unknown:
            shown = [self.displayed(r) + ("" if self.displayed(r) == r else f" ({r})") for r in remotes]
            raise MCPNameError(
                f"MCP server {self.name!r}: {'; '.join(unknown)}, which is not one of its tools; "
                f"its tools are: {', '.join(shown) or 'none'}"
            )
        levels = {r: level for entry, level in self.levels.items() for r in self._named(entry, remotes)}
        confirm = {r for entry in self.confirm for r in self._named(entry, remotes)}
        allowed = None
        if self.allowed_tools is not None:
            allowed = {remote for entry in self.allowed_tools for remote in self._named(entry, remotes)}
            missing = [
                entry
                for entry in self.allowed_tools
                if not self._named(entry, remotes) and entry not in ("resources", "prompts")
            ]
            if missing:
                log.warning("MCP server %r does not offer %s", self.name, ", ".join(sorted(missing)))
        return _Names(levels, confirm, allowed)

    async def _hold(self, ready: asyncio.Future[Client]) -> None:
        """The connection's own task: enter the SDK's client, hand it over, wait to be closed."""
        failure: Exception = MCPConnectionError("closed while connecting")
        try:
            async with AsyncExitStack() as stack:
                server = await self._server(stack)
                client = Client(server, client_info=_CLIENT_INFO, message_handler=self._on_message)
                ready.set_result(await stack.enter_async_context(client))
                listening = asyncio.create_task(self._listen(client))
                try:
                    await self._closing.wait()
                finally:
                    listening.cancel()
                    await asyncio.gather(listening, return_exceptions=True)
        except Exception as exc:
            if not ready.done():
                failure = exc
            else:
                self._connection_lost(_describe(exc))
                log.warning("MCP server %r: connection lost: %s", self.name, self._lost)
        finally:
            if not ready.done():
                ready.set_exception(failure)
                ready.exception()  # marked as seen: the opener may have stopped waiting (timeout)

    async def _server(self, stack: AsyncExitStack) -> Any:
        """What the SDK's `Client` connects to: stdio parameters, or a streamable-HTTP transport."""
        if self.command is not None:
            return StdioServerParameters(
                command=self.command, args=list(self.args), env=dict(self.env) or None, cwd=self.cwd
            )
        assert self.url is not None
        if self.transport == "sse":  # the legacy HTTP+SSE transport (protocol 2024-11-05)
            return sse_client(
                self.url, headers=dict(self.headers), timeout=30.0, sse_read_timeout=24 * 3600.0
            )
        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers=dict(self.headers), timeout=httpx2.Timeout(30.0, read=None))
        )  # no read timeout: the per-call timeout bounds every call, and a stream may idle
        return streamable_http_client(self.url, http_client=http)

    async def _stop(self) -> None:
        """End the connection's task: gracefully once connected, at once while still connecting."""
        task, established = self._task, self._client is not None
        self._task = self._client = None
        if self._refreshing is not None and not self._refreshing.done():
            self._refreshing.cancel()
        if task is None or task.done():
            return
        self._closing.set()
        if established:
            await asyncio.wait({task}, timeout=_CLOSE_GRACE)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _connection_lost(self, reason: str) -> None:
        self._lost, self._client = reason, None
        self._closing.set()  # the task ends; a later `connect` reconnects

    def _offered(self, specs: list[MCPToolSpec], names: _Names) -> list[MCPToolSpec]:
        if names.allowed is None:
            return specs
        return [spec for spec in specs if spec.name in names.allowed]

    def _declare(self, spec: MCPToolSpec, names: _Names) -> Tool:
        remote = spec.name

        async def call_remote(**arguments: Any) -> Any:
            return await self.call(remote, arguments)

        description = spec.description or spec.title or f"{remote} (a tool of the {self.name} MCP server)"
        displayed = self.displayed(remote)
        try:  # the server's schema checks every call before it is sent (kernel/tools/schema.py)
            parameters, checks = schema_checks(displayed, dict(spec.input_schema))
        except ToolDefinitionError as exc:
            raise MCPSchemaError(f"MCP server {self.name!r}: {exc}") from None
        return Tool(
            name=displayed,
            declared_name=None if displayed == remote else remote,
            schema_arguments=checks,
            description=description.strip(),
            parameters=parameters,
            handler=call_remote,
            timeout=self.timeout,
            level=names.levels.get(remote, self.level),
            confirm=remote in names.confirm,
            read_only_hint=bool(spec.annotations and spec.annotations.read_only_hint),
        )


@dataclass(frozen=True)
class _Names:
    """A server's `levels`, `confirm` and allow-list, resolved to the server's own tool names."""

    levels: dict[str, int]
    confirm: set[str]
    allowed: set[str] | None


class MCPToolset:
    """The MCP servers of a configuration, whose tools join an agent's registry on first use.

    `attach` never raises: a server that cannot be reached, or a tool whose name is taken, is
    logged and left out, and the agent runs with the tools it has. A server that failed or was
    lost is tried again by a later `attach`, at most every `retry_after` seconds. One toolset
    serves one registry.
    """

    def __init__(
        self, connections: Iterable[MCPConnection], *, retry_after: float = 30.0, first_wait: float = 2.0
    ) -> None:
        self.connections = list(connections)
        names = [connection.name for connection in self.connections]
        if len(set(names)) != len(names):
            raise ValueError(f"MCP server names must be unique, got {', '.join(names)}")
        self.retry_after = retry_after  # the first wait after a failure; doubled per failure
        self.first_wait = first_wait  # how long the first runs wait for servers still connecting
        self._registered: dict[str, str] = {}  # registered tool name → its server
        self._failed_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._first_deadline: float | None = None  # until then, every run waits for the first connections
        self.misconfigured: dict[str, str] = {}  # server → why its tools are left out (MCPNameError)
        self._registry: ToolRegistry | None = None
        for connection in self.connections:
            connection.listeners.append(self._changed)

    @classmethod
    def from_config(
        cls, servers: Iterable[MCPServerConfig | MCPConnection], environ: Mapping[str, str] | None = None
    ) -> MCPToolset:
        return cls(connection_from_config(server, environ) for server in servers)

    async def attach(self, registry: ToolRegistry, wait: float | None = None) -> None:
        """Start connecting the servers that are not connected (in the background), and register the
        tools of those connected. Waits for servers still connecting at most `wait` seconds (default:
        until `first_wait` after the first call, so runs that start together all wait for the first
        connections; not at all later): a server that is down or slow never holds a run; it is tried
        again after `retry_after`, doubled per failure up to 10 minutes. A tool list being fetched
        again after the server announced a change is waited for."""
        self._registry = registry
        now = time.monotonic()
        if self._first_deadline is None:
            self._first_deadline = now + self.first_wait
        if wait is None:
            wait = max(0.0, self._first_deadline - now)
        await asyncio.gather(*(connection.settled() for connection in self.connections))
        for connection in self.connections:
            name = connection.name
            if (
                connection.connected
                or name in self._pending
                or now < self._failed_at.get(name, -1e9) + self._backoff(name)
            ):
                continue
            self._pending[name] = asyncio.ensure_future(self._connect(registry, connection))
        pending = list(self._pending.values())
        if pending and wait > 0:
            await asyncio.wait(pending, timeout=wait)
        for connection in self.connections:
            if connection.connected:
                self._register_all(registry, connection)

    def _backoff(self, server: str) -> float:
        failures = self._failures.get(server, 0)
        return 0.0 if failures == 0 else min(self.retry_after * 2 ** (failures - 1), _MAX_BACKOFF)

    async def _connect(self, registry: ToolRegistry, connection: MCPConnection) -> None:
        """One background attempt to reach a server; never raises."""
        try:
            await connection.connect()
        except MCPNameError as exc:
            self._failed(connection, exc)
            self.misconfigured[connection.name] = str(exc)
            log.error("%s (its tools are left out until the configuration is fixed)", exc)
        except Exception as exc:
            self._failed(connection, exc)
            log.error(
                "%s (its tools are left out until it can be reached; next try in %g s)",
                exc,
                self._backoff(connection.name),
            )
        else:
            self._failed_at.pop(connection.name, None)
            self._failures.pop(connection.name, None)
            self.misconfigured.pop(connection.name, None)
            self._register_all(registry, connection)
        finally:
            self._pending.pop(connection.name, None)

    def _failed(self, connection: MCPConnection, exc: BaseException) -> None:
        self._failed_at[connection.name] = time.monotonic()
        self._failures[connection.name] = self._failures.get(connection.name, 0) + 1

    def _register_all(self, registry: ToolRegistry, connection: MCPConnection) -> None:
        current = {id(tool) for tool in connection.tools}
        for name, server in list(self._registered.items()):  # tools the server no longer offers
            held = registry.get(name)
            if server == connection.name and (held is None or id(held) not in current):
                if held is not None:
                    registry.remove(name)
                del self._registered[name]
        for declared in connection.tools:
            if (
                self._registered.get(declared.name) != connection.name
                or registry.get(declared.name) is not declared
            ):
                self._register(registry, connection, declared)

    def _changed(self, connection: MCPConnection) -> None:
        """A server's tool list changed (`notifications/tools/list_changed`): follow it."""
        if self._registry is not None:
            self._register_all(self._registry, connection)

    async def start(self, registry: ToolRegistry) -> None:
        """`attach` at start-up (`serve`, `hermes-kernel tools`): a server that is down is only logged
        and tried again later, but a `levels` or `confirm` name that none of a server's tools has
        raises `ConfigError` naming it."""
        from ..config import ConfigError

        await self.attach(registry, wait=max((c.connect_timeout for c in self.connections), default=0) + 1)
        if self.misconfigured:
            raise ConfigError("; ".join(self.misconfigured.values()))

    async def aclose(self) -> None:
        for pending in list(self._pending.values()):
            pending.cancel()
        await asyncio.gather(*self._pending.values(), return_exceptions=True)
        await asyncio.gather(*(connection.aclose() for connection in self.connections))

    async def __aenter__(self) -> MCPToolset:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _register(self, registry: ToolRegistry, connection: MCPConnection, declared: Tool) -> None:
        """Register `declared`; a name a local tool or another server's tool has is given a suffix
        (`_<server>`), with a WARNING naming both. Deterministic whichever server connects first: of
        two servers, the one later in the configuration gets the suffix."""
        old = registry.get(declared.name)
        holder = self._registered.get(declared.name)
        order = [c.name for c in self.connections]
        if old is not None and holder == connection.name:
            registry.remove(declared.name)  # the server's earlier declaration (reconnected, relisted)
        elif old is not None and holder in order and order.index(holder) > order.index(connection.name):
            registry.remove(declared.name)  # the later-configured server yields the plain name
            del self._registered[declared.name]
            registry.add(declared)
            self._registered[declared.name] = connection.name
            self._register(registry, self.connections[order.index(holder)], old)
            return
        elif old is not None:
            other = self._registered.get(declared.name, "a local tool")
            renamed = f"{declared.name[: 63 - len(connection.name)]}_{connection.name}"
            owner = other if other == "a local tool" else f"MCP server {other!r}"
            log.warning(
                "MCP server %r: tool %r is already registered by %s; offered as %r instead "
                "(give the server a prefix)",
                connection.name,
                declared.name,
                owner,
                renamed,
            )
            if registry.get(renamed) is not None and self._registered.get(renamed) != connection.name:
                log.error("MCP server %r: %r is taken too; the tool is left out", connection.name, renamed)
                return
            if registry.get(renamed) is not None:
                registry.remove(renamed)
            declared.name = renamed
        registry.add(declared)
        self._registered[declared.name] = connection.name


async def attach_mcp(agent: Agent, servers: Iterable[MCPServerConfig | MCPConnection]) -> MCPToolset:
    """Connect `servers` (`mcp:` configuration entries or `MCPConnection`s) now and add their tools
    to `agent`. Close the returned toolset when the agent is done: `await toolset.aclose()`."""
    toolset = MCPToolset.from_config(servers)
    await toolset.attach(agent.registry)
    return toolset


def connection_from_config(
    server: MCPServerConfig | MCPConnection, environ: Mapping[str, str] | None = None
) -> MCPConnection:
    """An `MCPConnection` from one `mcp:` entry of the configuration (config.py, `MCPServerConfig`).

    `env` names the variables to pass to the server; `headers` maps each header to the variable
    holding its value. The values are read from the environment here, never from the file.
    """
    if isinstance(server, MCPConnection):
        return server
    from ..config import ConfigError

    environ = os.environ if environ is None else environ
    where = f"mcp server {server.name!r}"

    def value_of(variable: str, what: str) -> str:
        if not _VARIABLE_NAME.match(variable):
            raise ConfigError(f"{where}: {what} must be the name of an environment variable, not a value")
        if variable not in environ:
            raise ConfigError(f"{where}: {what} reads the environment variable {variable}, which is not set")
        return environ[variable]

    return MCPConnection(
        server.name,
        command=server.command,
        args=tuple(server.args),
        env={variable: value_of(variable, "env") for variable in server.env},
        cwd=server.cwd,
        url=server.url,
        headers={
            header: value_of(variable, f"header {header}") for header, variable in server.headers.items()
        },
        level=server.level,
        levels=dict(server.levels),
        allowed_tools=server.tools,
        confirm=tuple(server.confirm),
        prefix=server.prefix,
        timeout=server.timeout,
        connect_timeout=server.connect_timeout,
        transport=server.transport,
        confirm_destructive=server.confirm_destructive,
    )


def tool_result(result: CallToolResult) -> Any:
    """What the model reads of an MCP tool's answer: its text, or without text its structured
    content, where an image or audio block (or any other base64 blob) becomes a one-line note, as
    in the text. An answer flagged `isError` raises `ToolError` with the server's text."""
    text = "\n".join(_block_text(block) for block in result.content)
    if result.is_error:
        raise ToolError(text or "the MCP tool failed without saying why")
    if result.structured_content is not None and not any(isinstance(b, TextContent) for b in result.content):
        return _without_media(result.structured_content)
    return text


_BASE64 = re.compile(r"[A-Za-z0-9+/\r\n]{200,}={0,2}")  # a blob, not a word: long and without spaces


def _without_media(value: Any) -> Any:
    """Structured content as a text model should read it: a media block (`{"type": "image",
    "data": …, "mimeType": …}`, a resource's `blob`) becomes the note `_block_text` writes, and any
    other string that is one long base64 run becomes its size; everything else is kept as it is."""
    if isinstance(value, dict):
        data = value.get("data", value.get("blob"))
        mime = value.get("mimeType", value.get("mime_type"))
        if isinstance(data, str) and isinstance(mime, str):
            kind = value.get("type") if isinstance(value.get("type"), str) else mime.split("/")[0]
            return f"[{kind}: {mime}, {_size(data)}, not shown to a text model]"
        return {key: _without_media(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_media(item) for item in value]
    if isinstance(value, str) and _BASE64.fullmatch(value):
        return f"[base64 data: {_size(''.join(value.split()))}, not shown to a text model]"
    return value


def _block_text(block: Any) -> str:
    """One content block as text for a text model: media and binaries as a short description (type,
    mime type, size), never their base64; a resource link with what reads it; annotations kept."""
    if isinstance(block, TextContent):
        text = block.text
    elif isinstance(block, EmbeddedResource):
        text = _contents_text(block.resource)
    elif isinstance(block, ResourceLink):
        mime = f", {block.mime_type}" if block.mime_type else ""
        text = (
            f"[resource link {block.uri} ({block.name}{mime}): read it with the server's read_resource tool]"
        )
    elif isinstance(block, (ImageContent, AudioContent)):
        text = f"[{block.type}: {block.mime_type}, {_size(block.data)}, not shown to a text model]"
    else:
        text = f"[{getattr(block, 'type', 'unknown')} content, not shown]"
    return text + _annotated(getattr(block, "annotations", None))


def _contents_text(contents: Any) -> str:
    if isinstance(contents, TextResourceContents):
        return contents.text
    if isinstance(contents, BlobResourceContents):
        mime = contents.mime_type or "binary"
        return f"[resource {contents.uri}: {mime}, {_size(contents.blob)}, not shown]"
    return f"[resource {contents.uri}]"


def _size(data: str) -> str:
    """The decoded size of base64 `data`, without decoding it."""
    size = len(data) * 3 // 4 - data[-2:].count("=")
    return f"{size} bytes" if size < 10_000 else f"{size / 1024:.0f} KiB"


def _annotated(annotations: Any) -> str:
    if annotations is None:
        return ""
    fields = annotations.model_dump(exclude_none=True, by_alias=True)
    return f" (annotations: {', '.join(f'{k}={v}' for k, v in fields.items())})" if fields else ""


def media_parts(result: CallToolResult) -> list[dict[str, Any]]:
    """The image and audio parts of an answer, as a vision-capable channel would pass them on."""
    return [
        {"type": block.type, "mime_type": block.mime_type, "data": block.data}
        for block in result.content
        if isinstance(block, (ImageContent, AudioContent))
    ]


def feature_tools(connection: MCPConnection, features: set[str]) -> list[Tool]:
    """Level-0 tools that reach the server's resources and prompts (when it offers them):
    `mcp_<server>_list_resources`, `…_read_resource` (also follows resource links), `…_list_prompts`,
    `…_get_prompt`. Their answers are text, capped like every result."""
    stem = f"mcp_{connection.name}"
    tools: list[Tool] = []

    def add(suffix: str, description: str, handler: Callable[..., Any], properties: dict[str, Any]) -> None:
        schema = {"type": "object", "properties": properties, "required": list(properties)[:1]}
        if suffix in ("list_resources", "list_prompts"):
            schema["required"] = []
        tools.append(
            Tool(
                name=f"{stem}_{suffix}"[:64],
                description=description,
                parameters=schema,
                handler=handler,
                timeout=connection.timeout,
                level=0,
                idempotent=True,
            )
        )

    if "resources" in features:
        add(
            "list_resources",
            f"List the resources of the {connection.name} MCP server (uri, name, mime type).",
            connection.list_resources,
            {},
        )
        add(
            "read_resource",
            f"Read a resource of the {connection.name} MCP server by its uri "
            "(also a resource link a tool returned).",
            connection.read_resource,
            {"uri": {"type": "string"}},
        )
    if "prompts" in features:
        add(
            "list_prompts",
            f"List the prompts of the {connection.name} MCP server and their arguments.",
            connection.list_prompts,
            {},
        )
        add(
            "get_prompt",
            f"Get a prompt of the {connection.name} MCP server by name, with its arguments.",
            connection.get_prompt,
            {
                "name": {"type": "string"},
                "arguments": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        )
    return tools


def _unique_names(server: str, remotes: list[str], base: Callable[[str], str]) -> dict[str, str]:
    """Display names without collisions: a name already taken (after mapping and the 64-character
    cut) gets `_2`, `_3`… in the server's order, with a WARNING naming both tools."""
    shown: dict[str, str] = {}
    owner: dict[str, str] = {}
    for remote in remotes:
        name = base(remote)
        if name in owner:
            number = 2
            while (candidate := f"{name[:60]}_{number}") in owner:
                number += 1
            log.warning(
                "MCP server %r: tools %r and %r both map to %s; the second is offered as %s",
                server,
                owner[name],
                remote,
                name,
                candidate,
            )
            name = candidate
        owner[name], shown[remote] = remote, name
    return shown


class _Lost(Exception):
    """The connection ended (the server crashed, or its HTTP session is gone)."""


def _names_lost_session(exc: MCPError) -> bool:
    text = exc.message.lower()
    return "session" in text and any(
        word in text for word in ("not found", "404", "400", "terminated", "invalid")
    )


async def _list_tools(client: Client) -> list[MCPToolSpec]:
    specs: list[MCPToolSpec] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor, cache_mode="refresh")
        specs.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return specs


def _describe(exc: BaseException) -> str:
    """One line for an error; the SDK's task groups wrap the interesting one in exception groups."""
    inner = getattr(exc, "exceptions", None)
    while inner:
        exc = inner[0]
        inner = getattr(exc, "exceptions", None)
    if isinstance(exc, asyncio.TimeoutError):
        return "no answer in time"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


__all__ = [
    "MCPConnection",
    "MCPConnectionError",
    "MCPNameError",
    "MCPSchemaError",
    "MCPToolset",
    "attach_mcp",
    "connection_from_config",
    "feature_tools",
    "log_progress",
    "media_parts",
    "tool_result",
]
