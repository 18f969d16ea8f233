"""`hermes-core`: chat in the terminal, run one message, list tools.

Only argparse is imported on the way to `--help`; the agent, pydantic and the HTTP client are
imported by the command that needs them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

EXIT_WORDS = {"exit", "quit", "/exit", "/quit", "退出"}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hermes-core",
        description="A small Hermes-style agent: the model decides, code runs the tools.",
        epilog="With no model configured, a built-in offline demo model answers. Configure one with "
        "HERMES_BASE_URL, HERMES_MODEL and HERMES_API_KEY (or --base-url/--model).",
    )
    parser.add_argument("--config", help="YAML configuration file")
    parser.add_argument("--model", help="model name (overrides configuration)")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--log-level", type=str.upper, choices=LOG_LEVELS,
        help="log to stderr at this level (default: HERMES_LOG_LEVEL; else INFO for serve, none otherwise)",
    )  # fmt: skip
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser("chat", help="interactive chat (exit, quit or Ctrl-D to leave)")
    run = commands.add_parser("run", help="run one message and print the reply")
    run.add_argument("message", help="the message to send")
    run.add_argument("--json", action="store_true", help="print the whole result as JSON")
    commands.add_parser("tools", help="list the tools and their JSON schemas")
    serve = commands.add_parser("serve", help="run the gateway: webhook and Feishu channels, /healthz")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8080)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    from .config import ConfigError, build_agent, load_settings
    from .redaction import redact_text

    try:
        settings = load_settings(args.config)  # loads .env first: the secrets to redact are all known now
        configure_logging(args.log_level or os.environ.get("HERMES_LOG_LEVEL"), args.command)
        settings.model.name = args.model or settings.model.name
        settings.model.base_url = args.base_url or settings.model.base_url
        agent = build_agent(settings)
    except (ConfigError, ValueError, TypeError) as exc:
        print(f"hermes-core: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    if args.command == "tools":
        return print_tools(agent)
    if args.command == "serve":
        return run_server(settings, agent, args)
    if args.command == "run":
        return asyncio.run(run_once(agent, args.message, as_json=args.json))
    return asyncio.run(chat(agent))


def print_tools(agent: Any) -> int:
    for declared in agent.registry:
        print(f"{declared.name}: {declared.description}")
        print(json.dumps(declared.parameters, ensure_ascii=False, indent=2))
    return 0


def configure_logging(level: str | None, command: str) -> None:
    """Log lines to stderr at `level` (INFO for `serve` when not given), every secret redacted."""
    import logging

    from .redaction import install_log_redaction

    level = level or ("INFO" if command == "serve" else None)
    if level is not None:
        if level.upper() not in LOG_LEVELS:
            raise ValueError(f"HERMES_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
        logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    install_log_redaction()  # also when nothing is configured: warnings still reach stderr


def run_server(settings: Any, agent: Any, args: argparse.Namespace) -> int:
    from .gateway.server import serve

    def ready(address: str) -> None:
        print(f"hermes-core serving on {address} (POST /webhook, /feishu/events; GET /healthz)", flush=True)

    asyncio.run(serve(settings, host=args.host, port=args.port, ready=ready, agent=agent))
    return 0


async def run_once(agent: Any, message: str, *, as_json: bool = False) -> int:
    from .redaction import redact_data, redact_text

    try:
        result = await agent.run(message)
    finally:
        await agent.aclose()
    if as_json:
        summary = {
            "reply": result.reply,
            "stop_reason": result.stop_reason,
            "tool_calls": [
                {"name": o.call.name, "arguments": o.arguments, "result": o.content}
                for o in result.tool_calls
            ],
            "usage": vars(result.usage),
            "model_calls": result.model_calls,
        }
        print(json.dumps(redact_data(summary), ensure_ascii=False, indent=2))
    else:
        print(redact_text(result.reply))
    return 0 if result.ok else 1


async def chat(agent: Any) -> int:
    from .gateway.runner import AgentRunner
    from .redaction import redact_text

    runner = AgentRunner(agent)  # the gateway's turn handling: memory, window, /memory and /forget
    streamed: list[str] = []
    if agent.interactions is None:  # approvals as a y/n prompt, clarify questions asked in place
        agent.use_interactions(terminal_interactions())

    def show(piece: str) -> None:  # each piece redacted: a secret split across two pieces would pass
        streamed.append(piece)
        print(redact_text(piece), end="", flush=True)

    print("hermes-core chat — type exit or quit (or Ctrl-D) to leave.")
    try:
        while True:
            try:
                line = await asyncio.to_thread(input, "> ")
            except (EOFError, KeyboardInterrupt):
                print()
                break
            if line.strip().lower() in EXIT_WORDS:
                break
            if not line.strip():
                continue
            streamed.clear()
            answer = await runner.reply("cli", line, on_text=show)
            reply = answer if isinstance(answer, str) else answer.text
            if streamed and "".join(streamed) == reply:
                print()
            else:
                print(("\n" if streamed else "") + redact_text(reply))
    finally:
        await agent.aclose()
    return 0


def terminal_interactions() -> Any:
    """Approvals and questions for `chat`: asked on the terminal, answered before the task goes on."""
    from .redaction import redact_text
    from .tasks.pending import InlineInteractions, Pending

    async def confirm(pending: Pending) -> bool:
        prompt = f"\nApprove {pending.tool}({redact_text(pending.arguments)})? 批准执行？ [y/N] "
        try:
            answer = await asyncio.to_thread(input, prompt)
        except (EOFError, KeyboardInterrupt):
            return False
        return answer.strip().lower() in {"y", "yes", "是", "好", "批准"}

    async def ask(question: str) -> str:
        try:
            return await asyncio.to_thread(input, f"\n{redact_text(question)}\n? ")
        except (EOFError, KeyboardInterrupt):
            return ""

    return InlineInteractions(confirm, ask)


if __name__ == "__main__":
    sys.exit(main())
