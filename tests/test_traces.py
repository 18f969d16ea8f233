"""Traces: each task's complete record in SQLite, X-rays of failed tasks, `hermes-kernel traces` and
`trace show`, OpenTelemetry spans; and, through a real `hermes-kernel serve`, no secret anywhere."""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from hermes_core import Agent, ModelUnavailable, Session, tool
from hermes_core.evals.traces import case_from_trace
from hermes_core.kernel.tools.permissions import Caller, Policy
from hermes_core.observe.commands import summary_table, timeline
from hermes_core.observe.traces import SQLiteTraceStore, Tracer, TraceStore, xray_path
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.pending import SQLiteInteractions
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from serve_process import CLEAN_ENV

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "docs" / "log-schema.json").read_text("utf-8"))
RECORD_KEYS = set(
    "task_id conversation channel caller input history messages model_calls tool_calls approvals reply "
    "stop_reason ok usage timings started_at finished_at error".split()
)
SUMMARY_KEYS = set(
    "task_id conversation input started_at finished_at stop_reason ok reply model_calls tool_names "
    "tokens".split()
)


@tool(level=0)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool(level=0)
def weather(city: str) -> dict:
    """Today's weather in a city."""
    return {"city": city, "condition": "sunny"}


def traced(tmp_path: Path, script: list[Any], **options: Any) -> tuple[Agent, SQLiteTraceStore]:
    store = SQLiteTraceStore(tmp_path / "traces.db")
    tracer = Tracer(store, xray_dir=tmp_path / "xray")
    return Agent(model=ScriptedModel(script), tools=[add, weather], tracer=tracer, **options), store


async def test_a_task_is_recorded_whole(tmp_path: Path) -> None:
    steps = [call("add", {"a": 40, "b": 2}, ("weather", {"city": "北京"})), reply("42")]
    agent, store = traced(tmp_path, steps)
    earlier = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    session = Session(id="webhook:u1", messages=earlier)
    caller = Caller("u1", channel="webhook")
    result = await agent.run("40 + 2, and the weather?", session=session, task_id="webhook:m1", caller=caller)
    record = await store.get("webhook:m1")
    await store.close()
    assert record is not None and RECORD_KEYS <= set(record)
    assert (record["conversation"], record["channel"]) == ("webhook:u1", "webhook")
    assert record["caller"] == {
        "user_id": "u1",
        "role": "member",
        "channel": "webhook",
        "interactive": True,
        "preapproved": [],
        "withheld": [],
    }
    assert record["input"] == "40 + 2, and the weather?"
    assert [m["role"] for m in record["history"]] == ["system", "user", "assistant"]  # as sent
    assert record["messages"] == json.loads(json.dumps(result.messages))
    first, second = record["model_calls"]
    assert (first["turn"], second["turn"]) == (1, 2) and first["request_messages_count"] == 4
    assert first["tools"] == ["add", "weather"] and first["error"] is None and first["elapsed"] >= 0
    raw = first["response"]
    assert [(c["name"], json.loads(c["arguments"])) for c in raw["tool_calls"]] == [
        ("add", {"a": 40, "b": 2}),
        ("weather", {"city": "北京"}),
    ]
    assert raw["usage"] == {
        "prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "cached_tokens": 0,
    }  # fmt: skip
    assert second["response"]["content"] == "42" and second["response"]["finish_reason"] == "stop"
    calls = record["tool_calls"]
    assert [(c["turn"], c["name"], c["result"], c["ok"], c["error"]) for c in calls] == [
        (1, "add", "42", True, None),
        (1, "weather", '{"city": "北京", "condition": "sunny"}', True, None),
    ]
    assert all(c["elapsed"] >= 0 and c["started_at"] >= record["started_at"] for c in calls)
    assert (record["reply"], record["stop_reason"], record["ok"]) == ("42", "completed", True)
    assert record["usage"]["total_tokens"] == 30 and set(record["timings"]) == {"model", "tools", "total"}
    assert record["started_at"] <= record["finished_at"] and record["approvals"] == []
    assert not (tmp_path / "xray").exists()  # a completed task leaves no X-ray


async def test_plan_mode_is_traced_like_the_loop(tmp_path: Path) -> None:
    from hermes_core.plans import run_plan

    first = {"id": "one", "tool": "add", "params": {"a": 1, "b": 2}}
    then = {"id": "two", "tool": "add", "params": {"a": "$output.one", "b": 4}, "requires": ["one"]}
    plan = {"steps": [first, then]}
    agent, store = traced(tmp_path, [json.dumps(plan), "It is 7."])
    result = await run_plan(agent, "add 1 and 2, then 4", task_id="p1")
    record = await store.get("p1")
    assert result.reply == "It is 7." and record is not None
    assert [(c["name"], c["result"], c["ok"]) for c in record["tool_calls"]] == [
        ("add", "3", True),
        ("add", "7", True),
    ]
    assert len(record["model_calls"]) == 2 and record["reply"] == "It is 7."


async def test_a_failed_task_is_an_xray_that_eval_add_reads(tmp_path: Path) -> None:
    script = [call("add", {"a": 1, "b": 1}), call("add", {"a": 2, "b": 2}), call("add", {"a": 3, "b": 3})]
    agent, store = traced(tmp_path, script, max_turns=2)
    result = await agent.run("keep adding", task_id="webhook:m2")
    await store.close()
    assert result.stop_reason == "max_turns"
    xray = json.loads(xray_path(tmp_path / "xray", "webhook:m2").read_text("utf-8"))
    assert xray_path(tmp_path / "xray", "webhook:m2").name == "webhook_m2.json"
    assert RECORD_KEYS <= set(xray) and xray["stop_reason"] == "max_turns" and xray["ok"] is False
    assert [(c["name"], c["ok"]) for c in xray["tool_calls"]] == [("add", True), ("add", True)]
    case, notes = case_from_trace(xray, "from-xray")  # another command's reader of the same shape
    assert case["conversation"] == [{"user": "keep adding"}] and case["checks"]["must_call"] == ["add"]
    assert notes[0] == "Recorded run: stop_reason=max_turns, 2 tool call(s)"


async def test_summaries_filter_by_failure_conversation_tool_and_date(tmp_path: Path) -> None:
    store = SQLiteTraceStore(tmp_path / "traces.db")
    tracer = Tracer(store)
    runs = [
        ("t1", "conv-a", [call("add", {"a": 1, "b": 2}), reply("3")]),
        ("t2", "conv-a", [call("weather", {"city": "上海"}), reply("sunny " * 100)]),
        ("t3", "conv-b", [ModelUnavailable("down")]),
    ]
    for task_id, conversation, script in runs:
        agent = Agent(model=ScriptedModel(script), tools=[add, weather], tracer=tracer)
        await agent.run(f"task {task_id}", session=Session(id=conversation), task_id=task_id)
    everything = await store.list()
    assert [s["task_id"] for s in everything] == ["t3", "t2", "t1"]  # newest first
    assert all(set(s) == SUMMARY_KEYS for s in everything)
    t2 = everything[1]
    assert (t2["conversation"], t2["input"], t2["ok"], t2["model_calls"], t2["tool_names"], t2["tokens"]) == (
        "conv-a",
        "task t2",
        True,
        2,
        ["weather"],
        30,
    )
    assert len(t2["reply"]) == 200 and t2["reply"].endswith("…")  # truncated in the summary only
    assert [s["task_id"] for s in await store.list(failed=True)] == ["t3"]
    assert [s["task_id"] for s in await store.list(failed=False)] == ["t2", "t1"]
    assert [s["task_id"] for s in await store.list(conversation="conv-a")] == ["t2", "t1"]
    assert [s["task_id"] for s in await store.list(tool="add")] == ["t1"]
    assert [s["task_id"] for s in await store.list(limit=1)] == ["t3"]
    t1 = await store.get("t1")
    assert t1 is not None
    await store.record({**t1, "task_id": "old", "started_at": 1_000.0, "finished_at": 1_001.0})
    assert [s["task_id"] for s in await store.list(until=2_000.0)] == ["old"]
    assert "old" not in [s["task_id"] for s in await store.list(since=2_000.0)]
    assert await store.get("missing") is None
    table = summary_table(await store.list()).splitlines()
    assert table[0].split()[:3] == ["started", "task", "conversation"] and "model_unavailable" in table[1]
    await store.close()


async def test_a_paused_task_is_recorded_with_its_approval_then_again_when_done(tmp_path: Path) -> None:
    ran: list[str] = []

    @tool(confirm=True)
    def send_invoice(customer: str) -> str:
        """Send an invoice (a person approves first)."""
        ran.append(customer)
        return "sent"

    database = tmp_path / "g.db"
    store = SQLiteTraceStore(database)
    interactions = SQLiteInteractions(database)
    policy = Policy.from_lists(admins=["feishu:boss"])
    model = ScriptedModel([call("send_invoice", {"customer": "ACME"}), reply("Invoice sent.")])
    agent = Agent(
        model=model,
        tools=[send_invoice],
        journal=SQLiteTaskJournal(database),
        permissions=policy,
        interactions=interactions,
        tracer=Tracer(store, xray_dir=tmp_path / "xray"),
    )
    alice = policy.caller("alice", "feishu")
    paused = await agent.run("invoice ACME", task_id="feishu:m1", caller=alice)
    assert paused.stop_reason == "awaiting_approval"
    record = await store.get("feishu:m1")
    assert record is not None and record["stop_reason"] == "awaiting_approval"
    [approval] = record["approvals"]
    assert (approval["tool"], approval["status"], approval["requested_by"]) == (
        "send_invoice",
        "pending",
        "alice",
    )
    assert await store.list(failed=True) == [] and not (tmp_path / "xray").exists()  # paused is not failed
    await interactions.decide(approval["id"], policy.caller("boss", "feishu"), approve=True)
    done = await agent.run("invoice ACME", task_id="feishu:m1", caller=alice)
    assert done.reply == "Invoice sent." and ran == ["ACME"]
    record = await store.get("feishu:m1")
    assert record is not None and record["ok"] is True and len(await store.list()) == 1  # replaced
    [approval] = record["approvals"]
    assert (approval["status"], approval["decided_by"]) == ("approved", "boss")
    assert [c["name"] for c in record["tool_calls"]] == ["send_invoice"] and record["tool_calls"][0]["ok"]
    assert "send_invoice" in timeline(record) and "approved by boss" in timeline(record)
    await store.close()
    await interactions.close()


class BrokenStore(TraceStore):
    async def record(self, trace: dict[str, Any]) -> None:
        raise OSError("disk full")

    async def get(self, task_id: str) -> dict[str, Any] | None:
        return None

    async def list(self, **filters: Any) -> list[dict[str, Any]]:  # type: ignore[override]
        return []


async def test_a_tracer_that_fails_never_fails_the_task(caplog: pytest.LogCaptureFixture) -> None:
    agent = Agent(
        model=ScriptedModel([call("add", {"a": 1, "b": 1}), reply("2")]),
        tools=[add],
        tracer=Tracer(BrokenStore()),
    )
    result = await agent.run("1 + 1", task_id="t-broken")
    assert result.reply == "2" and result.ok
    assert any("could not be stored" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_a_task_that_raises_is_recorded_as_an_error_and_dumped(tmp_path: Path) -> None:
    agent, store = traced(tmp_path, [call("add", {"a": 1, "b": 1}), RuntimeError("client bug")])
    with pytest.raises(RuntimeError, match="client bug"):
        await agent.run("1 + 1", task_id="t-crash")
    record = await store.get("t-crash")
    await store.close()
    assert record is not None and record["stop_reason"] == "error" and record["ok"] is False
    assert record["error"] == "RuntimeError: client bug"
    assert [c["name"] for c in record["tool_calls"]] == ["add"]
    assert (
        record["model_calls"][1]["response"] is None and record["model_calls"][1]["error"] == record["error"]
    )
    assert xray_path(tmp_path / "xray", "t-crash").is_file()


async def test_trace_show_prints_a_timeline_and_exports_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hermes_core.cli import main

    monkeypatch.chdir(tmp_path)
    store = SQLiteTraceStore(tmp_path / ".hermes" / "gateway.db")  # where the CLI looks by default
    agent = Agent(
        model=ScriptedModel([call("add", {"a": 40, "b": 2}), reply("It is 42.")]),
        tools=[add],
        tracer=Tracer(store),
    )
    await agent.run("what is 40 + 2?", task_id="cli:1")
    await store.close()
    assert await _cli(main, ["trace", "show", "cli:1"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith("task cli:1  conversation -")
    steps = [line.split("s  ", 1)[1] for line in shown if line.startswith("  +")]
    assert [step.split()[0] for step in steps] == ["message", "model", "tool", "model", "reply"]
    assert 'add({"a": 40, "b": 2}) ok → 42' in steps[2] and steps[-1] == 'reply out    "It is 42."'
    assert await _cli(main, ["trace", "show", "cli:1", "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert RECORD_KEYS <= set(exported) and exported["task_id"] == "cli:1"
    assert await _cli(main, ["traces", "--json", "--tool", "add"]) == 0
    assert [s["task_id"] for s in json.loads(capsys.readouterr().out)] == ["cli:1"]
    assert await _cli(main, ["trace", "show", "nope"]) == 2
    assert "no trace 'nope'" in capsys.readouterr().err


async def _cli(main: Any, argv: list[str]) -> int:
    import asyncio

    return await asyncio.to_thread(main, argv)  # the CLI runs its own event loop


async def test_otel_spans_one_per_task_model_call_and_tool_call() -> None:
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from hermes_core.observe.otel import OTelSpans

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    model = ScriptedModel([call("add", {"a": 1, "b": 2}, ("add", {"a": "x"})), reply("3")])
    agent = Agent(model=model, tools=[add], tracer=Tracer(spans=OTelSpans(provider)))
    await agent.run("1 + 2", task_id="t-otel")
    spans = exporter.get_finished_spans()
    names = sorted(s.name for s in spans)
    assert names == ["hermes.task", "model.complete", "model.complete", "tool add", "tool add"]
    [task] = [s for s in spans if s.name == "hermes.task"]
    assert dict(task.attributes) == {"hermes.task_id": "t-otel", "hermes.stop_reason": "completed"}
    children = [s for s in spans if s is not task]
    assert all(s.parent is not None and s.parent.span_id == task.context.span_id for s in children)
    first = next(s for s in spans if s.name == "model.complete" and s.attributes["hermes.turn"] == 1)
    assert first.attributes["gen_ai.usage.input_tokens"] == 10 and first.attributes["hermes.tool_calls"] == 2
    tools = sorted(s.attributes["hermes.ok"] for s in spans if s.name == "tool add")
    assert tools == [False, True]


# --- the whole service ---------------------------------------------------------------------------

SECRET = "sk-trace-Zq81Wm3Xn5Lp7Kv9Hb2Jc4"


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_serve_records_every_task_logs_json_and_leaks_no_secret(tmp_path: Path) -> None:
    (tmp_path / "hermes.yaml").write_text("observe:\n  log_dir: logs\n  log_format: json\n", encoding="utf-8")
    fake = FakeOpenAIServer(api_key=SECRET).start_in_thread()
    env = {**CLEAN_ENV, "HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "fake", "HERMES_API_KEY": SECRET}
    fake.script(
        FakeReply.tool_call("calculator", {"expression": "(12+34)*2"}),
        FakeReply.text(f"92 (and your key is {SECRET})"),
        FakeReply.error(400, f"invalid request from key {SECRET}"),
    )
    command = [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml"]
    stderr = (tmp_path / "stderr.txt").open("w")
    server = subprocess.Popen(
        [*command, "serve", "--port", "0"],
        cwd=tmp_path,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=stderr,
    )
    try:
        assert server.stdout is not None
        address = next(m.group(1) for line in server.stdout if (m := re.search(r"serving on (\S+) \(", line)))
        user = {"user_id": "u1", "message_id": "m1"}
        answer = post(f"{address}/webhook", {**user, "message": f"compute (12+34)*2, key {SECRET}"})
        assert "92" in answer["reply"]
        post(f"{address}/webhook", {**user, "message_id": "m2", "message": "and again?"})
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
        stderr.close()
        fake.stop()

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, *argv], cwd=tmp_path, env=CLEAN_ENV, capture_output=True, text=True)

    listed = json.loads(cli("traces", "--json").stdout)
    assert [(s["conversation"], s["stop_reason"]) for s in listed] == [
        ("webhook:u1", "model_rejected"),
        ("webhook:u1", "completed"),
    ]
    # a task id names the message and a part of its own (channels/seam.py: task_id_of)
    second, first = (s["task_id"] for s in listed)
    assert second.startswith("webhook:m2~") and first.startswith("webhook:m1~")
    assert [s["task_id"] for s in json.loads(cli("traces", "--failed", "--json").stdout)] == [second]
    shown = cli("trace", "show", first).stdout
    assert 'calculator({"expression": "(12+34)*2"}) ok → {"expression": "(12+34)*2", "result": 92}' in shown
    xray = tmp_path / ".hermes" / "xray" / f"{second.replace(':', '_').replace('~', '_')}.json"
    assert json.loads(xray.read_text("utf-8"))["stop_reason"] == "model_rejected"
    assert cli("replay", str(xray)).returncode == 0  # the recorded rejection, replayed
    replayed = cli("replay", first)
    assert replayed.returncode == 0 and "reproduced" in replayed.stdout

    log_file = tmp_path / "logs" / "hermes-kernel.log"
    log_lines = [json.loads(line) for line in log_file.read_text("utf-8").splitlines()]
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for line in log_lines:
        validator.validate(line)
    ours = [line for line in log_lines if line["task_id"] == first]
    assert {line["conversation"] for line in ours} == {"webhook:u1"}
    assert [line["event"] for line in ours if line["event"] != "log"] == [
        "message_in",
        "model_response",
        "tool_call",
        "tool_result",
        "model_response",
        "reply_out",
    ]
    written = [log_file, *(tmp_path / ".hermes" / "xray").iterdir(), tmp_path / "stderr.txt"]
    for path in written:  # the user's message held the key, the model echoed it, its error quoted it
        assert SECRET.encode() not in path.read_bytes(), path
    with sqlite3.connect(tmp_path / ".hermes" / "gateway.db") as db:
        rows = db.execute("SELECT * FROM traces").fetchall()
        rows += db.execute("SELECT * FROM trace_tools").fetchall()
    assert len(rows) == 3 and "[REDACTED]" in repr(rows) and SECRET not in repr(rows)


def test_run_and_chat_record_traces_that_traces_failed_lists(tmp_path: Path) -> None:
    """The README's order, from a fresh folder (issue 29: `run`/`chat` recorded no trace, so the next
    command, `traces --failed`, showed nothing): a `run` that fails (its model endpoint refuses the
    connection) and a `chat` turn (the offline demo model) are both in `traces`, the failed one in
    `traces --failed`."""
    unreachable = {**CLEAN_ENV, "HERMES_BASE_URL": "http://127.0.0.1:9/v1", "HERMES_MODEL": "m"}

    def cli(*argv: str, env: dict[str, str] = CLEAN_ENV, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hermes_core", *argv], cwd=tmp_path, env=env,
                              input=stdin, capture_output=True, text=True, timeout=120)  # fmt: skip

    assert cli("run", "what is 2+3", env=unreachable).returncode == 1
    assert cli("chat", "--quiet", stdin="计算 (12+34)*2\nexit\n").returncode == 0
    listed, failed = cli("traces").stdout, cli("traces", "--failed").stdout
    assert "what is 2+3" in listed and "计算 (12+34)*2" in listed
    assert "what is 2+3" in failed and "计算" not in failed
