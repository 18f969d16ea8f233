"""A small MCP server for the tests, built with the SDK's `MCPServer` (formerly FastMCP).

    python tests/mcp_demo_server.py                  # stdio
    python tests/mcp_demo_server.py --port 8765      # streamable HTTP on 127.0.0.1:8765/mcp

Every call is appended as one JSON line to the file named by DEMO_CALL_LOG (if set), so a test
can check which calls reached the server; DEMO_START_LOG gets a line per process started.
DEMO_GREETING, if set, is what `greet` answers with:
it shows that an environment variable was passed to the server. DEMO_START_DELAY (seconds) makes
the server wait that long before it answers the handshake, like a server that installs or loads
something first.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import AudioContent, CallToolResult, ImageContent, ToolAnnotations

server = MCPServer("demo", log_level="WARNING")
# A 1×1 PNG and a short WAV header, base64 (what the reference "everything" server's image and
# audio tools send, in miniature)
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
SOUND = base64.b64encode(b"RIFF" + bytes(600)).decode()
if os.environ.get("DEMO_START_LOG"):  # one line per server process started
    with open(os.environ["DEMO_START_LOG"], "a", encoding="utf-8") as starts:
        starts.write(f"{os.getpid()}\n")


def record(tool: str, **arguments: Any) -> None:
    path = os.environ.get("DEMO_CALL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"tool": tool, "arguments": arguments}) + "\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    record("add", a=a, b=b)
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Repeat the text."""
    record("echo", text=text)
    return text


@server.tool(structured_output=False)
def greet(name: str) -> str:
    """Greet someone (plain text, no structured content)."""
    record("greet", name=name)
    return f"{os.environ.get('DEMO_GREETING', 'hello')}, {name}"


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The value of one header of the HTTP request that carried this call."""
    record("header", name=name)
    return (ctx.headers or {}).get(name.lower(), "(none)")


@server.tool(name="delete.everything")
def delete_everything(confirm: bool = False) -> str:
    """Pretend to delete everything (a name with a dot; configured as irreversible in the tests)."""
    record("delete.everything", confirm=confirm)
    return "deleted"


@server.tool(name="pay.out")
def pay_out(account: str, amount: int) -> str:
    """Pay money out of an account (a dotted name: `hermes-kernel tools` shows it as pay_out)."""
    record("pay.out", account=account, amount=amount)
    return f"paid {amount} to {account}"


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep for a while, then answer."""
    record("slow", seconds=seconds)
    await asyncio.sleep(seconds)
    return "done"


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the given reason."""
    record("fail", reason=reason)
    raise ToolError(f"cannot do that: {reason}")


@server.tool()
async def retire(name: str, ctx: Context) -> str:
    """Withdraw one of this server's tools and tell the client its tool list changed."""
    record("retire", name=name)
    server.remove_tool(name)
    await ctx.notify_tools_changed()
    return f"{name} withdrawn"


if os.environ.get("DEMO_LONG_NAMES"):  # two names that are one after the 64-character cut

    @server.tool(name="summarise_the_quarterly_revenue_report_for_the_board_meeting_in_december_draft")
    def long_draft() -> str:
        """The draft summary."""
        return "draft"

    @server.tool(name="summarise_the_quarterly_revenue_report_for_the_board_meeting_in_december_final")
    def long_final() -> str:
        """The final summary."""
        return "final"


@server.tool()
def crash() -> str:
    """Ends the server process in the middle of the call."""
    record("crash")
    os._exit(3)


@server.tool()
def snapshot() -> CallToolResult:
    """A picture of the screen, answered as structured content only (no content blocks)."""
    record("snapshot")
    image = {"type": "image", "data": PIXEL, "mimeType": "image/png"}
    return CallToolResult(content=[], structured_content={"caption": "the screen", "image": image})


@server.tool()
def recording() -> CallToolResult:
    """A picture and a sound as content blocks, mirrored in the structured content."""
    record("recording")
    blocks = [
        ImageContent(data=PIXEL, mime_type="image/png"),
        AudioContent(data=SOUND, mime_type="audio/wav"),
    ]
    mirror = {"items": [block.model_dump(mode="json", by_alias=True) for block in blocks]}
    return CallToolResult(content=blocks, structured_content=mirror)


LOGGING = {"on": False}  # what `toggle_logging` switches, as the reference "everything" server does


@server.tool()
def toggle_logging() -> str:
    """Switch simulated logging on or off (no arguments: each call flips it)."""
    record("toggle_logging")
    LOGGING["on"] = not LOGGING["on"]
    return "logging on" if LOGGING["on"] else "logging off"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def logging_status() -> str:
    """Whether simulated logging is on (the server marks it read-only)."""
    record("logging_status")
    return "on" if LOGGING["on"] else "off"


async def serve_prompts_only() -> None:
    """A server with prompts and no tools capability at all (the SDK's low-level server)."""
    from mcp import types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    async def list_prompts(ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[types.Prompt(name="haiku", description="Write a haiku")])

    async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        text = types.TextContent(type="text", text="Write a haiku about the sea.")
        return types.GetPromptResult(messages=[types.PromptMessage(role="user", content=text)])

    prompts = Server("prompts-only", on_list_prompts=list_prompts, on_get_prompt=get_prompt)
    async with stdio_server() as (read, write):
        await prompts.run(read, write, prompts.create_initialization_options())


def main() -> None:
    if os.environ.get("DEMO_START_DELAY"):  # a slow start: nothing answered before it is over
        import time

        time.sleep(float(os.environ["DEMO_START_DELAY"]))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, help="serve streamable HTTP on this port instead of stdio")
    parser.add_argument("--prompts-only", action="store_true", help="a server without the tools capability")
    args = parser.parse_args()
    if args.prompts_only:
        asyncio.run(serve_prompts_only())
    elif args.port is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
