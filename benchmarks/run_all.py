"""Run every benchmark, print one summary table, write it to benchmarks/results/latest.md.

    python benchmarks/run_all.py [--quick | --smoke] [--gateway]

--quick runs fewer repetitions (still at the minimums the benchmarks ask for). --smoke runs each
benchmark a few iterations only, to show that it runs (its figures mean nothing, nothing is
written): CI runs it so, with every other script (tests/test_benchmarks_quick.py). --gateway adds the
gateway benchmark (a real `hermes-kernel serve` process, ~2 min: Feishu ack latency under load and
draining 1,000 conversations, whose replies are paced by the send rate limits).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_concurrency  # noqa: E402
import bench_gateway  # noqa: E402
import bench_import  # noqa: E402
import bench_install_size  # noqa: E402
import bench_one_turn_process  # noqa: E402
import bench_overhead  # noqa: E402
import bench_routing  # noqa: E402
from _common import BENCH_DIR, format_table, machine, markdown_table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="minimum repetitions")
    parser.add_argument("--smoke", action="store_true", help="a few iterations, no figures kept")
    parser.add_argument("--gateway", action="store_true", help="also the gateway benchmark (~2 min)")
    args = parser.parse_args()

    def runs(full: int, quick: int, smoke: int) -> int:
        return smoke if args.smoke else quick if args.quick else full

    benchmarks = {
        "import": lambda: bench_import.run(runs=runs(11, 7, 2)),
        "one turn, process": lambda: bench_one_turn_process.run(runs=runs(15, 10, 2)),
        "overhead": lambda: bench_overhead.run(turns=runs(1000, 200, 20)),
        "concurrency": lambda: bench_concurrency.run(runs=runs(7, 3, 1), turns=runs(500, 500, 50)),
        "install size": bench_install_size.run,
        "tool routing": lambda: bench_routing.run(repeats=runs(200, 50, 2)),
    }
    if args.smoke:  # a minute of pip; the quick run of bench_install_size.py itself covers it
        del benchmarks["install size"]
    if args.gateway:
        benchmarks["gateway"] = bench_gateway.run
    started = time.perf_counter()
    rows, seconds = [], {}
    for name, run in benchmarks.items():
        print(f"running {name} …", flush=True)
        began = time.perf_counter()
        rows += run()["rows"]
        seconds[name] = time.perf_counter() - began
    total = time.perf_counter() - started

    durations = ", ".join(f"{name} {s:.0f} s" for name, s in seconds.items())
    notes = [
        f"{machine()}; total {total:.0f} s ({durations}).",
        "Ratios are hermes / baseline, measured side by side in the same run; 'bare aiohttp' is a",
        "no-framework script making the same two POSTs with one aiohttp.ClientSession.",
        "Concurrency: Agent(max_concurrency=1000), bare TCPConnector(limit=1000).",
    ]
    if args.gateway:
        notes.append(
            "Gateway: `hermes-kernel serve` + fake model + FakeFeishu, encrypted and signed pushes; ack "
            'baseline is a bare aiohttp.web endpoint answering {"msg": "success"}; drain ideals '
            "are model calls x latency x waves, and the gateway's own send limiter schedule."
        )
    print()
    print(format_table(rows))
    print()
    print("\n".join(notes))
    if args.smoke:
        return
    results = BENCH_DIR / "results"
    results.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    text = f"# hermes_core benchmarks ({stamp})\n\n{markdown_table(rows)}\n\n" + " ".join(notes) + "\n"
    (results / "latest.md").write_text(text, encoding="utf-8")
    print(f"written to {(results / 'latest.md').relative_to(BENCH_DIR.parent)}")


if __name__ == "__main__":
    main()
