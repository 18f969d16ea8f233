"""Streamed Feishu replies: when the user first sees something, and what it costs in card updates.

    python benchmarks/bench_stream.py [--lengths 300,1200,2400] [--chunk-delay 0.02]

For each reply length, one turn through the gateway `serve` builds (build_gateway), the fake
Feishu platform (with its limits: 10 operations/s per CardKit card) and the fake model streaming
the reply in 3–8 character chunks `--chunk-delay` seconds apart, once with `feishu.stream` on (the
default way, CardKit) and once off. Measured on the platform's side, from the moment the user's
event is pushed: when a message first appears, when the first words of the reply appear, when the
complete reply is there; the number of card updates, the most in any one second, and how many
calls the platform refused. Many streams at once: bench_feishu_streams.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _common import format_table  # noqa: E402

WORDS = (
    "the weather in Hangzhou stays dry early in the week, rain moves in on Thursday and clears by Saturday "
)


async def one_turn(length: int, chunk_delay: float, stream: bool) -> dict[str, Any]:
    from gateway_harness import serving
    from hermes_core import Agent
    from hermes_core.config import FeishuConfig, GatewayConfig, Settings
    from hermes_core.gateway.server import build_gateway
    from hermes_core.testing.fake_feishu import FakeFeishu
    from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
    from waiting import eventually

    answer = (WORDS * (length // len(WORDS) + 1))[:length].strip() + "."
    with tempfile.TemporaryDirectory() as folder:
        async with FakeFeishu() as feishu, FakeOpenAIServer() as fake:
            # streamed: chunks `chunk_delay` apart; not streamed (stream off): the whole reply as late
            fake.script(FakeReply.text(answer, chunk_delay=chunk_delay, delay=0 if stream else
                                       chunk_delay * chunks(answer)))  # fmt: skip
            os.environ["FEISHU_APP_SECRET"] = feishu.app_secret
            os.environ["FEISHU_VERIFICATION_TOKEN"] = feishu.verification_token
            settings = Settings(
                gateway=GatewayConfig(data_dir=folder),
                feishu=FeishuConfig(app_id=feishu.app_id, base_url=feishu.base_url, stream=stream),
            )
            agent = Agent(model="fake-model", base_url=fake.base_url, api_key="sk-test", tools=[])
            gateway, routes = build_gateway(settings, agent)
            seen: dict[str, float] = {}
            async with serving(gateway, routes) as url:
                pushed = time.monotonic()
                assert (
                    await feishu.push(feishu.user_message("weather?", chat_id="oc_b"), f"{url}/feishu/events")
                ).ok

                def watch() -> bool:
                    now = time.monotonic() - pushed
                    if feishu.sent:
                        seen.setdefault("visible", now)
                        if answer[:20] in feishu.sent[0].text:
                            seen.setdefault("first words", now)
                        if feishu.sent[0].text == answer:
                            seen.setdefault("complete", now)
                    return "complete" in seen

                await eventually(watch, timeout=120)
            await gateway.runner.aclose()  # type: ignore[attr-defined]
            await agent.aclose()
            times = [patch.at for patch in feishu.patches]
            most = max((sum(1 for t in times if s <= t < s + 1.0) for s in times), default=0)
            refused = sum(1 for r in feishu.requests if r.code not in (0, None))
            return {"chars": len(answer), "stream": "on" if stream else "off", **seen,
                    "updates": len(times), "most in 1 s": most, "refused": refused,
                    "messages": len(feishu.sent)}  # fmt: skip


def chunks(text: str) -> int:
    """How many chunks the fake model streams `text` in (3 to 8 characters each, in turn)."""
    count, start = 0, 0
    while start < len(text):
        start, count = start + 3 + count % 6, count + 1
    return count + 1  # the opening chunk


async def run(lengths: list[int], chunk_delay: float) -> list[dict[str, Any]]:
    rows = []
    for length in lengths:
        for stream in (True, False):
            rows.append(await one_turn(length, chunk_delay, stream))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="300,1200,2400", help="reply lengths in characters")
    parser.add_argument("--chunk-delay", type=float, default=0.02, help="seconds between streamed chunks")
    args = parser.parse_args()
    rows = asyncio.run(run([int(n) for n in args.lengths.split(",")], args.chunk_delay))
    columns = ["chars", "stream", "visible", "first words", "complete", "updates", "most in 1 s", "refused",
               "messages"]  # fmt: skip
    print(format_table([{column: _cell(row.get(column)) for column in columns} for row in rows], columns))


def _cell(value: Any) -> str:
    return f"{value:.2f} s" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
