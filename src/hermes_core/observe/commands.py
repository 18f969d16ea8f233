"""`hermes-kernel traces`, `hermes-kernel trace show ID`, `hermes-kernel replay TRACE`.

TRACE is a task id in the configured database (`<gateway.data_dir>/gateway.db`, or PostgreSQL with
`database.url`) — or any beginning
of one that no other id shares, as `traces` prints them whole to be pasted — or the path of a
JSON file: an X-ray, or a record exported with `trace show ID --json`. Everything printed is
redacted (the records are redacted when stored; printing redacts again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..kernel.loop import PAUSES
from ..kernel.messages import JSON
from ..kernel.redaction import redact_data, redact_text
from .traces import TraceStore, TraceSummary, clip

if TYPE_CHECKING:
    from ..agent import Agent
    from ..config import Settings
    from .replay import ReplayReport

AMBIGUOUS_SHOWN = 5  # candidates named when a pasted prefix starts more than one task id


class TraceNotFound(LookupError):
    """No file and no recorded task by that name (or a prefix of several); the message says which."""


def observe_command(settings: Settings, agent: Agent, args: argparse.Namespace) -> int:
    """Run the `traces`, `trace show` or `replay` command; the process's exit code."""
    try:
        if args.command == "traces":
            return asyncio.run(list_command(settings, args))
        if args.command == "trace":
            return asyncio.run(show_command(settings, args))
        return asyncio.run(replay_command(settings, agent, args))
    except (TraceNotFound, ValueError) as exc:
        print(f"hermes-kernel: {redact_text(str(exc))}", file=sys.stderr)
        return 2


def database_of(settings: Any) -> Path | str:
    """The SQLite file, or the PostgreSQL URL as it may be shown (no password)."""
    from ..stores import database_url, sqlite_path

    url = database_url(settings)
    return redact_text(url) if url else sqlite_path(settings)


def _absent(database: Path | str) -> bool:
    return isinstance(database, Path) and not database.is_file()


def open_traces(settings: Any) -> TraceStore:
    from ..stores import trace_store

    return trace_store(settings)


async def load_trace(reference: str, settings: Settings) -> dict[str, JSON]:
    """The record named by `reference`: a JSON file, or a task id in the configured database."""
    path = Path(reference)
    if path.is_file():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError(f"{path} is not JSON: {exc}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}: a trace is a JSON object (task_id, input, history, model_calls…)")
        return record
    database = database_of(settings)
    if _absent(database):
        raise TraceNotFound(f"no trace {reference!r}: no such file, and no database at {database}")
    store = open_traces(settings)
    try:
        found = await store.get(reference)
        if found is None and reference:  # a pasted beginning of an id names the one task it starts
            found = await store.get(await unique_id(store, reference, database))
    finally:
        await store.close()
    if found is None:
        raise TraceNotFound(f"no trace {reference!r}: no such file, and no such task in {database}")
    return found


async def unique_id(store: Any, prefix: str, database: Path | str) -> str:
    """The one task id that starts with `prefix`; TraceNotFound naming the candidates if not one."""
    candidates = await store.ids_starting(prefix, limit=AMBIGUOUS_SHOWN + 1)
    if not candidates:
        raise TraceNotFound(f"no trace {prefix!r}: no such file, and no such task in {database}")
    if len(candidates) > 1:
        more = ", …" if len(candidates) > AMBIGUOUS_SHOWN else ""
        raise TraceNotFound(
            f"{prefix!r} is the start of more than one task id: "
            f"{', '.join(candidates[:AMBIGUOUS_SHOWN])}{more} (paste more of it)"
        )
    return candidates[0]


# --- hermes-kernel traces ----------------------------------------------------------------------------


async def list_command(settings: Settings, args: argparse.Namespace) -> int:
    database = database_of(settings)
    if _absent(database):
        print(f"no traces yet: no database at {database}")
        return 0
    since, until = parse_when(args.since), parse_when(args.until)
    if args.date:
        since = parse_when(args.date)
        until = since + 86400 if since is not None else None
    store = open_traces(settings)
    try:
        found = await store.list(
            failed=True if args.failed else None,
            conversation=args.conversation,
            tool=args.tool,
            since=since,
            until=until,
            limit=args.limit,
        )
    finally:
        await store.close()
    if args.json:
        print(json.dumps(redact_data(found), ensure_ascii=False, indent=2))
    else:
        print(redact_text(summary_table(found)))
    return 0


def parse_when(text: str | None) -> float | None:
    """A local date (`2025-01-31`) or date and time (`2025-01-31T08:00`) as a timestamp."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(f"not a date: {text!r} (use YYYY-MM-DD or YYYY-MM-DDTHH:MM)") from None


def summary_table(summaries: list[TraceSummary]) -> str:
    """One row per task; its id and conversation whole, never clipped: they are pasted into
    `trace show ID` and `traces --conversation`."""
    if not summaries:
        return "no traces match"
    rows = [("started", "task", "conversation", "stop reason", "model", "tokens", "tools", "input")]
    for s in summaries:
        rows.append((
            _when(s["started_at"]), str(s["task_id"]), str(s["conversation"] or "-"),
            str(s["stop_reason"]), str(s["model_calls"]), str(s["tokens"]),
            clip(",".join(s["tool_names"]) or "-", 24), clip(_one_line(s["input"]), 40),
        ))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    )


# --- hermes-kernel trace show ------------------------------------------------------------------------


async def show_command(settings: Settings, args: argparse.Namespace) -> int:
    record = await load_trace(args.trace, settings)
    if args.json:
        print(json.dumps(redact_data(record), ensure_ascii=False, indent=2))
    else:
        print(redact_text(timeline(record)))
    return 0


def timeline(record: dict[str, JSON]) -> str:
    """A recorded task as a readable timeline: header, then one line per step, in time order."""
    started = float(record.get("started_at") or 0.0)
    usage = record.get("usage") or {}
    timings = record.get("timings") or {}
    caller = record.get("caller") or {}
    status = "ok" if record.get("ok") else "FAILED" if record.get("stop_reason") not in PAUSES else "paused"
    lines = [
        f"task {record.get('task_id')}  conversation {record.get('conversation') or '-'}  "
        f"channel {record.get('channel') or '-'}  "
        f"caller {caller.get('user_id') or '-'} ({caller.get('role', '-')})",
        f"started {_when(started)}  stop reason {record.get('stop_reason')}  {status}"
        + (f"  error: {record['error']}" if record.get("error") else ""),
        f"tokens {usage.get('prompt_tokens', 0)} prompt{_cached(usage)} + "
        f"{usage.get('completion_tokens', 0)} completion = {usage.get('total_tokens', 0)}; "
        f"time: model {timings.get('model', 0):.2f}s, tools "
        f"{timings.get('tools', 0):.2f}s, total {timings.get('total', 0):.2f}s",
        "",
    ]
    steps: list[tuple[float, int, str]] = [(started, 0, f"message in   {_quote(record.get('input'))}")]
    for call in record.get("model_calls") or []:
        steps.append((call.get("started_at") or started, 1, _model_line(call)))
    for call in record.get("tool_calls") or []:
        steps.append((call.get("started_at") or started, 2, _tool_line(call)))
    for pending in record.get("approvals") or []:
        steps.append((pending.get("created_at") or started, 3, _approval_line(pending)))
    finished = record.get("finished_at") or started
    steps.append((finished, 4, f"reply out    {_quote(record.get('reply'))}"))
    for at, _, text in sorted(steps, key=lambda step: (step[0], step[1])):
        lines.append(f"  +{max(0.0, at - started):7.3f}s  {text}")
    return "\n".join(lines)


def _cached(usage: dict[str, JSON]) -> str:
    """The prompt tokens a provider's cache served (", 900 cached"), when it said so."""
    return f", {usage['cached_tokens']} cached" if usage.get("cached_tokens") else ""


def _model_line(call: dict[str, JSON]) -> str:
    head = f"model #{call.get('turn')}     {call.get('elapsed', 0):.2f}s  "
    response = call.get("response")
    if response is None:
        return head + f"ERROR {call.get('error')}"
    usage = response.get("usage") or {}
    tokens = f"  [{usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)} tokens{_cached(usage)}]"
    calls = response.get("tool_calls") or []
    if calls:
        said = "calls " + ", ".join(f"{c['name']}({clip(str(c['arguments']), 160)})" for c in calls)
    else:
        said = f"says {_quote(response.get('content') or response.get('refusal'))}"
    return head + said + tokens


def _tool_line(call: dict[str, JSON]) -> str:
    status = "ok" if call.get("ok") else f"FAILED ({call.get('error')})"
    arguments = clip(_one_line(str(call.get("arguments"))), 120)
    return (
        f"tool #{call.get('turn')}      {call.get('elapsed', 0):.2f}s  {call.get('name')}({arguments}) "
        f"{status} → {clip(_one_line(str(call.get('result'))), 200)}"
    )


def _approval_line(pending: dict[str, JSON]) -> str:
    decided = f" by {pending['decided_by']}" if pending.get("decided_by") else ""
    what = f"question {_quote(pending.get('arguments'))}" if pending.get("kind") == "question" else (
        f"approval {pending.get('id')} for {pending.get('tool')}({clip(str(pending.get('arguments')), 120)})"
    )  # fmt: skip
    return f"{pending.get('kind', 'approval'):<12} {what}: {pending.get('status')}{decided}"


def _quote(value: JSON, limit: int = 200) -> str:
    return json.dumps(clip(_one_line(str(value or "")), limit), ensure_ascii=False)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


# --- hermes-kernel replay ----------------------------------------------------------------------------


async def replay_command(settings: Settings, agent: Agent, args: argparse.Namespace) -> int:
    """0: the run reproduces the recording; 1: it diverges (the report says where)."""
    from ..sessions import ConversationMemory, InMemorySessionStore
    from .replay import replay

    record = await load_trace(args.trace, settings)
    if agent.registry.get("remember") is None:  # the gateway's memory tool, as recorded runs had it
        ConversationMemory(InMemorySessionStore()).attach(agent)
    try:
        report = await replay(record, agent, live=args.live, run_writes=args.run_writes)
    finally:
        await agent.aclose()
    if args.json:
        print(json.dumps(redact_data(report.to_dict()), ensure_ascii=False, indent=2))
    else:
        print(redact_text(replay_text(report)))
    return 0 if report.reproduced else 1


def replay_text(report: ReplayReport) -> str:
    source = "the configured model" if report.live else "the recorded model outputs"
    lines = [f"replay of task {report.task_id}: {source}, the current code and tools", ""]
    for call in report.calls:
        ran = "ran" if call.ran else call.note or "not run"
        status = "ok" if call.ok else f"failed ({call.error})"
        lines.append(
            f"  turn {call.turn} call {call.index}  {call.name}({clip(_one_line(call.arguments), 100)}) "
            f"{status} → {clip(_one_line(call.result), 120)}  [{ran}]"
        )
    lines.append(f"  reply {_quote(report.result.reply)}  ({report.result.stop_reason})")
    lines.append("")
    if report.reproduced:
        lines.append("reproduced: the same tool calls, arguments, results and reply as recorded")
        return "\n".join(lines)
    lines.append(f"DIVERGED in {len(report.divergences)} place(s):")
    for divergence in report.divergences:
        lines.append(f"  - [{divergence.kind}] {clip(_one_line(divergence.message), 300)}")
        if divergence.kind in ("arguments", "result", "reply"):
            lines.append(f"      recorded: {clip(_one_line(str(divergence.recorded)), 300)}")
            lines.append(f"      now:      {clip(_one_line(str(divergence.replayed)), 300)}")
    return "\n".join(lines)
