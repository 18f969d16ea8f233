"""engine: temporal under load, against a local Temporal dev server (docs/scale-out.md).

    python benchmarks/bench_temporal.py [--quick] [--messages 300] [--chats 30] [--kills 10]
    python benchmarks/bench_temporal.py --only throughput --turns 300 --workers 1,2

Three measurements, each with real processes (`hermes-kernel serve` / `worker`), the fake Feishu
platform and the fake model (200 ms a call):

1. soak: `--messages` over `--chats` chats, every push sent twice (to both gateway nodes, the same
   event id or the same message id under a new one), while a worker is SIGKILLed `--kills` times
   (and started again): missing replies, duplicated replies, chats out of order, tool calls run
   more than once, and the resume time: for every step that was running on a killed worker and
   ran again on another (a model or tool call, read from the workflows' histories: an activity's
   started event with attempt > 1), the time from the SIGKILL to that step's new start — what the
   heartbeat timeout bounds;
2. throughput: `--turns` one-message chats delivered at once, as the platform delivers (a push
   refused under the burst — 503 — is sent again on its retry schedule, `pushes_sent_again`), on
   the embedded gateway (one `serve`, its default SQLite file), on two PostgreSQL nodes (two
   `serve`, `database.url`; the pushes alternate between them) and on Temporal with 1, 2 and 4
   workers (one `serve` node): turns/s,
   and CPU ms per turn of the serve nodes, the workers, the Temporal server and PostgreSQL, each
   apart, with the ratio of each engine's to the embedded gateway's (`cpu_ms_per_turn`: the
   nodes', serve + workers; `all_cpu_ms_per_turn`: everything) — `--engines` picks which run
   besides the embedded one;
3. acks: events pushed at `--ack-rate` a second for `--ack-seconds` to two gateway nodes: the
   platform's wait for each HTTP 200 (p50, p99, max), with no worker running (the accept path
   alone: the turns wait in the cluster) and with two workers running the turns meanwhile.

The Temporal nodes keep their state in a private PostgreSQL server (tests/pg_server.py; a fresh
database per measurement, `fsync` off as in the tests): its CPU per turn (the postmaster and its
backends) is reported beside the Temporal server's. The embedded gateway it is compared with keeps
its default SQLite file.

The dev server keeps its state in memory unless `--server-db`: its SQLite file commits one
operation at a time and bounds every rate here at about 50 a second, which a production cluster
(PostgreSQL, Cassandra) does not. The numbers depend on the machine: a 2-core machine runs the
dev server, the fakes, the nodes and the workers at once. It prints what it measured; `--quick`
runs smaller counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from hermes_core.testing.fake_feishu import FakeFeishu  # noqa: E402
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest  # noqa: E402

TOOLS = """
import json, os
from pathlib import Path
from hermes_core import tool

@tool(level=1)
def record(arg: str) -> str:
    \"\"\"Record a step (a write).\"\"\"
    with Path(os.environ["STEP_LOG"]).open("a") as f:
        f.write(json.dumps({"arg": arg, "pid": os.getpid()}) + "\\n")
    return f"recorded {arg}"
"""


def follow(request: RecordedRequest) -> FakeReply:
    """ "call record <x>": the tool, then "done: …"; anything else: "ok: …"."""
    last = request.messages[-1]
    if last["role"] == "tool":
        return FakeReply.text(f"done: {last['content']}")
    words = str(last.get("content") or "").split()
    if len(words) == 3 and words[0] == "call":
        return FakeReply.tool_call(words[1], {"arg": words[2]})
    return FakeReply.text(f"ok: {last.get('content')}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (and its waited-for children) from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds(data_dir: Path) -> float:
    """CPU of a PostgreSQL server: the postmaster (with its waited-for backends) and its live ones."""
    try:
        postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    total = cpu_seconds(postmaster)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:  # a backend: its own CPU (not yet in the parent's)
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


DATABASES: Any = None  # main: the PostgreSQL server whose fresh databases the Temporal nodes use
KEEP: set[Path] = set()  # folders kept at the end: a run that timed out, with its nodes' logs


def left_in(url: str) -> dict[str, Any]:
    """What a run that timed out left in its database: messages by status, live and expired turn
    claims by node, replies by status and node (engine: temporal keeps no inbox: empty)."""
    import psycopg

    found: dict[str, Any] = {}
    queries = {
        "inbox": "SELECT status, count(*) FROM inbox GROUP BY 1",
        "claims": "SELECT node, count(*), count(*) FILTER (WHERE expires_at > "
        "EXTRACT(EPOCH FROM clock_timestamp())) FROM turn_claims GROUP BY 1",
        "outbox": "SELECT status, node, count(*) FROM outbox GROUP BY 1, 2",
    }
    with psycopg.connect(url, autocommit=True) as connection:
        for name, query in queries.items():
            try:
                found[name] = [list(row) for row in connection.execute(query).fetchall()]
            except psycopg.Error:
                found[name] = []
    return found


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(0.05)


class Nodes:
    """`serve` and `worker` processes in one folder on one task queue (or `serve` embedded)."""

    def __init__(
        self,
        folder: Path,
        model: FakeOpenAIServer,
        feishu: FakeFeishu,
        temporal: str | None,
        *,
        postgres: bool = False,
    ) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / "steps.jsonl"
        self.log.touch()
        (folder / "bench_tools_mod.py").write_text(textwrap.dedent(TOOLS), encoding="utf-8")
        config: dict[str, Any] = {"tools": ["bench_tools_mod"], "gateway": {"metrics": False}}
        self.task_queue = f"b-{uuid.uuid4().hex[:8]}"
        if temporal is not None:
            config.update(engine="temporal", temporal={"address": temporal, "task_queue": self.task_queue})
            config["feishu"] = {"app_send_rate": 1000, "chat_send_rate": 1000}
        (folder / "hermes.yaml").write_text(json.dumps(config), encoding="utf-8")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FEISHU_"))}
        self.env.update(
            PYTHONPATH=str(folder),
            HERMES_BASE_URL=model.base_url,
            HERMES_MODEL="m",
            STEP_LOG=str(self.log),
            FEISHU_APP_ID=feishu.app_id,
            FEISHU_APP_SECRET=feishu.app_secret,
            FEISHU_VERIFICATION_TOKEN=feishu.verification_token,
            FEISHU_BASE_URL=feishu.base_url,
            HERMES_LOG_LEVEL="WARNING",
        )
        if temporal is not None or postgres:  # the engine keeps its state in PostgreSQL (database.url)
            self.env["HERMES_DATABASE_URL"] = DATABASES.fresh_database()
        self.nodes: list[tuple[subprocess.Popen[bytes], str]] = []
        self.workers: list[subprocess.Popen[bytes]] = []
        self._count = 0

    def _start(self, *args: str) -> subprocess.Popen[bytes]:
        self._count += 1
        output = (self.folder / f"p{self._count}.log").open("ab")
        command = [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", *args]
        return subprocess.Popen(
            command, cwd=self.folder, env=self.env, stdout=output, stderr=subprocess.STDOUT
        )

    def serve(self) -> str:
        from serve_process import free_port

        port = free_port()
        process = self._start("serve", "--port", str(port))
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _healthy(url) or process.poll() is not None, 60, "serve")
        self.nodes.append((process, url))
        return url

    def worker(self) -> subprocess.Popen[bytes]:
        process = self._start("worker")
        log = self.folder / f"p{self._count}.log"
        wait_until(
            lambda: "worker running" in log.read_text(errors="replace") or process.poll() is not None,
            60,
            "worker",
        )
        self.workers.append(process)
        return process

    def events(self, index: int) -> str:
        return self.nodes[index % len(self.nodes)][1] + "/feishu/events"

    def cpu(self, which: str) -> float:
        processes = [p for p, _ in self.nodes] if which == "serve" else self.workers
        return sum(cpu_seconds(p.pid) for p in processes)

    def stop(self) -> None:
        every = [p for p, _ in self.nodes] + self.workers
        for process in every:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in every:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


async def resume_times(address: str, task_queue: str, killed_at: list[float]) -> list[float]:
    """Seconds from a kill to the new start of each step it interrupted (see the docstring)."""
    from temporalio.client import Client

    client = await Client.connect(address)
    found = []
    async for listed in client.list_workflows(f"TaskQueue = '{task_queue}'"):
        history = await client.get_workflow_handle(listed.id, run_id=listed.run_id).fetch_history()
        scheduled = {e.event_id: e.event_time.ToDatetime().timestamp() for e in history.events}
        for event in history.events:
            if not event.HasField("activity_task_started_event_attributes"):
                continue
            attributes = event.activity_task_started_event_attributes
            if attributes.attempt < 2:
                continue
            started = event.event_time.ToDatetime().timestamp()
            since = scheduled.get(attributes.scheduled_event_id, 0.0)
            kills = [at for at in killed_at if since <= at <= started]  # the first one interrupted it
            if kills:
                found.append(started - kills[0])
    return found


async def soak(
    folder: Path,
    temporal: str,
    model: FakeOpenAIServer,
    feishu: FakeFeishu,
    messages: int,
    chats: int,
    kills: int,
) -> dict[str, Any]:
    nodes = Nodes(folder, model, feishu, temporal)
    rng = random.Random(20261201)
    try:
        nodes.serve(), nodes.serve()
        nodes.worker(), nodes.worker()
        run = uuid.uuid4().hex[:6]
        names = [f"oc_{run}_{n}" for n in range(chats)]
        sent: dict[str, list[str]] = {name: [] for name in names}
        killed_at: list[float] = []
        per_chat = messages // chats

        async def talk(number: int, chat: str) -> None:
            for i in range(per_chat):
                envelope = feishu.user_message(f"call record {chat}-{i}", chat_id=chat, sender=f"ou_{chat}")
                sent[chat].append(envelope["event"]["message"]["message_id"])
                again = feishu.redelivery_of(envelope, new_event_id=i % 2 == 1)
                first = (number + i) % 2
                await asyncio.gather(
                    feishu.push(envelope, nodes.events(first)), feishu.push(again, nodes.events(first + 1))
                )
                await asyncio.sleep(rng.uniform(0.05, 0.3))

        async def killer() -> None:
            for _ in range(kills):
                await asyncio.sleep(rng.uniform(1.0, 2.5))
                victim = rng.choice(nodes.workers)
                killed_at.append(time.time())
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait()
                nodes.workers.remove(victim)
                await asyncio.to_thread(nodes.worker)

        started = time.monotonic()
        await asyncio.gather(*(talk(n, chat) for n, chat in enumerate(names)), killer())
        everything = {mid for ids in sent.values() for mid in ids}
        answered = lambda: {m.reply_to for m in feishu.sent} >= everything  # noqa: E731
        await asyncio.to_thread(wait_until, answered, 180, "every reply")
        took = time.monotonic() - started
        replies = Counter(m.reply_to for m in feishu.sent if m.reply_to in everything)
        order = sum(1 for chat in names if [m.reply_to for m in feishu.messages_in(chat)] != sent[chat])
        runs = Counter(json.loads(line)["arg"] for line in nodes.log.read_text().splitlines() if line)
        resumed = sorted(await resume_times(temporal, nodes.task_queue, killed_at))
        return {
            "messages": len(everything),
            "pushes": 2 * len(everything),
            "kills": kills,
            "seconds": round(took, 1),
            "missing": len(everything - set(replies)),
            "duplicated_replies": sum(n - 1 for n in replies.values()),
            "chats_out_of_order": order,
            "tool_runs": sum(runs.values()),
            "tool_calls_run_twice": sum(1 for n in runs.values() if n > 1),
            "steps_resumed": len(resumed),
            "resume_s_median": round(resumed[len(resumed) // 2], 1) if resumed else None,
            "resume_s_max": round(resumed[-1], 1) if resumed else None,
        }
    finally:
        nodes.stop()


async def throughput(
    folder: Path,
    kind: str,
    model: FakeOpenAIServer,
    feishu: FakeFeishu,
    turns: int,
    *,
    temporal: str | None = None,
    temporal_pid: int | None = None,
    workers: int = 0,
    embedded: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`turns` messages, one per chat (the turns run concurrently), pushed at once; CPU per turn
    of the serve nodes, the workers, the Temporal server and PostgreSQL, each apart; the ratio of
    the nodes' (serve + workers) to `embedded`'s."""
    postgres = kind != "embedded"
    nodes = Nodes(folder, model, feishu, temporal if kind == "temporal" else None, postgres=postgres)
    try:
        for _ in range(2 if kind == "postgres" else 1):
            nodes.serve()
        for _ in range(workers):
            nodes.worker()
        run = uuid.uuid4().hex[:6]
        names = [f"oc_{run}_{n}" for n in range(turns)]  # one message per chat: turns run concurrently
        serve_before, workers_before = nodes.cpu("serve"), nodes.cpu("workers")
        server_before = cpu_seconds(temporal_pid) if temporal_pid else 0.0
        postgres_before = postgres_cpu_seconds(DATABASES.data) if postgres else 0.0
        started = time.monotonic()
        envelopes = [
            feishu.user_message(f"hello {n}", chat_id=chat, sender=f"ou_{chat}")
            for n, chat in enumerate(names)
        ]
        # delivered as the platform does: a push answered with anything but 200 in time (a node
        # under this burst answers 503 when Temporal does not take a signal within its deadline)
        # is sent again on the platform's schedule (× time_scale)
        logged = len(feishu.push_log)
        for n, envelope in enumerate(envelopes):
            feishu.deliver(envelope, nodes.events(n))
        ids = {e["event"]["message"]["message_id"] for e in envelopes}
        answered = lambda: len(ids & {m.reply_to for m in feishu.sent})  # noqa: E731
        try:
            await asyncio.to_thread(
                wait_until, lambda: answered() == turns, 300, lambda: f"{answered()} of the turns"
            )
        except RuntimeError:
            KEEP.add(folder)
            print("unanswered", kind, sorted(ids - {m.reply_to for m in feishu.sent})[:10], flush=True)
            if "HERMES_DATABASE_URL" in nodes.env:
                print("left in PostgreSQL", json.dumps(left_in(nodes.env["HERMES_DATABASE_URL"])), flush=True)
            raise
        took = time.monotonic() - started
        attempts = [a for a in feishu.push_log[logged:] if a.message_id in ids]
        serve = nodes.cpu("serve") - serve_before
        worker = nodes.cpu("workers") - workers_before
        server = (cpu_seconds(temporal_pid) - server_before) if temporal_pid else 0.0
        database = (postgres_cpu_seconds(DATABASES.data) - postgres_before) if postgres else 0.0
        per_turn = lambda seconds: round(1000 * seconds / turns, 1)  # noqa: E731
        result = {
            "engine": kind,
            "serve_nodes": len(nodes.nodes),
            "workers": workers,
            "turns": turns,
            "turns_per_s": round(turns / took, 1),
            "pushes_sent_again": sum(1 for a in attempts if a.attempt > 0),
            "cpu_ms_per_turn": per_turn(serve + worker),
            "serve_cpu_ms_per_turn": per_turn(serve),
            "worker_cpu_ms_per_turn": per_turn(worker) if kind == "temporal" else None,
            "temporal_server_cpu_ms_per_turn": per_turn(server) if kind == "temporal" else None,
            "postgres_cpu_ms_per_turn": per_turn(database) if postgres else None,
            "all_cpu_ms_per_turn": per_turn(serve + worker + server + database),
        }
        for name in ("cpu_ms_per_turn", "all_cpu_ms_per_turn", "turns_per_s") if embedded else ():
            result[f"{name}_ratio_to_embedded"] = round(result[name] / embedded[name], 2)
        return result
    finally:
        nodes.stop()


async def acks(
    folder: Path,
    temporal: str,
    model: FakeOpenAIServer,
    feishu: FakeFeishu,
    rate: float,
    seconds: float,
    workers: int,
) -> dict[str, Any]:
    nodes = Nodes(folder, model, feishu, temporal)
    try:
        nodes.serve(), nodes.serve()
        for _ in range(workers):  # 0: the accept path alone, the turns wait in the cluster
            nodes.worker()
        run = uuid.uuid4().hex[:6]
        count = int(rate * seconds)
        pushes = []
        started = time.monotonic()
        for n in range(count):
            chat = f"oc_{run}_{n % 50}"
            envelope = feishu.user_message(f"hello {n}", chat_id=chat, sender=f"ou_{chat}")
            pushes.append(asyncio.ensure_future(feishu.push(envelope, nodes.events(n))))
            await asyncio.sleep(max(0.0, started + (n + 1) / rate - time.monotonic()))
        results = await asyncio.gather(*pushes)
        waits = sorted(result.elapsed for result in results)
        return {
            "workers": workers,
            "events": count,
            "rate_per_s": rate,
            "ok": sum(1 for r in results if r.ok),
            "ack_p50_ms": round(1000 * waits[len(waits) // 2], 1),
            "ack_p99_ms": round(1000 * waits[int(len(waits) * 0.99) - 1], 1),
            "ack_max_ms": round(1000 * waits[-1], 1),
        }
    finally:
        nodes.stop()


async def main(args: argparse.Namespace) -> None:
    global DATABASES
    from pg_server import PostgresServer, missing
    from temporal_dev import DevServer, temporal_binary

    binary, why = temporal_binary()
    if binary is None or missing() is not None:
        print(f"bench_temporal: {why or missing()}")
        return
    DATABASES = await asyncio.to_thread(PostgresServer().start)
    folder = Path(tempfile.mkdtemp(prefix="bench-temporal-"))
    server = DevServer(binary, folder, persistent=args.server_db)
    model = FakeOpenAIServer(handler=follow, latency=args.latency, record_requests=False).start_in_thread()
    feishu = FakeFeishu(time_scale=0.01).start_in_thread()
    try:
        await asyncio.to_thread(server.wait_ready)
        parts = set(args.only.split(",")) if args.only else {"soak", "throughput", "acks"}
        if "soak" in parts:
            result = await soak(
                folder / "soak", server.address, model, feishu, args.messages, args.chats, args.kills
            )
            print("soak", json.dumps(result), flush=True)
        if "throughput" in parts:
            embedded = await throughput(folder / "embedded", "embedded", model, feishu, args.turns)
            print("throughput", json.dumps(embedded), flush=True)
            if "postgres" in args.engines:
                result = await throughput(
                    folder / "postgres", "postgres", model, feishu, args.turns, embedded=embedded
                )
                print("throughput", json.dumps(result), flush=True)
            for workers in [int(w) for w in args.workers.split(",")] if "temporal" in args.engines else []:
                result = await throughput(
                    folder / f"w{workers}",
                    "temporal",
                    model,
                    feishu,
                    args.turns,
                    temporal=server.address,
                    temporal_pid=server.process.pid,
                    workers=workers,
                    embedded=embedded,
                )
                print("throughput", json.dumps(result), flush=True)
        if "acks" in parts:
            for workers in (0, 2):
                result = await acks(
                    folder / f"acks{workers}",
                    server.address,
                    model,
                    feishu,
                    args.ack_rate,
                    args.ack_seconds,
                    workers,
                )
                print("acks", json.dumps(result), flush=True)
    finally:
        feishu.stop()
        model.stop()
        server.stop()
        DATABASES.stop()
        if folder in KEEP or any(kept.is_relative_to(folder) for kept in KEEP):
            print("kept for reading:", folder, flush=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 messages over 6 chats, 3 kills, 60 turns")
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--chats", type=int, default=30)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--turns", type=int, default=200, help="turns of the throughput runs")
    parser.add_argument("--workers", default="1,2,4", help="worker counts of the throughput runs")
    parser.add_argument(
        "--engines", default="postgres,temporal", help="throughput: besides embedded (postgres, temporal)"
    )
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per model call")
    parser.add_argument("--ack-rate", type=float, default=200.0)
    parser.add_argument("--ack-seconds", type=float, default=5.0)
    parser.add_argument("--only", help="soak, throughput, acks (comma-separated)")
    parser.add_argument(
        "--server-db",
        action="store_true",
        help="the dev server keeps its state in a SQLite file (each commit waits for the disk: about 50 "
        "signal-with-starts a second here); default: in memory",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.chats, args.kills, args.turns, args.ack_seconds = 30, 6, 3, 60, 2.0
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
