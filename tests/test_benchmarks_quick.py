"""Every script in benchmarks/ runs here, briefly, so that none of them can rot unnoticed.

Each runs as its own process with a few iterations (`QUICK`); no figure is asserted — a benchmark's
figures come from a quiet machine and a full run (docs/benchmarks.md) — only that it finishes
without an error and prints its report. A new script without a line in `QUICK` fails the first
test. (Two of them had crashed unseen: bench_gateway.py formatted an unset send rate, bench_fuzz.py
asked hypothesis for zero examples when its corpus covered a short run; bench_schedule.py's warm-up
waited 60 s for replies it never counted.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
pytestmark = pytest.mark.slow

# script -> the arguments of a quick run (seconds, not minutes)
QUICK: dict[str, list[str]] = {
    "bench_ack_load": [
        "--rate",
        "20",
        "--seconds",
        "1",
        "--backlog",
        "20",
        "--quiet-rate",
        "5",
        "--quiet-seconds",
        "1",
    ],  # fmt: skip
    "bench_concurrency": ["--runs", "1", "--turns", "20", "--latency", "0.05"],
    "bench_conversation_cost": ["--turns", "3"],  # without --peers: installing them needs the network
    "bench_crash_soak": ["--kills", "2"],
    "bench_feishu_streams": ["--streams", "1,2", "--chars", "60", "--chunk-delay", "0.005"],
    "bench_fuzz": ["--requests", "100", "--rounds", "2"],
    "bench_gateway": ["--rate", "20", "--seconds", "2", "--chats", "10", "--conversations", "20"],
    "bench_import": ["--runs", "2"],
    "bench_install_size": [],
    "bench_instructions": ["--smoke", "--turns", "2"],  # valgrind's counts take minutes: the code only
    "bench_media": ["--runs", "1"],
    "bench_one_turn_process": ["--runs", "2"],
    "bench_overhead": ["--turns", "20", "--block", "10", "--warmup", "2"],
    "bench_plan_vs_loop": ["--latency", "0.02", "--tool-seconds", "0.01", "--runs", "1"],
    "bench_prompt_bytes": ["--appends", "20"],
    "bench_routing": ["--repeats", "2"],
    "bench_schedule": ["--jobs", "20", "--rate", "5", "--seconds", "1", "--latency", "0.01"],
    "bench_schema_validation": ["--rounds", "1"],
    "bench_send_pacing": ["--replies", "10", "--chats", "3"],
    "bench_stream": ["--lengths", "60", "--chunk-delay", "0.005"],
    "bench_temporal": [
        "--messages",
        "6",
        "--chats",
        "2",
        "--kills",
        "1",
        "--turns",
        "10",
        "--workers",
        "1",
        "--ack-rate",
        "20",
    ],  # fmt: skip
    "bench_textcalls": ["--number", "50"],
    "bench_textcall_parse": ["--size", "20000", "--runs", "1", "--formats", "hermes", "kimi_k2"],
    "run_all": ["--smoke"],
}


def test_every_script_has_a_quick_run() -> None:
    scripts = {path.stem for path in BENCHMARKS.glob("*.py") if not path.stem.startswith("_")}
    assert scripts == set(QUICK), f"scripts without a quick run: {sorted(scripts - set(QUICK))}"


@pytest.mark.parametrize("script", sorted(QUICK))
def test_the_benchmark_runs(script: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FEISHU_"))}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{script}.py"), *QUICK[script]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    if script == "bench_temporal" and "no `temporal` binary" in output:
        pytest.skip("the Temporal dev server is not installed (.ci/run installs it)")
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
    assert done.stdout.strip(), output[-4000:]  # it printed its report
