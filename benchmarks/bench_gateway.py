"""The gateway as a real process: Feishu webhook ack latency under load, and draining 1,000 conversations.

Three processes, as in production: `python -m hermes_core serve` (cwd: a temporary directory, so
its SQLite lives there), the fake model (`python -m hermes_core.testing.fake_openai`, which calls
the calculator with {"expression": "1+1"} and then answers "done: ..."), and this process, which
runs `FakeFeishu` (the platform: open API + event pusher) in a thread. Events are encrypted with
an Encrypt Key and signed, as the real platform does; the gateway verifies both.

1. Ack latency: 200 message events/s for 30 s (6,000 events over 300 p2p chats), paced on an
   absolute schedule (event i at t0 + i/200), pushes concurrent; 1 s model latency. Each push's
   HTTP round trip as the platform sees it (`PushResult.elapsed`). Baseline in the same run: the
   same push loop against a bare aiohttp.web endpoint that only answers {"msg": "success"}.
2. Drain: 1,000 events at once (1,000 chats), 200 ms model latency, `feishu.send_rate: 50` and
   FakeFeishu limits app_qps=50, app_qpm=100000: time until all turns are done (/healthz
   `turns_done`) and until all replies reached FakeFeishu, each against its ideal; the server's
   peak RSS (VmHWM) and CPU time.

The model client's in-flight cap (`model.max_concurrency`, default 64) is raised to 1024 in both
runs, so the gateway's `max_turns_in_flight` is the only concurrency limit being measured.
Linux only (/proc).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import WORKLOADS, format_table, machine, percentile, ratio, row

TOOL_ARGS = '{"expression": "1+1"}'
EXPECTED_REPLY = '"result": 2'  # in "done: {...}" once the calculator ran
ENCRYPT_KEY = "bench-encrypt-key"
MODEL_CONCURRENCY = 1024
ACK_TARGET_MS = 20.0
PLATFORM_APP_QPS = 50
WARMUP_PUSHES = 20
TEXT = "what is 1+1?"


# -- processes -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _process(
    command: Sequence[str], ready: str, log: Path, *, cwd: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], re.Match[str]]]:
    """Start `command` (output to `log`), wait for a line matching `ready`; SIGTERM it on exit."""
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            found = re.search(ready, log.read_text(errors="replace"))
            if found:
                break
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{command[2]} did not start (exit {process.poll()}):\n{tail}")
            time.sleep(0.05)
        yield process, found
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class Server:
    url: str  # the Feishu callback URL
    base: str
    pid: int
    settings: Any


@contextlib.contextmanager
def model_process(latency: float, workdir: Path) -> Iterator[tuple[str, int]]:
    """The fake model in its own process: yields (base URL, pid)."""
    command = [sys.executable, "-m", "hermes_core.testing.fake_openai", "--port", "0"]
    command += ["--latency", str(latency), "--tool-args", TOOL_ARGS]
    with _process(command, r"READY (\S+)", workdir / "model.log", cwd=workdir) as (process, found):
        yield found.group(1), process.pid


@contextlib.contextmanager
def bare_process(workdir: Path) -> Iterator[tuple[str, int]]:
    command = [sys.executable, str(WORKLOADS / "bare_ack_server.py")]
    with _process(command, r"READY (\S+)", workdir / "bare.log", cwd=workdir) as (process, found):
        yield found.group(1), process.pid


@contextlib.contextmanager
def gateway_process(
    model_url: str,
    feishu: Any,
    workdir: Path,
    *,
    send_rate: float | None = None,
    gateway: dict[str, Any] | None = None,
) -> Iterator[Server]:
    """`python -m hermes_core serve` with Feishu on, cwd `workdir` (its SQLite lands there);
    `gateway`: more `gateway.*` settings."""
    from hermes_core.config import load_settings

    config: dict[str, Any] = {
        "model": {"name": "fake-model", "base_url": model_url, "max_concurrency": MODEL_CONCURRENCY},
        # per-sender limits off: this measures load, and each chat sends more than a person would
        "gateway": {
            "shutdown_grace": 1.0,
            "user_messages_per_minute": None,
            "conversation_queue": None,
            **(gateway or {}),
        },  # fmt: skip
    }
    if send_rate is not None:
        config["feishu"] = {"send_rate": send_rate}
    config_path = workdir / "hermes.yaml"
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FEISHU_"))}
    env.update(
        FEISHU_APP_ID=feishu.app_id,
        FEISHU_APP_SECRET=feishu.app_secret,
        FEISHU_BASE_URL=feishu.base_url,
        FEISHU_VERIFICATION_TOKEN=feishu.verification_token,
        FEISHU_ENCRYPT_KEY=feishu.encrypt_key,
    )
    settings = load_settings(config_path, env=env, dotenv=None)
    # --port 0: the OS picks a free port, read back from the ready line (no bind race)
    # --config is a global option: it goes before the subcommand
    command = [sys.executable, "-m", "hermes_core", "--config", config_path.name, "serve", "--port", "0"]
    ready = r"hermes-kernel serving on (http://\S+) \("
    with _process(command, ready, workdir / "server.log", cwd=workdir, env=env) as (process, found):
        base = found.group(1)
        yield Server(base + "/feishu/events", base, process.pid, settings)


# -- /proc -----------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])
    return total - idle, total


class Usage:
    """CPU seconds used by some processes (and this one) between construction and `done()`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        self.own = _own_cpu()
        self.ticks = machine_ticks()
        self.started = time.perf_counter()

    def done(self) -> dict[str, float]:
        used = {name: cpu_seconds(pid) - self.before[name] for name, pid in self.pids.items()}
        used["benchmark (pusher + FakeFeishu)"] = _own_cpu() - self.own
        busy, total = machine_ticks()
        busy_s = (busy - self.ticks[0]) / os.sysconf("SC_CLK_TCK")
        used["anything else on the machine"] = max(0.0, busy_s - sum(used.values()))  # noise
        used["machine busy %"] = 100 * (busy - self.ticks[0]) / max(1, total - self.ticks[1])
        used["wall s"] = time.perf_counter() - self.started
        return used


def background_load(seconds: float = 1.0) -> float:
    """How busy the machine is (% of all CPUs) while this benchmark does nothing: other work."""
    before = machine_ticks()
    time.sleep(seconds)
    after = machine_ticks()
    return 100 * (after[0] - before[0]) / max(1, after[1] - before[1])


def commit() -> str:
    """The measured source: git commit, plus a short hash of uncommitted changes under src/."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
        return done.stdout

    try:
        head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
        changes = git("diff", "HEAD", "--", "src") + git("ls-files", "--others", "--exclude-standard", "src")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not changes:
        return head
    untracked = git("ls-files", "--others", "--exclude-standard", "src").split()
    digest = hashlib.sha256(changes.encode())
    for name in untracked:
        with contextlib.suppress(OSError):
            digest.update((root / name).read_bytes())
    return f"{head}+uncommitted:{digest.hexdigest()[:8]}"


def noise_warning(cpu: dict[str, float], window: str) -> None:
    """Say so when other work on the machine took a noticeable share of the CPUs during a window."""
    other, wall = cpu["anything else on the machine"], cpu["wall s"]
    share = 100 * other / max(1e-9, wall * (os.cpu_count() or 1))
    if share > 5:
        print(
            f"WARNING: other processes used {other:.1f} CPU-s ({share:.0f}% of the machine) during the "
            f"{window}: its figures are inflated by them; rerun on a quiet machine"
        )


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


# -- pushing ---------------------------------------------------------------------------------------


async def health(session: Any, server: Server) -> dict[str, Any]:
    async with session.get(server.base + "/healthz") as response:
        return await response.json()


async def paced_pushes(feishu: Any, url: str, envelopes: list[dict], rate: float) -> tuple[list, list]:
    """Event i is pushed at t0 + i/rate (absolute schedule), without waiting for earlier acks.
    Returns the PushResults and how late (s) each push started against its schedule."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.05
    tasks, late = [], []
    for i, envelope in enumerate(envelopes):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        late.append(loop.time() - due)
        tasks.append(asyncio.create_task(feishu.push(envelope, url)))
    return list(await asyncio.gather(*tasks)), late


def summarize(results: list, late: list[float] | None = None) -> dict[str, Any]:
    ms = [r.elapsed * 1e3 for r in results]
    summary = {
        "n": len(results),
        "p50_ms": percentile(ms, 50),
        "p90_ms": percentile(ms, 90),
        "p99_ms": percentile(ms, 99),
        "max_ms": max(ms),
        "not_ok": sum(not r.ok for r in results),
        "outcomes": dict(Counter(str(r.status) if r.ok else (r.error or str(r.status)) for r in results)),
    }
    if late is not None:
        summary["late_p99_ms"] = percentile(late, 99) * 1e3
        summary["late_max_ms"] = max(late) * 1e3
    return summary


async def warm_up(feishu: Any, url: str, tag: str) -> None:
    """A few pushes first: imports (cryptography), connections, SQLite pages."""
    for i in range(WARMUP_PUSHES):
        envelope = feishu.user_message(TEXT, chat_id=f"oc_warm_{tag}{i}", sender=f"ou_warm_{tag}{i}")
        result = await feishu.push(envelope, url)
        if not result.ok:
            raise RuntimeError(f"warm-up push to {url} failed: {result.error} {result.body[:200]}")


def envelopes_for(feishu: Any, n: int, chats: int, tag: str) -> list[dict]:
    return [
        feishu.user_message(TEXT, chat_id=f"oc_{tag}{i % chats}", sender=f"ou_{tag}{i % chats}")
        for i in range(n)
    ]


# -- phase 1: ack latency --------------------------------------------------------------------------


async def _bare_run(feishu: Any, url: str, pid: int, rate: float, n: int, chats: int) -> dict[str, Any]:
    await warm_up(feishu, url, "bare")
    envelopes = envelopes_for(feishu, n, chats, "bare")
    usage = Usage({"bare server": pid})
    results, late = await paced_pushes(feishu, url, envelopes, rate)
    return {**summarize(results, late), "cpu": usage.done()}


async def _gateway_run(
    feishu: Any, server: Server, model_pid: int, rate: float, n: int, chats: int
) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        await warm_up(feishu, server.url, "gw")
        envelopes = envelopes_for(feishu, n, chats, "gw")
        usage = Usage({"gateway server": server.pid, "fake model": model_pid})
        busy: list[int] = []
        sampling = asyncio.create_task(_sample_in_flight(session, server, busy))
        try:
            results, late = await paced_pushes(feishu, server.url, envelopes, rate)
        finally:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
        cpu = usage.done()
        status = await health(session, server)
    return {
        **summarize(results, late),
        "cpu": cpu,
        "in_flight_max": max(busy, default=0),
        "in_flight_median": statistics.median(busy) if busy else 0,
        "health_at_end": status,
        "server_peak_rss_mb": peak_rss_mb(server.pid),
    }


async def _sample_in_flight(session: Any, server: Server, samples: list[int]) -> None:
    """conversations_busy (turns running or waiting for a slot) once a second, until cancelled."""
    while True:
        await asyncio.sleep(1.0)
        samples.append((await health(session, server))["conversations_busy"])


def ack_phase(rate: float, seconds: float, chats: int, latency: float) -> dict[str, Any]:
    from hermes_core.testing.fake_feishu import FakeFeishu

    n = int(rate * seconds)
    workdir = Path(tempfile.mkdtemp(prefix="hermes-bench-gw-ack-"))
    try:
        with FakeFeishu(encrypt_key=ENCRYPT_KEY) as feishu:
            with bare_process(workdir) as (bare_url, bare_pid):
                bare = asyncio.run(_bare_run(feishu, bare_url, bare_pid, rate, n, chats))
            with model_process(latency, workdir) as (model_url, model_pid):
                with gateway_process(model_url, feishu, workdir) as server:
                    gateway = asyncio.run(_gateway_run(feishu, server, model_pid, rate, n, chats))
                    feishu_settings = server.settings.feishu
                    send_rate = feishu_settings.send_rate or feishu_settings.app_send_rate
                    max_turns = server.settings.gateway.max_turns_in_flight
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    figures = {
        "events": n,
        "rate": rate,
        "seconds": seconds,
        "chats": chats,
        "model_latency_s": latency,
        "send_rate": send_rate,
        "max_concurrent_turns": max_turns,
        "gateway": gateway,
        "bare": bare,
        "ratio_p99": ratio(gateway["p99_ms"], bare["p99_ms"]),
        "ratio_p50": ratio(gateway["p50_ms"], bare["p50_ms"]),
    }
    _print_ack(figures)
    return figures


def _print_ack(f: dict[str, Any]) -> None:
    print(
        f"\n[1] Feishu webhook ack latency: {f['events']} encrypted+signed message events at "
        f"{f['rate']:g}/s for {f['seconds']:g} s over {f['chats']} p2p chats, model latency "
        f"{f['model_latency_s']:g} s; PushResult.elapsed (POST -> response read, in FakeFeishu's loop)"
    )
    table = []
    for name, key in (("hermes gateway", "gateway"), ("bare aiohttp", "bare")):
        s = f[key]
        table.append(
            {
                "endpoint": name,
                "p50": f"{s['p50_ms']:.1f} ms",
                "p90": f"{s['p90_ms']:.1f} ms",
                "p99": f"{s['p99_ms']:.1f} ms",
                "max": f"{s['max_ms']:.1f} ms",
                "not acked OK": f"{s['not_ok']} of {s['n']}",
                "push start late p99/max": f"{s['late_p99_ms']:.1f}/{s['late_max_ms']:.1f} ms",
            }
        )
    print(format_table(table, list(table[0])))
    ratios = f"p50 {f['ratio_p50']:.2f}, p99 {f['ratio_p99']:.2f}"
    print(f"ratio gateway/bare: {ratios}; target p99 <= {ACK_TARGET_MS:g} ms")
    g = f["gateway"]
    print(
        f"gateway outcomes {g['outcomes']}; conversations busy (a turn running or waiting for a "
        f"slot; 1/s samples): "
        f"median {g['in_flight_median']:g}, max {g['in_flight_max']} "
        f"(max_concurrent_turns {f['max_concurrent_turns']}, model.max_concurrency {MODEL_CONCURRENCY})"
    )
    h = g["health_at_end"]
    print(
        f"at the end of the window: turns_done {h.get('turns_done')}, replies_sent {h.get('replies_sent')} "
        f"(send rate cap {f['send_rate']:g}/s), messages_waiting {h.get('messages_waiting')}, "
        f"inbox_pending {h.get('inbox_pending')}; server peak RSS {g['server_peak_rss_mb']:.1f} MB"
    )
    for name in ("bare", "gateway"):
        cpu = f[name]["cpu"]
        parts = ", ".join(f"{k} {v:.1f}" + ("" if "%" in k or "wall" in k else " s") for k, v in cpu.items())
        print(f"CPU during the {name} window: {parts}")
        noise_warning(cpu, f"{name} window")


# -- phase 2: drain --------------------------------------------------------------------------------


async def _limiter_release_time(n: int, send_rate: float) -> float:
    """When the gateway's own SendLimiter (as `serve` builds it) would let the n-th of n sends to
    n different chats start, from a fresh limiter: simulated on a fake clock."""
    from hermes_core.channels.feishu.ratelimit import SendLimiter

    now = [0.0]

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    limiter = SendLimiter(rate_per_s=send_rate, clock=lambda: now[0], sleep=sleep)
    for i in range(n):
        async with limiter.slot(f"oc_{i}"):
            pass
    return now[0]


async def _drain_run(
    feishu: Any, server: Server, model_pid: int, n: int, latency: float, probes: int, timeout: float
) -> dict[str, Any]:
    import aiohttp

    async with aiohttp.ClientSession() as session:

        async def turns_done() -> int:
            return (await health(session, server))["turns_done"]

        # Model calls per turn, measured: one turn at a time on the idle server.
        probe_times = []
        for i in range(probes):
            before = await turns_done()
            started = time.perf_counter()
            envelope = feishu.user_message(TEXT, chat_id=f"oc_probe{i}", sender=f"ou_probe{i}")
            result = await feishu.push(envelope, server.url)
            assert result.ok, result
            while await turns_done() <= before:
                await asyncio.sleep(0.005)
            probe_times.append(time.perf_counter() - started)
        deadline = time.perf_counter() + 30
        while len(feishu.sent) < probes and time.perf_counter() < deadline:
            await asyncio.sleep(0.02)
        sample_reply = feishu.sent[0].text
        if EXPECTED_REPLY not in sample_reply:
            raise RuntimeError(f"unexpected reply (did the calculator run?): {sample_reply!r}")
        turn_s = statistics.median(probe_times)
        calls_per_turn = max(1, round(turn_s / latency))

        base_turns, base_sent = await turns_done(), len(feishu.sent)
        envelopes = [feishu.user_message(TEXT, chat_id=f"oc_d{i}", sender=f"ou_d{i}") for i in range(n)]
        cpu_before = cpu_seconds(server.pid)
        usage = Usage({"gateway server": server.pid, "fake model": model_pid})
        t0 = time.perf_counter()
        results = await asyncio.gather(*(feishu.push(e, server.url) for e in envelopes))
        acked = time.perf_counter() - t0
        done_at = delivered_at = None
        while done_at is None or delivered_at is None:
            now = time.perf_counter() - t0
            if done_at is None and await turns_done() - base_turns >= n:
                done_at = time.perf_counter() - t0
            if delivered_at is None and len(feishu.sent) - base_sent >= n:
                delivered_at = time.perf_counter() - t0
            if now > timeout:
                raise TimeoutError(
                    f"drain not finished after {timeout} s: turns {await turns_done() - base_turns}, "
                    f"delivered {len(feishu.sent) - base_sent} of {n}"
                )
            await asyncio.sleep(0.05)
        cpu = usage.done()
        status = await health(session, server)
        rss = peak_rss_mb(server.pid)  # just before the server is stopped
        cpu_total = cpu_seconds(server.pid)
    throttled = sum(1 for call in feishu.requests if call.status == 429 or call.code not in (0, None))
    return {
        "probe_turn_s": probe_times,
        "model_calls_per_turn": calls_per_turn,
        "sample_reply": sample_reply,
        "push": summarize(results),
        "all_acked_s": acked,
        "turns_s": done_at,
        "delivered_s": delivered_at,
        "cpu": cpu,
        "server_cpu_drain_s": cpu_total - cpu_before,
        "server_cpu_total_s": cpu_total,
        "server_peak_rss_mb": rss,
        "health_at_end": status,
        "platform_refusals": throttled,
    }


def drain_phase(n: int, latency: float, send_rate: float, probes: int = 3, timeout: float = 300.0) -> dict:
    from hermes_core.testing.fake_feishu import FakeFeishu

    workdir = Path(tempfile.mkdtemp(prefix="hermes-bench-gw-drain-"))
    try:
        with FakeFeishu(encrypt_key=ENCRYPT_KEY) as feishu:
            feishu.set_limits(app_qps=PLATFORM_APP_QPS, app_qpm=100_000)
            with model_process(latency, workdir) as (model_url, model_pid):
                with gateway_process(model_url, feishu, workdir, send_rate=send_rate) as server:
                    run = asyncio.run(_drain_run(feishu, server, model_pid, n, latency, probes, timeout))
                    max_turns = server.settings.gateway.max_turns_in_flight
                    actual_send_rate = server.settings.feishu.send_rate
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    calls = run["model_calls_per_turn"]
    release = asyncio.run(_limiter_release_time(n, actual_send_rate))
    figures = {
        **run,
        "conversations": n,
        "model_latency_s": latency,
        "max_concurrent_turns": max_turns,
        "send_rate": actual_send_rate,
        "turns_ideal_s": calls * latency * math.ceil(n / max_turns),
        "delivery_ideal_nominal_s": n / min(actual_send_rate, PLATFORM_APP_QPS),
        "delivery_ideal_s": release,
        "effective_send_rate": n / release if release else float("inf"),
    }
    figures["ratio_turns"] = ratio(figures["turns_s"], figures["turns_ideal_s"])
    figures["ratio_delivered"] = ratio(figures["delivered_s"], figures["delivery_ideal_s"])
    _print_drain(figures)
    return figures


def _print_drain(f: dict[str, Any]) -> None:
    n = f["conversations"]
    print(
        f"\n[2] Drain: {n} conversations at once (one event each, pushed concurrently), model latency "
        f"{f['model_latency_s']:g} s; feishu.send_rate {f['send_rate']:g}/s, FakeFeishu "
        f"set_limits(app_qps={PLATFORM_APP_QPS}, app_qpm=100000)"
    )
    probes = ", ".join(f"{t * 1e3:.0f}" for t in f["probe_turn_s"])
    print(
        f"model calls per turn: {f['model_calls_per_turn']} (measured: a lone turn takes {probes} ms at "
        f"{f['model_latency_s'] * 1e3:.0f} ms per model call; by design the fake calls the calculator, "
        f"then answers; reply seen: {f['sample_reply'][:60]!r})"
    )
    p = f["push"]
    print(
        f"all {n} pushes acked after {f['all_acked_s']:.2f} s (ack p50 {p['p50_ms']:.0f} ms, "
        f"p99 {p['p99_ms']:.0f} ms, max {p['max_ms']:.0f} ms, not acked OK {p['not_ok']})"
    )
    print(
        f"all turns done: {f['turns_s']:.2f} s; ideal {f['model_calls_per_turn']} calls x "
        f"{f['model_latency_s']:g} s x ceil({n}/{f['max_concurrent_turns']}) = {f['turns_ideal_s']:.2f} s "
        f"(max_concurrent_turns {f['max_concurrent_turns']}) -> x{f['ratio_turns']:.2f}"
    )
    print(
        f"all replies delivered: {f['delivered_s']:.2f} s; ideal {f['delivery_ideal_s']:.2f} s = when the "
        f"gateway's SendLimiter(rate_per_s={f['send_rate']:g}, app_per_s=50, app_per_min=1000) releases "
        f"send #{n} (effective {f['effective_send_rate']:.1f}/s) -> x{f['ratio_delivered']:.2f}; "
        f"nominal {n}/{min(f['send_rate'], PLATFORM_APP_QPS):g}/s = {f['delivery_ideal_nominal_s']:.1f} s"
    )
    h = f["health_at_end"]
    print(
        f"server: peak RSS (VmHWM) {f['server_peak_rss_mb']:.1f} MB, CPU {f['server_cpu_drain_s']:.2f} s "
        f"during the drain ({f['server_cpu_total_s']:.2f} s since start); dead_letters "
        f"{h.get('dead_letters')}, platform refusals (429 / code != 0) {f['platform_refusals']}"
    )
    cpu = f["cpu"]
    print(
        "CPU during the drain: "
        + ", ".join(f"{k} {v:.1f}" + ("" if "%" in k or "wall" in k else " s") for k, v in cpu.items())
    )
    noise_warning(cpu, "drain")


# -- both ------------------------------------------------------------------------------------------


def _report(metric: str, hermes: str, baseline: str, ratio_value: float | None) -> dict:
    """A row without a target (reported, not judged)."""
    shown = "" if ratio_value is None else f"{ratio_value:.2f}"
    return {"metric": metric, "hermes": hermes, "baseline": baseline, "ratio": shown, "target": "-", "ok": ""}


def run(
    rate: float = 200.0,
    seconds: float = 30.0,
    chats: int = 300,
    ack_latency: float = 1.0,
    conversations: int = 1000,
    drain_latency: float = 0.2,
    send_rate: float = 50.0,
) -> dict:
    started = time.perf_counter()
    source, idle = commit(), background_load()
    print(f"gateway benchmark: source {source}; machine busy {idle:.0f}% before starting (other work)")
    ack = ack_phase(rate, seconds, chats, ack_latency)
    drain = drain_phase(conversations, drain_latency, send_rate)
    g, b = ack["gateway"], ack["bare"]
    label = f"Feishu ack, {rate:g} ev/s x {seconds:g} s, {ack_latency:g} s model"
    p99 = row(
        f"{label}: p99",
        f"{g['p99_ms']:.1f} ms",
        f"{b['p99_ms']:.1f} ms (bare aiohttp)",
        g["p99_ms"],
        ACK_TARGET_MS,
        " ms",
    )
    p99["ratio"] = f"{ack['ratio_p99']:.2f}"
    not_ok = row(
        f"{label}: not acked OK",
        f"{g['not_ok']} of {g['n']}",
        f"{b['not_ok']} of {b['n']}",
        g["not_ok"],
        0,
        "",
    )
    not_ok["ratio"] = ""
    d = f"{conversations} conversations at once, {drain_latency * 1e3:g} ms model"
    rows = [
        _report(
            f"{label}: p50", f"{g['p50_ms']:.1f} ms", f"{b['p50_ms']:.1f} ms (bare aiohttp)", ack["ratio_p50"]
        ),
        p99,
        not_ok,
        _report(
            f"{d}: all turns done",
            f"{drain['turns_s']:.2f} s",
            f"ideal {drain['turns_ideal_s']:.2f} s",
            drain["ratio_turns"],
        ),
        _report(
            f"{d}: all replies delivered",
            f"{drain['delivered_s']:.2f} s",
            f"ideal {drain['delivery_ideal_s']:.2f} s",
            drain["ratio_delivered"],
        ),
        _report(
            f"{d}: server peak RSS / CPU",
            f"{drain['server_peak_rss_mb']:.1f} MB / {drain['server_cpu_drain_s']:.1f} s",
            "",
            None,
        ),
    ]
    total = time.perf_counter() - started
    return {
        "ack": ack,
        "drain": drain,
        "rows": rows,
        "seconds": total,
        "source": source,
        "background_load_pct": idle,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="events per second (phase 1)")
    parser.add_argument("--seconds", type=float, default=30.0, help="push window, seconds (phase 1)")
    parser.add_argument("--chats", type=int, default=300, help="p2p chats the events spread over")
    parser.add_argument("--ack-latency", type=float, default=1.0, help="model latency in phase 1, s")
    parser.add_argument("--conversations", type=int, default=1000, help="conversations at once (phase 2)")
    parser.add_argument("--drain-latency", type=float, default=0.2, help="model latency in phase 2, s")
    parser.add_argument("--send-rate", type=float, default=50.0, help="feishu.send_rate in phase 2")
    args = parser.parse_args()
    figures = run(
        args.rate,
        args.seconds,
        args.chats,
        args.ack_latency,
        args.conversations,
        args.drain_latency,
        args.send_rate,
    )
    print()
    print(format_table(figures["rows"]))
    print(f"\n{machine()}; total {figures['seconds']:.0f} s")


if __name__ == "__main__":
    main()
