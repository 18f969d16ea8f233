"""One record format for what a task's steps produced: model responses and tool outcomes.

The journal (tasks/journal.py) persists them to resume a task, the trace (observe/traces.py) to
show and replay it (observe/replay.py, evals/traces.py). They write and read these records
through this module only, so that what is persisted cannot drift between them:

    response: {"content", "tool_calls": [{"id", "name", "arguments"}], "usage": {"prompt_tokens",
               "completion_tokens", "total_tokens", "cached_tokens"}, "model", "answered_by",
               "finish_reason", "refusal", "reasoning"}
    outcome:  {"id", "name", "arguments", "result", "ok", "error", "elapsed", "parsed"}

Each store adds its own context around a record (the journal its turn, counted from 0; the trace
its turn, counted from 1, and the start time). The readers also take the rows written before this
format: the journal's (`tool_calls` as `[id, name, arguments]` lists, `usage` as a list, the
result under `content`); tests/data/records/ holds such rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict

from .messages import CANONICAL_JSON, JSON, ModelResponse, ToolCall, Usage, canonical_arguments
from .tools.registry import ToolOutcome


def record_of(response: ModelResponse) -> dict[str, JSON]:
    """A model response as it is persisted: the raw output, tool calls included."""
    return {
        "content": response.content,
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in response.tool_calls],
        "usage": asdict(response.usage),
        "model": response.model,
        "answered_by": response.answered_by,  # the configured model (a route's, a fallback) that answered
        "finish_reason": response.finish_reason,
        "refusal": response.refusal,
        "reasoning": response.reasoning,
    }


def response_from(record: Mapping[str, JSON]) -> ModelResponse:
    """The response a record (of this format, or an older journal row) was made from."""
    return ModelResponse(
        content=record.get("content"),
        tool_calls=[_call_from(call) for call in record.get("tool_calls") or []],
        usage=_usage_from(record.get("usage")),
        model=record.get("model") or "",
        answered_by=record.get("answered_by") or "",
        finish_reason=record.get("finish_reason"),
        refusal=record.get("refusal"),
        reasoning=record.get("reasoning"),
    )


def outcome_record(outcome: ToolOutcome) -> dict[str, JSON]:
    """A tool call's outcome as it is persisted: the call, what it returned, how it ended."""
    call = outcome.call
    return {
        "id": call.id, "name": call.name, "arguments": call.arguments, "result": outcome.content,
        "ok": outcome.ok, "error": outcome.error, "elapsed": outcome.elapsed, "parsed": outcome.arguments,
    }  # fmt: skip


def outcome_from(record: Mapping[str, JSON]) -> ToolOutcome:
    """The outcome a record (of this format, or an older journal row) was made from."""
    call = ToolCall(str(record.get("id") or ""), str(record.get("name")), record.get("arguments", "{}"))
    result = record["result"] if "result" in record else record.get("content", "")
    return ToolOutcome(
        call,
        str(result),
        bool(record.get("ok")),
        record.get("parsed"),
        float(record.get("elapsed") or 0.0),
        record.get("error"),
    )


def canonical(arguments: JSON) -> str:
    """Arguments as compared: a JSON text or an already decoded value, spacing and key order aside."""
    if isinstance(arguments, str):
        return canonical_arguments(arguments)
    return CANONICAL_JSON(arguments)


def _call_from(call: JSON) -> ToolCall:
    if isinstance(call, Mapping):
        return ToolCall(str(call["id"]), str(call["name"]), call.get("arguments", "{}"))
    return ToolCall(*call)  # an older journal row: [id, name, arguments]


def _usage_from(usage: JSON) -> Usage:
    if isinstance(usage, Mapping):
        keys = ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens")
        return Usage(**{key: usage.get(key, 0) for key in keys})
    return Usage(*(usage or [0, 0, 0]))  # an older journal row: [prompt, completion, total]


__all__ = ["canonical", "outcome_from", "outcome_record", "record_of", "response_from"]
