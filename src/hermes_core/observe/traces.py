"""Traces: each task's complete record — stored in SQLite, and dumped as an X-ray file when it fails.

A `Tracer` on the agent (`Agent(tracer=Tracer(store))`; `hermes-kernel serve` sets one) observes every
run: its `TaskTrace` is the run's hooks (kernel/hooks.py), which the loop calls before and after each model
call and each tool call. It times them, writes the log events of observe/logs.py
(`model_request`, `model_response`, `tool_call`, `tool_result`, `error`, each carrying the task,
conversation and turn), the latency metrics and, with `otel` configured, one OpenTelemetry span
each (observe/otel.py). `Agent.run` starts the trace (`message_in`) and finishes it (`reply_out`);
the finished record goes to the `TraceStore`, and a failed task (not completed, and not paused for
a person) is also written to `<xray_dir>/<task>.json` — the seed's "X-ray": everything the model saw
and did, replayable with `hermes-kernel replay FILE`. Responses and tool outcomes are recorded in the
one record format of kernel/records.py, the journal's.

The record (the X-ray file has the same shape)::

    {"task_id", "conversation", "channel", "caller", "model", "input", "history" (messages before
     the input, as sent), "messages" (all messages of the run), "model_calls": [{"turn",
     "started_at", "elapsed", "request_messages_count", "tools", "response": {"content",
     "tool_calls": [{"id", "name", "arguments"}], "usage", "model", "answered_by", "finish_reason",
     "refusal", "reasoning"}, "error"}], "tool_calls": [{"turn", "id", "name", "arguments", "result", "ok",
     "error", "elapsed", "parsed", "started_at"}], "approvals": [pending summaries], "reply", "stop_reason",
     "ok", "usage", "timings", "started_at", "finished_at", "error"}

Everything recorded is redacted first (kernel/redaction.py). A tracer never fails a task: a store that
cannot write is logged, and the task goes on.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import os
import re
import sqlite3
import time
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TypedDict

from ..kernel.approvals import PendingStore
from ..kernel.hooks import TaskHooks
from ..kernel.loop import PAUSES, RunResult
from ..kernel.messages import Message, ModelResponse, ToolCall, without_images
from ..kernel.model import ModelClient, ModelError
from ..kernel.records import outcome_record, record_of
from ..kernel.redaction import cut_text, redact_data
from ..kernel.tools import ToolRegistry
from ..kernel.tools.permissions import Caller
from ..kernel.tools.registry import ToolOutcome
from ..storage import SQLiteDatabase
from ..tasks.fence import ClaimLost
from .logs import bind_task, log_event, task_context, unbind_task
from .metrics import MODEL_SECONDS, OTHER_TOOL, TOOL_SECONDS, count_tokens

log = logging.getLogger("hermes_core.traces")

REPLY_SUMMARY_CHARS = 200

MIGRATIONS = {
    1: """
    CREATE TABLE traces (
        task_id TEXT PRIMARY KEY,
        conversation TEXT,
        input TEXT NOT NULL,
        started_at REAL NOT NULL,
        finished_at REAL,
        stop_reason TEXT NOT NULL,
        ok INTEGER NOT NULL,
        failed INTEGER NOT NULL,          -- not ok, and not paused for a person
        reply TEXT NOT NULL,
        model_calls INTEGER NOT NULL,
        tool_names TEXT NOT NULL,         -- JSON list, in call order, each name once
        tokens INTEGER NOT NULL,
        data TEXT NOT NULL                -- the whole record, JSON
    );
    CREATE INDEX traces_by_start ON traces (started_at);
    CREATE INDEX traces_by_conversation ON traces (conversation, started_at);
    CREATE TABLE trace_tools (
        tool TEXT NOT NULL,
        task_id TEXT NOT NULL,
        PRIMARY KEY (tool, task_id)
    )
    """,
}


# --- the store -------------------------------------------------------------------------------------


class TraceSummary(TypedDict):
    """One task as `TraceStore.list` shows it."""

    task_id: str
    conversation: str | None
    input: str
    started_at: float
    finished_at: float | None
    stop_reason: str
    ok: bool
    reply: str  # cut to REPLY_SUMMARY_CHARS, with "…"
    model_calls: int
    tool_names: builtins.list[str]  # in call order, each name once
    tokens: int  # the record's usage.total_tokens


class TraceStore(Protocol):
    """Where finished tasks' records go (a record is a JSON object of the shape above). A record
    stored again under the same task id replaces it (a task paused for a person is recorded, then
    recorded again when it finishes). What is stored is redacted."""

    async def record(self, trace: dict[str, Any]) -> None:
        """Store (or replace) the record of `trace["task_id"]`."""
        ...

    async def get(self, task_id: str) -> dict[str, Any] | None:
        """The full record, or None."""
        ...

    async def list(
        self,
        *,
        failed: bool | None = None,
        conversation: str | None = None,
        tool: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
    ) -> builtins.list[TraceSummary]:
        """Summaries, the most recently started first; `failed` as `is_failure` says, `tool` for
        the tasks that called it, `since` ≤ started_at < `until`."""
        ...

    async def ids_starting(self, prefix: str, limit: int = 10) -> builtins.list[str]:
        """The task ids that begin with `prefix` (a pasted part of one, taken literally), at most
        `limit`, sorted."""
        ...

    async def prune(self, older_than: float) -> None:
        """Forget the tasks started before `older_than` (a timestamp)."""
        ...

    async def close(self) -> None:
        """Release the store (another instance may open the same storage again)."""
        ...


class SQLiteTraceStore(TraceStore):
    """Traces in a SQLite file (`serve` uses the gateway's database)."""

    def __init__(self, path: str | Path) -> None:
        self.db = SQLiteDatabase.shared(path)
        self.db.migrate("traces", MIGRATIONS)

    async def record(self, trace: dict[str, Any]) -> None:
        trace = redact_data(trace)  # the tracer's records are redacted already; anyone else's too
        names = list(dict.fromkeys(str(call["name"]) for call in trace.get("tool_calls") or []))
        row = (
            trace["task_id"],
            trace.get("conversation"),
            trace.get("input") or "",
            trace["started_at"],
            trace.get("finished_at"),
            trace.get("stop_reason") or "",
            int(bool(trace.get("ok"))),
            int(is_failure(trace)),
            trace.get("reply") or "",
            len(trace.get("model_calls") or []),
            json.dumps(names, ensure_ascii=False),
            int((trace.get("usage") or {}).get("total_tokens", 0)),
            json.dumps(trace, ensure_ascii=False),
        )

        def write(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM trace_tools WHERE task_id = ?", (trace["task_id"],))
            db.execute(f"INSERT OR REPLACE INTO traces VALUES ({', '.join('?' * len(row))})", row)
            db.executemany(
                "INSERT INTO trace_tools (tool, task_id) VALUES (?, ?)",
                [(n, trace["task_id"]) for n in names],
            )

        await self.db.transaction(write)

    async def get(self, task_id: str) -> dict[str, Any] | None:
        row = await self.db.transaction(
            lambda db: db.execute("SELECT data FROM traces WHERE task_id = ?", (task_id,)).fetchone()
        )
        return json.loads(row[0]) if row else None

    async def ids_starting(self, prefix: str, limit: int = 10) -> builtins.list[str]:
        query = "SELECT task_id FROM traces WHERE substr(task_id, 1, ?) = ? ORDER BY task_id LIMIT ?"
        arguments = (len(prefix), prefix, limit)
        rows = await self.db.transaction(lambda db: db.execute(query, arguments).fetchall())
        return [row[0] for row in rows]

    async def list(
        self,
        *,
        failed: bool | None = None,
        conversation: str | None = None,
        tool: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
    ) -> builtins.list[TraceSummary]:
        where, args = ["1 = 1"], []
        for clause, value in (
            ("failed = ?", None if failed is None else int(failed)),
            ("conversation = ?", conversation),
            ("task_id IN (SELECT task_id FROM trace_tools WHERE tool = ?)", tool),
            ("started_at >= ?", since),
            ("started_at < ?", until),
        ):
            if value is not None:
                where.append(clause)
                args.append(value)
        query = (
            "SELECT task_id, conversation, input, started_at, finished_at, stop_reason, ok, reply, "
            f"model_calls, tool_names, tokens FROM traces WHERE {' AND '.join(where)} "
            "ORDER BY started_at DESC LIMIT ?"
        )
        rows = await self.db.transaction(lambda db: db.execute(query, (*args, limit)).fetchall())
        return [_summary(*row) for row in rows]

    async def prune(self, older_than: float) -> None:
        def delete(db: sqlite3.Connection) -> None:
            db.execute(
                "DELETE FROM trace_tools WHERE task_id IN (SELECT task_id FROM traces WHERE started_at < ?)",
                (older_than,),
            )
            db.execute("DELETE FROM traces WHERE started_at < ?", (older_than,))

        await self.db.transaction(delete)

    async def close(self) -> None:
        await self.db.close()


def _summary(task_id: str, conversation: str | None, input: str, started_at: float, finished_at: float | None,
             stop_reason: str, ok: int, reply: str, model_calls: int, tool_names: str,
             tokens: int) -> TraceSummary:  # fmt: skip
    """A row of the `traces` table as a summary."""
    return TraceSummary(task_id=task_id, conversation=conversation, input=input, started_at=started_at,
                        finished_at=finished_at, stop_reason=stop_reason, ok=bool(ok),
                        reply=clip(reply, REPLY_SUMMARY_CHARS), model_calls=model_calls,
                        tool_names=json.loads(tool_names), tokens=tokens)  # fmt: skip


def is_failure(trace: dict[str, Any]) -> bool:
    """Not completed, and not merely waiting for a person's approval or answer."""
    return not trace.get("ok") and trace.get("stop_reason") not in PAUSES


def clip(text: str, limit: int) -> str:
    """`text` redacted, and cut to `limit` characters with `…` (nothing of a secret left at the cut)."""
    shown, total = cut_text(text, limit)
    return shown if total <= limit else cut_text(shown, limit - 1)[0] + "…"


# --- the tracer ------------------------------------------------------------------------------------


class Tracer:
    """Observes the agent's tasks: log events, a record per task in `store`, X-rays of failures.

    Without a store it only writes the log events. `spans` (observe/otel.py) adds OpenTelemetry
    spans: one per task, with one child per model call and per tool call.
    """

    def __init__(
        self, store: TraceStore | None = None, *, xray_dir: str | Path | None = None, spans: Any = None
    ) -> None:
        self.store = store
        self.xray_dir = Path(xray_dir) if xray_dir else None
        self.spans = spans

    def start(
        self,
        task_id: str,
        message: str,
        messages: list[Message],
        *,
        conversation: str | None = None,
        caller: Caller | None = None,
    ) -> TaskTrace:
        """Begin observing one run over `messages` (the list the loop extends; the input is last)."""
        return TaskTrace(self, task_id, message, messages, conversation, caller)

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()


class TaskTrace(TaskHooks):
    """One run being observed: the hooks the loop calls (kernel/hooks.py). The run ends with `finish`
    (or, when a call raises something other than a model error, `crashed`), whichever comes first."""

    def __init__(
        self,
        tracer: Tracer,
        task_id: str,
        message: str,
        messages: list[Message],
        conversation: str | None,
        caller: Caller | None,
    ) -> None:
        self.tracer, self.task_id, self.input = tracer, task_id, message
        self.conversation, self.caller = conversation, caller
        self.messages = messages
        self.history = _json_copy(messages[:-1])
        self.started_at = time.time()
        self.turn = 0  # the current model call, from 1
        self.model_calls: list[dict[str, Any]] = []
        self.started_calls: dict[str, dict[str, Any]] = {}  # call id → {"turn", "started_at"}
        self.outcomes: list[ToolOutcome] = []  # as they finished: what a crashed run's record shows
        self.registry: ToolRegistry | None = None
        self.model_name = ""
        self.done = False
        self._model_call: tuple[Any, ...] = ()  # the model call under way: turn, times, span…
        self._tool_calls_open: dict[int, tuple[Any, ...]] = {}  # id(call) → turn, start, span, log context
        self.span = self.start_span(
            "hermes.task", {"hermes.task_id": task_id, "hermes.conversation": conversation}
        )
        with self.bound():
            channel = caller.channel if caller else None
            log_event("message_in", input=message, channel=channel, history_messages=len(self.history))

    def bound(self) -> AbstractContextManager[None]:
        """Inside this block, log records carry the task id, the conversation and the current turn."""
        return task_context(self.task_id, self.conversation, self.turn)

    def attach(self, model: ModelClient, registry: ToolRegistry) -> TaskTrace:
        """Say which model and tools the run uses (its record names the model, asks the registry
        about approvals); the loop then calls the four hooks below."""
        self.registry, self.model_name = registry, model.name
        return self

    # -- the hooks: what the loop reports -------------------------------------------------------

    async def on_model_start(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> None:
        """A model call begins: its turn, span and log context open; `model_request` logged."""
        self.turn += 1
        names = [str(schema.get("function", {}).get("name")) for schema in tools or []]
        span = self.start_span(
            "model.complete", {"hermes.turn": self.turn, "gen_ai.request.model": self.model_name}, self.span
        )
        bound = bind_task(self.task_id, self.conversation, self.turn)
        log_event(
            "model_request",
            logging.DEBUG,
            model=self.model_name,
            messages_count=len(messages),
            tools=names,
            messages=without_images(messages),
        )
        self._model_call = (self.turn, time.time(), time.perf_counter(), len(messages), names, span, bound)

    async def on_model_end(self, response: ModelResponse | None, error: BaseException | None) -> None:
        """The model call is over: recorded, logged, its span ended; an error that is not a model
        error (the loop turns those into a reply) ends the run, and its record is kept now."""
        turn, started_at, clock, count, names, span, bound = self._model_call
        try:
            self.model_done(turn, started_at, time.perf_counter() - clock, count, names, response, error)
            if response is None:
                self.end_span(span, {}, error)
                if error is not None and not isinstance(error, ModelError):
                    await self.crashed(error)
        finally:
            unbind_task(bound)
        if response is not None:
            usage = response.usage
            self.end_span(
                span,
                {
                    "gen_ai.response.model": response.model,
                    "gen_ai.usage.input_tokens": usage.prompt_tokens,
                    "gen_ai.usage.output_tokens": usage.completion_tokens,
                    "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
                    "hermes.tool_calls": len(response.tool_calls),
                },
                None,
            )

    async def on_tool_start(self, call: ToolCall) -> None:
        """A tool call begins (parallel calls each in their own task): span, log context, `tool_call`."""
        span = self.start_span(
            f"tool {call.name}", {"hermes.turn": self.turn, "hermes.tool": call.name}, self.span
        )
        bound = bind_task(self.task_id, self.conversation, self.turn)
        log_event("tool_call", tool=call.name, call_id=call.id, arguments=call.arguments)
        self._tool_calls_open[id(call)] = (self.turn, time.time(), span, bound)

    async def on_tool_end(
        self, call: ToolCall, outcome: ToolOutcome | None, error: BaseException | None
    ) -> None:
        """The tool call is over: recorded, logged, its span ended; an error ends the run."""
        turn, started_at, span, bound = self._tool_calls_open.pop(id(call))
        try:
            if outcome is not None:
                self.tool_done(turn, started_at, outcome)
            elif error is not None:
                failure = describe_error(error)
                log_event("error", _severity(error), stage="tool", tool=call.name, error=failure)
                self.end_span(span, {}, error)
                await self.crashed(error)
        finally:
            unbind_task(bound)
        if outcome is not None:
            self.end_span(span, {"hermes.ok": outcome.ok, "hermes.error": outcome.error or ""}, None)

    # -- what the hooks record ------------------------------------------------------------------

    def model_done(
        self,
        turn: int,
        started_at: float,
        elapsed: float,
        messages_count: int,
        tools: list[str],
        response: ModelResponse | None,
        error: BaseException | None,
    ) -> None:
        MODEL_SECONDS.observe(elapsed, outcome="ok" if error is None else "error")
        if response is not None:
            count_tokens(response.answered_by or self.model_name or "", response.usage)
        raw = record_of(response) if response is not None else None
        failure = describe_error(error) if error is not None else None
        self.model_calls.append({
            "turn": turn, "started_at": started_at, "elapsed": elapsed,
            "request_messages_count": messages_count, "tools": tools, "response": raw, "error": failure,
        })  # fmt: skip
        if raw is None:
            log_event("error", _severity(error), stage="model", error=failure, elapsed=elapsed)
        else:
            log_event("model_response", elapsed=elapsed, **raw)

    def _tool_label(self, name: str) -> str:
        """A metric label for the tool `name`: the model chooses it, so only a registered tool's
        name is one; any other (an invented name, one per call) is `other`, so /metrics stays
        bounded by the registry's size."""
        return name if self.registry is not None and self.registry.get(name) is not None else OTHER_TOOL

    def tool_done(self, turn: int, started_at: float, outcome: ToolOutcome) -> None:
        self.started_calls[outcome.call.id] = {"turn": turn, "started_at": started_at}
        self.outcomes.append(outcome)
        paused = outcome.error in PAUSES
        result = "ok" if outcome.ok else "paused" if paused else "error"
        TOOL_SECONDS.observe(outcome.elapsed, tool=self._tool_label(outcome.call.name), outcome=result)
        log_event(
            "tool_result",
            logging.INFO if outcome.ok or paused else logging.WARNING,
            tool=outcome.call.name,
            call_id=outcome.call.id,
            arguments=outcome.call.arguments,
            ok=outcome.ok,
            error=outcome.error,
            elapsed=outcome.elapsed,
            result=clip(outcome.content, 500),
            result_chars=len(outcome.content),
        )

    # -- the end --------------------------------------------------------------------------------

    async def finish(self, result: RunResult) -> dict[str, Any] | None:
        """Record the run (completed, failed or paused); returns the record, or None if that failed."""
        if self.done:
            return None
        self.done = True
        try:
            with self.bound():
                record = await self._build(result, None)
                failed = is_failure(record)
                log_event(
                    "reply_out",
                    logging.WARNING if failed else logging.INFO,
                    reply=record["reply"],
                    stop_reason=record["stop_reason"],
                    ok=record["ok"],
                    usage=record["usage"],
                    model_calls=len(record["model_calls"]),
                    tool_calls=len(record["tool_calls"]),
                    elapsed=result.timings.get("total", 0.0),
                )
                await self._keep(record, failed)
            return record
        except Exception:
            log.exception("the trace of task %s was not recorded", self.task_id)
            return None
        finally:
            self.end_span(self.span, {"hermes.stop_reason": result.stop_reason}, None)

    async def crashed(self, error: BaseException) -> None:
        """A wrapped call raised and the run ends with that exception: record what there is."""
        if self.done:
            return
        self.done = True
        if isinstance(error, ClaimLost):  # the task is another node's now: its record is the one kept
            self.end_span(self.span, {"hermes.stop_reason": "claim_lost"}, None)
            return
        try:
            with self.bound():
                log_event("error", logging.ERROR, stage="task", error=describe_error(error))
                await self._keep(await self._build(None, error), True)
        except Exception:
            log.exception("the trace of task %s was not recorded", self.task_id)
        finally:
            self.end_span(self.span, {"hermes.stop_reason": "error"}, error)

    async def _build(self, result: RunResult | None, error: BaseException | None) -> dict[str, Any]:
        outcomes = result.tool_calls if result is not None else self.outcomes
        usage = (
            asdict(result.usage)
            if result is not None
            else {
                key: sum(((m["response"] or {}).get("usage") or {}).get(key, 0) for m in self.model_calls)
                for key in ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens")
            }
        )
        record: dict[str, Any] = {
            "task_id": self.task_id,
            "conversation": self.conversation,
            "channel": self.caller.channel if self.caller else None,
            "caller": asdict(self.caller) if self.caller else None,
            "model": self.model_name,
            "input": self.input,
            "history": self.history,
            "messages": _json_copy(without_images(self.messages)),  # a placeholder for each picture
            "model_calls": self.model_calls,
            "tool_calls": self._tool_calls(outcomes),
            "approvals": await self._approvals(outcomes),
            "reply": result.reply if result is not None else "",
            "stop_reason": result.stop_reason if result is not None else "error",
            "ok": result.ok if result is not None else False,
            "usage": usage,
            "timings": dict(result.timings) if result is not None else {},
            "started_at": self.started_at,
            "finished_at": time.time(),
            "error": describe_error(error) if error is not None else None,
        }
        return redact_data(_json_copy(record))

    def _tool_calls(self, outcomes: list[ToolOutcome]) -> list[dict[str, Any]]:
        """Every call of the run in call order — the refused ones too — with its turn and timing."""
        asked = [
            (entry["turn"], call["id"])
            for entry in self.model_calls
            for call in (entry["response"] or {}).get("tool_calls", [])
        ]
        rows, position = [], 0
        for outcome in outcomes:
            call = outcome.call
            started = self.started_calls.get(call.id, {})
            turn = started.get("turn")
            for index in range(position, len(asked)):  # the call's turn: the next response that asked it
                if asked[index][1] == call.id:
                    turn, position = asked[index][0], index + 1
                    break
            rows.append({"turn": turn, **outcome_record(outcome), "started_at": started.get("started_at")})
        return rows

    async def _approvals(self, outcomes: list[ToolOutcome]) -> list[dict[str, Any]]:
        """The approvals and questions of this task, as they stand now (tasks/pending.py)."""
        registry = self.registry
        interactions = registry.interactions if registry is not None else None
        if registry is None or not isinstance(interactions, PendingStore):  # asked in place: none kept
            return []
        declared = [registry.get(outcome.call.name) for outcome in outcomes]
        if not any(tool is not None and tool.needs_person for tool in declared):
            return []
        found = {p.id: p.summary() for p in await interactions.open_for_task(self.task_id)}
        store = self.tracer.store
        earlier = await store.get(self.task_id) if store is not None else None
        for old in (earlier or {}).get("approvals") or []:  # decided since the run that asked
            if old.get("id") not in found:
                fresh = await interactions.get(old["id"])
                found[old["id"]] = fresh.summary() if fresh is not None else old
        return sorted(found.values(), key=lambda p: p.get("created_at") or 0)

    async def _keep(self, record: dict[str, Any], failed: bool) -> None:
        if self.tracer.store is not None:
            try:
                await self.tracer.store.record(record)
            except Exception:
                log.exception("the trace of task %s could not be stored", self.task_id)
        if failed and self.tracer.xray_dir is not None:
            path = await asyncio.to_thread(write_xray, self.tracer.xray_dir, record)
            log.info("failed task %s: X-ray written to %s", self.task_id, path)

    # -- spans ----------------------------------------------------------------------------------

    def start_span(self, name: str, attributes: dict[str, Any], parent: Any = None) -> Any:
        spans = self.tracer.spans
        return spans.start(name, attributes, parent) if spans is not None else None

    def end_span(self, span: Any, attributes: dict[str, Any], error: BaseException | None) -> None:
        if span is not None:
            self.tracer.spans.end(span, attributes, error)


# --- helpers ---------------------------------------------------------------------------------------


def tracer_for(settings: Any) -> Tracer:
    """The tracer `settings.observe` asks for. Traces (`observe.traces`, default on, for `serve` as
    for `run` and `chat`, so `traces --failed` shows what just failed) go to the gateway's database
    (SQLite, or PostgreSQL with `database.url`: stores.py); X-rays to `observe.xray_dir`, by default
    `<data_dir>/xray` when traces are on. Without traces the tracer still writes the log events."""
    from ..stores import trace_store

    observe, data_dir = settings.observe, Path(settings.gateway.data_dir)
    keep = observe.traces
    store = trace_store(settings) if keep else None
    xray_dir = observe.xray_dir if observe.xray_dir is not None else (str(data_dir / "xray") if keep else "")
    spans = None
    if observe.otel:
        try:
            from .otel import OTelSpans
        except ImportError as exc:
            raise ValueError(f"observe.otel: {exc}") from None
        spans = OTelSpans()
    return Tracer(store, xray_dir=xray_dir or None, spans=spans)


def _severity(error: BaseException | None) -> int:
    """How loud a step's error is logged: a claim another node took (tasks/fence.py) is no failure."""
    return logging.WARNING if isinstance(error, ClaimLost) else logging.ERROR


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def xray_path(xray_dir: str | Path, task_id: str) -> Path:
    """`<xray_dir>/<task id>.json`, the task id made safe as a file name."""
    return Path(xray_dir) / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', task_id).strip('.') or 'task'}.json"


def write_xray(xray_dir: str | Path, record: dict[str, Any]) -> Path:
    """Write a failed task's record as a standalone JSON file (atomically); returns its path."""
    path = xray_path(xray_dir, str(record["task_id"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(redact_data(record), ensure_ascii=False, indent=2), encoding="utf-8")
    os.replace(partial, path)
    return path


def _json_copy(value: Any) -> Any:
    """A JSON-shaped deep copy: later changes to the run's lists do not reach the record."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


__all__ = [
    "SQLiteTraceStore",
    "TaskTrace",
    "TraceStore",
    "TraceSummary",
    "Tracer",
    "is_failure",
    "tracer_for",
    "write_xray",
    "xray_path",
]
