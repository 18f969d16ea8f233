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
    commands.add_parser("doctor", help="check configuration, model endpoint, Feishu credentials, database")
    serve = commands.add_parser("serve", help="run the gateway: webhook and Feishu channels, /healthz")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8080)")
    evaluate = commands.add_parser("eval", help="run the regression cases and print a pass table")
    evaluate.add_argument("--cases", help="folder of case files, or one file (default: ./evals)")
    evaluate.add_argument("-k", dest="select", help="only the cases whose name contains this")
    evaluate.add_argument("--json", dest="json_out", metavar="PATH", help="also write the results as JSON")
    evaluate.add_argument("--concurrency", type=int, default=4, help="cases run at once (default 4)")
    eval_commands = evaluate.add_subparsers(dest="eval_command", metavar="[add TRACE]")
    add_case = eval_commands.add_parser("add", help="turn a recorded task (JSON trace) into a case file")
    add_case.add_argument("trace", help="the JSON dump of a recorded task")
    add_case.add_argument("--cases", default=argparse.SUPPRESS, help="folder to write the case to")
    add_case.add_argument("--name", help="case name (default: from the task id)")
    add_case.add_argument("--force", action="store_true", help="replace a case of the same name")
    bench = commands.add_parser("bench", help="compare models on tasks: success rate, steps, latency, cost")
    bench.add_argument("--models", help="comma-separated model names (default: the configured model)")
    bench.add_argument("--tasks", help="tasks YAML file (default: the built-in task set)")
    bench.add_argument("-n", type=int, default=20, help="runs of each task per model (default 20)")
    bench.add_argument("--concurrency", type=int, help="runs in flight per model (default: max_concurrency)")
    bench.add_argument("--prices", help="YAML of {model: {prompt, completion}} prices per 1k tokens")
    bench.add_argument("--out", help="folder for bench.csv, bench.json, bench.svg (default: bench-results)")
    traces = commands.add_parser("traces", help="recent tasks: filter by failed, conversation, tool, date")
    traces.add_argument("--failed", action="store_true", help="only tasks that failed (not paused ones)")
    traces.add_argument("--conversation", help="only this conversation")
    traces.add_argument("--tool", help="only tasks that called this tool")
    traces.add_argument("--date", help="only tasks started that day (YYYY-MM-DD, local time)")
    traces.add_argument("--since", help="started at or after (YYYY-MM-DD or YYYY-MM-DDTHH:MM)")
    traces.add_argument("--until", help="started before (YYYY-MM-DD or YYYY-MM-DDTHH:MM)")
    traces.add_argument("--limit", type=int, default=20, help="at most this many, newest first (default 20)")
    traces.add_argument("--json", action="store_true", help="print the summaries as JSON")
    trace = commands.add_parser("trace", help="one recorded task: trace show ID")
    show = trace.add_subparsers(dest="trace_command", metavar="show", required=True).add_parser(
        "show", help="print a task's timeline (--json: export its whole record)"
    )
    show.add_argument("trace", help="a task id, or the path of an X-ray or exported JSON file")
    show.add_argument("--json", action="store_true", help="print the whole record as JSON")
    dead = commands.add_parser("deadletters", help="replies given up on; `deadletters resend ID` sends one")
    dead.add_argument("--limit", type=int, default=50, help="at most this many, newest first (default 50)")
    dead.add_argument("--json", action="store_true", help="print them as JSON")
    resend = dead.add_subparsers(dest="deadletters_command", metavar="[resend ID]").add_parser(
        "resend", help="send a dead letter again (the running gateway picks it up within seconds)"
    )
    resend.add_argument("id", type=int, help="the dead letter's id (first column of the list)")
    replay = commands.add_parser("replay", help="re-run a recorded task on the current code: what diverges")
    replay.add_argument("trace", help="a task id, or the path of an X-ray or exported JSON file")
    replay.add_argument("--live", action="store_true", help="ask the configured model, not the recording")
    replay.add_argument("--run-writes", action="store_true", help="run level-1 (writing) tools for real too")
    replay.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "doctor":  # loads the configuration itself: a bad one is one of its findings
        from .doctor import run_doctor

        return run_doctor(args)
    from .config import ConfigError, build_agent, load_settings
    from .redaction import redact_text

    try:
        settings = load_settings(args.config)  # loads .env first: the secrets to redact are all known now
        configure_logging(
            args.log_level or os.environ.get("HERMES_LOG_LEVEL"), args.command, settings.observe
        )
        settings.model.name = args.model or settings.model.name
        settings.model.base_url = args.base_url or settings.model.base_url
        agent = build_agent(settings)
        if args.command in ("run", "chat", "serve") and agent.tracer is None:  # log events, traces (observe/)
            from .observe.traces import tracer_for

            agent.tracer = tracer_for(settings, serving=args.command == "serve")
    except (ConfigError, ValueError, TypeError) as exc:
        print(f"hermes-core: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    if args.command == "eval":
        from .evals.runner import eval_command

        return eval_command(settings, args)
    if args.command == "bench":
        from .evals.bench import bench_command

        return bench_command(settings, args)
    if args.command in ("traces", "trace", "replay"):
        from .observe.commands import observe_command

        return observe_command(settings, agent, args)
    if args.command == "deadletters":
        return asyncio.run(deadletters_command(settings, args))
    if args.command == "tools":
        return print_tools(agent)
    if args.command == "serve":
        return run_server(settings, agent, args)
    if args.command == "run":
        return asyncio.run(run_once(agent, args.message, as_json=args.json))
    return asyncio.run(chat(agent))


async def deadletters_command(settings: Any, args: argparse.Namespace) -> int:
    """List the dead letters of the gateway's database, or ask for one to be sent again.

    The resend is a request in the database, not a send from here: the running gateway (or the
    next one to start) puts the reply back in its outbox, in its conversation's order."""
    import time
    from pathlib import Path

    from .gateway.store import SQLiteGatewayStore, dead_letter_summary
    from .redaction import redact_data, redact_text

    database = Path(settings.gateway.data_dir) / "gateway.db"
    if not database.exists():
        print(f"hermes-core: no gateway database at {database} (gateway.data_dir)", file=sys.stderr)
        return 1
    store = SQLiteGatewayStore(database)
    try:
        if getattr(args, "deadletters_command", None) == "resend":
            if not await store.request_resend(args.id):
                print(f"hermes-core: no dead letter {args.id}", file=sys.stderr)
                return 1
            print(f"dead letter {args.id}: resend requested; the running gateway sends it within seconds "
                  "(or at its next start)")  # fmt: skip
            return 0
        rows = [dead_letter_summary(row) for row in await store.dead_letters(limit=max(1, args.limit))]
    finally:
        await store.close()
    if args.json:
        print(json.dumps(redact_data(rows), ensure_ascii=False, indent=2))
        return 0
    if not rows:
        print("no dead letters")
    for row in rows:
        asked = "  (resend requested)" if row["resend_requested_at"] else ""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["dead_at"]))
        head = f"{row['id']}\t{when}\t{row['channel']}\t{row['conversation']}\t{row['attempts']} attempt(s)"
        print(redact_text(f"{head}{asked}\n\t{row['error']}\n\t> {row['text']}"))
    return 0


def print_tools(agent: Any) -> int:
    if agent.mcp is not None:  # MCP servers' tools are known once connected
        from .config import ConfigError

        async def connect() -> None:
            try:
                await agent.mcp.start(agent.registry)
            finally:
                await agent.mcp.aclose()

        try:
            asyncio.run(connect())
        except ConfigError as exc:  # `levels` or `confirm` names a tool its server does not have
            print(f"hermes-core: {exc}", file=sys.stderr)
            return 2
    for declared in agent.registry:
        print(f"{declared.name}: {declared.description}")
        print(json.dumps(declared.parameters, ensure_ascii=False, indent=2))
    return 0


def configure_logging(level: str | None, command: str, observe: Any = None) -> None:
    """Log lines to stderr at `level` (else `observe.level`; INFO for `serve`), every secret redacted.
    With the configuration's `observe` section: its format, and daily JSON files (observe/logs.py)."""
    import logging

    from .redaction import install_log_redaction

    level = level or getattr(observe, "level", None) or ("INFO" if command == "serve" else None)
    if level is not None:
        if level.upper() not in LOG_LEVELS:
            raise ValueError(f"HERMES_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
        if observe is not None:
            from .observe.logs import setup_logging

            setup_logging(level, log_format=observe.log_format, log_dir=observe.log_dir,
                          retention_days=observe.retention_days)  # fmt: skip
        else:
            logging.basicConfig(level=level.upper(), format=LOG_FORMAT)
    install_log_redaction()  # also when nothing is configured: warnings still reach stderr


def run_server(settings: Any, agent: Any, args: argparse.Namespace) -> int:
    from .gateway.server import serve

    def ready(address: str) -> None:
        print(f"hermes-core serving on {address} (POST /webhook, /feishu/events; GET /healthz)", flush=True)

    from .config import ConfigError
    from .redaction import redact_text

    try:
        asyncio.run(serve(settings, host=args.host, port=args.port, ready=ready, agent=agent))
    except ConfigError as exc:  # e.g. the console on a public address without a token
        print(f"hermes-core: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    return 0


async def run_once(agent: Any, message: str, *, as_json: bool = False) -> int:
    from .redaction import redact_data, redact_text

    try:
        result = await agent.run(message, caller=terminal_caller(agent))
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
    caller = terminal_caller(agent)
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
            answer = await runner.reply("cli", line, on_text=show, caller=caller)
            reply = answer if isinstance(answer, str) else answer.text
            if streamed and "".join(streamed) == reply:
                print()
            else:
                print(("\n" if streamed else "") + redact_text(reply))
    finally:
        await agent.aclose()
    return 0


def terminal_caller(agent: Any) -> Any:
    """Who the terminal's tasks run for: the login name on the `terminal` channel, so that
    `permissions.admins: ["terminal:<login>"]` makes that person an admin here and nowhere else."""
    import getpass

    try:
        login = getpass.getuser()
    except (KeyError, OSError):  # no login name known (a container without a passwd entry)
        login = ""
    return agent.permissions.caller(login, "terminal")


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
