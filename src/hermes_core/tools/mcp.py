"""Tools from MCP servers (Model Context Protocol), through the official `mcp` SDK (version 2).

    async with MCPConnection("demo", command="python", args=["server.py"]) as demo:
        agent = Agent(tools=demo.tools)
        result = await agent.run("what is 40 + 2?")

Each tool a server lists becomes an ordinary `Tool` whose handler calls the server, so every call
passes `ToolRegistry.execute` like any other: permissions (levels, roles, allowed models), the
server's input schema (checked when listed, then lax coercion and validation of every call,
tools/schema.py), the timeout, result capping and redaction apply unchanged. An MCP tool
is level 1 unless configured (`level` per server, `levels` per tool): the server's own hints are
not trusted to lower it. The server's answer becomes the tool's result: its text (or, without
text, its structured content); `isError` and a lost connection become error results.

The SDK's connections are task-scoped (anyio), so each connection lives in a task of its own and
may be opened by one task (an agent's first run) and closed by another (shutdown).
`MCPToolset` groups the servers of a configuration and adds their tools to a registry on first use.

Optional: `pip install "hermes-core[mcp]"`. Only `config.mcp_toolset` imports this module, and only
when servers are configured: the kernel never loads the SDK.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

try:
    import httpx2
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
    from mcp.types import (
        CONNECTION_CLOSED,
        CallToolResult,
        EmbeddedResource,
        Implementation,
        ResourceLink,
        TextContent,
        TextResourceContents,
    )
    from mcp.types import Tool as MCPToolSpec
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f'MCP tools need the mcp extra: pip install "hermes-core[mcp]" ({exc})', name=exc.name
    ) from exc

from .. import __version__
from .declare import Tool, ToolDefinitionError, ToolError, schema_checks
from .registry import ToolRegistry
from .schema import SchemaDefinitionError, wire_name, wire_names

log = logging.getLogger("hermes_core.mcp")

_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CLOSE_GRACE = 10.0  # seconds a server gets to shut down before its connection task is cancelled
_CLIENT_INFO = Implementation(name="hermes-core", version=__version__)


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
    level: int = 1  # every tool's level, unless `levels` names it (tools/permissions.py)
    # Tools are named as the server names them (`pay.out`) or as `hermes-core tools` shows them
    # (`pay_out`, with the prefix): both match. A `levels` or `confirm` name matching none is an error.
    levels: Mapping[str, int] = field(default_factory=dict)  # tool → level
    allowed_tools: Sequence[str] | None = None  # offer only these; None: all
    confirm: Sequence[str] = ()  # tools whose every call a person approves (tasks/pending.py)
    prefix: str = ""  # put before every tool name, e.g. "github_": avoids collisions between servers
    timeout: float | None = None  # per call; None: the agent's tool_timeout
    connect_timeout: float = 30.0

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(
                f"MCP server {self.name!r}: give either command (stdio) or url (streamable HTTP)"
            )
        for level in (self.level, *self.levels.values()):
            if level not in (0, 1, 2):
                raise ValueError(f"MCP server {self.name!r}: levels are 0, 1 or 2, got {level!r}")
        self.tools: list[Tool] = []
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._opening: asyncio.Future[list[Tool]] | None = None
        self._lost = ""  # why the last connection ended, for the error results that follow

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
        """Call one of the server's tools by its own name; every failure raises `ToolError`."""
        client = self._client
        if client is None or not self.connected:
            reason = f" ({self._lost})" if self._lost else ""
            raise ToolError(f"MCP server {self.name!r} is not connected{reason}; try again later")
        try:
            result = await client.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise ToolError(f"MCP server {self.name!r} refused the call: {exc.message}") from None
            self._connection_lost("it closed the connection")
            raise ToolError(f"MCP server {self.name!r} closed the connection during the call") from None
        return tool_result(result)

    async def _open(self) -> list[Tool]:
        await self._stop()
        self._closing, self._lost = asyncio.Event(), ""
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready), name=f"mcp-{self.name}")
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout)
            specs = await asyncio.wait_for(_list_tools(client), self.connect_timeout)
        except Exception as exc:
            await self._stop()
            raise MCPConnectionError(f"cannot connect to MCP server {self.name!r}: {_describe(exc)}") from exc
        except BaseException:
            await self._stop()
            raise
        try:
            names = self._resolve([spec.name for spec in specs])
            offered = self._offered(specs, names)
            self._check_names(offered)
            tools = [self._declare(spec, names) for spec in offered]
        except MCPNameError:
            await self._stop()  # none of its tools is offered: one of them may be the mistyped one
            raise
        self._client = client
        self.tools = tools
        return self.tools

    def _check_names(self, specs: list[MCPToolSpec]) -> None:
        """Two of the server's tools that would reach the model under one name: MCPNameError."""
        try:
            wire_names(f"{self.prefix}{spec.name}" for spec in specs)
        except SchemaDefinitionError as exc:
            raise MCPSchemaError(f"MCP server {self.name!r}: {exc}") from None

    def displayed(self, remote: str) -> str:
        """The name the model and `hermes-core tools` see for the server's tool `remote`
        (`wire_name` of tools/schema.py, the mapping every schema tool's name goes through)."""
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
            missing = [entry for entry in self.allowed_tools if not self._named(entry, remotes)]
            if missing:
                log.warning("MCP server %r does not offer %s", self.name, ", ".join(sorted(missing)))
        return _Names(levels, confirm, allowed)

    async def _hold(self, ready: asyncio.Future[Client]) -> None:
        """The connection's own task: enter the SDK's client, hand it over, wait to be closed."""
        failure: Exception = MCPConnectionError("closed while connecting")
        try:
            async with AsyncExitStack() as stack:
                server = await self._server(stack)
                ready.set_result(await stack.enter_async_context(Client(server, client_info=_CLIENT_INFO)))
                await self._closing.wait()
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
        http = await stack.enter_async_context(
            httpx2.AsyncClient(headers=dict(self.headers), timeout=httpx2.Timeout(30.0, read=None))
        )  # no read timeout: the per-call timeout bounds every call, and a stream may idle
        return streamable_http_client(self.url, http_client=http)

    async def _stop(self) -> None:
        """End the connection's task: gracefully once connected, at once while still connecting."""
        task, established = self._task, self._client is not None
        self._task = self._client = None
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
        try:  # the server's schema checks every call before it is sent (tools/schema.py)
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

    def __init__(self, connections: Iterable[MCPConnection], *, retry_after: float = 30.0) -> None:
        self.connections = list(connections)
        names = [connection.name for connection in self.connections]
        if len(set(names)) != len(names):
            raise ValueError(f"MCP server names must be unique, got {', '.join(names)}")
        self.retry_after = retry_after
        self._registered: set[str] = set()
        self._failed_at: dict[str, float] = {}
        self.misconfigured: dict[str, str] = {}  # server → why its tools are left out (MCPNameError)

    @classmethod
    def from_config(cls, servers: Iterable[Any], environ: Mapping[str, str] | None = None) -> MCPToolset:
        return cls(connection_from_config(server, environ) for server in servers)

    async def attach(self, registry: ToolRegistry) -> None:
        """Connect the servers that are not connected, and register the tools not registered yet."""
        now = time.monotonic()
        due = [
            connection
            for connection in self.connections
            if not connection.connected
            and now - self._failed_at.get(connection.name, -1e9) >= self.retry_after
        ]
        outcomes = await asyncio.gather(*(connection.connect() for connection in due), return_exceptions=True)
        for connection, outcome in zip(due, outcomes, strict=True):
            if isinstance(outcome, MCPNameError):
                self._failed_at[connection.name] = time.monotonic()
                self.misconfigured[connection.name] = str(outcome)
                log.error("%s (its tools are left out until the configuration is fixed)", outcome)
                continue
            if isinstance(outcome, BaseException):
                self._failed_at[connection.name] = time.monotonic()
                log.error("%s (its tools are left out until it can be reached)", outcome)
                continue
            self._failed_at.pop(connection.name, None)
            self.misconfigured.pop(connection.name, None)
            for declared in outcome:
                if declared.name not in self._registered:
                    self._register(registry, connection, declared)

    async def start(self, registry: ToolRegistry) -> None:
        """`attach` at start-up (`serve`, `hermes-core tools`): a server that is down is only logged
        and tried again later, but a `levels` or `confirm` name that none of a server's tools has
        raises `ConfigError` naming it."""
        from ..config import ConfigError

        await self.attach(registry)
        if self.misconfigured:
            raise ConfigError("; ".join(self.misconfigured.values()))

    async def aclose(self) -> None:
        await asyncio.gather(*(connection.aclose() for connection in self.connections))

    async def __aenter__(self) -> MCPToolset:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _register(self, registry: ToolRegistry, connection: MCPConnection, declared: Tool) -> None:
        try:
            registry.add(declared)
        except ValueError:
            log.error(
                "MCP server %r: a tool named %r is already registered; give the server a prefix",
                connection.name,
                declared.name,
            )
            return
        self._registered.add(declared.name)


async def attach_mcp(agent: Any, servers: Iterable[Any]) -> MCPToolset:
    """Connect `servers` (`mcp:` configuration entries or `MCPConnection`s) now and add their tools
    to `agent`. Close the returned toolset when the agent is done: `await toolset.aclose()`."""
    toolset = MCPToolset.from_config(servers)
    await toolset.attach(agent.registry)
    return toolset


def connection_from_config(server: Any, environ: Mapping[str, str] | None = None) -> MCPConnection:
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
    )


def tool_result(result: CallToolResult) -> Any:
    """What the model reads of an MCP tool's answer: its text, or without text its structured
    content. An answer flagged `isError` raises `ToolError` with the server's text."""
    text = "\n".join(_block_text(block) for block in result.content)
    if result.is_error:
        raise ToolError(text or "the MCP tool failed without saying why")
    if result.structured_content is not None and not any(isinstance(b, TextContent) for b in result.content):
        return result.structured_content
    return text


def _block_text(block: Any) -> str:
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, EmbeddedResource):
        contents = block.resource
        return contents.text if isinstance(contents, TextResourceContents) else f"[resource {contents.uri}]"
    if isinstance(block, ResourceLink):
        return f"[resource {block.uri}]"
    return f"[{block.type} content ({getattr(block, 'mime_type', '')}), not shown]"  # image, audio


async def _list_tools(client: Client) -> list[MCPToolSpec]:
    specs: list[MCPToolSpec] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
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
    "tool_result",
]
