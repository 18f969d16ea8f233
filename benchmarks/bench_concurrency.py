"""500 concurrent turns at 200 ms model latency: wall time and peak RSS, hermes vs bare aiohttp.

Each run is a fresh subprocess (`workloads/*.py URL 500`) that reports the wall and CPU time of
its 500 `asyncio.gather`-ed turns and its own peak RSS (`ru_maxrss`), so memory is isolated per run.
Two round trips of 0.2 s make the ideal ~0.4 s. The Agent is built with max_concurrency=1000
(its aiohttp connector limit follows it), the bare session with TCPConnector(limit=1000), so
neither the client's in-flight cap (default 64) nor a connection pool limit is what is measured.
A second hermes process declares its tool `@tool(inline=True)` (it runs on the event loop, as the
bare script runs it). The guarded floor (workloads/guarded_aiohttp.py, bench_overhead.py says what
it keeps) is shown for reference: hermes against it is the kernel's own cost; the same floor with
its tool on the event loop is the inline contender's.
"""

from __future__ import annotations

import argparse

from _common import fake_server, format_table, median, ratio, row, run_workload

TARGETS = {"wall": 1.2, "rss": 1.3, "cpu": 1.3}
SCRIPTS = {  # name: the workload and its arguments after URL TURNS
    "hermes": ("hermes_agent.py",),
    "hermes, tool declared inline": ("hermes_agent.py", "inline"),
    "bare aiohttp": ("bare_aiohttp.py",),
    "guarded floor": ("guarded_aiohttp.py",),
    "guarded floor, tool inline": ("guarded_aiohttp.py", "inline"),
}


def run(runs: int = 5, turns: int = 500, latency: float = 0.2) -> dict:
    wall: dict[str, list[float]] = {name: [] for name in SCRIPTS}
    rss: dict[str, list[float]] = {name: [] for name in SCRIPTS}
    cpu: dict[str, list[float]] = {name: [] for name in SCRIPTS}
    with fake_server(latency=latency) as url:
        for script, *extra in SCRIPTS.values():  # untimed: .pyc files, the fake's first burst
            run_workload(script, url, str(turns), *extra)
        for i in range(runs):
            for name in list(SCRIPTS)[:: 1 if i % 2 == 0 else -1]:
                script, *extra = SCRIPTS[name]
                _, report = run_workload(script, url, str(turns), *extra)
                wall[name].append(report["seconds"])
                rss[name].append(report["maxrss_kb"] / 1024)
                cpu[name].append(report["cpu_seconds"])
    figures = {
        "runs": runs,
        "turns": turns,
        "latency_s": latency,
        "ideal_s": 2 * latency,
        "wall_s": {name: median(v) for name, v in wall.items()},
        "peak_rss_mb": {name: median(v) for name, v in rss.items()},
        "client_cpu_s": {name: median(v) for name, v in cpu.items()},
        "max_concurrency": 1000,
    }
    figures["ratio_wall"] = ratio(figures["wall_s"]["hermes"], figures["wall_s"]["bare aiohttp"])
    figures["ratio_rss"] = ratio(figures["peak_rss_mb"]["hermes"], figures["peak_rss_mb"]["bare aiohttp"])
    figures["ratio_cpu"] = ratio(figures["client_cpu_s"]["hermes"], figures["client_cpu_s"]["bare aiohttp"])
    w, m, c = figures["wall_s"], figures["peak_rss_mb"], figures["client_cpu_s"]
    label = f"{turns} concurrent turns, {latency * 1e3:.0f} ms latency"
    figures["rows"] = [
        row(
            f"{label}: wall",
            f"{w['hermes']:.2f} s",
            f"{w['bare aiohttp']:.2f} s",
            figures["ratio_wall"],
            TARGETS["wall"],
        ),
        row(
            f"{label}: peak RSS",
            f"{m['hermes']:.1f} MB",
            f"{m['bare aiohttp']:.1f} MB",
            figures["ratio_rss"],
            TARGETS["rss"],
        ),
        row(
            f"{label}: client CPU",
            f"{c['hermes']:.2f} s",
            f"{c['bare aiohttp']:.2f} s",
            figures["ratio_cpu"],
            TARGETS["cpu"],
        ),
        row(
            f"{label}: wall, the tool declared inline",
            f"{w['hermes, tool declared inline']:.2f} s",
            f"{w['bare aiohttp']:.2f} s",
            ratio(w["hermes, tool declared inline"], w["bare aiohttp"]),
            TARGETS["wall"],
        ),
        row(
            f"{label}: client CPU, the tool declared inline",
            f"{c['hermes, tool declared inline']:.2f} s",
            f"{c['bare aiohttp']:.2f} s",
            ratio(c["hermes, tool declared inline"], c["bare aiohttp"]),
            TARGETS["cpu"],
        ),
        row(
            f"{label}: wall, hermes vs the guarded floor",
            f"{w['hermes']:.2f} s",
            f"{w['guarded floor']:.2f} s",
            ratio(w["hermes"], w["guarded floor"]),
            None,
        ),
        row(
            f"{label}: client CPU, hermes vs the guarded floor",
            f"{c['hermes']:.2f} s",
            f"{c['guarded floor']:.2f} s",
            ratio(c["hermes"], c["guarded floor"]),
            None,
        ),
        row(
            f"{label}: client CPU, hermes inline vs the floor with the tool inline",
            f"{c['hermes, tool declared inline']:.2f} s",
            f"{c['guarded floor, tool inline']:.2f} s",
            ratio(c["hermes, tool declared inline"], c["guarded floor, tool inline"]),
            None,
        ),
    ]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="fresh processes of each (>= 3)")
    parser.add_argument("--turns", type=int, default=500, help="concurrent turns per process")
    parser.add_argument("--latency", type=float, default=0.2, help="the fake server's latency, seconds")
    args = parser.parse_args()
    figures = run(args.runs, args.turns, args.latency)
    print(
        f"{figures['turns']} concurrent turns, latency {figures['latency_s']} s "
        f"(ideal ~{figures['ideal_s']:.1f} s), median of {figures['runs']} fresh processes each, "
        f"alternating; hermes Agent(max_concurrency={figures['max_concurrency']})"
    )
    table = [
        {
            "client": name,
            "wall": f"{figures['wall_s'][name]:.3f} s",
            "client CPU": f"{figures['client_cpu_s'][name]:.3f} s",
            "peak RSS": f"{figures['peak_rss_mb'][name]:.1f} MB",
        }
        for name in SCRIPTS
    ]
    print(format_table(table, ("client", "wall", "client CPU", "peak RSS")))
    print()
    print(format_table(figures["rows"]))


if __name__ == "__main__":
    main()
