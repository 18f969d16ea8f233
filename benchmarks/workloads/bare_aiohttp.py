"""The floor: one turn with no framework, just aiohttp and one ClientSession.

POST with the tool schema -> the model calls `add` -> run it by hand -> POST with the result
appended -> the text reply. Same bodies as the hermes workload (same system prompt, temperature).

    python bare_aiohttp.py BASE_URL [CONCURRENT_TURNS]

prints the reply of the first turn, then one JSON line: turns, seconds and cpu_seconds (wall and
CPU time of the turns only) and maxrss_kb (this process's peak RSS at exit).
"""

import asyncio
import json
import resource
import sys
import time

import aiohttp

SYSTEM = "You are a helpful assistant."
EXPECTED = "done: 3"  # the fake's reply once the tool ran with {"a": 1, "b": 2}
ADD_SCHEMA = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "type": "object",
        },
    },
}


def add(a: int, b: int) -> int:
    return a + b


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with session.post(url, json=body) as response:
        response.raise_for_status()
        return (await response.json())["choices"][0]["message"]


async def turn(session: aiohttp.ClientSession, base_url: str, question: str = "what is 1 + 2?") -> str:
    url = base_url + "/chat/completions"
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    body = {"model": "m", "messages": messages, "temperature": 0.2, "tools": [ADD_SCHEMA]}
    message = await post(session, url, body)
    messages.append(message)
    for call in message.get("tool_calls") or []:
        result = add(**json.loads(call["function"]["arguments"]))
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
    message = await post(session, url, {"model": "m", "messages": messages, "temperature": 0.2})
    return message["content"]


def new_session() -> aiohttp.ClientSession:
    headers = {"Authorization": "Bearer x"}  # hermes sends its api_key the same way
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000), headers=headers)


async def main(base_url: str, turns: int, one_turn=turn) -> tuple[list[str], float, float]:
    async with new_session() as session:
        started, cpu = time.perf_counter(), time.process_time()
        replies = await asyncio.gather(*(one_turn(session, base_url) for _ in range(turns)))
        return replies, time.perf_counter() - started, time.process_time() - cpu


def report(one_turn=turn) -> None:
    """The command line (module docstring): `one_turn` of this script, or of one built on it."""
    turns = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    replies, seconds, cpu_seconds = asyncio.run(main(sys.argv[1], turns, one_turn))
    if any(reply != EXPECTED for reply in replies):
        sys.exit(f"unexpected replies: {sorted(set(replies) - {EXPECTED})[:3]}")
    print(replies[0])
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"turns": turns, "seconds": seconds, "cpu_seconds": cpu_seconds, "maxrss_kb": maxrss}))


if __name__ == "__main__":
    report()
