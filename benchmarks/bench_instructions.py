"""Machine instructions per turn, counted by valgrind: the steady figure of a turn's cost.

CPU time on a shared 2-core machine moves by ±10 % between runs; the number of instructions a
turn executes does not (about ±2 %, from how the replies happen to arrive). Each contender of
bench_overhead.py (bare aiohttp, the guarded floor, hermes with its tool inline, hermes with the
tool on a worker thread) runs sequential turns against the fake server in a process of its own
under `valgrind --tool=callgrind`, once with `--turns` turns after a warm-up and once with the
warm-up only; the difference divided by the turns is what one turn costs. Every thread of the
process is counted (the tool's worker thread too); the fake server runs outside valgrind.

    python benchmarks/bench_instructions.py [--turns 100]

needs valgrind (`apt-get install valgrind`); two contenders run at a time, about 3 minutes in all.
Instructions are not time: code that runs right after the event loop slept misses the CPU's
caches, so a cut in instructions shows in CPU time smaller than it is (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from _common import WORKLOADS, fake_server, format_table, ratio

CONTENDERS = ("bare aiohttp", "guarded floor", "hermes, tool declared inline", "hermes")
WARMUP = 20
TARGET = 1.3  # the target for client CPU per turn, read here in instructions


async def _turns(url: str, contender: str, turns: int) -> None:
    sys.path.insert(0, str(WORKLOADS))
    import bare_aiohttp
    import guarded_aiohttp
    import hermes_agent

    session = bare_aiohttp.new_session()
    agent = hermes_agent.new_agent(url, inline=contender == "hermes, tool declared inline")
    one = {
        "bare aiohttp": lambda: bare_aiohttp.turn(session, url),
        "guarded floor": lambda: guarded_aiohttp.turn(session, url),
    }.get(contender, lambda: hermes_agent.turn(agent))
    try:
        for _ in range(WARMUP + turns):
            assert await one() == hermes_agent.EXPECTED
    finally:
        await session.close()
        await agent.aclose()


def _collected(url: str, contender: str, turns: int) -> int:
    """Instructions valgrind counted for the whole process: start-up, warm-up and `turns` turns."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
    command += [__file__, "--run", url, contender, str(turns)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{contender}: valgrind failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def run(turns: int = 100) -> dict[str, float]:
    """Instructions per turn of each contender."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    with fake_server(latency=0.0) as url, ThreadPoolExecutor(max_workers=2) as pool:
        jobs = {
            c: (pool.submit(_collected, url, c, turns), pool.submit(_collected, url, c, 0))
            for c in CONTENDERS
        }
        return {c: (full.result() - base.result()) / turns for c, (full, base) in jobs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100, help="measured turns of each contender")
    parser.add_argument("--run", nargs=3, metavar=("URL", "CONTENDER", "TURNS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:  # one contender's process, under valgrind
        url, contender, turns = args.run
        asyncio.run(_turns(url, contender, int(turns)))
        return
    per_turn = run(args.turns)
    bare = per_turn["bare aiohttp"]
    rows = [
        {
            "contender": name,
            "instructions per turn": f"{count:,.0f}",
            "vs bare aiohttp": f"{ratio(count, bare):.2f}",
            "target": f"<= {TARGET}" if name.startswith("hermes") else "",
        }
        for name, count in per_turn.items()
    ]
    print(f"sequential turns, {args.turns} of each after {WARMUP} unmeasured, under valgrind")
    print(format_table(rows, ("contender", "instructions per turn", "vs bare aiohttp", "target")))


if __name__ == "__main__":
    main()
