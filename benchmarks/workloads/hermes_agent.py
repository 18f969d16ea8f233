"""One turn with hermes_core: a `@tool` and an `Agent` against an OpenAI-compatible endpoint.

    python hermes_agent.py BASE_URL [CONCURRENT_TURNS] [inline]

prints the reply of the first turn, then one JSON line: turns, seconds and cpu_seconds (wall and
CPU time of the turns only) and maxrss_kb (this process's peak RSS at exit). The Agent has
max_concurrency=1000 so that the client's in-flight cap (default 64) is not what a 500-turn run
measures. With `inline` the tool is declared `@tool(inline=True)`: it runs on the event loop, as
the bare script runs it, instead of on a worker thread.

hermes_core imports aiohttp on its first model call; it is imported up front here, as the bare
script does, so that `seconds` times the turns only in both (the process's total is unchanged).
"""

import asyncio
import json
import resource
import sys
import time

import aiohttp  # noqa: F401  (see the docstring)

from hermes_core import Agent, tool

SYSTEM = "You are a helpful assistant."  # the same as the bare-aiohttp workload
EXPECTED = "done: 3"  # the fake's reply once the tool ran with {"a": 1, "b": 2}


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(name="add", inline=True)
def add_inline(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def new_agent(base_url: str, inline: bool = False) -> Agent:
    return Agent(
        model="m",
        base_url=base_url,
        api_key="x",
        system_prompt=SYSTEM,
        tools=[add_inline if inline else add],
        max_concurrency=1000,
    )


async def turn(agent: Agent, question: str = "what is 1 + 2?") -> str:
    result = await agent.run(question)
    return result.reply


async def main(base_url: str, turns: int, inline: bool = False) -> tuple[list[str], float, float]:
    agent = new_agent(base_url, inline)
    try:
        started, cpu = time.perf_counter(), time.process_time()
        replies = await asyncio.gather(*(turn(agent) for _ in range(turns)))
        return replies, time.perf_counter() - started, time.process_time() - cpu
    finally:
        await agent.aclose()


if __name__ == "__main__":
    turns = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    replies, seconds, cpu_seconds = asyncio.run(main(sys.argv[1], turns, sys.argv[3:4] == ["inline"]))
    if any(reply != EXPECTED for reply in replies):
        sys.exit(f"unexpected replies: {sorted(set(replies) - {EXPECTED})[:3]}")
    print(replies[0])
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"turns": turns, "seconds": seconds, "cpu_seconds": cpu_seconds, "maxrss_kb": maxrss}))
