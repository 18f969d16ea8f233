"""1,000 scheduled jobs due in the same second, while people keep writing: do the fires all run
within the minute, and do acks and interactive turns stay fast?

Three processes, as in production: `hermes-kernel serve` (webhook channel, SQLite on disk), the fake
model (`--latency` per call, 50 ms; a turn is two calls: a tool, then the answer) and this process,
which seeds the jobs into the gateway's database before the start (as `hermes-kernel schedule add`
does), receives every reply on a local callback server and sends the interactive load.

1. Quiet (after a one-second warm-up): `--rate` webhook messages/s (20) for `--seconds` (8), each
   with a callback: the ack is the HTTP answer (202), the turn is the time until its callback arrives.
2. Burst: `--jobs` one-shot jobs (1,000), all due at the same second, fire while the same load runs
   again for `--seconds`.

Printed: fire latency (due time → the reply sent, from the database) p50/p99/max and whether all
fired within 60 s; ack p99 and interactive turn p50/p99, quiet and during the burst.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import fake_server, machine, percentile  # noqa: E402
from bench_gateway import _process  # noqa: E402


async def seed(database: Path, jobs: int, due: float, callback: str) -> None:
    from hermes_core.gateway.schedules import SQLiteScheduleStore
    from hermes_core.schedule.jobs import Job

    store = SQLiteScheduleStore(database)
    batch = [Job(id=f"b{n}", prompt=f"scheduled report {n}", channel="webhook", conversation=f"webhook:{n}",
                 sender="ops", timezone="UTC", at=due, next_fire=due, callback_url=callback)
             for n in range(jobs)]  # fmt: skip
    await asyncio.gather(*(store.add(job) for job in batch))  # group commit: a few transactions
    await store.close()


def fire_latencies(database: Path) -> list[float]:
    with sqlite3.connect(database) as db:
        rows = db.execute(
            "SELECT MAX(o.sent_at) - f.fire_at FROM schedule_fires f "
            "JOIN outbox o ON o.inbound_id = f.inbox_id WHERE o.status = 'sent' GROUP BY f.job_id"
        ).fetchall()
    return [float(r[0]) for r in rows]


class Load:
    """Interactive messages at `rate`/s: ack and turn latencies."""

    def __init__(self, url: str, callback: str) -> None:
        self.url, self.callback = url, callback
        self.sent: dict[str, float] = {}
        self.turns: list[float] = []
        self.acks: list[float] = []

    def replied(self, message_id: str) -> None:
        started = self.sent.pop(message_id, None)
        if started is not None:
            self.turns.append(time.perf_counter() - started)

    async def run(self, http: aiohttp.ClientSession, rate: float, seconds: float, tag: str) -> None:
        start, count = time.perf_counter(), int(rate * seconds)

        async def one(n: int) -> None:
            await asyncio.sleep(max(0.0, start + n / rate - time.perf_counter()))  # absolute schedule
            message_id = f"{tag}-{n}"
            body = {"message": f"what is {n} + 1", "user_id": f"{tag}{n % 50}", "message_id": message_id,
                    "callback_url": self.callback}  # fmt: skip
            sent = time.perf_counter()
            self.sent[message_id] = sent
            async with http.post(f"{self.url}/webhook", json=body) as answer:
                await answer.read()
                assert answer.status in (200, 202), answer.status
            self.acks.append(time.perf_counter() - sent)

        await asyncio.gather(*(one(n) for n in range(count)))
        deadline = time.perf_counter() + 60
        while self.sent and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)


async def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    received: set[str] = set()
    load: Load | None = None

    async def callback(request: web.Request) -> web.Response:
        body = await request.json()
        received.add(body.get("message_id", ""))
        if load is not None:
            load.replied(body.get("message_id", ""))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/cb", callback)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    callback_url = f"http://127.0.0.1:{port}/cb"
    database = work / ".hermes" / "gateway.db"
    due = time.time() + 8 + args.seconds  # after the start, the warm-up and the quiet phase
    await seed(database, args.jobs, due, callback_url)
    with fake_server(latency=args.latency) as model_url:
        config = work / "hermes.yaml"
        config.write_text(f"webhook: {{callback_hosts: ['127.0.0.1:{port}']}}\nobserve: {{traces: false}}\n"
                          f"model: {{name: m, base_url: '{model_url}'}}\n"
                          "gateway: {user_messages_per_minute: null, conversation_queue: null}\n",  # load
                          encoding="utf-8")  # fmt: skip
        command = [sys.executable, "-m", "hermes_core", "--config", str(config), "serve", "--port", "0"]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FEISHU_"))}
        with _process(command, r"serving on (http://\S+)", work / "serve.log", cwd=work, env=env) as (
            _,
            found,
        ):
            url = found.group(1)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
                load = Load(url, callback_url)  # its replies end the warm-up (else it waited 60 s)
                await load.run(http, args.rate, 1.0, "warm-up")  # first-use imports
                quiet = load = Load(url, callback_url)
                await quiet.run(http, args.rate, args.seconds, "quiet")
                await asyncio.sleep(max(0.0, due - 1 - time.time()))
                burst = load = Load(url, callback_url)
                await burst.run(http, args.rate, args.seconds, "burst")
                deadline = due + 120
                while sum(1 for m in received if m.startswith("job:")) < args.jobs and time.time() < deadline:
                    await asyncio.sleep(0.1)
    await runner.cleanup()
    fires = fire_latencies(database)
    return {"quiet": quiet, "burst": burst, "fires": fires}


def report(result: dict[str, Any], jobs: int) -> str:
    fires: list[float] = result["fires"]
    quiet, burst = result["quiet"], result["burst"]
    ms = lambda values, p: f"{percentile(values, p) * 1000:.0f} ms" if values else "n/a"  # noqa: E731
    within = sum(1 for f in fires if f <= 60)
    lines = [
        f"bench_schedule: {jobs} jobs due in the same second; {machine()}",
        f"fires answered: {len(fires)}/{jobs}; within 60 s: {within}",
        f"fire latency (due -> reply sent): p50 {percentile(fires, 50):.1f} s, "
        f"p99 {percentile(fires, 99):.1f} s, max {max(fires):.1f} s"
        if fires
        else "fire latency: none answered",
        f"ack p99: quiet {ms(quiet.acks, 99)}, during the burst {ms(burst.acks, 99)}",
        f"interactive turn p50/p99: quiet {ms(quiet.turns, 50)} / {ms(quiet.turns, 99)}, "
        f"during the burst {ms(burst.turns, 50)} / {ms(burst.turns, 99)}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20.0, help="interactive messages per second")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each load phase")
    parser.add_argument("--latency", type=float, default=0.05, help="the fake model's seconds per call")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-schedule-"))
    try:
        result = asyncio.run(bench(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(report(result, args.jobs))
    return 0 if len(result["fires"]) == args.jobs else 1


if __name__ == "__main__":
    raise SystemExit(main())
