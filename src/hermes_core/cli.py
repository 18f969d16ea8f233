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
        epilog="With no model configured, a built-in offline demo model answers. Configure one with a "
        "provider preset (HERMES_PROVIDER or --provider: openai, deepseek, qwen, moonshot, zhipu, "
        "siliconflow, "
        "openrouter, ollama, vllm, llamacpp, lmstudio) and its key variable, or with HERMES_BASE_URL, "
        "HERMES_MODEL and HERMES_API_KEY (or --base-url/--model); `hermes-core doctor` checks it.",
    )
    parser.add_argument("--config", help="YAML configuration file")
    parser.add_argument(
        "--provider", help="provider preset, e.g. deepseek, qwen, ollama (overrides configuration)"
    )
    parser.add_argument("--model", help="model name (overrides configuration)")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--mode", choices=("loop", "plan", "team"),
        help="how run, chat and serve run a task (overrides agent.mode; team needs team.experts)",
    )  # fmt: skip
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
        apply_model_flags(settings, args)
        if getattr(args, "mode", None):
            settings = apply_mode(settings, args.mode)
        asks_model = args.command not in ("traces", "trace") and getattr(args, "live", True) is not False
        agent = build_agent(settings, model_required=asks_model)  # a recorded replay needs no model
        if args.command in ("run", "chat"):
            announce_model(settings)
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
    if args.command == "tools":
        return print_tools(agent)
    if args.command == "serve":
        return run_server(settings, agent, args)
    if args.command == "run":
        return asyncio.run(run_once(agent, args.message, as_json=args.json))
    return asyncio.run(chat(agent))


def apply_model_flags(settings: Any, args: argparse.Namespace) -> None:
    """--provider, --model and --base-url over the configuration (doctor applies them too)."""
    model = settings.model
    model.provider = getattr(args, "provider", None) or model.provider
    model.name = args.model or model.name
    model.base_url = args.base_url or model.base_url
    if getattr(args, "models", None) and model.base_url and not model.name:  # bench --models m1,m2
        model.name = args.models.split(",")[0].strip() or None


def apply_mode(settings: Any, mode: str) -> Any:
    """--mode over `agent.mode`, validated again: team mode without experts is a ConfigError."""
    from pydantic import ValidationError

    from .config import ConfigError, Settings

    data = settings.model_dump()
    data["agent"]["mode"] = mode
    try:
        changed = Settings.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(error["msg"].removeprefix("Value error, ") for error in exc.errors())
        raise ConfigError(f"--mode {mode}: {problems}") from None
    changed._source = settings.source
    return changed


def announce_model(settings: Any) -> None:
    """Which model answers: the offline demo is one line on stderr; a real model a log line (INFO)."""
    import logging

    from .config import model_endpoint

    endpoint = model_endpoint(settings)
    if endpoint is None:
        print(OFFLINE_NOTICE, file=sys.stderr)
    else:
        logging.getLogger("hermes_core.cli").info("model: %s", endpoint.describe())


OFFLINE_NOTICE = (
    "hermes-core: no model configured, the offline demo model answers (arithmetic, dates and times only). "
    "Set HERMES_PROVIDER (e.g. deepseek, qwen, ollama) and its API key, or HERMES_BASE_URL and HERMES_MODEL; "
    "`hermes-core doctor` checks it."
)


def offered_tools(agent: Any) -> Any:
    """The agent's tools as serve and chat offer them: with what a conversation adds (the memory's
    `remember`), attached by the same `AgentRunner` serve and chat run the agent through."""
    from .gateway.runner import AgentRunner

    AgentRunner(agent)
    return agent.registry


def print_tools(agent: Any) -> int:
    offered_tools(agent)
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
    from .models.routing import usage_by_model
    from .modes import run_task
    from .redaction import redact_data, redact_text

    try:
        result = await run_task(agent, message, caller=terminal_caller(agent))
    finally:
        if agent.mode is not None:
            await agent.mode.aclose()
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
            "usage_by_model": {name: vars(usage) for name, usage in usage_by_model(result).items()},
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
        if agent.mode is not None:  # a team's queues and its members' clients
            await agent.mode.aclose()
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
