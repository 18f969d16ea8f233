"""Machine instructions per turn, counted by valgrind: the steady figure of a turn's cost.

CPU time on a shared 2-core machine moves by ±10 % between runs; the number of instructions a
turn executes does not (about ±2 %, from how the replies happen to arrive). Each contender of
bench_overhead.py (bare aiohttp, the guarded floor, hermes with its tool inline, hermes with the
tool on a worker thread) runs sequential turns against the fake server in a process of its own
under `valgrind --tool=callgrind`, once with `--turns` turns after a warm-up and once with the
warm-up only; the difference divided by the turns is what one turn costs. Every thread of the
process is counted (the tool's worker thread too); the fake server runs outside valgrind.

    python benchmarks/bench_instructions.py [--turns 100]
    python benchmarks/bench_instructions.py --concurrent 500

needs valgrind (`apt-get install valgrind`); two contenders run at a time: about 1.5 minutes in all,
3 with `--concurrent 500`.
`--concurrent N` counts N turns `asyncio.gather`-ed in one burst after the warm-up, against a model
of 200 ms as bench_concurrency.py runs them (the same turns, so the same objects alive at once,
and the garbage collector's passes over them counted too).
Instructions are not time: code that runs right after the event loop slept misses the CPU's
caches, and so does a collector's pass over many objects, so the same instructions can cost more
time in one contender than in another (docs/benchmarks.md).
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

CONTENDERS = (
    "bare aiohttp",
    "guarded floor",
    "guarded floor, tool inline",
    "hermes, tool declared inline",
    "hermes",
)
WARMUP = 20
TARGET = 1.3  # the target for client CPU per turn, read here in instructions


async def _turns(url: str, contender: str, turns: int, concurrent: bool) -> None:
    sys.path.insert(0, str(WORKLOADS))
    import bare_aiohttp
    import guarded_aiohttp
    import hermes_agent

    session = bare_aiohttp.new_session()
    agent = hermes_agent.new_agent(url, inline=contender == "hermes, tool declared inline")
    one = {
        "bare aiohttp": lambda: bare_aiohttp.turn(session, url),
        "guarded floor": lambda: guarded_aiohttp.turn(session, url),
        "guarded floor, tool inline": lambda: guarded_aiohttp.turn_inline(session, url),
    }.get(contender, lambda: hermes_agent.turn(agent))
    try:
        for _ in range(WARMUP + (0 if concurrent else turns)):
            assert await one() == hermes_agent.EXPECTED
        if concurrent:
            replies = await asyncio.gather(*(one() for _ in range(turns)))
            assert set(replies) <= {hermes_agent.EXPECTED}
    finally:
        await session.close()
        await agent.aclose()


def _collected(url: str, contender: str, turns: int, concurrent: bool) -> int:
    """Instructions valgrind counted for the whole process: start-up, warm-up and `turns` turns."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
    command += [__file__, "--run", url, contender, str(turns), "concurrent" if concurrent else "sequential"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{contender}: valgrind failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def run(turns: int = 100, concurrent: bool = False) -> dict[str, float]:
    """Instructions per turn of each contender: `turns` one after the other, or in one burst."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    with fake_server(latency=0.2 if concurrent else 0.0) as url, ThreadPoolExecutor(max_workers=2) as pool:
        jobs = {
            c: (
                pool.submit(_collected, url, c, turns, concurrent),
                pool.submit(_collected, url, c, 0, concurrent),
            )
            for c in CONTENDERS
        }
        return {c: (full.result() - base.result()) / turns for c, (full, base) in jobs.items()}


def smoke(turns: int) -> None:
    """Each contender's turns in this process, without valgrind: the code runs, no figures (the
    quick run CI makes of every benchmark, tests/test_benchmarks_quick.py)."""
    with fake_server(latency=0.0) as url:
        for contender in CONTENDERS:
            asyncio.run(_turns(url, contender, turns, False))
    print(f"smoke: {len(CONTENDERS)} contenders ran {WARMUP} + {turns} turns each, without valgrind")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100, help="measured turns of each contender")
    parser.add_argument("--concurrent", type=int, metavar="N", help="N turns in one burst instead")
    parser.add_argument(
        "--smoke", action="store_true", help="run each contender briefly, no valgrind, no figures"
    )
    parser.add_argument(
        "--run", nargs=4, metavar=("URL", "CONTENDER", "TURNS", "HOW"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.run:  # one contender's process, under valgrind
        url, contender, turns, how = args.run
        asyncio.run(_turns(url, contender, int(turns), how == "concurrent"))
        return
    if args.smoke:
        smoke(args.turns)
        return
    turns = args.concurrent or args.turns
    per_turn = run(turns, concurrent=bool(args.concurrent))
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
    if args.concurrent:
        print(f"{turns} concurrent turns of each, 200 ms model, after {WARMUP} unmeasured, under valgrind")
    else:
        print(f"sequential turns, {turns} of each after {WARMUP} unmeasured, under valgrind")
    print(format_table(rows, ("contender", "instructions per turn", "vs bare aiohttp", "target")))


if __name__ == "__main__":
    main()
