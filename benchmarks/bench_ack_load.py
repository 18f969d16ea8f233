"""Feishu ack latency while the gateway is busy with turns: quiet, then with 2,000 turns queued.

The platform re-pushes an event it has not seen acknowledged within 3 s, which adds load exactly
when the gateway is already behind; so an ack (verify, dedup, durable insert, 200) must not wait
for turn work. Three processes as in production (bench_gateway.py): `hermes-kernel serve` with
Feishu on, the fake model (`--latency`, 200 ms per call; a turn is two calls: the calculator, then
the answer) and this process running FakeFeishu (encrypted, signed pushes).

1. Quiet: `--quiet-rate` events/s (20) for `--quiet-seconds` (10) on the idle gateway.
2. Backlog: `--backlog` events (2,000), each its own chat, pushed 64 at a time: 2,000 turns queued.
3. Loaded: `--rate` events/s (200) for `--seconds` (15) over 300 chats, paced on an absolute
   schedule, while the backlog runs.

Printed: quiet and loaded ack p50/p99 (`PushResult.elapsed`, as the platform sees it), their
ratio, and the turns waiting or running (/healthz `messages_waiting`) during the loaded window.
`--set key=value` passes `gateway.*` settings (e.g. `--set max_turns_in_flight=32`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import format_table, machine, ratio, row  # noqa: E402
from bench_gateway import (  # noqa: E402
    ENCRYPT_KEY,
    TEXT,
    Usage,
    background_load,
    commit,
    envelopes_for,
    gateway_process,
    health,
    model_process,
    noise_warning,
    paced_pushes,
    summarize,
    warm_up,
)

ACK_GOAL_MS = 50.0  # loaded p99
RATIO_GOAL = 2.0  # loaded p99 / quiet p99
FEISHU_DEADLINE_MS = 3000.0


async def _settle(session: Any, server: Any, timeout: float = 120.0) -> dict[str, Any]:
    """Wait until no turn waits or runs (the quiet phase's turns are done)."""
    deadline = time.monotonic() + timeout
    while True:
        status = await health(session, server)
        if status["messages_waiting"] == 0 or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.2)


async def _backlog(feishu: Any, server: Any, n: int, parallel: int = 64) -> float:
    """Queue `n` turns (one chat each); returns the seconds it took to have them all acked."""
    gate = asyncio.Semaphore(parallel)
    envelopes = [feishu.user_message(TEXT, chat_id=f"oc_q{i}", sender=f"ou_q{i}") for i in range(n)]

    async def push(envelope: dict) -> None:
        async with gate:
            result = await feishu.push(envelope, server.url)
            if not result.ok:
                raise RuntimeError(f"backlog push failed: {result.error} {result.body[:200]}")

    started = time.perf_counter()
    await asyncio.gather(*(push(e) for e in envelopes))
    return time.perf_counter() - started


async def _sample(session: Any, server: Any, samples: list[dict[str, Any]]) -> None:
    while True:
        await asyncio.sleep(1.0)
        samples.append(await health(session, server))


async def _measure(feishu: Any, server: Any, model_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        await warm_up(feishu, server.url, "al")
        await _settle(session, server)
        quiet_n = int(args.quiet_rate * args.quiet_seconds)
        quiet_results, quiet_late = await paced_pushes(
            feishu, server.url, envelopes_for(feishu, quiet_n, 300, "quiet"), args.quiet_rate
        )
        await _settle(session, server)
        backlog_s = await _backlog(feishu, server, args.backlog)
        before = await health(session, server)
        n = int(args.rate * args.seconds)
        envelopes = envelopes_for(feishu, n, 300, "load")
        usage = Usage({"gateway server": server.pid, "fake model": model_pid})
        samples: list[dict[str, Any]] = []
        sampling = asyncio.create_task(_sample(session, server, samples))
        try:
            results, late = await paced_pushes(feishu, server.url, envelopes, args.rate)
        finally:
            sampling.cancel()
        cpu = usage.done()
        after = await health(session, server)
    waiting = [s["messages_waiting"] for s in samples] or [after["messages_waiting"]]
    limits = [s["turn_limit"] for s in samples if "turn_limit" in s]
    return {
        "quiet": _summary(quiet_results, quiet_late),
        "loaded": _summary(results, late),
        "backlog_push_s": backlog_s,
        "queued_at_start": before["messages_waiting"],
        "queued_min": min(waiting),
        "queued_max": max(waiting),
        "turns_done_in_window": after["turns_done"] - before["turns_done"],
        "turn_limit": (min(limits), statistics.median(limits), max(limits)) if limits else None,
        "cpu": cpu,
    }


def _summary(results: list, late: list[float]) -> dict[str, Any]:
    """bench_gateway's summary, plus the acks past Feishu's deadline (it would push those again)."""
    over = sum(1 for r in results if r.elapsed * 1e3 > FEISHU_DEADLINE_MS)
    return {**summarize(results, late), "over_deadline": over}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from hermes_core.testing.fake_feishu import FakeFeishu

    started = time.perf_counter()
    source, idle = commit(), background_load()
    print(f"ack-under-load benchmark: source {source}; machine busy {idle:.0f}% before starting")
    workdir = Path(tempfile.mkdtemp(prefix="hermes-bench-ack-load-"))
    try:
        with FakeFeishu(encrypt_key=ENCRYPT_KEY) as feishu:
            with model_process(args.latency, workdir) as (model_url, model_pid):
                with gateway_process(model_url, feishu, workdir, gateway=args.gateway) as server:
                    figures = asyncio.run(_measure(feishu, server, model_pid, args))
                    figures["settings"] = server.settings.gateway.model_dump()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    q, lo = figures["quiet"], figures["loaded"]
    figures["ratio_p99"] = ratio(lo["p99_ms"], q["p99_ms"])
    figures["ratio_p50"] = ratio(lo["p50_ms"], q["p50_ms"])
    _print(figures, args)
    label = f"Feishu ack, {args.rate:g} ev/s, {args.backlog} turns queued, {args.latency * 1e3:g} ms model"
    p99 = row(f"{label}: p99", f"{lo['p99_ms']:.1f} ms", f"{q['p99_ms']:.1f} ms (quiet)",
              lo["p99_ms"], ACK_GOAL_MS, " ms")  # fmt: skip
    p99_ratio = row(f"{label}: p99 loaded/quiet", f"{lo['p99_ms']:.1f} ms", f"{q['p99_ms']:.1f} ms",
                    figures["ratio_p99"], RATIO_GOAL)  # fmt: skip
    not_ok = row(f"{label}: not acked OK", f"{lo['not_ok']} of {lo['n']}", "", lo["not_ok"], 0, "")
    figures["rows"] = [p99, p99_ratio, not_ok]
    figures["seconds"] = time.perf_counter() - started
    return figures


def _print(f: dict[str, Any], args: argparse.Namespace) -> None:
    table = []
    for name in ("quiet", "loaded"):
        s = f[name]
        table.append({
            "phase": name, "events": s["n"], "p50": f"{s['p50_ms']:.1f} ms", "p90": f"{s['p90_ms']:.1f} ms",
            "p99": f"{s['p99_ms']:.1f} ms", "max": f"{s['max_ms']:.1f} ms",
            "over 3 s": s["over_deadline"],
            "not acked OK": s["not_ok"], "push late p99": f"{s['late_p99_ms']:.1f} ms",
        })  # fmt: skip
    print(f"\nquiet {args.quiet_rate:g} ev/s x {args.quiet_seconds:g} s; loaded {args.rate:g} ev/s x "
          f"{args.seconds:g} s after {args.backlog} events queued ({f['backlog_push_s']:.1f} s to ack them); "
          f"model {args.latency * 1e3:g} ms per call")  # fmt: skip
    print(format_table(table, list(table[0])))
    print(f"loaded/quiet: p50 x{f['ratio_p50']:.2f}, p99 x{f['ratio_p99']:.2f} "
          f"(goal: loaded p99 <= {ACK_GOAL_MS:g} ms and <= x{RATIO_GOAL:g})")  # fmt: skip
    print(
        f"turns waiting or running: {f['queued_at_start']} at the start of the loaded window, "
        f"{f['queued_min']}..{f['queued_max']} during it; {f['turns_done_in_window']} turns done in it"
    )
    if f["turn_limit"]:
        low, mid, high = f["turn_limit"]
        print(f"adaptive turn limit (1/s samples): min {low}, median {mid:g}, max {high}")
    settings = f["settings"]
    print("gateway settings: " + json.dumps({k: v for k, v in settings.items() if "turn" in k or "lag" in k}))
    cpu = f["cpu"]
    print(
        "CPU during the loaded window: "
        + ", ".join(f"{k} {v:.1f}" + ("" if "%" in k or "wall" in k else " s") for k, v in cpu.items())
    )
    noise_warning(cpu, "loaded window")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="events per second, loaded window")
    parser.add_argument("--seconds", type=float, default=15.0, help="loaded window, seconds")
    parser.add_argument("--backlog", type=int, default=2000, help="turns queued before the loaded window")
    parser.add_argument("--latency", type=float, default=0.2, help="fake model latency per call, s")
    parser.add_argument("--quiet-rate", type=float, default=20.0, help="events per second, quiet window")
    parser.add_argument("--quiet-seconds", type=float, default=10.0, help="quiet window, seconds")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a gateway.* setting (repeatable)")  # fmt: skip
    args = parser.parse_args()
    args.gateway = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    figures = run(args)
    print()
    print(format_table(figures["rows"]))
    print(f"\n{machine()}; total {figures['seconds']:.0f} s")


if __name__ == "__main__":
    main()
