"""Send pacing: how long N queued replies over M chats take to reach Feishu, before and after.

    python benchmarks/bench_send_pacing.py [--replies 100] [--chats 20]

"before" is the pace the shipped configuration used to give (`send_rate: 5`: the whole app at 5
messages/s, on top of 5/s per chat); "after" is the default now (each chat at 5/s, the app at
Feishu's 50/s and 1,000/min). Measured: the replies are sent for real, over HTTP, to the fake
Feishu platform (in its own thread, with Feishu's limits), one lane per chat as the outbox sends
them; the drain time is from the first request to the last message the platform created. Also
printed: the same limiters on a virtual clock for a larger backlog (the 200 events/s minute of the
report), where only the limiters' own pacing counts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import format_table  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "before (send_rate: 5)": {"rate_per_s": 5.0},
    "after (defaults)": {},
}


def limiter(options: dict[str, Any], **clock: Any) -> Any:
    from hermes_core.channels.feishu.ratelimit import SendLimiter

    return SendLimiter(**{"rate_per_s": None, "chat_per_s": 5.0, "app_per_s": 50.0, "app_per_min": 1000.0,
                          **options, **clock})  # fmt: skip


async def drain(feishu: Any, options: dict[str, Any], replies: int, chats: int) -> dict[str, float]:
    """Send `replies` replies spread over `chats` chats through a fresh FeishuAPI; time the drain."""
    from hermes_core.channels.feishu.api import FeishuAPI

    before = len(feishu.sent)
    api = FeishuAPI(feishu.app_id, feishu.app_secret, base_url=feishu.base_url, limiter=limiter(options))
    await api.bot_info()  # the token first: not part of the drain
    per_chat = [replies // chats + (1 if n < replies % chats else 0) for n in range(chats)]

    async def lane(n: int) -> None:
        for i in range(per_chat[n]):
            await api.send_text(f"oc_bench{n}", f"reply {i}")

    started = time.time()
    try:
        await asyncio.gather(*(lane(n) for n in range(chats)))
    finally:
        await api.aclose()
    created = [m.created_at for m in feishu.sent[before:]]
    refused = sum(1 for call in feishu.requests if call.code not in (0, None))
    elapsed = max(created) - started
    return {"drain_s": elapsed, "rate": len(created) / elapsed, "refused": refused}


async def virtual_drain(options: dict[str, Any], replies: int, chats: int) -> float:
    """When the last of `replies` sends over `chats` chats may start, on a virtual clock."""
    now = [0.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    pacer = limiter(options, clock=lambda: now[0], sleep=sleep)
    for i in range(replies):
        async with pacer.slot(f"oc_{i % chats}"):
            pass
    return now[0]


def run(replies: int = 100, chats: int = 20) -> dict[str, Any]:
    from hermes_core.testing.fake_feishu import FakeFeishu

    rows: list[dict[str, Any]] = []
    for name, options in SETTINGS.items():
        feishu = FakeFeishu().start_in_thread()
        try:
            measured = asyncio.run(drain(feishu, options, replies, chats))
        finally:
            feishu.stop()
        backlog = asyncio.run(virtual_drain(options, 12_000, 2_000))
        rows.append({"setting": name, **measured, "backlog_s": backlog})
    before, after = rows
    return {"rows": rows, "speedup": before["drain_s"] / after["drain_s"], "replies": replies, "chats": chats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=100)
    parser.add_argument("--chats", type=int, default=20)
    args = parser.parse_args()
    figures = run(args.replies, args.chats)
    table = [
        {
            "setting": row["setting"],
            f"{args.replies} replies / {args.chats} chats": f"{row['drain_s']:.2f} s",
            "messages/s": f"{row['rate']:.1f}",
            "platform refusals": str(row["refused"]),
            "12,000 replies / 2,000 chats (virtual)": f"{row['backlog_s'] / 60:.1f} min",
        }
        for row in figures["rows"]
    ]
    print(format_table(table, list(table[0])))
    print(f"\nafter vs before: drain x{1 / figures['speedup']:.2f} ({figures['speedup']:.1f} times faster); "
          "the 12,000-reply backlog is now bound only by Feishu's own 1,000/min per app")  # fmt: skip


if __name__ == "__main__":
    main()
