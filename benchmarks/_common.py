"""Shared helpers of the benchmarks: the fake server process, statistics, timed subprocesses.

Every benchmark starts its own fake OpenAI-compatible server in a separate process (so the
client under test never shares an event loop or a GIL with it) and stops it even on errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
WORKLOADS = BENCH_DIR / "workloads"
TOOL_ARGS = '{"a": 1, "b": 2}'


@contextlib.contextmanager
def fake_server(latency: float = 0.0, tool_args: str = TOOL_ARGS) -> Iterator[str]:
    """Run `python -m hermes_core.testing.fake_openai` and yield its base URL."""
    command = [sys.executable, "-m", "hermes_core.testing.fake_openai", "--port", "0"]
    command += ["--latency", str(latency), "--tool-args", tool_args]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline().strip() if process.stdout else ""
        if not line.startswith("READY "):
            raise RuntimeError(f"fake server did not start (exit code {process.poll()}): {line!r}")
        yield line.split(" ", 1)[1]
    finally:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0–100), linear interpolation between closest ranks."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * p / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def timed_run(command: Sequence[str], cwd: str | Path | None = None) -> tuple[float, str]:
    """Run a command to completion; return (wall seconds, stdout). Fails loudly on a non-zero exit."""
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command))} failed ({done.returncode}):\n{done.stderr}")
    return elapsed, done.stdout


def run_workload(script: str, *args: str) -> tuple[float, dict]:
    """Run `workloads/<script>` in a fresh interpreter; return (wall seconds, its JSON report).

    The workload prints its own report as the last line of stdout, including `maxrss_kb` (its
    own `ru_maxrss` at exit), so peak memory is that one process's, not a mix of children.
    """
    elapsed, stdout = timed_run([sys.executable, str(WORKLOADS / script), *args], cwd=BENCH_DIR)
    return elapsed, json.loads(stdout.strip().splitlines()[-1])


def ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline else float("nan")


def row(metric: str, hermes: str, baseline: str, value: float, target: float | None, unit: str = "") -> dict:
    """One line of a summary table. `value` is compared with `target`: the hermes/baseline ratio,
    or, with a `unit`, an absolute figure (then shown in the hermes column, not as a ratio).
    A `target` of None: a figure shown for reference, with nothing to meet."""
    return {
        "metric": metric,
        "hermes": hermes,
        "baseline": baseline,
        "ratio": "" if unit else f"{value:.2f}",
        "target": "" if target is None else f"<= {target:g}{unit}",
        "ok": "" if target is None else ("yes" if value <= target else "NO"),
    }


COLUMNS = ("metric", "hermes", "baseline", "ratio", "target", "ok")


def format_table(rows: Sequence[dict], columns: Sequence[str] = COLUMNS) -> str:
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += [
        "  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths, strict=True)) for r in rows
    ]
    return "\n".join(lines)


def markdown_table(rows: Sequence[dict], columns: Sequence[str] = COLUMNS) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def machine() -> str:
    return f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {sys.platform}"
