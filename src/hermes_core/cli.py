"""`hermes-kernel`: chat in the terminal, run one message, list tools.

Only argparse is imported on the way to `--help`; the agent, pydantic and the HTTP client are
imported by the command that needs them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from .onboarding import CONFIG_NAME as DEFAULT_CONFIG
from .onboarding import add_init_command

if TYPE_CHECKING:  # imported by the commands that need them (see above)
    from .agent import Agent
    from .cli_display import Terminal, TurnDisplay
    from .config import ObserveConfig, Settings
    from .kernel.tools.permissions import Caller
    from .tasks.pending import InlineInteractions
    from .tools import ToolRegistry

EXIT_WORDS = {"exit", "quit", "/exit", "/quit", "退出"}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
TRACE_HELP = "a task id as `traces` prints it (or a beginning only it has), or an X-ray or JSON export"


def build_parser() -> argparse.ArgumentParser:
    from .models.providers import names  # the one table of presets (standard library only)
    from .modes import MODES  # the one list of modes (standard library only)

    parser = argparse.ArgumentParser(
        prog="hermes-kernel",
        description="A small Hermes-style agent: the model decides, code runs the tools.",
        epilog="With no model configured, a built-in offline demo model answers. Configure one with a "
        f"provider preset (HERMES_PROVIDER or --provider: {', '.join(names())}) and its key variable, "
        "or with HERMES_BASE_URL, HERMES_MODEL and HERMES_API_KEY (or --base-url/--model); "
        "`hermes-kernel doctor` checks it.",
    )
    parser.add_argument(
        "--config", help=f"YAML configuration file (default: ./{DEFAULT_CONFIG} when there is one)"
    )
    parser.add_argument(
        "--provider", help="provider preset, e.g. deepseek, qwen, ollama (overrides configuration)"
    )
    parser.add_argument("--model", help="model name (overrides configuration)")
    parser.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument(
        "--mode", choices=MODES,
        help="how run, chat and serve run a task (overrides agent.mode; team needs team.experts)",
    )  # fmt: skip
    parser.add_argument(
        "--log-level", type=str.upper, choices=LOG_LEVELS,
        help="log to stderr at this level (default: HERMES_LOG_LEVEL; else INFO for serve, none otherwise)",
    )  # fmt: skip
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_turn_commands(commands)
    add_init_command(commands)
    commands.add_parser("tools", help="list the tools and their JSON schemas")
    commands.add_parser("doctor", help="check configuration, model endpoint, Feishu credentials, database")
    serve = commands.add_parser("serve", help="run the gateway: webhook and Feishu channels, /healthz")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8080)")
    commands.add_parser(
        "worker", help="run conversation turns for `engine: temporal` (a Temporal worker; docs/scale-out.md)"
    )
    commands.add_parser(
        "prune", help="delete now what is older than its retention (history, uploads, journals, traces)"
    )
    evaluate = commands.add_parser("eval", help="run the regression cases and print a pass table")
    evaluate.add_argument("--cases", help="folder of case files, or one file (default: ./evals)")
    evaluate.add_argument("-k", dest="select", help="only the cases whose name contains this")
    evaluate.add_argument("--json", dest="json_out", metavar="PATH", help="also write the results as JSON")
    evaluate.add_argument("--concurrency", type=int, default=4, help="cases run at once (default 4)")
    eval_commands = evaluate.add_subparsers(dest="eval_command", metavar="[add TRACE]")
    add_case = eval_commands.add_parser("add", help="turn a recorded task (JSON trace) into a case file")
    add_case.add_argument("trace", help=TRACE_HELP)
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
    show.add_argument("trace", help=TRACE_HELP)
    show.add_argument("--json", action="store_true", help="print the whole record as JSON")
    dead = commands.add_parser("deadletters", help="replies given up on; `deadletters resend ID` sends one")
    dead.add_argument("--limit", type=int, default=50, help="at most this many, newest first (default 50)")
    dead.add_argument("--json", action="store_true", help="print them as JSON")
    resend = dead.add_subparsers(dest="deadletters_command", metavar="[resend ID]").add_parser(
        "resend", help="send a dead letter again (the running gateway picks it up within seconds)"
    )
    resend.add_argument("id", type=int, help="the dead letter's id (first column of the list)")
    add_schedule_commands(commands)
    replay = commands.add_parser("replay", help="re-run a recorded task on the current code: what diverges")
    replay.add_argument("trace", help=TRACE_HELP)
    replay.add_argument("--live", action="store_true", help="ask the configured model, not the recording")
    replay.add_argument("--run-writes", action="store_true", help="run level-1 (writing) tools for real too")
    replay.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def add_schedule_commands(commands: Any) -> None:
    """`schedule list | add | cancel ID`: the gateway's scheduled jobs (docs/scheduling.md)."""
    schedule = commands.add_parser("schedule", help="scheduled jobs: schedule list | add | cancel ID")
    what = schedule.add_subparsers(dest="schedule_command", metavar="list|add|cancel", required=True)
    listing = what.add_parser("list", help="the active jobs, by next fire time")
    listing.add_argument("--all", action="store_true", help="also finished and cancelled jobs")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    add = what.add_parser("add", help="add a job (the running gateway picks it up within a second)")
    add.add_argument("--prompt", required=True, help="what the task is asked to do when it fires")
    add.add_argument("--id", dest="job_id", help="the job's id (default: a new random one)")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help="a 5-field cron expression, e.g. '0 9 * * 1-5'")
    when.add_argument("--at", help="once, at this ISO date and time, e.g. 2026-12-01T15:00")
    when.add_argument("--in", dest="minutes", type=float, help="once, this many minutes from now")
    add.add_argument("--timezone", help="IANA zone of the time (default: schedule.timezone)")
    add.add_argument(
        "--channel", choices=("feishu", "webhook", "web"),
        help="where its reply goes (default: feishu with --chat-id, webhook with --callback-url, "
        "else web, the console's chat)",
    )  # fmt: skip
    add.add_argument("--chat-id", help="feishu: the chat it posts into")
    add.add_argument("--callback-url", help="webhook: where its reply is POSTed")
    add.add_argument("--conversation", help="the conversation key (default from the channel and chat)")
    add.add_argument("--sender", default="scheduler", help="whom it runs for, a user id on the channel")
    cancel = what.add_parser("cancel", help="cancel a job by its id")
    cancel.add_argument("id", help="the job's id, as `schedule list` prints it")


QUIET_HELP = "no status line (thinking…, tool calls) on stderr; it is shown only when stderr is a terminal"


def add_turn_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`chat` and `run`: what they show while a turn runs is in cli_display.py."""
    chat = commands.add_parser(
        "chat", help="interactive chat (exit, quit, Ctrl-D or Ctrl-C at the prompt to leave)",
        description="Chat in the terminal. While the model works, a status line on stderr says what it "
        "does and its text appears as it is written. Ctrl-C cancels the turn; at the prompt it leaves.",
    )  # fmt: skip
    chat.add_argument("--quiet", "-q", action="store_true", help=QUIET_HELP)
    run = commands.add_parser(
        "run", help="run one message and print the reply",
        description="Run one message; stdout gets the reply only (streamed as it is written when stdout "
        "is a terminal), the status line goes to stderr when that is a terminal. Exit 0 when the task "
        "completed, 1 when it failed, 130 on Ctrl-C.",
    )  # fmt: skip
    run.add_argument("message", help="the message to send")
    run.add_argument("--json", action="store_true", help="print the whole result as JSON")
    run.add_argument("--quiet", "-q", action="store_true", help=QUIET_HELP)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config is None and args.command != "init" and Path(DEFAULT_CONFIG).is_file():
        args.config = DEFAULT_CONFIG  # what `init` wrote here: `serve` in the bot's folder reads it
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "doctor":  # loads the configuration itself: a bad one is one of its findings
        from .doctor import run_doctor

        return run_doctor(args)
    if args.command == "init":  # writes the configuration: none is loaded before
        from .onboarding import run_init

        return run_init(args)
    from .config import ConfigError, build_agent, load_settings
    from .kernel.redaction import redact_text

    try:
        settings = load_settings(args.config)  # loads .env first: the secrets to redact are all known now
        configure_logging(
            args.log_level or os.environ.get("HERMES_LOG_LEVEL"), args.command, settings.observe
        )
        apply_model_flags(settings, args)
        if getattr(args, "mode", None):
            settings = apply_mode(settings, args.mode)
        no_model = ("traces", "trace", "schedule", "prune")
        asks_model = args.command not in no_model and getattr(args, "live", True) is not False
        agent = build_agent(settings, model_required=asks_model)  # a recorded replay needs no model
        if args.command in ("run", "chat"):
            announce_model(settings)
        traced = args.command in ("run", "chat") or (args.command, settings.engine) == ("serve", "embedded")
        if traced and agent.tracer is None:  # log events, traces (observe/)
            from .observe.traces import tracer_for

            agent.tracer = tracer_for(settings)
    except (ConfigError, ValueError, TypeError) as exc:
        print(f"hermes-kernel: {redact_text(str(exc))}", file=sys.stderr)
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
    if args.command == "prune":
        from . import stores
        from .retention import prune_now

        if stores.database_url(settings) is None and not stores.sqlite_path(settings).exists():
            print(f"nothing stored yet: no database at {stores.sqlite_path(settings)} (gateway.data_dir)")
            return 0
        print("\n".join(asyncio.run(prune_now(settings))))
        return 0
    if args.command == "schedule":
        return asyncio.run(schedule_command(settings, agent, args))
    if args.command == "tools":
        return print_tools(agent, settings)
    if args.command == "serve":
        return run_server(settings, agent, args)
    if args.command == "worker":
        return run_worker(settings, agent)
    try:
        if args.command == "run":
            return asyncio.run(run_once(agent, args.message, as_json=args.json, quiet=args.quiet))
        return asyncio.run(chat(agent, quiet=args.quiet))
    except ConfigError as exc:  # an MCP server's `levels` or `confirm` names a tool it does not have
        print(f"hermes-kernel: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C where the terminal's own handler is not installed (Windows)
        print("\nhermes-kernel: cancelled", file=sys.stderr)
        return 130


def apply_model_flags(settings: Settings, args: argparse.Namespace) -> None:
    """--provider, --model and --base-url over the configuration (doctor applies them too)."""
    model = settings.model
    model.provider = getattr(args, "provider", None) or model.provider
    model.name = args.model or model.name
    model.base_url = args.base_url or model.base_url
    if getattr(args, "models", None) and model.base_url and not model.name:  # bench --models m1,m2
        model.name = args.models.split(",")[0].strip() or None


def apply_mode(settings: Settings, mode: str) -> Settings:
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


def announce_model(settings: Settings) -> None:
    """Which model answers: the offline demo is one line on stderr; a real model a log line (INFO)."""
    import logging

    from .config import model_endpoint

    endpoint = model_endpoint(settings)
    if endpoint is None:
        print(OFFLINE_NOTICE, file=sys.stderr)
    else:
        logging.getLogger("hermes_core.cli").info("model: %s", endpoint.describe())


OFFLINE_NOTICE = (
    "hermes-kernel: no model configured, the offline demo model answers (arithmetic, dates and times only). "
    "Set HERMES_PROVIDER (e.g. deepseek, qwen, ollama) and its API key, or HERMES_BASE_URL and HERMES_MODEL; "
    "`hermes-kernel doctor` checks it."
)


def offered_tools(agent: Agent, settings: Settings | None = None) -> ToolRegistry:
    """The agent's tools as serve and chat offer them: with what a conversation adds (the memory's
    `remember`), attached by the same `AgentRunner` serve and chat run the agent through, and, given
    the settings, the scheduling tools and `send_message` serve adds (gateway/server.py)."""
    from .gateway.runner import AgentRunner

    AgentRunner(agent)
    if settings is not None and settings.schedule.enabled and schedules_served(settings):
        from .schedule.jobs import ScheduleStore
        from .schedule.tools import register_schedule_tools

        unopened = cast(ScheduleStore, object())  # listed, never called: no database is opened
        register_schedule_tools(agent, unopened, timezone=settings.schedule.timezone)
    if settings is not None and settings.engine == "embedded":  # gateway/server.py `build_gateway`
        from .gateway.outgoing import register_outgoing_tools

        register_outgoing_tools(agent)
    return agent.registry


def schedules_served(settings: Settings) -> bool:
    """Whether serve (or, with engine temporal, a worker) offers the scheduling tools: always on the
    embedded engine; with engine temporal when the jobs have a shared store (database.url)."""
    from . import stores

    return settings.engine == "embedded" or stores.database_url(settings) is not None


async def deadletters_command(settings: Settings, args: argparse.Namespace) -> int:
    """List the dead letters of the gateway's database, or ask for one to be sent again.

    The resend is a request in the database, not a send from here: the running gateway (or the
    next one to start) puts the reply back in its outbox, in its conversation's order."""
    import time

    from . import stores
    from .gateway.store import dead_letter_summary
    from .kernel.redaction import redact_data, redact_text

    database = stores.sqlite_path(settings)
    if stores.database_url(settings) is None and not database.exists():
        print(f"hermes-kernel: no gateway database at {database} (gateway.data_dir)", file=sys.stderr)
        return 1
    store = stores.gateway_store(settings)
    try:
        if getattr(args, "deadletters_command", None) == "resend":
            if not await store.request_resend(args.id):
                print(f"hermes-kernel: no dead letter {args.id}", file=sys.stderr)
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


def job_channel(chat_id: str | None, callback_url: str | None) -> str:
    """The channel a `schedule add` without --channel means: the one its other flags name, else the
    console's chat (`web`), which every setup has — a reminder then shows where the user reads."""
    return "feishu" if chat_id else "webhook" if callback_url else "web"


async def schedule_command(settings: Any, agent: Any, args: argparse.Namespace) -> int:
    """`schedule list | add | cancel`, on the gateway's database (SQLite, or PostgreSQL with
    database.url): a running gateway sees a change within `schedule.tick` seconds (it reads the next
    fire time from the database)."""
    import time
    import uuid

    from . import stores
    from .gateway.schedules import conversation_of
    from .schedule.jobs import Job, ScheduleError, check_cron, first_fire, parse_at, zone
    from .schedule.tools import job_lines
    from .storage import StoreUnavailable

    store = stores.schedule_store(settings)
    try:
        if args.schedule_command == "list":
            jobs = await store.jobs(active_only=not args.all)
            if args.json:
                print(json.dumps([job.describe() for job in jobs], ensure_ascii=False, indent=2))
            else:
                lines = job_lines(jobs)
                print("\n".join(lines) if lines else "no scheduled jobs")
            return 0
        if args.schedule_command == "cancel":
            if await store.cancel(args.id) is None:
                print(f"hermes-kernel: no active job {args.id}", file=sys.stderr)
                return 1
            print(f"job {args.id} cancelled")
            return 0
        zone_name, now = args.timezone or settings.schedule.timezone, time.time()
        args.channel = args.channel or job_channel(args.chat_id, args.callback_url)
        if args.channel == "feishu" and not args.chat_id:
            raise ScheduleError("a feishu job needs --chat-id (the chat it posts into)")
        if args.channel == "webhook" and not args.callback_url:
            raise ScheduleError("a webhook job needs --callback-url (where its reply goes)")
        zone(zone_name)
        cron = check_cron(args.cron) if args.cron else None
        at = parse_at(args.at, zone_name, now) if args.at else None
        if args.minutes is not None:
            if args.minutes <= 0:
                raise ScheduleError("--in takes a number of minutes above 0")
            at = now + args.minutes * 60
        conversation = args.conversation or conversation_of(args.channel, args.chat_id, args.sender)
        job_id = args.job_id or "c" + uuid.uuid4().hex[:11]
        if await store.get(job_id) is not None:
            raise ScheduleError(f"there is a job {job_id} already (schedule list --all)")
        job = Job(
            id=job_id, prompt=args.prompt, channel=args.channel,
            conversation=conversation, sender=args.sender, timezone=zone_name, cron=cron, at=at,
            next_fire=first_fire(cron, at, zone_name, now), chat_id=args.chat_id,
            creator_role=agent.permissions.caller(args.sender, args.channel).role,
            chat_type="group" if args.chat_id else "p2p", callback_url=args.callback_url, source="cli",
        )  # fmt: skip
        await store.add(job)
        print(f"job {job.id}: {job.when}, next {job.describe()['next_fire_local']}")
        return 0
    except ScheduleError as exc:
        print(f"hermes-kernel: {exc}", file=sys.stderr)
        return 2
    except (StoreUnavailable, ImportError) as exc:  # the database down, or no driver for it
        print(f"hermes-kernel: {exc}", file=sys.stderr)
        return 1
    finally:
        await store.close()


def print_tools(agent: Agent, settings: Settings | None = None) -> int:
    offered_tools(agent, settings)
    mcp = agent.mcp
    if mcp is not None:  # MCP servers' tools are known once connected
        from .config import ConfigError

        async def connect() -> None:
            try:
                await mcp.start(agent.registry)
            finally:
                await mcp.aclose()

        try:
            asyncio.run(connect())
        except ConfigError as exc:  # `levels` or `confirm` names a tool its server does not have
            print(f"hermes-kernel: {exc}", file=sys.stderr)
            return 2
    for declared in agent.registry:
        print(f"{declared.name}: {declared.description}")
        who = f"{declared.required_role} only" if declared.required_role else ""
        if declared.level >= 2:
            asked = "level 2: off unless permissions.allow_irreversible names it, then each call approved"
        else:
            asked = "each call approved by a person" if declared.confirm else ""
        if who or asked:  # serve offers it only to that role, and runs it only once approved
            print(f"  ({'; '.join(note for note in (who, asked) if note)})")
        print(json.dumps(declared.parameters, ensure_ascii=False, indent=2))
    return 0


def configure_logging(level: str | None, command: str, observe: ObserveConfig | None = None) -> None:
    """Log lines to stderr at `level` (else `observe.level`; INFO for `serve`), every secret redacted.
    With the configuration's `observe` section: its format, and daily JSON files (observe/logs.py)."""
    import logging

    from .observe.log_redaction import install_log_redaction

    level = level or getattr(observe, "level", None) or ("INFO" if command in ("serve", "worker") else None)
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


NEEDS_TEMPORAL = 'engine temporal needs its extra: pip install "hermes-kernel[temporal]"'


def run_worker(settings: Settings, agent: Agent) -> int:
    """`hermes-kernel worker`: only with `engine: temporal` (and its extra installed)."""
    if settings.engine != "temporal":
        print("hermes-kernel: `worker` runs turns for `engine: temporal`; this configuration's engine is "
              f"{settings.engine} (serve runs its turns itself)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        from .engine.temporal import worker
    except ImportError as exc:
        print(f"hermes-kernel: {NEEDS_TEMPORAL} ({exc})", file=sys.stderr)
        return 2
    return worker.run(settings, agent)


def run_server(settings: Settings, agent: Agent, args: argparse.Namespace) -> int:
    from .postgres.database import then_close_pools
    from .server import serve

    if settings.engine == "temporal":
        try:
            from .engine.temporal import server
        except ImportError as exc:
            print(f"hermes-kernel: {NEEDS_TEMPORAL} ({exc})", file=sys.stderr)
            return 2
        return server.run(settings, args)

    def banner(address: str, routes: str) -> None:
        print(f"hermes-kernel serving on {address} ({routes})", flush=True)

    from .config import ConfigError
    from .kernel.redaction import redact_text

    try:
        asyncio.run(
            then_close_pools(serve(settings, host=args.host, port=args.port, banner=banner, agent=agent))
        )
    except ConfigError as exc:  # e.g. the console on a public address without a token
        print(f"hermes-kernel: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    return 0


async def run_once(agent: Agent, message: str, *, as_json: bool = False, quiet: bool = False) -> int:
    """One message; Ctrl-C cancels it: one line on stderr, exit 130."""
    from .cli_display import Terminal, TurnCancelled, TurnDisplay, show_tool_calls
    from .kernel.redaction import redact_data
    from .models.routing import usage_by_model
    from .modes import run_task

    display = TurnDisplay.for_terminal(quiet=quiet, stream=not as_json and sys.stdout.isatty())
    show_tool_calls(agent, display)
    terminal = Terminal()
    on_text = display.on_text if display.streams else None  # asking for text makes the client stream
    try:
        await start_mcp(agent)
        display.start()
        result = await terminal.turn(run_task(agent, message, caller=terminal_caller(agent), on_text=on_text))
    except TurnCancelled:
        display.prompting()  # the status line cleared, a streamed line ended
        print("hermes-kernel: cancelled", file=sys.stderr)
        return 130
    finally:
        terminal.close()
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
        display.finish(result.reply)
    return 0 if result.ok else 1


async def start_mcp(agent: Agent) -> None:
    """The MCP servers started before the first turn, each given its `connect_timeout` (30 s by
    default), as `serve` does: a server that needs a few seconds to start is not missed by the one
    run of `run` (a run alone waits only `first_wait`, 2 s). ConfigError for a mistyped tool name."""
    if agent.mcp is not None:
        await agent.mcp.start(agent.registry)


async def chat(agent: Agent, *, quiet: bool = False) -> int:
    """The REPL. Ctrl-C cancels the turn that runs; at the prompt (or again at once) it leaves."""
    from .cli_display import Terminal, TurnCancelled, TurnDisplay, show_tool_calls
    from .gateway.runner import AgentRunner

    runner = AgentRunner(agent)  # the gateway's turn handling: memory, window, /memory and /forget
    caller = terminal_caller(agent)
    terminal = Terminal()
    display = TurnDisplay.for_terminal(quiet=quiet, stream=True)
    if agent.interactions is None:  # approvals as a y/n prompt, clarify questions asked in place
        agent.use_interactions(terminal_interactions(terminal, display))
    show_tool_calls(agent, display)
    print("hermes-kernel chat — type exit or quit (or Ctrl-D) to leave; Ctrl-C cancels a turn.")
    try:
        await start_mcp(agent)
        while True:
            line = await terminal.read_line("> ")
            if line is None:  # end of input, or Ctrl-C at the prompt
                print()
                break
            if line.strip().lower() in EXIT_WORDS:
                break
            if not line.strip():
                continue
            display.start()
            try:
                turn = runner.reply("cli", line, on_text=display.on_text, caller=caller)
                answer = await terminal.turn(turn)
            except TurnCancelled as cancelled:
                display.cancelled()
                if cancelled.leaving:
                    break
                continue
            display.finish(answer if isinstance(answer, str) else answer.text)
    finally:
        terminal.close()
        if agent.mode is not None:  # a team's queues and its members' clients
            await agent.mode.aclose()
        await agent.aclose()
    return 0


def terminal_caller(agent: Agent) -> Caller:
    """Who the terminal's tasks run for: the login name on the `terminal` channel, so that
    `permissions.admins: ["terminal:<login>"]` makes that person an admin here and nowhere else."""
    import getpass

    try:
        login = getpass.getuser()
    except (KeyError, OSError):  # no login name known (a container without a passwd entry)
        login = ""
    return agent.permissions.caller(login, "terminal")


def terminal_interactions(terminal: Terminal, display: TurnDisplay) -> InlineInteractions:
    """Approvals and questions for `chat`: asked on the terminal, answered before the task goes on.
    Their lines come from the session's `Terminal`, so Ctrl-C at such a prompt cancels the turn."""
    from .channels.inert import shown_arguments
    from .kernel.redaction import redact_text
    from .tasks.pending import InlineInteractions, Pending

    async def confirm(pending: Pending) -> bool:
        display.prompting()
        arguments = shown_arguments(redact_text(pending.arguments))
        prompt = f"Approve {pending.tool}({arguments})? 批准执行？ [y/N] "
        answer = await terminal.read_line(prompt)
        return (answer or "").strip().lower() in {"y", "yes", "是", "好", "批准"}

    async def ask(question: str) -> str:
        display.prompting()
        return await terminal.read_line(f"{redact_text(question)}\n? ") or ""

    return InlineInteractions(confirm, ask)


if __name__ == "__main__":
    sys.exit(main())
