"""Observability: structured logs (O2), traces and X-rays, replay (O3), optional OpenTelemetry spans.

- `logs.py`: one line per event (JSON or console), the task's id/conversation/turn on every
  record, daily rotated files; `setup_logging`, `log_event`.
- `traces.py`: `Tracer` (set as `Agent.tracer`) wraps the model client and the tool registry of
  each run, writes the log events and one record per task to a `TraceStore` (`SQLiteTraceStore`),
  and an X-ray JSON file for each failed task.
- `replay.py`: run a recorded task again with its recorded model outputs and the current tools,
  and report where the behaviour diverges.
- `otel.py`: OpenTelemetry spans (the `otel` extra).
- `commands.py`: `hermes-kernel traces`, `trace show`, `replay`.

Nothing here is imported by `import hermes_core` or by an agent without a tracer; names below are
resolved on first use. See docs/observability.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Tracer": "traces",
    "TraceStore": "traces",
    "SQLiteTraceStore": "traces",
    "setup_logging": "logs",
    "log_event": "logs",
    "replay": "replay",
    "ReplayReport": "replay",
}

if TYPE_CHECKING:
    from .logs import log_event, setup_logging
    from .replay import ReplayReport, replay
    from .traces import SQLiteTraceStore, Tracer, TraceStore


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hermes_core.observe' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = ["ReplayReport", "SQLiteTraceStore", "TraceStore", "Tracer", "log_event", "replay", "setup_logging"]
