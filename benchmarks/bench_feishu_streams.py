"""Many Feishu replies streaming at once: what each user sees, and what it costs the app's budget.

    python benchmarks/bench_feishu_streams.py [--streams 1,10,30] [--chars 600] [--chunk-delay 0.02]

For each number of concurrent streams, N users in N chats ask at the same moment; the fake model
streams each answer in 3–8 character chunks `--chunk-delay` seconds apart. Through the gateway
`serve` builds (build_gateway) and the fake Feishu platform with the platform's limits (50/s and
1,000/min per API per app, 5/s per chat, 5 patches/s per message, 10 operations/s per CardKit
card entity). Three ways, side by side:

- **before**: cards patched (PATCH of the message), every API counted under one app budget — what
  the bot did before CardKit and per-API budgets;
- **patch**: the same patched cards, each API under its own budget (the fallback way today);
- **cardkit**: CardKit card entities typed into (the default way), each API under its own budget.

Printed per row, measured on the platform's side from the moment the events were pushed:
`first text` (median seconds until a card shows the first words of its answer), `complete`
(median until it holds the whole answer), `updates/s per card` (operations on a card while it
streamed: patches or CardKit operations, divided by the time from its first to its last),
`unrelated reply` (seconds an ordinary message to another chat, sent through the same client half
way through the streams, waited for its turn and its answer), `calls per reply` (every Open API
call but the token's, divided by the replies), and `refused` (calls the platform refused).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _common import format_table  # noqa: E402

WORDS = (
    "the weather in Hangzhou stays dry early in the week, rain moves in on Thursday and clears by Saturday "
)
WAYS = ("before", "patch", "cardkit")


@contextmanager
def one_budget_for_every_api() -> Any:
    """The limiter as it was: every API of the app drawn from one pair of buckets."""
    from hermes_core.channels.feishu.ratelimit import SendLimiter

    original = SendLimiter._api_buckets
    SendLimiter._api_buckets = lambda self, api: original(self, "im.message.create")  # type: ignore[method-assign]
    try:
        yield
    finally:
        SendLimiter._api_buckets = original  # type: ignore[method-assign]


async def one_run(way: str, streams: int, chars: int, chunk_delay: float) -> dict[str, Any]:
    from hermes_core.testing.fake_feishu import FakeFeishu
    from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

    answers = [
        (f"Answer {n}: " + WORDS * (chars // len(WORDS) + 1))[:chars].strip() + "." for n in range(streams)
    ]
    # the platform and the model in threads of their own: the gateway's loop is the bot's alone
    feishu, fake = FakeFeishu().start_in_thread(), FakeOpenAIServer().start_in_thread()
    try:
        fake.script(*(FakeReply.text(answer, chunk_delay=chunk_delay) for answer in answers))
        with tempfile.TemporaryDirectory() as folder:
            seen, waited = await _streams(
                feishu, fake.base_url, folder, way, answers, chunk_delay * chars / 11
            )
    finally:
        feishu.stop()
        fake.stop()
    return {"way": way, "streams": streams, "first text": _median(seen["first"]),
            "complete": _median(seen["complete"]), "updates/s per card": _update_rate(feishu),
            "unrelated reply": waited, "calls per reply": _calls(feishu) / streams,
            "refused": sum(1 for r in feishu.requests if r.code not in (0, None))}  # fmt: skip


async def _streams(
    feishu: Any, model_url: str, folder: str, way: str, answers: list[str], unrelated_after: float
) -> tuple[dict[str, dict[str, float]], float]:
    """One user per chat asks at once; when each chat first shows its answer, and when all of it."""
    from gateway_harness import serving
    from hermes_core import Agent
    from hermes_core.config import FeishuConfig, GatewayConfig, Settings
    from hermes_core.gateway.server import build_gateway
    from waiting import eventually

    os.environ["FEISHU_APP_SECRET"] = feishu.app_secret
    os.environ["FEISHU_VERIFICATION_TOKEN"] = feishu.verification_token
    feishu_config = FeishuConfig(app_id=feishu.app_id, base_url=feishu.base_url,
                                 card_streaming="cardkit" if way == "cardkit" else "patch")  # fmt: skip
    settings = Settings(gateway=GatewayConfig(data_dir=folder), feishu=feishu_config)
    agent = Agent(model="fake-model", base_url=model_url, api_key="sk-test", tools=[])
    gateway, routes = build_gateway(settings, agent)
    seen: dict[str, dict[str, float]] = {"first": {}, "complete": {}}
    async with serving(gateway, routes) as url:
        events = [
            feishu.user_message("weather?", chat_id=f"oc_{n}", sender=f"ou_{n}") for n in range(len(answers))
        ]
        pushed = time.monotonic()
        results = await asyncio.gather(*(feishu.push(event, f"{url}/feishu/events") for event in events))
        assert all(result.ok for result in results)

        def watch() -> bool:
            now = time.monotonic() - pushed
            for message in feishu.sent:
                if message.text.startswith("Answer"):
                    seen["first"].setdefault(message.chat_id, now)
                    if message.text in answers:
                        seen["complete"].setdefault(message.chat_id, now)
            return len(seen["complete"]) == len(answers)

        unrelated = asyncio.create_task(_unrelated_reply(gateway.channels["feishu"], unrelated_after))
        await eventually(watch, timeout=300)
        waited = await unrelated
    await gateway.runner.aclose()  # type: ignore[attr-defined]
    await agent.aclose()
    return seen, waited


async def _unrelated_reply(channel: Any, after: float) -> float:
    """Half way through the streams, an ordinary message to another chat through the same client."""
    await asyncio.sleep(after)
    started = time.monotonic()
    await channel.api.send_text("oc_unrelated", "The meeting moved to 3 pm.")
    return time.monotonic() - started


def _update_rate(feishu: Any) -> float:
    """Operations on each card while it streamed, per second, median over the cards."""
    rates = []
    by_card: dict[str, list[float]] = {}
    for patch in feishu.patches:
        by_card.setdefault(patch.message_id, []).append(patch.at)
    for times in by_card.values():
        if len(times) > 1 and times[-1] > times[0]:
            rates.append((len(times) - 1) / (times[-1] - times[0]))
    return statistics.median(rates) if rates else 0.0


def _calls(feishu: Any) -> int:
    skipped = ("tenant_access_token", "bot/v3/info")
    ours = [r for r in feishu.requests if "oc_unrelated" not in str(r.body)]
    counted = [r for r in ours if r.path.startswith("/open-apis/")]
    return sum(1 for r in counted if not any(part in r.path for part in skipped))


def _median(times: dict[str, float]) -> float | None:
    return statistics.median(times.values()) if times else None


async def run(streams: list[int], chars: int, chunk_delay: float) -> list[dict[str, Any]]:
    rows = []
    for count in streams:
        for way in WAYS:
            if way == "before":
                with one_budget_for_every_api():
                    rows.append(await one_run(way, count, chars, chunk_delay))
            else:
                rows.append(await one_run(way, count, chars, chunk_delay))
    return rows


COLUMNS = ["streams", "way", "first text", "complete", "updates/s per card", "unrelated reply",
           "calls per reply", "refused"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default="1,10,30", help="numbers of concurrent streamed replies")
    parser.add_argument("--chars", type=int, default=600, help="characters per answer")
    parser.add_argument("--chunk-delay", type=float, default=0.02, help="seconds between streamed chunks")
    args = parser.parse_args()
    rows = asyncio.run(run([int(n) for n in args.streams.split(",")], args.chars, args.chunk_delay))
    print(format_table([{column: _cell(row.get(column)) for column in COLUMNS} for row in rows], COLUMNS))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "-" if value is None else str(value)


if __name__ == "__main__":
    main()
