"""Metrics: counters, gauges and histograms, served by `hermes-kernel serve` on GET /metrics.

The exposition is Prometheus' text format 0.0.4, written here in a few lines rather than with
`prometheus_client`: the format is small and stable, this process needs no multiprocess mode,
push gateway or second HTTP server, and the kernel stays free of a dependency it would import on
every start. (The tests parse what we write with prometheus_client's parser, a test-only
dependency, so the output is checked against a reference implementation.)

Recording is a hook, not a wrapper: the gateway, the tracer, the model client and the dispatcher
call `counter(...).inc()` / `histogram(...).observe()` where the fact is already known. Each is a
dict lookup and an add under a lock (a histogram adds a bisect): well under a microsecond, a few
per turn. Other parts use the process-wide registry the same way:

    from hermes_core.observe.metrics import REGISTRY
    REGISTRY.counter("hermes_dead_letters_total", "Replies given up on.", ("channel",)).inc(channel="feishu")

Asking for a metric that exists returns it (same type and labels, or ValueError). Values that
live elsewhere (queue depths in the database) are `Sample`s the /metrics handler reads at scrape
time and renders with `render(extra=...)`.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ..kernel.messages import Usage

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

LabelValues = tuple[str, ...]
M = TypeVar("M", bound="_Metric")


class _Metric:
    kind = ""

    def __init__(self, name: str, help: str, labels: Sequence[str]) -> None:
        if not _NAME.match(name) or any(not _LABEL.match(label) or label == "le" for label in labels):
            raise ValueError(f"bad metric name or label: {name} {list(labels)}")
        self.name, self.help, self.labels = name, help, tuple(labels)
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, object]) -> LabelValues:
        if len(labels) != len(self.labels):
            raise ValueError(f"{self.name} takes the labels {list(self.labels)}, got {sorted(labels)}")
        return tuple(str(labels[name]) for name in self.labels)

    def lines(self) -> list[str]:
        raise NotImplementedError


class Counter(_Metric):
    """A count that only goes up (per label values). Name it `…_total`."""

    kind = "counter"

    def __init__(self, name: str, help: str, labels: Sequence[str]) -> None:
        super().__init__(name, help, labels)
        self._values: dict[LabelValues, float] = {}

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: object) -> float:
        return self._values.get(self._key(labels), 0.0)

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [_sample(self.name, self.labels, key, value) for key, value in items]


class Gauge(Counter):
    """A value that goes up and down."""

    kind = "gauge"

    def set(self, value: float, **labels: object) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = value

    def inc(self, amount: float = 1.0, **labels: object) -> None:
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount


@dataclass
class _Buckets:
    counts: list[int]
    total: float = 0.0
    count: int = 0


class Histogram(_Metric):
    """Observations counted into cumulative `le` buckets, with their sum and count."""

    kind = "histogram"

    def __init__(self, name: str, help: str, labels: Sequence[str], buckets: Sequence[float]) -> None:
        super().__init__(name, help, labels)
        self.buckets = tuple(sorted(float(b) for b in buckets if not math.isinf(b)))
        self._values: dict[LabelValues, _Buckets] = {}

    def observe(self, value: float, **labels: object) -> None:
        key = self._key(labels)
        index = bisect.bisect_left(self.buckets, value)
        with self._lock:
            entry = self._values.get(key)
            if entry is None:
                entry = self._values[key] = _Buckets([0] * (len(self.buckets) + 1))
            entry.counts[index] += 1
            entry.total += value
            entry.count += 1

    def count(self, **labels: object) -> int:
        entry = self._values.get(self._key(labels))
        return entry.count if entry else 0

    def lines(self) -> list[str]:
        with self._lock:
            items = sorted(
                (key, _Buckets(list(e.counts), e.total, e.count)) for key, e in self._values.items()
            )
        out: list[str] = []
        names = (*self.labels, "le")
        for key, entry in items:
            running = 0
            for bound, n in zip((*self.buckets, math.inf), entry.counts, strict=True):
                running += n
                out.append(_sample(f"{self.name}_bucket", names, (*key, _number(bound)), running))
            out.append(_sample(f"{self.name}_sum", self.labels, key, entry.total))
            out.append(_sample(f"{self.name}_count", self.labels, key, entry.count))
        return out


@dataclass
class Sample:
    """A gauge read at scrape time (a queue depth): name, help, and values by label values."""

    name: str
    help: str
    value: float | None = None  # without labels
    labels: tuple[str, ...] = ()
    values: dict[LabelValues, float] = field(default_factory=dict)

    def lines(self) -> list[str]:
        if not self.labels:
            return [] if self.value is None else [_sample(self.name, (), (), self.value)]
        return [_sample(self.name, self.labels, key, value) for key, value in sorted(self.values.items())]


class Metrics:
    """A registry: metrics by name, rendered together."""

    def __init__(self) -> None:
        self._metrics: dict[str, _Metric] = {}
        self._lock = threading.Lock()

    def counter(self, name: str, help: str = "", labels: Sequence[str] = ()) -> Counter:
        return self._get(Counter, name, lambda: Counter(name, help, labels), labels)

    def gauge(self, name: str, help: str = "", labels: Sequence[str] = ()) -> Gauge:
        return self._get(Gauge, name, lambda: Gauge(name, help, labels), labels)

    def histogram(
        self,
        name: str,
        help: str = "",
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        return self._get(Histogram, name, lambda: Histogram(name, help, labels, buckets), labels)

    def _get(self, cls: type[M], name: str, make: Callable[[], M], labels: Sequence[str]) -> M:
        """The metric `name`, made on first use; it must have the same type and labels."""
        with self._lock:
            found = self._metrics.get(name)
            if found is None:
                found = self._metrics[name] = make()
        if type(found) is not cls or found.labels != tuple(labels):
            raise ValueError(f"{found.name} exists as a {found.kind} with labels {list(found.labels)}")
        return found

    def render(self, extra: Iterable[Sample] = ()) -> str:
        """The text exposition (format 0.0.4) of every metric, then of `extra`."""
        with self._lock:
            metrics: list[_Metric | Sample] = list(self._metrics.values())
        out: list[str] = []
        for metric in [*metrics, *extra]:
            kind = metric.kind if isinstance(metric, _Metric) else "gauge"
            out.append(f"# HELP {metric.name} {_escape_help(metric.help)}")
            out.append(f"# TYPE {metric.name} {kind}")
            out.extend(metric.lines())
        return "\n".join(out) + "\n"


def _sample(name: str, labels: Sequence[str], values: Sequence[str], value: float) -> str:
    if not labels:
        return f"{name} {_number(value)}"
    pairs = ",".join(f'{label}="{_escape_label(v)}"' for label, v in zip(labels, values, strict=True))
    return f"{name}{{{pairs}}} {_number(value)}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else repr(float(value))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


REGISTRY = Metrics()  # the process's: what /metrics serves

# The gateway's own metrics (others are declared where they are recorded, through REGISTRY).
ACKS = REGISTRY.counter(
    "hermes_acks_total", "Inbound events answered by the gateway, by outcome.", ("channel", "outcome")
)
TURNS = REGISTRY.counter("hermes_turns_total", "Turns finished, by outcome.", ("channel", "outcome"))
THROTTLED = REGISTRY.counter(
    "hermes_messages_throttled_total", "Messages answered with the fixed reply: over a per-sender limit.",
    ("channel", "limit"),
)  # fmt: skip
TURN_SECONDS = REGISTRY.histogram(
    "hermes_turn_seconds", "Time from a turn's start (slot granted) to its replies queued.", ("channel",)
)
MODEL_SECONDS = REGISTRY.histogram(
    "hermes_model_call_seconds", "Model call latency, retries included, by outcome.", ("outcome",)
)
OTHER_TOOL = "other"  # the `tool` label of a call to no registered tool (observe/traces.py)
TOOL_SECONDS = REGISTRY.histogram(
    "hermes_tool_call_seconds", "Tool call latency, by tool and outcome.", ("tool", "outcome")
)
PROMPT_TOKENS = REGISTRY.counter("hermes_prompt_tokens_total", "Prompt tokens sent, by model.", ("model",))
CACHED_PROMPT_TOKENS = REGISTRY.counter(
    "hermes_cached_prompt_tokens_total",
    "Prompt tokens the provider's prompt cache served (part of the prompt tokens), by model.",
    ("model",),
)
COMPLETION_TOKENS = REGISTRY.counter(
    "hermes_completion_tokens_total", "Completion tokens received, by model.", ("model",)
)


def count_tokens(model: str, usage: Usage) -> None:
    """Add one model call's usage to the token counters (the tracer calls it once per call)."""
    if usage.prompt_tokens > 0 or usage.completion_tokens > 0:
        PROMPT_TOKENS.inc(max(usage.prompt_tokens, 0), model=model)
        CACHED_PROMPT_TOKENS.inc(max(usage.cached_tokens, 0), model=model)
        COMPLETION_TOKENS.inc(max(usage.completion_tokens, 0), model=model)


MODEL_RETRIES = REGISTRY.counter(
    "hermes_model_retries_total", "Model requests tried again after a transient failure.", ("model",)
)
SENDS = REGISTRY.counter(
    "hermes_send_attempts_total",
    "Reply delivery attempts, by outcome (sent, retry, dead).",
    ("channel", "outcome"),
)
