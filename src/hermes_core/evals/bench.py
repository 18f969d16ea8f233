"""Compare models on the same tasks (`hermes-kernel bench`): success rate, steps, latency, tokens, cost.

    hermes-kernel bench --models m1,m2,m3 --tasks tasks.yaml -n 20 --out bench-results

runs every task n times per model and prints one row per model — the table of a hand-made
comparison (success rate, average steps, average latency), plus average tokens and, when prices
are known, average cost per run (prompt tokens the provider's cache served at the `cached`
price, when one is given; `PUBLISHED` prices a few models, a run's own prices win) — then
writes the same table as CSV, JSON (with every run and the success rate per task) and an SVG bar
chart.

A task is a case (`cases.py`): a conversation, optional workspace `files`, and checks; a run
succeeds when every check passes, and its steps are its model calls. The tasks file::

    prices:                        # optional, per 1,000 tokens; also `--prices FILE`
      my-model: {prompt: 0.0004, completion: 0.0016, cached: 0.0001}
    tasks:
      - name: calculation
        input: What is (1234 + 5678) * 3 - 17? Use the calculator.
        checks: {must_call: [calculator], reply_matches: ['20,?719']}

With `model.routes` configured (models/routing.py), every model runs twice: `<model>` with the routes
off and `<model>+routes` with them on (that model as the main one), and the table gains a
`tokens by model` column (the average tokens per run of each answering model) and a line comparing
each routed row with its unrouted one. A run's cost is priced per answering model, so the cheaper
model's tokens cost the cheaper model's price.

Without `--tasks` the built-in set (`evals/tasks/default.yaml`) runs. Models run concurrently;
each model has one client, so its `requests_per_second` and `max_concurrency` hold across all of
its runs, and at most `max_concurrency` of its runs (or `--concurrency`) are in flight at once.
Progress goes to stderr as a plain-text bar.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from xml.sax.saxutils import escape

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .cases import Case, CaseError, describe_errors, parse_case
from .runner import CaseResult, format_table, model_client, run_case

if TYPE_CHECKING:
    from ..config import Settings

DEFAULT_OUT = "bench-results"
COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#B279A2", "#FF9DA6", "#9D755D")


class ModelPrice(BaseModel):
    """What a model costs per 1,000 tokens: prompt, completion, and cached prompt tokens (those the
    provider's prompt cache served, billed lower; without a `cached` price, at the prompt price)."""

    model_config = ConfigDict(extra="forbid")
    prompt: float = Field(ge=0)
    completion: float = Field(ge=0)
    cached: float | None = Field(None, ge=0)

    def cost(self, prompt: int, completion: int, cached: int = 0) -> float:
        cached_price = self.prompt if self.cached is None else self.cached
        return ((prompt - cached) * self.prompt + cached * cached_price + completion * self.completion) / 1000


Prices = dict[str, ModelPrice]

# Published list prices per 1,000 tokens (prompt on a cache miss, completion, prompt on a cache hit),
# used for a model that `prices:` or `--prices` does not price; those always win. Only models whose
# pricing page was read, with where: api-docs.deepseek.com/quick_start/pricing-details-usd
# (deepseek-chat, deepseek-reasoner) and openai.com/api/pricing (gpt-4o-mini), as read on
# 2026-12-06. Prices change and differ by region and hour: a tasks file's `prices:` is the place to
# keep the ones a team pays.
PUBLISHED: dict[str, ModelPrice] = {
    "deepseek-chat": ModelPrice(prompt=0.00027, completion=0.0011, cached=0.00007),
    "deepseek-reasoner": ModelPrice(prompt=0.00055, completion=0.00219, cached=0.00014),
    "gpt-4o-mini": ModelPrice(prompt=0.00015, completion=0.0006, cached=0.000075),
}


@dataclass
class BenchRun:
    """One run of one task by one model."""

    model: str
    task: str
    index: int
    passed: bool
    steps: int
    latency: float
    prompt_tokens: int
    completion_tokens: int
    stop_reason: str
    failed: list[str] = field(default_factory=list)  # the checks that did not hold
    error: str | None = None
    # model → [prompt, completion, cached] tokens
    tokens_by_model: dict[str, list[int]] = field(default_factory=dict)
    cached_tokens: int = 0  # of `prompt_tokens`, those the provider's prompt cache served

    @classmethod
    def of(cls, model: str, index: int, result: CaseResult) -> BenchRun:
        failed = [check.check for check in result.failures]
        return cls(
            model, result.name, index, result.passed, result.steps, result.latency,
            result.prompt_tokens, result.completion_tokens, result.stop_reason, failed, result.error,
            dict(result.tokens_by_model), result.cached_tokens,
        )  # fmt: skip

    def cost(self, prices: Prices, row_model: str) -> float | None:
        """What the run cost, each answering model's tokens at its price; None if one has none."""
        own = [self.prompt_tokens, self.completion_tokens, self.cached_tokens]
        spent = self.tokens_by_model or {row_model: own}
        total = 0.0
        for model, tokens in spent.items():
            price = prices.get(model)
            if price is None:
                return None
            total += price.cost(*tokens[:3])  # (runs written before cached tokens: two numbers)
        return total


@dataclass
class ModelSummary:
    """One row of the table: averages over every run of one model."""

    model: str
    runs: int
    passed: int
    avg_steps: float
    avg_latency: float
    avg_prompt_tokens: float
    avg_completion_tokens: float
    avg_cost: float | None  # None when no price is configured for the model
    by_task: dict[str, float] = field(default_factory=dict)  # task → success rate
    tokens_by_model: dict[str, float] = field(default_factory=dict)  # answering model → avg tokens per run
    avg_cached_tokens: float = 0.0  # of the prompt tokens, those the provider's cache served

    @property
    def success_rate(self) -> float:
        return self.passed / self.runs if self.runs else 0.0

    @property
    def avg_tokens(self) -> float:
        return self.avg_prompt_tokens + self.avg_completion_tokens


# -- tasks and prices -------------------------------------------------------------------------------


def load_tasks(path: str | Path | None = None) -> tuple[list[Case], Prices]:
    """The tasks (and prices) of a tasks file; the built-in set when `path` is None."""
    import yaml

    if path is None:
        where, text = "default tasks", default_tasks_text()
    else:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise CaseError(f"cannot read tasks {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CaseError(f"{where} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
        raise CaseError(
            f"{where}: expected a mapping with a non-empty `tasks:` list (and optional `prices:`)"
        )
    unknown = set(data) - {"tasks", "prices"}
    if unknown:
        raise CaseError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected tasks and prices")
    tasks: list[Case] = []
    for index, item in enumerate(data["tasks"]):
        task = parse_case(item if isinstance(item, dict) else {}, f"{where}: tasks[{index}]")
        if not task.name:
            raise CaseError(f"{where}: tasks[{index}] needs a name")
        if task.name in {t.name for t in tasks}:
            raise CaseError(f"{where}: two tasks are named {task.name!r}")
        tasks.append(task)
    return tasks, parse_prices(data.get("prices") or {}, where)


def default_tasks_text() -> str:
    return (
        resources.files("hermes_core.evals")
        .joinpath("tasks")
        .joinpath("default.yaml")
        .read_text(encoding="utf-8")
    )


def load_prices(path: str | Path) -> Prices:
    """A prices file: `{model: {prompt, completion}}`, optionally under a `prices:` key."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CaseError(f"cannot read prices {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise CaseError(f"{path} is not valid YAML: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("prices"), dict):
        data = data["prices"]
    return parse_prices(data, str(path))


def parse_prices(data: Any, where: str) -> Prices:
    if not isinstance(data, dict):
        raise CaseError(f"{where}: prices is a mapping of model name to {{prompt, completion}} per 1k tokens")
    try:
        return TypeAdapter(Prices).validate_python({str(model): price for model, price in data.items()})
    except ValidationError as exc:
        raise CaseError(f"{where}: prices: {describe_errors(exc)}") from None


# -- running --------------------------------------------------------------------------------------


class Progress:
    """A plain-text progress bar: redrawn in place on a terminal, a line per tenth otherwise."""

    def __init__(self, totals: Mapping[str, int], stream: TextIO | None = None, width: int = 24) -> None:
        self.totals = dict(totals)
        self.done = dict.fromkeys(totals, 0)
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self._interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._shown_tenth = -1

    @property
    def total(self) -> int:
        return sum(self.totals.values())

    def advance(self, model: str) -> None:
        self.done[model] += 1
        done = sum(self.done.values())
        tenth = done * 10 // max(1, self.total)
        if self._interactive:
            self.stream.write("\r" + self.line())
        elif tenth != self._shown_tenth:
            self._shown_tenth = tenth
            self.stream.write(self.line() + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self._interactive:
            self.stream.write("\n")
            self.stream.flush()

    def line(self) -> str:
        done, total = sum(self.done.values()), max(1, self.total)
        filled = self.width * done // total
        models = "  ".join(f"{name} {self.done[name]}/{self.totals[name]}" for name in self.totals)
        return f"bench [{'#' * filled}{'-' * (self.width - filled)}] {done}/{self.total} runs  {models}"


ROUTED = "+routes"  # the row of a model run with `model.routes` on


def bench_rows(models: Sequence[str], settings: Settings) -> list[str]:
    """The table's rows: each model, and with `model.routes` each model routed too."""
    if not settings.model.routes:
        return list(models)
    return [row for model in models for row in (model, model + ROUTED)]


async def run_bench(
    settings: Settings,
    models: Sequence[str],
    tasks: Sequence[Case],
    n: int,
    *,
    concurrency: int | None = None,
    progress: Progress | None = None,
) -> list[BenchRun]:
    """Every task n times on every row of `models` (`m+routes`: m with the routes); concurrently."""
    per_model = await asyncio.gather(
        *(
            bench_model(settings, model, tasks, n, concurrency=concurrency, progress=progress)
            for model in models
        )
    )
    return [run for runs in per_model for run in runs]


async def bench_model(
    settings: Settings,
    model: str,
    tasks: Sequence[Case],
    n: int,
    *,
    concurrency: int | None = None,
    progress: Progress | None = None,
) -> list[BenchRun]:
    """Every task n times on one model, through one client, at most `max_concurrency` runs at once.
    `model` ending in `+routes`: that model as the main one, with `model.routes`; otherwise none."""
    model_settings = settings.model_copy(deep=True)
    model_settings.model.name = model.removesuffix(ROUTED)
    if not model.endswith(ROUTED):
        model_settings.model.routes = []
    limit = model_settings.model.max_concurrency
    slots = asyncio.Semaphore(limit if concurrency is None else max(1, min(concurrency, limit)))
    client = model_client(model_settings)

    async def one(task: Case, index: int) -> BenchRun:
        async with slots:
            result = await run_case(task, model_settings, model=client)
        if progress is not None:
            progress.advance(model)
        return BenchRun.of(model, index, result)

    try:
        return list(await asyncio.gather(*(one(task, i) for i in range(n) for task in tasks)))
    finally:
        await client.aclose()


# -- the table and the files ------------------------------------------------------------------------


def summarize(
    runs: Sequence[BenchRun], models: Sequence[str], prices: Prices | None = None
) -> list[ModelSummary]:
    """One summary per model, in the order of `models`."""
    summaries = []
    for model in models:
        mine = [run for run in runs if run.model == model]
        count = max(1, len(mine))
        prompt = sum(run.prompt_tokens for run in mine) / count
        completion = sum(run.completion_tokens for run in mine) / count
        costs = [run.cost(prices or {}, model.removesuffix(ROUTED)) for run in mine]
        cost = None if None in costs else sum(c or 0.0 for c in costs) / count
        by_model: dict[str, float] = {}
        for run in mine:
            for name, (p, c, *_) in run.tokens_by_model.items():
                by_model[name] = by_model.get(name, 0.0) + (p + c) / count
        by_task: dict[str, list[bool]] = {}
        for run in mine:
            by_task.setdefault(run.task, []).append(run.passed)
        summaries.append(
            ModelSummary(
                model, len(mine), sum(run.passed for run in mine),
                avg_steps=sum(run.steps for run in mine) / count,
                avg_latency=sum(run.latency for run in mine) / count,
                avg_prompt_tokens=prompt, avg_completion_tokens=completion, avg_cost=cost,
                by_task={task: sum(results) / len(results) for task, results in by_task.items()},
                tokens_by_model=by_model, avg_cached_tokens=sum(run.cached_tokens for run in mine) / count,
            )
        )  # fmt: skip
    return summaries


def bench_table(summaries: Sequence[ModelSummary]) -> str:
    """The printed table; the cached prompt tokens only when a provider reported some, the cost
    column only when some model has a price, the tokens of each answering model only when some row
    is routed."""
    with_cost = any(summary.avg_cost is not None for summary in summaries)
    with_cached = any(summary.avg_cached_tokens for summary in summaries)
    routed = any(summary.model.endswith(ROUTED) for summary in summaries)
    headers = ["model", "runs", "success", "avg steps", "avg latency (s)", "avg tokens"]
    headers += ["avg cached"] if with_cached else []
    headers += ["avg cost"] if with_cost else []
    headers += ["tokens by model"] if routed else []
    rows = []
    for s in summaries:
        row = [s.model, str(s.runs), f"{s.success_rate:.1%}", f"{s.avg_steps:.2f}", f"{s.avg_latency:.2f}"]
        row.append(f"{s.avg_tokens:.1f}")
        if with_cached:
            row.append(f"{s.avg_cached_tokens:.1f}")
        if with_cost:
            row.append("-" if s.avg_cost is None else f"{s.avg_cost:.6f}")
        if routed:
            row.append(" ".join(f"{name}:{tokens:.1f}" for name, tokens in s.tokens_by_model.items()) or "-")
        rows.append(row)
    align = "lrrrrr" + ("r" if with_cached else "") + ("r" if with_cost else "") + ("l" if routed else "")
    return format_table(headers, rows, align)


def routing_comparison(summaries: Sequence[ModelSummary]) -> list[str]:
    """One line per routed row: its cost (or tokens) against the same model unrouted."""
    by_name = {summary.model: summary for summary in summaries}
    lines = []
    for routed in summaries:
        plain = by_name.get(routed.model.removesuffix(ROUTED))
        if not routed.model.endswith(ROUTED) or plain is None:
            continue
        if routed.avg_cost is not None and plain.avg_cost:
            ratio, what = routed.avg_cost / plain.avg_cost, "cost"
        else:
            ratio, what = routed.avg_tokens / max(plain.avg_tokens, 1e-9), "tokens"
        lines.append(
            f"routes: {routed.model} {what} per run {ratio:.2f}x of {plain.model} "
            f"(success {routed.success_rate:.1%} vs {plain.success_rate:.1%})"
        )
    return lines


CSV_FIELDS = [
    "model", "runs", "passed", "success_rate", "avg_steps", "avg_latency_s",
    "avg_prompt_tokens", "avg_completion_tokens", "avg_tokens", "avg_cost", "tokens_by_model",
    "avg_cached_tokens",
]  # fmt: skip


def summary_row(s: ModelSummary) -> dict[str, Any]:
    return {
        "model": s.model, "runs": s.runs, "passed": s.passed, "success_rate": s.success_rate,
        "avg_steps": s.avg_steps, "avg_latency_s": s.avg_latency, "avg_prompt_tokens": s.avg_prompt_tokens,
        "avg_completion_tokens": s.avg_completion_tokens, "avg_tokens": s.avg_tokens, "avg_cost": s.avg_cost,
        "tokens_by_model": s.tokens_by_model, "avg_cached_tokens": s.avg_cached_tokens,
    }  # fmt: skip


def write_csv(path: Path, summaries: Sequence[ModelSummary]) -> None:
    with path.open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for summary in summaries:
            row = summary_row(summary)
            row["tokens_by_model"] = json.dumps(row["tokens_by_model"], ensure_ascii=False)
            writer.writerow({key: "" if value is None else value for key, value in row.items()})


def write_json(
    path: Path, summaries: Sequence[ModelSummary], runs: Sequence[BenchRun], tasks: Sequence[str], n: int
) -> None:
    data = {
        "n": n,
        "tasks": list(tasks),
        "models": [summary_row(s) | {"by_task": s.by_task} for s in summaries],
        "runs": [asdict(run) for run in runs],
    }
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def bench_svg(summaries: Sequence[ModelSummary], title: str) -> str:
    """The table as a bar chart: one panel per column, one bar per model. Plain SVG, no library."""
    metrics: list[tuple[str, list[float], str]] = [
        ("success rate", [s.success_rate * 100 for s in summaries], "{:.1f}%"),
        ("avg steps", [s.avg_steps for s in summaries], "{:.2f}"),
        ("avg latency (s)", [s.avg_latency for s in summaries], "{:.2f}"),
        ("avg tokens", [s.avg_tokens for s in summaries], "{:.1f}"),
    ]
    if any(s.avg_cost is not None for s in summaries):
        metrics.append(("avg cost", [s.avg_cost or 0.0 for s in summaries], "{:.6f}"))
    longest = max((len(s.model) for s in summaries), default=0)
    left, label_width, bar_width, row_height = 16, max(150, 16 + 7 * longest), 360, 22
    width = left + label_width + bar_width + 120
    parts = [_svg_text(left, 26, title, size=15, bold=True)]
    y = 44
    for name, values, fmt in metrics:
        parts.append(_svg_text(left, y + 14, name, bold=True))
        y += 20
        peak = max(values, default=0.0)
        for i, (summary, value) in enumerate(zip(summaries, values, strict=True)):
            length = round(bar_width * value / peak, 1) if peak > 0 else 0.0
            x = left + label_width
            parts.append(_svg_text(left + 8, y + 15, summary.model))
            parts.append(
                f'<rect x="{x}" y="{y + 3}" width="{length}" height="16" fill="{COLORS[i % len(COLORS)]}">'
                f"<title>{escape(summary.model)}: {escape(fmt.format(value))}</title></rect>"
            )
            parts.append(_svg_text(x + length + 6, y + 15, fmt.format(value)))
            y += row_height
        y += 14
    height = y + 4
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">'
    )
    background = f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>'
    return "\n".join([head, f"<title>{escape(title)}</title>", background, *parts, "</svg>"]) + "\n"


def _svg_text(x: float, y: float, text: str, *, size: int = 12, bold: bool = False) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return f'<text x="{x}" y="{y}" font-size="{size}"{weight}>{escape(text)}</text>'


def write_outputs(
    out: Path, summaries: Sequence[ModelSummary], runs: Sequence[BenchRun], tasks: Sequence[str], n: int
) -> list[Path]:
    """bench.csv, bench.json and bench.svg in `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "bench.csv", out / "bench.json", out / "bench.svg"]
    write_csv(paths[0], summaries)
    write_json(paths[1], summaries, runs, tasks, n)
    title = f"hermes-kernel bench: {len(tasks)} task(s) x {n} run(s) per model"
    paths[2].write_text(bench_svg(summaries, title), encoding="utf-8")
    return paths


# -- the command ----------------------------------------------------------------------------------


def bench_command(settings: Settings, args: argparse.Namespace) -> int:
    """`hermes-kernel bench --models m1,m2 --tasks tasks.yaml -n 20 [--prices FILE] [--out DIR]`."""
    models = [name.strip() for name in (args.models or settings.model.name or "").split(",") if name.strip()]
    if not models:
        return _usage_error("name the models to compare: --models m1,m2 (or configure model.name)")
    if args.n < 1:
        return _usage_error("-n must be at least 1")
    try:
        tasks, prices = load_tasks(args.tasks)
        if args.prices:
            prices.update(load_prices(args.prices))
        prices = {**PUBLISHED, **prices}  # a price given for the run wins over the published one
    except CaseError as exc:
        return _usage_error(str(exc))
    models = bench_rows(models, settings)
    progress = Progress({model: len(tasks) * args.n for model in models})
    try:
        runs = asyncio.run(
            run_bench(settings, models, tasks, args.n, concurrency=args.concurrency, progress=progress)
        )
    except ValueError as exc:  # e.g. a model client that cannot be built from the settings
        return _usage_error(str(exc))
    finally:
        progress.finish()
    summaries = summarize(runs, models, prices)
    print(f"bench: {len(tasks)} task(s) x {args.n} run(s) per model ({', '.join(t.name for t in tasks)})")
    print(bench_table(summaries))
    for line in routing_comparison(summaries):
        print(line)
    paths = write_outputs(Path(args.out or DEFAULT_OUT), summaries, runs, [t.name for t in tasks], args.n)
    print("wrote " + ", ".join(str(path) for path in paths))
    return 0


def _usage_error(message: str) -> int:
    from ..kernel.redaction import redact_text

    print(f"hermes-kernel: {redact_text(message)}", file=sys.stderr)
    return 2
