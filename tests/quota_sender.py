"""One sending process for tests/test_postgres_quota.py: `python quota_sender.py URL BASE_URL NAME …`.

Args: the PostgreSQL URL ("-": no shared quota, this process's limits only), the fake Feishu
platform's base URL, a name (the texts' and uuids' prefix), how many messages, the chats they go
to round-robin (`PREFIX:N`: `PREFIX0` … `PREFIX<N-1>`; senders given one prefix share those
chats), the app's limit per "minute", the minute's length in seconds, the chats' limit per second.
Prints `ready`, waits for a line on stdin (so that every sender starts at once), sends every
message at once through `FeishuAPI` — a platform "wait" handed back is waited for and sent again,
as the outbox does — then prints `sent N`.
"""

from __future__ import annotations

import asyncio
import sys

from hermes_core.channels.feishu.api import FeishuAPI, FeishuError
from hermes_core.channels.feishu.ratelimit import SendLimiter
from hermes_core.postgres.database import PostgresDatabase
from hermes_core.postgres.quota import SharedSendQuota

APP_ID, APP_SECRET = "cli_fake", "fake-secret"


async def main(url: str, base_url: str, name: str, count: str, chats: str, per_minute: str, minute: str,
               chat_rate: str) -> None:  # fmt: skip
    prefix, many = chats.split(":")
    limits = {"chat_per_s": float(chat_rate), "app_per_s": 50.0, "app_per_min": float(per_minute)}
    shared = None
    if url != "-":
        shared = SharedSendQuota(PostgresDatabase(url), APP_ID, **limits, minute=float(minute))
    limiter = SendLimiter(**limits, minute=float(minute), shared=shared)
    api = FeishuAPI(APP_ID, APP_SECRET, base_url=base_url, limiter=limiter, retry_base_delay=0.05)

    async def send(n: int) -> None:
        while True:
            try:
                await api.send_text(f"{prefix}{n % int(many)}", f"{name} {n}", uuid=f"{name}-{n}")
                return
            except FeishuError as exc:
                if not exc.throttled:
                    raise
                await asyncio.sleep(exc.retry_after or 0.1)  # as long as the platform said: a client's wait

    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    try:
        await asyncio.gather(*(send(n) for n in range(int(count))))
    finally:
        await api.aclose()
    print(f"sent {count}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
