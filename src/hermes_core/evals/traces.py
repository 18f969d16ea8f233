"""From a recorded failure to a regression case: `hermes-kernel eval add TRACE`.

TRACE is the JSON dump of one recorded task::

    {"task_id": "…", "conversation": "the conversation's id",
     "input": "the user message", "history": [earlier messages; optional],
     "messages": [every message of the run], "reply": "…", "stop_reason": "max_turns",
     "tool_calls": [{"name", "arguments", "result", "ok", "error", "elapsed"}] (kernel/records.py),
     "usage": {…}, "timings": {…}}

The case keeps the conversation: `history` (system messages dropped), then `input`. Without
`input`, the task is the last user message of `messages` and the history what came before it;
without `history`, what came before `input` in `messages`. It proposes checks: each tool that
succeeded must be called (and succeed) again, the run must complete, and a run that did not
complete must not end with the same reply. The recorded calls and reply are written as comments
above the case, for the person who edits the checks into what "fixed" means.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from ..channels.seam import unique_of
from ..kernel.messages import JSON, Message
from ..kernel.records import outcome_from
from ..kernel.tools.registry import ToolOutcome
from .cases import WIRE_KEYS, CaseError, clip, parse_case

FILE_TOOLS = ("read_file", "write_file", "list_directory")


def add_trace(
    trace_path: str | Path,
    cases_dir: str | Path,
    *,
    name: str | None = None,
    force: bool = False,
    record: Mapping[str, JSON] | None = None,
) -> Path:
    """Write the case proposed for a trace into `cases_dir`; returns the new file.

    The trace is the JSON file `trace_path`, or `record` (a trace store's record, `trace_path`
    then being its task id)."""
    import yaml

    from ..kernel.redaction import redact_text

    source = Path(trace_path)
    try:
        trace = dict(record) if record is not None else json.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CaseError(f"cannot read trace {source}: {exc.strerror}") from None
    except ValueError as exc:
        raise CaseError(f"{source} is not JSON: {exc}") from None
    if not isinstance(trace, dict):
        raise CaseError(f"{source}: a trace is a JSON object (task_id, input, history, tool_calls, reply…)")
    name = name or _case_name(trace, source)
    target = Path(cases_dir) / f"{name}.yaml"
    if target.exists() and not force:
        raise CaseError(f"{target} exists: pass --name to choose another name, or --force to replace it")
    try:
        data, notes = case_from_trace(trace, name)
    except CaseError as exc:
        raise CaseError(f"{source}: {exc}") from None
    parse_case(data, str(source))  # what is written must load
    header = [
        f"Proposed by `hermes-kernel eval add` from {source.name}: edit the checks, they are a first guess.",
        *notes,
    ]
    body = yaml.safe_dump(data, allow_unicode=True, sort_keys=False, width=100)
    text = "".join(f"# {line}\n" for line in header) + body
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(redact_text(text), encoding="utf-8")
    return target


def case_from_trace(trace: Mapping[str, JSON], name: str) -> tuple[dict[str, JSON], list[str]]:
    """The case data proposed for a trace, and comment lines describing the recorded run."""
    history, task = _trace_conversation(trace)
    calls = [outcome_from(call) for call in trace.get("tool_calls") or [] if isinstance(call, Mapping)]
    succeeded = list(dict.fromkeys(outcome.call.name for outcome in calls if outcome.ok))
    stop_reason = str(trace.get("stop_reason") or "")
    reply = str(trace.get("reply") or "")
    checks: dict[str, JSON] = {}
    if succeeded:
        checks["must_call"] = succeeded
    if stop_reason and stop_reason != "completed" and reply:
        checks["reply_not_contains"] = [reply]
    checks["stop_reason"] = "completed"
    data: dict[str, JSON] = {
        "name": name,
        "description": f"recorded failure ({stop_reason or 'no stop reason'}); edit the checks",
    }
    if trace.get("task_id"):
        data["source"] = f"task {trace['task_id']}"
    data["conversation"] = [*(_shorthand(message) for message in history), {"user": task}]
    data["checks"] = checks
    return data, _notes(calls, stop_reason, reply)


def _notes(calls: list[ToolOutcome], stop_reason: str, reply: str) -> list[str]:
    """What the recorded run did, as comment lines for the case file."""
    notes = [f"Recorded run: stop_reason={stop_reason or '?'}, {len(calls)} tool call(s)"]
    for outcome in calls:
        arguments: JSON = outcome.call.arguments  # a hand-written trace may hold them decoded
        shown = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        status = "ok" if outcome.ok else f"failed ({outcome.error or 'error'})"
        notes.append(f"  {outcome.call.name} {clip(shown or '{}')} -> {status}: {clip(outcome.content)}")
    notes.append(f"Recorded reply: {clip(reply)}")
    if any(outcome.call.name in FILE_TOOLS for outcome in calls):
        notes.append("The run used the workspace: add the files it needs under `files:` (path: content).")
    return notes


def _trace_conversation(trace: Mapping[str, JSON]) -> tuple[list[Message], str]:
    """(earlier messages, the task) of a trace: `history` + `input`, or derived from `messages`."""
    messages = [m for m in trace.get("messages") or [] if isinstance(m, Mapping)]
    task = trace.get("input")
    history = trace.get("history")
    if not isinstance(task, str) or not task:
        users = [
            i for i, m in enumerate(messages) if m.get("role") == "user" and isinstance(m.get("content"), str)
        ]
        if not users:
            raise CaseError("the trace has no input and no user message in messages")
        task, history = str(messages[users[-1]]["content"]), messages[: users[-1]]
    elif not isinstance(history, list):
        starts = [i for i, m in enumerate(messages) if m.get("role") == "user" and m.get("content") == task]
        history = messages[: starts[-1]] if starts else []
    kept = [dict(m) for m in history if isinstance(m, Mapping) and m.get("role") != "system"]
    return kept, task


def _shorthand(message: Mapping[str, JSON]) -> dict[str, JSON]:
    """`{user: text}` / `{assistant: text}` where the message is only that, else the wire message."""
    wire = {key: message[key] for key in WIRE_KEYS if key in message}
    plain = set(wire) == {"role", "content"} and isinstance(wire["content"], str)
    return {wire["role"]: wire["content"]} if plain and wire["role"] in ("user", "assistant") else wire


def _case_name(trace: Mapping[str, JSON], source: Path) -> str:
    task_id = str(trace.get("task_id") or "")
    unique = unique_of(task_id)  # what tells apart the tasks of one channel (channels/seam.py)
    unique = task_id[:12] if unique is None else unique
    raw = f"trace-{unique}" if unique else source.stem
    return re.sub(r"[^\w.-]+", "-", raw).strip("-") or "trace"
