"""In-process overhead per turn: hermes `Agent.run` vs the bare-aiohttp turn, 0 ms model latency.

Both run in this process, sequentially (one turn at a time), against one fake server process,
in alternating blocks after a warm-up; the same Agent / ClientSession is reused throughout.
Two figures per turn: wall µs/turn, which includes the fake server's own time (the same for
both), and client CPU µs/turn (`time.process_time` of this process: the fake server's CPU is
not in it), which is what the client itself costs.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from _common import WORKLOADS, fake_server, format_table, median, ratio, row

sys.path.insert(0, str(WORKLOADS))
import bare_aiohttp  # noqa: E402
import hermes_agent  # noqa: E402

TARGET = 1.5  # wall time per turn
CPU_TARGET = 1.3  # client CPU per turn


async def measure(
    url: str, turns: int, block: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    agent = hermes_agent.new_agent(url)
    session = bare_aiohttp.new_session()
    contenders = {
        "hermes": lambda: hermes_agent.turn(agent),
        "bare aiohttp": lambda: bare_aiohttp.turn(session, url),
    }
    per_turn: dict[str, list[float]] = {name: [] for name in contenders}  # one mean per block
    cpu_per_turn: dict[str, list[float]] = {name: [] for name in contenders}
    try:
        for name, one_turn in contenders.items():
            for _ in range(warmup):
                assert await one_turn() == hermes_agent.EXPECTED, name
        for i in range(-(-turns // block)):
            for name in list(contenders)[:: 1 if i % 2 == 0 else -1]:
                one_turn = contenders[name]
                started, cpu = time.perf_counter(), time.process_time()
                for _ in range(block):
                    await one_turn()
                per_turn[name].append((time.perf_counter() - started) / block)
                cpu_per_turn[name].append((time.process_time() - cpu) / block)
    finally:
        await agent.aclose()
        await session.close()
    return per_turn, cpu_per_turn


def run(turns: int = 400, block: int = 50, warmup: int = 20) -> dict:
    with fake_server(latency=0.0) as url:
        per_turn, cpu_per_turn = asyncio.run(measure(url, turns, block, warmup))
    us = {name: sum(v) / len(v) * 1e6 for name, v in per_turn.items()}
    block_median = {name: median(v) * 1e6 for name, v in per_turn.items()}
    cpu_us = {name: median(v) * 1e6 for name, v in cpu_per_turn.items()}  # median of the blocks
    hermes, bare = us["hermes"], us["bare aiohttp"]
    figures = {
        "turns": len(per_turn["hermes"]) * block,
        "us_per_turn": us,
        "block_median_us": block_median,
        "cpu_us_per_turn": cpu_us,
        "added_us_per_turn": hermes - bare,
        "added_cpu_us_per_turn": cpu_us["hermes"] - cpu_us["bare aiohttp"],
        "ratio": ratio(hermes, bare),
        "ratio_cpu": ratio(cpu_us["hermes"], cpu_us["bare aiohttp"]),
    }
    figures["rows"] = [
        row(
            "overhead per turn, in process, 0 ms latency",
            f"{hermes:.0f} µs",
            f"{bare:.0f} µs",
            figures["ratio"],
            TARGET,
        ),
        row(
            "client CPU per turn, in process, 0 ms latency",
            f"{cpu_us['hermes']:.0f} µs",
            f"{cpu_us['bare aiohttp']:.0f} µs",
            figures["ratio_cpu"],
            CPU_TARGET,
        ),
    ]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400, help="measured turns of each (>= 200)")
    parser.add_argument("--block", type=int, default=50, help="turns per alternating block")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured turns of each first")
    args = parser.parse_args()
    figures = run(args.turns, args.block, args.warmup)
    print(f"sequential turns in one process, {figures['turns']} each in alternating blocks of {args.block}")
    table = [
        {
            "client": name,
            "mean µs/turn": f"{figures['us_per_turn'][name]:.0f}",
            "median of block means": f"{figures['block_median_us'][name]:.0f}",
            "client CPU µs/turn": f"{figures['cpu_us_per_turn'][name]:.0f}",
        }
        for name in figures["us_per_turn"]
    ]
    print(format_table(table, ("client", "mean µs/turn", "median of block means", "client CPU µs/turn")))
    print(
        f"hermes adds {figures['added_us_per_turn']:.0f} µs per turn "
        f"({figures['added_cpu_us_per_turn']:.0f} µs of client CPU)"
    )
    print()
    print(format_table(figures["rows"]))


if __name__ == "__main__":
    main()
