"""Regression evals (O4): the case format, the checks, `hermes-kernel eval` and `eval add TRACE`.

End to end, the cases run against the real-HTTP fake OpenAI server (see eval_fakes.py): "good"
follows its plan, "broken" has every tool call's arguments broken by the fake, so its cases must
fail and the exit code must say so.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eval_fakes import GIVE_UP, fake_models, requests_for, write_config
from hermes_core import cli
from hermes_core.evals.cases import Case, CaseError, Checks, evaluate, load_case, load_cases, parse_case
from hermes_core.kernel.loop import RunResult
from hermes_core.kernel.messages import ModelResponse, ToolCall
from hermes_core.kernel.replies import fixed_reply
from hermes_core.kernel.tools.registry import ToolOutcome

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "evals"

CASES = {
    "calc.yaml": """
        input: what is (12+34)*2
        checks:
          must_call:
            - tool: calculator
              arguments: {expression: "(12+34)*2"}
          reply_contains: ["92"]
          max_steps: 2
    """,
    "follow-up.yaml": """
        conversation:
          - user: I have two invoices, 1280 and 745 euros.
          - assistant: Noted, two invoices of 1280 and 745 euros.
          - user: what is (1280+745)*2
        checks:
          must_call:
            - tool: calculator
              arguments_match: {expression: '1280\\+745'}
          reply_matches: ['\\b4050\\b']
    """,
    "greeting.yaml": """
        input: 你好
        checks: {must_not_call: [calculator], max_steps: 1}
    """,
    "report.yaml": """
        files:
          sales.csv: "region,q1,q2\\nNorth,1200,1500\\n"
        input: Read sales.csv and write the report
        checks:
          must_call: [read_file, {tool: write_file, arguments: {path: report.md}}]
          file_contains: {report.md: ["North: 25%"]}
    """,
}


@pytest.fixture(autouse=True)
def clean_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HERMES_BASE_URL", "HERMES_MODEL", "HERMES_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no .env of the repository, outputs land in the test's folder


def write_cases(folder: Path, cases: dict[str, str]) -> Path:
    for name, text in cases.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text), encoding="utf-8")
    return folder


def table_rows(output: str) -> dict[str, list[str]]:
    """The pass table's rows by case name: [result, steps, latency, tokens, tools]."""
    rows = {}
    for line in output.splitlines():
        cells = line.split()
        if len(cells) >= 6 and cells[1] in ("PASS", "FAIL"):
            rows[cells[0]] = cells[1:]
    return rows


# -- the checks, on runs made by hand -----------------------------------------------------------------


def outcome(
    name: str, arguments: dict[str, object] | None, ok: bool = True, error: str | None = None
) -> ToolOutcome:
    call = ToolCall(f"call_{name}", name, json.dumps(arguments) if arguments is not None else "[1]")
    return ToolOutcome(call, "{}", ok, arguments, error=error)


def run_result(
    reply: str, outcomes: list[ToolOutcome], steps: int, stop_reason: str = "completed"
) -> RunResult:
    responses = [ModelResponse(content="") for _ in range(steps)]
    return RunResult(reply, [], outcomes, responses, stop_reason=stop_reason)


def verdicts(checks: dict[str, object], result: RunResult, workspace: Path | None = None) -> dict[str, bool]:
    return {check.check: check.passed for check in evaluate(Checks.model_validate(checks), result, workspace)}


def test_each_check_passes_and_fails_on_what_the_run_did(tmp_path: Path) -> None:
    (tmp_path / "report.md").write_text("North: 25%\n", encoding="utf-8")
    result = run_result(
        "The answer is 92.",
        [
            outcome("calculator", {"expression": "(12+34)*2"}),
            outcome("read_file", None, ok=False, error="bad_arguments"),
        ],
        steps=3,
    )
    checks = {
        "must_call": [
            "calculator",
            {"tool": "calculator", "arguments": {"expression": "(12+34)*2"}},
            {"tool": "calculator", "arguments_match": {"expression": r"12\+34"}},
            {"tool": "calculator", "arguments": {"expression": "12+34"}},
            "read_file",  # attempted, but it failed: not a successful call
        ],
        "must_not_call": ["write_file", "read_file"],
        "reply_contains": ["92", "93"],
        "reply_not_contains": ["Sorry"],
        "reply_matches": [r"\b92\b", r"^Sorry"],
        "max_steps": 2,
        "file_contains": {"report.md": ["North: 25%", "South"], "missing.md": ["x"]},
    }
    assert verdicts(checks, result, tmp_path) == {
        "must_call calculator": True,
        "must_call calculator(expression='(12+34)*2')": True,
        r"must_call calculator(expression~/12\+34/)": True,
        "must_call calculator(expression='12+34')": False,
        "must_call read_file": False,
        "must_not_call write_file": True,
        "must_not_call read_file": False,
        "reply_contains '92'": True,
        "reply_contains '93'": False,
        "reply_not_contains 'Sorry'": True,
        r"reply_matches /\b92\b/": True,
        "reply_matches /^Sorry/": False,
        "max_steps 2": False,
        "stop_reason completed": True,
        "file_contains report.md 'North: 25%'": True,
        "file_contains report.md 'South'": False,
        "file_contains missing.md 'x'": False,
    }
    stopped = run_result(fixed_reply("max_turns", "en"), [], steps=8, stop_reason="max_turns")
    assert verdicts({}, stopped) == {"stop_reason completed": False}
    assert verdicts({"stop_reason": None}, stopped) == {}
    failed = evaluate(Checks.model_validate({"must_call": ["read_file"], "max_steps": 2}), result)
    assert [c.detail for c in failed if not c.passed] == ["calls: [1] → bad_arguments", "took 3"]


def test_case_files_and_their_errors(tmp_path: Path) -> None:
    case = parse_case(
        {"conversation": [{"user": "a"}, {"assistant": "b"}, {"role": "user", "content": "c"}], "checks": {}},
        "x",
    )
    assert case.history == [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert case.task == "c" and case.checks.stop_reason == "completed"
    shorthand = parse_case({"conversation": [{"user": "a"}], "input": "b"}, "x")
    assert shorthand.history == [{"role": "user", "content": "a"}] and shorthand.task == "b"
    bad = {
        "input: x\nchecks: {reply_contain: [a]}\n": "checks.reply_contain: unknown key",
        "conversation: [{user: a}, {assistant: b}]\n": "the last message must be a user message",
        "conversation: [{system: a}, {user: b}]\n": "message 1: write {user: text}",
        "conversation: [{role: system, content: a}, {user: b}]\n": "system messages come from the settings",
        "input: x\nchecks: {reply_matches: '(unclosed'}\n": "invalid regular expression",
        "input: x\nfiles: {../escape.txt: x}\n": "must be relative",
        "- a list\n": "a case is a mapping",
    }
    for index, (text, expected) in enumerate(bad.items()):
        path = tmp_path / f"bad{index}.yaml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(CaseError) as info:
            load_case(path)
        assert str(path) in str(info.value) and expected in str(info.value), str(info.value)
    folder = write_cases(tmp_path / "cases", {"a.yaml": "input: x\n", "sub/b.yml": "name: a\ninput: y\n"})
    with pytest.raises(CaseError, match="case name 'a' is also used by"):
        load_cases(folder)


def test_the_example_cases_pass_on_the_offline_demo_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert [case.name for case in load_cases(EXAMPLES)] == [
        "calculation",
        "follow-up",
        "greeting",
        "workspace-listing",
    ]
    assert cli.main(["eval", "--cases", str(EXAMPLES)]) == 0
    assert "4 case(s): 4 passed, 0 failed" in capsys.readouterr().out


# -- end to end against the fake model server ------------------------------------------------------


def test_eval_passes_on_the_good_model_and_fails_on_the_broken_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = write_cases(tmp_path / "cases", CASES)
    config = write_config(tmp_path)
    with fake_models() as fake:
        common = ["--config", str(config), "--base-url", fake.base_url]
        code = cli.main([*common, "--model", "good", "eval", "--cases", str(cases), "--json", "good.json"])
        good = capsys.readouterr().out
        assert code == 0, good
        rows = table_rows(good)
        assert {name: row[0] for name, row in rows.items()} == dict.fromkeys(
            ["calc", "follow-up", "greeting", "report"], "PASS"
        )
        # steps are the model calls the fake answered: a tool turn and the answer, the greeting one call
        assert {name: int(row[1]) for name, row in rows.items()} == {
            "calc": 2,
            "follow-up": 2,
            "greeting": 1,
            "report": 4,
        }
        assert requests_for(fake, "good") == 9
        assert rows["report"][4] == "read_file,calculator,write_file" and rows["greeting"][4] == "-"
        assert rows["calc"][3] == "220"  # two answers of 110 tokens each, as the fake reported
        assert "4 case(s): 4 passed, 0 failed" in good
        history = [r.messages for r in fake.requests if "1280 and 745" in json.dumps(r.messages)]
        assert [m["role"] for m in history[0]] == ["system", "user", "assistant", "user"]
        assert history[0][-1]["content"] == "what is (1280+745)*2"
        results = json.loads((tmp_path / "good.json").read_text())
        assert results["passed"] == 4 and results["failed"] == 0

        code = cli.main([*common, "--model", "broken", "eval", "--cases", str(cases)])
        broken = capsys.readouterr().out
    assert code == 1, broken
    assert {name: row[0] for name, row in table_rows(broken).items()} == {
        "calc": "FAIL",
        "follow-up": "FAIL",
        "greeting": "PASS",  # no tool call to break
        "report": "FAIL",
    }
    assert fake.broken["broken"] == 3  # one broken tool call per failed case, after which the model gave up
    assert "4 case(s): 1 passed, 3 failed" in broken
    assert "must_call calculator(expression='(12+34)*2'): calls: [\"(12+34)*2\"] → bad_arguments" in broken
    assert f"reply_contains '92': reply was {GIVE_UP!r}" in broken


def test_eval_add_turns_a_trace_into_a_case_that_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failure = fixed_reply("max_turns", "en")
    trace = {
        "task_id": "4f2a9c0d1e7b44aa9d55",
        "conversation": "webhook:alice",
        "input": "what is (1280+745)*2",
        "history": [
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "I have two invoices, 1280 and 745 euros."},
            {"role": "assistant", "content": "Noted."},
        ],
        "messages": [],
        "tool_calls": [
            {"name": "calculator", "arguments": {"expression": "(1280+745)*2"}, "result": '{"result": 4050}',
             "ok": True, "error": None, "elapsed": 0.01},
            {"name": "read_file", "arguments": "[broken", "result": '{"error": "bad"}', "ok": False,
             "error": "bad_arguments", "elapsed": 0.0},
        ],
        "reply": failure,
        "stop_reason": "max_turns",
        "usage": {"prompt_tokens": 900, "completion_tokens": 80, "total_tokens": 980},
        "timings": {"total": 12.5},
    }  # fmt: skip
    trace_path = tmp_path / "failure.json"
    trace_path.write_text(json.dumps(trace), encoding="utf-8")
    cases = tmp_path / "cases"
    assert cli.main(["eval", "add", str(trace_path), "--cases", str(cases)]) == 0
    written = cases / "trace-4f2a9c0d1e7b.yaml"
    assert str(written) in capsys.readouterr().out
    text = written.read_text(encoding="utf-8")
    assert text.startswith("# Proposed by `hermes-kernel eval add` from failure.json")
    assert "#   read_file [broken -> failed (bad_arguments)" in text and "# Recorded reply: This task" in text
    case = load_case(written)
    assert case.source == "task 4f2a9c0d1e7b44aa9d55"
    assert case.history == [
        {"role": "user", "content": "I have two invoices, 1280 and 745 euros."},
        {"role": "assistant", "content": "Noted."},
    ]
    assert case.task == "what is (1280+745)*2"
    assert [check.tool for check in case.checks.must_call] == ["calculator"]
    assert case.checks.reply_not_contains == [failure] and case.checks.stop_reason == "completed"

    # the same trace again: refused unless forced; --cases may also come before `add`
    assert cli.main(["eval", "add", str(trace_path), "--cases", str(cases)]) == 2
    assert "exists" in capsys.readouterr().err
    assert cli.main(["eval", "--cases", str(cases), "add", str(trace_path), "--force"]) == 0
    capsys.readouterr()

    # without input and history, the conversation comes from the recorded messages
    bare = {"messages": [*trace["history"], {"role": "user", "content": "what is (12+34)*2"}]}
    (tmp_path / "bare.json").write_text(json.dumps(bare), encoding="utf-8")
    assert (
        cli.main(["eval", "add", str(tmp_path / "bare.json"), "--cases", str(cases), "--name", "bare"]) == 0
    )
    assert load_case(cases / "bare.yaml").task == "what is (12+34)*2"
    assert load_case(cases / "bare.yaml").checks.must_call == []

    with fake_models() as fake:
        args = ["--config", str(write_config(tmp_path)), "--base-url", fake.base_url, "--model", "good"]
        assert cli.main([*args, "eval", "--cases", str(cases), "-k", "trace"]) == 0
    out = capsys.readouterr().out
    assert table_rows(out)["trace-4f2a9c0d1e7b"][0] == "PASS" and "1 case(s): 1 passed" in out


@pytest.mark.slow
def test_eval_as_a_subprocess_exits_non_zero_on_a_regression(tmp_path: Path) -> None:
    cases = write_cases(
        tmp_path / "cases", {"calc.yaml": CASES["calc.yaml"], "greeting.yaml": CASES["greeting.yaml"]}
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    with fake_models() as fake:
        command = [sys.executable, "-m", "hermes_core", "--config", str(write_config(tmp_path))]
        command += ["--base-url", fake.base_url]
        good = subprocess.run(
            [*command, "--model", "good", "eval", "--cases", str(cases)],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
        )  # fmt: skip
        broken = subprocess.run(
            [*command, "--model", "broken", "eval", "--cases", str(cases)],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
        )  # fmt: skip
    assert good.returncode == 0, good.stdout + good.stderr
    assert re.search(r"^calc\s+PASS\s+2\b", good.stdout, re.MULTILINE)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert re.search(r"^calc\s+FAIL\s+2\b", broken.stdout, re.MULTILINE)
    assert re.search(r"^greeting\s+PASS\s+1\b", broken.stdout, re.MULTILINE)
    assert requests_for(fake, "good") == 3 and requests_for(fake, "broken") == 3


def test_eval_reports_a_missing_cases_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["eval", "--cases", str(tmp_path / "nowhere")]) == 2
    assert "no cases" in capsys.readouterr().err
    assert isinstance(parse_case({"input": "x"}, "x"), Case)


async def test_eval_add_takes_a_task_id_from_the_trace_store(tmp_path: Path) -> None:
    from hermes_core import Agent
    from hermes_core.observe.traces import SQLiteTraceStore, Tracer
    from hermes_core.testing import ScriptedModel, call, reply
    from hermes_core.tools.examples import calculator_tool

    store = SQLiteTraceStore(tmp_path / "data" / "gateway.db")
    model = ScriptedModel([call("calculator", {"expression": "(12+34)*2"}), reply("92")])
    await Agent(model=model, tools=[calculator_tool], tracer=Tracer(store)).run(
        "(12+34)*2?", task_id="web:m1"
    )
    await store.close()
    config = tmp_path / "hermes.yaml"
    config.write_text(f"gateway:\n  data_dir: {tmp_path / 'data'}\n", encoding="utf-8")
    cases = tmp_path / "cases"
    argv = ["--config", str(config), "eval", "add", "web:m1", "--cases", str(cases), "--name", "calc"]
    assert await asyncio.to_thread(cli.main, argv) == 0
    case = load_case(cases / "calc.yaml")
    assert case.task == "(12+34)*2?" and [c.tool for c in case.checks.must_call] == ["calculator"]
    missing = ["--config", str(config), "eval", "add", "web:nope", "--cases", str(cases)]
    assert await asyncio.to_thread(cli.main, missing) == 2
