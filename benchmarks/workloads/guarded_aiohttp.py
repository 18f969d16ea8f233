"""The floor with the kernel's guarantees: bare aiohttp plus only what a turn must do safely.

The same two POSTs as bare_aiohttp.py, and in between the least code that keeps the guarantees
the kernel gives every turn (docs/benchmarks.md): the arguments validated by a pydantic model,
the sync tool run on a worker thread (a tool that hangs must not hold the event loop), and every
text that goes to the model or comes back passed through a secret pattern. No loop, guards,
hooks, permissions or fallbacks: what is left between hermes and this line is the kernel's own.

    python guarded_aiohttp.py BASE_URL [CONCURRENT_TURNS] [inline]

prints the reply of the first turn, then one JSON line as bare_aiohttp.py does. With `inline` the
tool is called on the event loop, as the bare script calls it: the floor of hermes' contender
whose tool is declared `@tool(inline=True)`, the same guarantees but the hop.
"""

import asyncio
import functools
import json
import queue
import re
import threading

import aiohttp
from bare_aiohttp import ADD_SCHEMA, EXPECTED, SYSTEM, add, report  # noqa: F401  (EXPECTED: the bench)
from pydantic import BaseModel

SECRET = re.compile(r"sk-[A-Za-z0-9_-]{20,}|xox[abp]-[A-Za-z0-9-]{10,}|gh[pousr]_[A-Za-z0-9]{36}")
JOBS: queue.SimpleQueue = queue.SimpleQueue()
THREADS = 32  # as many as the kernel's (kernel/tools/registry.py MAX_TOOL_THREADS)


def _work() -> None:
    """The cheapest hop there is: a queue, a thread, `call_soon_threadsafe` back (cheaper than
    `run_in_executor`'s futures), so the floor is not raised by the way it hops."""
    while True:
        loop, future, function, args = JOBS.get()
        result = function(*args)
        loop.call_soon_threadsafe(future.set_result, result)


for _ in range(THREADS):
    threading.Thread(target=_work, daemon=True).start()


async def on_a_thread(function, *args):
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    JOBS.put((loop, future, function, args))
    return await future


async def on_the_loop(function, *args):
    return function(*args)


class AddArguments(BaseModel):
    a: int
    b: int


def redacted(text: str) -> str:
    return SECRET.sub("[redacted]", text)


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    data = redacted(json.dumps(body, ensure_ascii=False)).encode()
    async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as response:
        response.raise_for_status()
        return (await response.json())["choices"][0]["message"]


async def turn(
    session: aiohttp.ClientSession, base_url: str, question: str = "what is 1 + 2?", hop=on_a_thread
) -> str:
    url = base_url + "/chat/completions"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    body = {"model": "m", "messages": messages, "temperature": 0.2, "tools": [ADD_SCHEMA]}
    message = await post(session, url, body)
    messages.append(message)
    for call in message.get("tool_calls") or []:
        arguments = AddArguments.model_validate_json(call["function"]["arguments"])
        result = await hop(add, arguments.a, arguments.b)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": redacted(json.dumps(result))})
    body = {"model": "m", "messages": messages, "temperature": 0.2, "tools": [ADD_SCHEMA]}
    message = await post(session, url, body)
    return redacted(message["content"])


turn_inline = functools.partial(turn, hop=on_the_loop)


if __name__ == "__main__":
    import sys

    report(turn_inline if sys.argv[3:4] == ["inline"] else turn)
