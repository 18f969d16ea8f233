"""In-process overhead per turn: hermes `Agent.run` vs the bare-aiohttp turn, 0 ms model latency.

Both run in this process, sequentially (one turn at a time), against one fake server process,
in alternating blocks after a warm-up; the same Agent / ClientSession is reused throughout.
Two figures per turn: wall µs/turn, which includes the fake server's own time (the same for
both), and client CPU µs/turn (`time.process_time` of this process: the fake server's CPU is
not in it), which is what the client itself costs.

The hermes turn runs its sync tool on a worker thread, as every sync tool runs unless declared
otherwise; a second hermes contender declares it `@tool(inline=True)`, so that it runs on the event
loop as the bare script runs it (kernel/tools/registry.py says when that is safe).

A third contender, the guarded floor (workloads/guarded_aiohttp.py), is bare aiohttp plus the
least code that keeps the kernel's guarantees (arguments validated, the sync tool on a worker
thread, texts redacted): hermes against it is the kernel's own cost. The same floor with the tool
called on the event loop is the floor of the inline contender: the guarantees without the hop.
`--stages` also prints the
turn built up one layer at a time (raw client, + tool registry, + loop, + model stack, `Agent.run`),
each layer's CPU per turn measured in the same alternating blocks: where a turn's cost lies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable

from _common import WORKLOADS, fake_server, format_table, median, ratio, row

sys.path.insert(0, str(WORKLOADS))
import bare_aiohttp  # noqa: E402
import guarded_aiohttp  # noqa: E402
import hermes_agent  # noqa: E402

TARGET = 1.5  # wall time per turn
CPU_TARGET = 1.3  # client CPU per turn


def stages(url: str) -> tuple[dict[str, Callable[[], Awaitable[str]]], Callable[[], Awaitable[None]]]:
    """The turn built up one layer at a time, with an async copy of the tool (no thread hop)
    except in the last stage, which is the hermes contender itself."""
    from hermes_core import tool
    from hermes_core.kernel.loop import run_loop

    @tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    agent = hermes_agent.new_agent(url)
    agent.registry.remove("add")
    agent.register_tool(add)
    stack, registry = agent.client, agent.registry
    raw = stack
    while getattr(raw, "inner", None) is not None:
        raw = raw.inner  # type: ignore[attr-defined]
    schemas = registry.schemas()

    def opening() -> list[dict]:
        return [
            {"role": "system", "content": hermes_agent.SYSTEM},
            {"role": "user", "content": "what is 1 + 2?"},
        ]

    async def by_hand(execute: bool) -> str:
        messages = opening()
        response = await raw.complete(messages, schemas)
        messages.append(response.to_message())
        for call in response.tool_calls:
            if execute:
                messages.append((await registry.execute(call)).to_message())
            else:
                result = await add.handler(**json.loads(call.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
        return (await raw.complete(messages, schemas)).content or ""

    async def looped(client: object) -> str:
        return (await run_loop(client, registry, opening(), agent.limits, "en", task_id="t")).reply  # type: ignore[arg-type]

    async def whole() -> str:
        return (await agent.run("what is 1 + 2?")).reply

    layers = {
        "raw model client, tool by hand": lambda: by_hand(False),
        "+ tool registry (execute)": lambda: by_hand(True),
        "+ loop (run_loop, raw client)": lambda: looped(raw),
        "+ model stack (redaction, text calls)": lambda: looped(stack),
        "+ Agent.run (async tool)": whole,
    }
    return layers, agent.aclose


async def measure(
    url: str, turns: int, block: int, warmup: int, with_stages: bool = False
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    agent, inline_agent = hermes_agent.new_agent(url), hermes_agent.new_agent(url, inline=True)
    session = bare_aiohttp.new_session()
    contenders: dict[str, Callable[[], Awaitable[str]]] = {
        "hermes": lambda: hermes_agent.turn(agent),
        "hermes, tool declared inline": lambda: hermes_agent.turn(inline_agent),
        "bare aiohttp": lambda: bare_aiohttp.turn(session, url),
        "guarded floor": lambda: guarded_aiohttp.turn(session, url),
        "guarded floor, tool inline": lambda: guarded_aiohttp.turn_inline(session, url),
    }
    close_stages = None
    if with_stages:
        layers, close_stages = stages(url)
        contenders.update(layers)
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
        await inline_agent.aclose()
        await session.close()
        if close_stages is not None:
            await close_stages()
    return per_turn, cpu_per_turn


def run(turns: int = 400, block: int = 50, warmup: int = 20, with_stages: bool = False) -> dict:
    with fake_server(latency=0.0) as url:
        per_turn, cpu_per_turn = asyncio.run(measure(url, turns, block, warmup, with_stages))
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
        "ratio_cpu_inline": ratio(cpu_us["hermes, tool declared inline"], cpu_us["bare aiohttp"]),
        "ratio_cpu_guarded": ratio(cpu_us["guarded floor"], cpu_us["bare aiohttp"]),
        "ratio_cpu_vs_guarded": ratio(cpu_us["hermes"], cpu_us["guarded floor"]),
        "ratio_cpu_guarded_inline": ratio(cpu_us["guarded floor, tool inline"], cpu_us["bare aiohttp"]),
        "ratio_cpu_inline_vs_guarded_inline": ratio(
            cpu_us["hermes, tool declared inline"], cpu_us["guarded floor, tool inline"]
        ),
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
        row(
            "client CPU per turn, the tool declared inline (as bare runs it)",
            f"{cpu_us['hermes, tool declared inline']:.0f} µs",
            f"{cpu_us['bare aiohttp']:.0f} µs",
            figures["ratio_cpu_inline"],
            CPU_TARGET,
        ),
        row(
            "client CPU per turn, the guarded floor",
            f"{cpu_us['guarded floor']:.0f} µs",
            f"{cpu_us['bare aiohttp']:.0f} µs",
            figures["ratio_cpu_guarded"],
            None,
        ),
        row(
            "client CPU per turn, hermes vs the guarded floor",
            f"{cpu_us['hermes']:.0f} µs",
            f"{cpu_us['guarded floor']:.0f} µs",
            figures["ratio_cpu_vs_guarded"],
            None,
        ),
        row(
            "client CPU per turn, the guarded floor with the tool inline",
            f"{cpu_us['guarded floor, tool inline']:.0f} µs",
            f"{cpu_us['bare aiohttp']:.0f} µs",
            figures["ratio_cpu_guarded_inline"],
            None,
        ),
        row(
            "client CPU per turn, hermes inline vs that floor",
            f"{cpu_us['hermes, tool declared inline']:.0f} µs",
            f"{cpu_us['guarded floor, tool inline']:.0f} µs",
            figures["ratio_cpu_inline_vs_guarded_inline"],
            None,
        ),
    ]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400, help="measured turns of each (>= 200)")
    parser.add_argument("--block", type=int, default=50, help="turns per alternating block")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured turns of each first")
    parser.add_argument("--stages", action="store_true", help="also the turn built up one layer at a time")
    args = parser.parse_args()
    figures = run(args.turns, args.block, args.warmup, args.stages)
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
