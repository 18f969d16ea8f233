"""In-process overhead per turn: hermes `Agent.run` vs the bare-aiohttp turn, 0 ms model latency.

Both run in this process, sequentially (one turn at a time), against one fake server process,
in alternating blocks after a warm-up; the same Agent / ClientSession is reused throughout.
µs/turn includes the fake server's own time, which is the same for both.
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

TARGET = 1.5


async def measure(url: str, turns: int, block: int, warmup: int) -> dict[str, list[float]]:
    agent = hermes_agent.new_agent(url)
    session = bare_aiohttp.new_session()
    contenders = {
        "hermes": lambda: hermes_agent.turn(agent),
        "bare aiohttp": lambda: bare_aiohttp.turn(session, url),
    }
    per_turn: dict[str, list[float]] = {name: [] for name in contenders}  # one mean per block
    try:
        for name, one_turn in contenders.items():
            for _ in range(warmup):
                assert await one_turn() == hermes_agent.EXPECTED, name
        for i in range(-(-turns // block)):
            for name in list(contenders)[:: 1 if i % 2 == 0 else -1]:
                one_turn = contenders[name]
                started = time.perf_counter()
                for _ in range(block):
                    await one_turn()
                per_turn[name].append((time.perf_counter() - started) / block)
    finally:
        await agent.aclose()
        await session.close()
    return per_turn


def run(turns: int = 400, block: int = 50, warmup: int = 20) -> dict:
    with fake_server(latency=0.0) as url:
        per_turn = asyncio.run(measure(url, turns, block, warmup))
    us = {name: sum(v) / len(v) * 1e6 for name, v in per_turn.items()}
    block_median = {name: median(v) * 1e6 for name, v in per_turn.items()}
    hermes, bare = us["hermes"], us["bare aiohttp"]
    figures = {
        "turns": len(per_turn["hermes"]) * block,
        "us_per_turn": us,
        "block_median_us": block_median,
        "added_us_per_turn": hermes - bare,
        "ratio": ratio(hermes, bare),
    }
    figures["rows"] = [
        row(
            "overhead per turn, in process, 0 ms latency",
            f"{hermes:.0f} µs",
            f"{bare:.0f} µs",
            figures["ratio"],
            TARGET,
        )
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
        }
        for name in figures["us_per_turn"]
    ]
    print(format_table(table, ("client", "mean µs/turn", "median of block means")))
    print(f"hermes adds {figures['added_us_per_turn']:.0f} µs per turn")
    print()
    print(format_table(figures["rows"]))


if __name__ == "__main__":
    main()
