"""What a conversation costs: the same 20-turn conversation through each contender's own session
mechanism, every request logged at a local OpenAI-compatible endpoint, and what a provider's prompt
cache could reuse of each.

    python benchmarks/bench_conversation_cost.py [--turns 20] [--peers]

Each turn is one user message ("what is 12*7?"), one calculator call, then a text answer. The
endpoint answers every contender alike: a request whose last message is a tool result gets the text
"The answer is …", a request that offers no tool (a summary of folded turns) a short text, any
other request a calculator call for the expression of the newest user message. Contenders:

- floor: bare aiohttp, the history kept by hand (append-only), the one calculator schema;
- `Agent.run(session=Session())`: the library path, the built-in calculator;
- `serve` + webhook, defaults: the product path (memory, state and the default tools on);
- with `--peers`, openai-agents (`SQLiteSession`), pydantic-ai (`message_history`) and LangGraph
  (`create_agent` with a SQLite checkpointer), installed into a virtual environment of their own
  under benchmarks/.peers/ on first use (network needed once).

Per contender (serve's one-token start-up check of the key left out): the requests, their total
bytes (× the floor's, and for ours × the floor at the same prompt: a bare loop that sends our
contender's own system prompt and tools and words tool results as ours do, so what is left is
what the framework adds per turn), the last request's bytes, the mean prefix reuse (the longest
prefix a request shares with any earlier one, over its length) of all requests and of each turn's
first request (and its minimum), the uncached characters (summed over the conversation: what no
earlier request's prefix covers; × the floor's, and × the floor at the same prompt) and the input
cost at published prices.

How a request is compared: as the prompt a provider renders it — the system message, then the tool
schemas, then the other messages — each part serialised with sorted keys (a template does not see
key order, but it does see every character of content, arguments and tool order). Tokens are taken
as characters / 4 for the cost; real caches also round the prefix down to blocks (OpenAI: from 1,024
tokens in steps of 128; DeepSeek: 64-token units), which this ignores. No figure is asserted
(tests/test_benchmarks_quick.py runs it briefly); the goals are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import venv
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from _common import BENCH_DIR, WORKLOADS, format_table, machine
from aiohttp import web

# USD per 1M input tokens, (cache miss, cache hit), as the providers' pricing pages publish them:
# api-docs.deepseek.com/quick_start/pricing-details-usd (deepseek-chat), openai.com/api/pricing
# (gpt-4o-mini). Prices change; the ratios between contenders are what this compares.
PRICES = {"DeepSeek deepseek-chat": (0.27, 0.07), "OpenAI gpt-4o-mini": (0.15, 0.075)}
CHARS_PER_TOKEN = 4
PEERS = {
    "openai-agents, SQLiteSession": ("peer_openai_agents.py", ["openai-agents>=0.24"]),
    "pydantic-ai, message_history": ("peer_pydantic_ai.py", ["pydantic-ai-slim[openai]>=2"]),
    "langgraph, SqliteSaver checkpointer": (
        "peer_langgraph.py",
        ["langchain>=1", "langgraph>=1", "langchain-openai>=1", "langgraph-checkpoint-sqlite>=2"],
    ),
}
PEERS_VENV = BENCH_DIR / ".peers"
EXPRESSION = re.compile(r"what is ([0-9+*/() .-]+)\?")


def question(turn: int) -> str:
    return f"what is {turn + 12}*{turn % 7 + 3}?"


# -- the endpoint ----------------------------------------------------------------------------------


@dataclass
class Recorder:
    """An OpenAI-compatible endpoint that logs each request's body and answers as the docstring says."""

    bodies: list[bytes] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> Recorder:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", lambda _: web.json_response({"object": "list", "data": []}))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def chat(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = json.loads(raw)
        if body.get("max_tokens") != 1:  # serve's start-up check of the key is no part of the conversation
            self.bodies.append(raw)
        messages = body.get("messages") or []
        n = len(self.bodies)
        if not body.get("tools"):  # a call that offers no tool: a summary of folded turns
            message: dict[str, Any] = {"role": "assistant", "content": f"The user asked {n} sums."}
        elif messages and messages[-1].get("role") == "tool":
            message = {"role": "assistant", "content": f"The answer is {messages[-1]['content']}."}
        else:
            asked = next((m for m in map(_text, reversed(messages)) if EXPRESSION.search(m)), "what is 1+1?")
            expression = EXPRESSION.search(asked).group(1)  # type: ignore[union-attr]
            arguments = json.dumps({"expression": expression})
            call = {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": "calculator", "arguments": arguments},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        prompt = len(raw) // CHARS_PER_TOKEN
        return web.json_response({
            "id": f"chatcmpl-{n}", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 10, "total_tokens": prompt + 10},
        })  # fmt: skip


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "") if message.get("role") == "user" else ""


# -- what a cache could reuse ----------------------------------------------------------------------


def rendered(raw: bytes) -> str:
    """The request as a provider renders its prompt: system, tools, then the other messages."""
    body = json.loads(raw)
    messages = body.get("messages") or []
    head = [m for m in messages[:1] if m.get("role") in ("system", "developer")]
    parts = [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in head]
    parts.append(json.dumps(body.get("tools") or [], sort_keys=True, ensure_ascii=False))
    parts += [json.dumps(m, sort_keys=True, ensure_ascii=False) for m in messages[len(head) :]]
    return "\n".join(parts)


def common_prefix(a: str, b: str) -> int:
    return len(os.path.commonprefix([a, b]))


@dataclass
class Figures:
    requests: int
    total_bytes: int
    last_bytes: int
    reuse: list[float]  # per request
    turn_start_reuse: list[float]  # per turn's first request (after the first turn)
    uncached: int  # characters no earlier prefix covers
    rendered_chars: int

    def cost(self, miss: float, hit: float) -> float:
        cached = self.rendered_chars - self.uncached
        return (self.uncached * miss + cached * hit) / CHARS_PER_TOKEN / 1e6


def measure(bodies: list[bytes]) -> Figures:
    prompts = [rendered(raw) for raw in bodies]
    reuse, starts, uncached = [], [], 0
    for k, prompt in enumerate(prompts):
        kept = max((common_prefix(prompt, earlier) for earlier in prompts[:k]), default=0)
        reuse.append(kept / len(prompt) if prompt else 1.0)
        uncached += len(prompt) - kept
        if k and json.loads(bodies[k])["messages"][-1].get("role") != "tool":  # a turn's first request
            starts.append(reuse[-1])
    return Figures(len(bodies), sum(map(len, bodies)), len(bodies[-1]) if bodies else 0, reuse, starts,
                   uncached, sum(map(len, prompts)))  # fmt: skip


# -- the contenders --------------------------------------------------------------------------------

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}


def calculate(expression: str) -> str:
    if not re.fullmatch(r"[0-9+*/() .-]+", expression):
        return "error: not arithmetic"
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - digits and operators only


async def floor(
    url: str,
    turns: int,
    system: str = "You are a helpful assistant.",
    tools: list[dict[str, Any]] | None = None,
    ours: bool = False,
) -> None:
    """Bare aiohttp: the history kept by hand, append-only. By default one small tool; the floor at
    the same prompt sends a contender's own system prompt and tools and words results as ours do."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    async with aiohttp.ClientSession() as http:
        for turn in range(turns):
            messages.append({"role": "user", "content": question(turn)})
            while True:
                body = {"model": "m", "messages": messages, "tools": tools or [CALCULATOR]}
                async with http.post(f"{url}/chat/completions", json=body) as answer:
                    reply = (await answer.json())["choices"][0]["message"]
                messages.append(reply)
                if not reply.get("tool_calls"):
                    break
                for call in reply["tool_calls"]:
                    expression = json.loads(call["function"]["arguments"])["expression"]
                    result = calculate(expression)
                    if ours:  # the calculator of hermes_core.tools.examples answers with its expression
                        result = json.dumps({"expression": expression, "result": int(result)})
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})


async def agent_api(url: str, turns: int) -> None:
    from hermes_core import Agent, Session
    from hermes_core.tools.examples import calculator_tool

    agent = Agent(model="m", tools=[calculator_tool], base_url=url, api_key="bench")
    session = Session()
    try:
        for turn in range(turns):
            await agent.run(question(turn), session=session)
    finally:
        await agent.aclose()


async def gateway(url: str, turns: int) -> None:
    """`hermes-kernel serve` with its defaults, the turns posted to its webhook one after another."""
    with tempfile.TemporaryDirectory(prefix="hermes-bench-cost-") as work:
        config = Path(work) / "hermes.yaml"
        # defaults, but the per-sender limit: a long conversation here sends more than 20 messages a minute
        limits = "gateway: {user_messages_per_minute: null}\n"
        config.write_text(f"model: {{name: m, base_url: '{url}'}}\n{limits}", encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FEISHU_"))}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hermes_core", "--config", str(config), "serve", "--port", "0",
            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = await _serving(process)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
                for turn in range(turns):
                    body = {"message": question(turn), "user_id": "bench", "message_id": f"m{turn}"}
                    async with http.post(f"{base}/webhook", json=body) as answer:
                        if answer.status != 200:
                            raise RuntimeError(f"webhook answered {answer.status}: {await answer.text()}")
        finally:
            process.terminate()
            await process.wait()


async def _serving(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    while line := (await asyncio.wait_for(process.stdout.readline(), 60)).decode():
        found = re.search(r"serving on (http://\S+)", line)
        if found:
            return found.group(1)
    raise RuntimeError(f"serve did not start (exit {await process.wait()})")


def peer(script: str) -> Callable[[str, int], Awaitable[None]]:
    async def run(url: str, turns: int) -> None:
        python = PEERS_VENV / "bin" / "python"
        process = await asyncio.create_subprocess_exec(str(python), str(WORKLOADS / script), url, str(turns))
        if await process.wait() != 0:
            raise RuntimeError(f"{script} failed")

    return run


def install_peers() -> None:
    """A virtual environment of their own for the peer frameworks (created once, then reused)."""
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        venv.create(PEERS_VENV, with_pip=True)
    wanted = [spec for _, specs in PEERS.values() for spec in specs]
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *wanted], check=True)


# -- the run ---------------------------------------------------------------------------------------


async def conversation(
    name: str, contender: Callable[[str, int], Awaitable[None]], turns: int
) -> tuple[Figures, dict[str, Any]]:
    """The contender's figures, and its first request (its system prompt and tools)."""
    recorder = await Recorder().start()
    try:
        await contender(recorder.url, turns)
    finally:
        await recorder.stop()
    if not recorder.bodies:
        raise RuntimeError(f"{name}: no request reached the endpoint")
    return measure(recorder.bodies), json.loads(recorder.bodies[0])


def run(turns: int = 20, peers: bool = False) -> dict[str, Any]:
    contenders: dict[str, Callable[[str, int], Awaitable[None]]] = {
        "bare aiohttp, history by hand (floor)": floor,
        "ours, Agent.run(session=Session())": agent_api,
        "ours, serve + webhook, defaults": gateway,
    }
    if peers:
        install_peers()
        contenders.update({name: peer(script) for name, (script, _) in PEERS.items()})
    figures, same = {}, {}
    for name, contender in contenders.items():
        figures[name], first = asyncio.run(conversation(name, contender, turns))
        if name.startswith("ours"):  # the floor at the same prompt: this contender's system and tools
            prompt = first["messages"][0]["content"]

            async def same_prompt(
                url: str, turns: int, prompt: str = prompt, tools: Any = first["tools"]
            ) -> None:
                await floor(url, turns, prompt, tools, ours=True)

            same[name] = asyncio.run(conversation("floor at the same prompt", same_prompt, turns))[0]
    base = figures["bare aiohttp, history by hand (floor)"]
    rows = []
    for name, f in figures.items():
        starts = f.turn_start_reuse or [1.0]
        floor_here = same.get(name)
        row = {
            "contender": name,
            "requests": str(f.requests),
            "total bytes (x floor)": f"{f.total_bytes:,} ({f.total_bytes / base.total_bytes:.2f}x)",
            "bytes x same floor": f"{f.total_bytes / floor_here.total_bytes:.2f}x" if floor_here else "",
            "last bytes": f"{f.last_bytes:,}",
            "reuse mean": f"{sum(f.reuse) / len(f.reuse):.3f}",
            "turn starts mean (min)": f"{sum(starts) / len(starts):.3f} ({min(starts):.3f})",
            "uncached chars (x floor)": f"{f.uncached:,} ({f.uncached / base.uncached:.2f}x)",
            "uncached x same floor": f"{f.uncached / floor_here.uncached:.2f}x" if floor_here else "",
        }
        for price, (miss, hit) in PRICES.items():
            row[f"{price} $"] = f"{f.cost(miss, hit):.5f}"
        rows.append(row)
    return {"turns": turns, "rows": rows, "figures": figures, "same_prompt": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20, help="turns of the conversation")
    parser.add_argument(
        "--peers", action="store_true", help="also openai-agents, pydantic-ai and langgraph (installs them)"
    )
    args = parser.parse_args()
    result = run(args.turns, args.peers)
    print(f"one conversation of {args.turns} turns (one tool call each); input cost per conversation at "
          f"{', '.join(f'{p} ${m}/${h} per 1M miss/hit' for p, (m, h) in PRICES.items())}, "
          f"tokens = chars/{CHARS_PER_TOKEN}")  # fmt: skip
    print(format_table(result["rows"], list(result["rows"][0])))
    print(f"\n{machine()}")


if __name__ == "__main__":
    main()
