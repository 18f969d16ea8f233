"""One turn as a whole process: `workloads/hermes_agent.py` vs `workloads/bare_aiohttp.py`.

Each run is a fresh interpreter that imports its libraries, declares the `add` tool and runs one
turn (2 model calls + 1 tool call) against the fake server (0 latency), then exits. Wall time of
the whole process; the two scripts alternate.
"""

from __future__ import annotations

import argparse

from _common import fake_server, format_table, median, percentile, ratio, row, run_workload

TARGET = 1.3
SCRIPTS = {
    "hermes": "hermes_agent.py",
    "bare aiohttp": "bare_aiohttp.py",
    "bare aiohttp + import pydantic": "bare_aiohttp_pydantic.py",
}


def run(runs: int = 11) -> dict:
    wall: dict[str, list[float]] = {name: [] for name in SCRIPTS}
    in_turn: dict[str, list[float]] = {name: [] for name in SCRIPTS}
    with fake_server(latency=0.0) as url:
        for script in SCRIPTS.values():  # untimed: .pyc files, the fake's first connection
            run_workload(script, url)
        for i in range(runs):
            for name in list(SCRIPTS)[:: 1 if i % 2 == 0 else -1]:
                seconds, report = run_workload(SCRIPTS[name], url)
                wall[name].append(seconds)
                in_turn[name].append(report["seconds"])
    figures = {
        "runs": runs,
        "wall_median_s": {name: median(v) for name, v in wall.items()},
        "wall_p90_s": {name: percentile(v, 90) for name, v in wall.items()},
        "turn_median_s": {name: median(v) for name, v in in_turn.items()},
    }
    hermes, bare = figures["wall_median_s"]["hermes"], figures["wall_median_s"]["bare aiohttp"]
    figures["ratio"] = ratio(hermes, bare)
    with_pydantic = figures["wall_median_s"]["bare aiohttp + import pydantic"]
    figures["ratio_vs_pydantic_floor"] = ratio(hermes, with_pydantic)
    figures["rows"] = [
        row(
            "one turn, whole process (wall)",
            f"{hermes * 1e3:.0f} ms",
            f"{bare * 1e3:.0f} ms",
            figures["ratio"],
            TARGET,
        ),
        row(
            "  same, vs bare aiohttp + import pydantic",
            f"{hermes * 1e3:.0f} ms",
            f"{with_pydantic * 1e3:.0f} ms",
            figures["ratio_vs_pydantic_floor"],
            TARGET,
        ),
    ]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11, help="runs of each script (>= 10)")
    figures = run(parser.parse_args().runs)
    runs = figures["runs"]
    print(f"one turn (2 model calls + 1 tool call), whole process, median of {runs} alternating runs")
    table = [
        {
            "script": name,
            "process median": f"{figures['wall_median_s'][name] * 1e3:.0f} ms",
            "process p90": f"{figures['wall_p90_s'][name] * 1e3:.0f} ms",
            "turn itself (median)": f"{figures['turn_median_s'][name] * 1e3:.1f} ms",
        }
        for name in SCRIPTS
    ]
    print(format_table(table, ("script", "process median", "process p90", "turn itself (median)")))
    print()
    print(format_table(figures["rows"]))


if __name__ == "__main__":
    main()
