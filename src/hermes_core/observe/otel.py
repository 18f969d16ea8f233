"""OpenTelemetry spans for traced tasks (`pip install "hermes-kernel[otel]"`; `observe.otel: true`).

One span per task (`hermes.task`), with a child span per model call (`model.complete`) and per tool
call (`tool <name>`), started and ended by the trace's hooks (observe/traces.py, kernel/hooks.py), each
carrying the task id, the turn, token usage or the tool's outcome. The spans go to the global
tracer provider unless one is passed: configure the SDK and its exporter (OTLP, console…) the usual
OpenTelemetry way. This module is imported only when spans are asked
for; without the package, `OTelSpans()` raises ImportError naming the extra.
"""

from __future__ import annotations

from typing import Any

from ..kernel.redaction import redact_text

try:
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('OpenTelemetry spans need the otel extra: pip install "hermes-kernel[otel]"') from exc


class OTelSpans:
    """What `Tracer(spans=…)` calls: `start` a span under a parent, `end` it with more attributes."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self.tracer = trace.get_tracer("hermes_core", tracer_provider=tracer_provider)

    def start(self, name: str, attributes: dict[str, Any], parent: Any = None) -> Any:
        context = trace.set_span_in_context(parent) if parent is not None else None
        return self.tracer.start_span(name, context=context, attributes=_valid(attributes))

    def end(self, span: Any, attributes: dict[str, Any], error: BaseException | None) -> None:
        span.set_attributes(_valid(attributes))
        if error is not None:  # the message redacted: an exception may quote a URL with a key in it
            message = redact_text(str(error))
            span.add_event(
                "exception", {"exception.type": type(error).__name__, "exception.message": message}
            )
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {message}"))
        span.end()


def _valid(attributes: dict[str, Any]) -> dict[str, Any]:
    """OpenTelemetry takes str, bool, int and float values: drop the empty ones."""
    return {key: value for key, value in attributes.items() if value is not None}


__all__ = ["OTelSpans"]
