"""Structured logs (O2): one line per event, as JSON for machines or as one readable line for people.

An *event* is one step of a task: `message_in`, `model_request`, `model_response`, `tool_call`,
`tool_result`, `reply_out`, `error`. `log_event(kind, **fields)` writes it through the standard
`logging` module (logger `hermes_core.events`), so levels, handlers and redaction work as for any
other record. The task's id, its conversation and the current turn come from a context variable
(`task_context`), so every record written inside it carries them — the registry's warnings and a
sync tool's own log lines (they run in a copy of the caller's context) included.

`setup_logging` installs the handlers: standard error in the `console` or `json` format, and,
with a `log_dir`, a JSON-lines file rotated at midnight keeping `retention_days` old files.
The field of each event type is documented by `docs/log-schema.json`, which the tests validate
every line against. Both formatters redact what they write (kernel/redaction.py), and a shortened value in
a readable message is redacted before it is cut, so no secret leaves its first characters behind.
"""

from __future__ import annotations

import contextvars
import json
import logging
import logging.handlers
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from ..kernel.redaction import cut_text, redact_data, redact_text
from .log_redaction import install_log_redaction

EVENTS = ("message_in", "model_request", "model_response", "tool_call", "tool_result", "reply_out", "error")
EVENT_LOGGER = "hermes_core.events"
LOG_FILE = "hermes-kernel.log"
SUMMARY_CHARS = 300  # how much of a reply, a result or a text goes into a line's readable message

log = logging.getLogger(EVENT_LOGGER)


# --- the task a record belongs to -------------------------------------------------------------------


@dataclass
class TaskFields:
    """What every record written during a task carries; `turn` is the current model call (1-based)."""

    task_id: str
    conversation: str | None = None
    turn: int = 0


_current: contextvars.ContextVar[TaskFields | None] = contextvars.ContextVar("hermes_task", default=None)


def bind_task(
    task_id: str, conversation: str | None = None, turn: int = 0
) -> contextvars.Token[TaskFields | None]:
    """Mark the records written from here on (in this context) as the task's; undo with `unbind_task`."""
    return _current.set(TaskFields(task_id, conversation, turn))


def unbind_task(token: contextvars.Token[TaskFields | None]) -> None:
    _current.reset(token)


@contextmanager
def task_context(task_id: str, conversation: str | None = None, turn: int = 0) -> Iterator[None]:
    """The records written inside the block belong to the task (and to its `turn`, if given)."""
    token = bind_task(task_id, conversation, turn)
    try:
        yield
    finally:
        unbind_task(token)


def current_task() -> TaskFields | None:
    return _current.get()


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Write one event of the current task. `fields` become top-level keys of the JSON line."""
    if not log.isEnabledFor(level):
        return
    log.log(level, "%s", describe(event, fields), extra={"event": event, "fields": fields})


# --- formatters ------------------------------------------------------------------------------------


class TaskContextFilter(logging.Filter):
    """Stamps each record with the task, conversation and turn of the context it is written in."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "task_id"):
            task = _current.get()
            record.task_id = task.task_id if task else None
            record.conversation = task.conversation if task else None
            record.turn = task.turn if task and task.turn else None
        return True


class JSONFormatter(logging.Formatter):
    """One JSON object per line: the keys of docs/log-schema.json, secrets redacted."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "event": getattr(record, "event", "log"),
            "message": record.getMessage(),
            "task_id": getattr(record, "task_id", None),
            "conversation": getattr(record, "conversation", None),
            "turn": getattr(record, "turn", None),
        }
        for key, value in getattr(record, "fields", {}).items():
            payload.setdefault(key, value)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            payload["exception"] = record.exc_text
        return json.dumps(redact_data(payload), ensure_ascii=False, default=str)


class ConsoleFormatter(logging.Formatter):
    """One readable line per record:
    `2025-01-01 12:00:00.123 INFO    [task webhook:m1 turn 2] tool result: calculator ok in 0.001s: 92`."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        task = getattr(record, "task_id", None)
        turn = getattr(record, "turn", None)
        where = f"[task {task}{f' turn {turn}' if turn else ''}] " if task else ""
        source = "" if hasattr(record, "event") else f"{record.name}: "
        line = f"{when}.{int(record.msecs):03d} {record.levelname:<7} {where}{source}{record.getMessage()}"
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += " | " + record.exc_text.replace("\n", " | ")
        return redact_text(line.replace("\n", "\\n"))


def describe(event: str, fields: dict[str, Any]) -> str:
    """The readable message of an event: what a person scanning the console needs."""
    if event == "message_in":
        return f"message in: {_clip(fields.get('input'))}"
    if event == "model_request":
        return f"model request: {fields.get('messages_count')} messages, tools {fields.get('tools') or []}"
    if event == "model_response":
        calls = ", ".join(
            f"{c['name']}({_clip(c['arguments'], 120)})" for c in fields.get("tool_calls") or []
        )
        usage = fields.get("usage") or {}
        said = f"tool_calls {calls}" if calls else f"text {_clip(fields.get('content'))}"
        tokens = f"{usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)} tokens"
        return f"model response in {fields.get('elapsed', 0):.2f}s ({tokens}): {said}"
    if event == "tool_call":
        return f"tool call: {fields.get('tool')} {_clip(fields.get('arguments'), 200)}"
    if event == "tool_result":
        status = "ok" if fields.get("ok") else f"failed ({fields.get('error')})"
        took = f"{fields.get('elapsed', 0):.3f}s"
        return f"tool result: {fields.get('tool')} {status} in {took}: {_clip(fields.get('result'))}"
    if event == "reply_out":
        tokens = (fields.get("usage") or {}).get("total_tokens", 0)
        took = f"{fields.get('elapsed', 0):.2f}s"
        summary = (
            f"{fields.get('stop_reason')}, {fields.get('model_calls')} model calls, {tokens} tokens, {took}"
        )
        return f"reply out ({summary}): {_clip(fields.get('reply'))}"
    if event == "error":
        return f"error: {fields.get('error')}"
    return f"{event}: {_clip(json.dumps(fields, ensure_ascii=False, default=str))}"


def _clip(value: Any, limit: int = SUMMARY_CHARS) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    shown, total = cut_text(text, limit)
    return shown if total <= limit else f"{shown}… [{total} chars]"


# --- daily files -----------------------------------------------------------------------------------


class DailyFileHandler(logging.handlers.TimedRotatingFileHandler):
    """A JSON-lines file rotated at local midnight (`hermes-kernel.log.2025-01-01`), keeping `keep` old
    files. `clock` replaces `time.time` for the rotation decisions, so a test can move time forward."""

    def __init__(self, path: str | Path, *, keep: int = 7, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        super().__init__(path, when="midnight", backupCount=keep, encoding="utf-8", delay=True)
        started = os.stat(self.baseFilename).st_mtime if os.path.exists(self.baseFilename) else clock()
        self.rolloverAt = self.computeRollover(int(started))

    def shouldRollover(self, record: logging.LogRecord) -> bool:  # noqa: N802 (logging's name)
        return self.clock() >= self.rolloverAt

    def doRollover(self) -> None:  # noqa: N802
        """Close today's file, rename it after the day it covers, drop the oldest beyond `keep`."""
        if self.stream:
            self.stream.close()
            self.stream = None
        day = time.strftime(self.suffix, time.localtime(self.rolloverAt - self.interval))
        target = self.rotation_filename(f"{self.baseFilename}.{day}")
        if os.path.exists(self.baseFilename):
            if os.path.exists(target):
                os.remove(target)
            self.rotate(self.baseFilename, target)
        for old in self.getFilesToDelete():
            os.remove(old)
        now = int(self.clock())
        self.rolloverAt = self.computeRollover(now)
        while self.rolloverAt <= now:
            self.rolloverAt += self.interval


# --- set-up ----------------------------------------------------------------------------------------


def setup_logging(
    level: str = "INFO",
    *,
    log_format: str = "console",
    log_dir: str | Path | None = None,
    retention_days: int = 7,
    stream: TextIO | None = None,
    clock: Callable[[], float] = time.time,
) -> list[logging.Handler]:
    """Log at `level` to standard error (`console` or `json`) and, with `log_dir`, to a daily JSON file.

    Replaces the handlers an earlier call installed (not anyone else's); installs log redaction.
    Returns the handlers it added.
    """
    if log_format not in ("console", "json"):
        raise ValueError(f"log format must be console or json, got {log_format!r}")
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "hermes_observe", False)]:
        root.removeHandler(handler)
        handler.close()
    console = logging.StreamHandler(stream or sys.stderr)
    console.setFormatter(JSONFormatter() if log_format == "json" else ConsoleFormatter())
    handlers: list[logging.Handler] = [console]
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        daily = DailyFileHandler(Path(log_dir) / LOG_FILE, keep=retention_days, clock=clock)
        daily.setFormatter(JSONFormatter())
        handlers.append(daily)
    for handler in handlers:
        handler.addFilter(TaskContextFilter())
        handler.hermes_observe = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level.upper())
    install_log_redaction()
    return handlers


__all__ = [
    "EVENTS",
    "ConsoleFormatter",
    "DailyFileHandler",
    "JSONFormatter",
    "TaskContextFilter",
    "bind_task",
    "current_task",
    "log_event",
    "setup_logging",
    "task_context",
    "unbind_task",
]
