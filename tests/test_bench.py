"""The model bench (O5): `hermes-kernel bench` against the real-HTTP fake OpenAI server.

Three scripted models (eval_fakes.py): "good" always solves the task, "flaky" has its tool-call
arguments broken by the fake on a fixed 30% schedule (and then gives up), "slow" solves it with a
delay on every answer. The printed table, the CSV, the JSON and the SVG must show what the fake
actually did: success rate = 1 - broken / runs, average steps = model calls answered / runs.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from xml.etree import ElementTree

import pytest

from eval_fakes import SLOW_LATENCY, USAGE, fake_models, requests_for, write_config
from hermes_core import cli
from hermes_core.evals.bench import Progress, load_tasks
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest

MODELS = ["good", "flaky", "slow"]
PRICES = {"good": {"prompt": 0.5, "completion": 2.0}, "flaky": {"prompt": 0.5, "completion": 2.0}}
CALL_COST = USAGE["prompt_tokens"] / 1000 * 0.5 + USAGE["completion_tokens"] / 1000 * 2.0  # 0.07

CALCULATION_ONLY = """
    tasks:
      - name: calculation
        input: What is (1234 + 5678) * 3 - 17? Use the calculator.
        checks: {must_call: [calculator], reply_matches: ['20,?719'], max_steps: 4}
"""


@pytest.fixture(autouse=True)
def clean_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HERMES_BASE_URL", "HERMES_MODEL", "HERMES_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def table(output: str) -> dict[str, list[str]]:
    """The bench table's rows by model: [runs, success, avg steps, avg latency, avg tokens, (cost)]."""
    rows = {}
    for line in output.splitlines():
        cells = line.split()
        if cells and cells[0] in MODELS and len(cells) >= 6 and cells[2].endswith("%"):
            rows[cells[0]] = cells[1:]
    return rows


def test_bench_prints_what_the_fake_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(json.dumps({"prices": PRICES}), encoding="utf-8")
    n = 4
    with fake_models() as fake:
        code = cli.main(
            ["--config", str(write_config(tmp_path, max_concurrency=2)), "--base-url", fake.base_url]
            + ["bench", "--models", ",".join(MODELS), "-n", str(n), "--prices", str(prices), "--out", "out"]
        )
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    tasks, _ = load_tasks()  # the built-in task set
    runs = len(tasks) * n
    assert runs == 20 and "bench: 5 task(s) x 4 run(s) per model" in captured.out
    rows = table(captured.out)
    assert list(rows) == MODELS

    broken = fake.broken["flaky"]
    assert broken > 0 and fake.broken["good"] == fake.broken["slow"] == 0
    expected_success = {"good": 1.0, "flaky": (runs - broken) / runs, "slow": 1.0}
    for model in MODELS:
        steps = requests_for(fake, model) / runs  # every model call is one request to the fake
        runs_cell, success, avg_steps, _latency, tokens, *cost = rows[model]
        assert runs_cell == str(runs)
        assert success == f"{expected_success[model]:.1%}"
        assert avg_steps == f"{steps:.2f}"
        assert tokens == f"{steps * USAGE['total_tokens']:.1f}"  # the fake reports 110 tokens per answer
        assert cost == ([f"{steps * CALL_COST:.6f}"] if model in PRICES else ["-"])
    # the plans take 2, 2, 4, 4 and 3 model calls; a broken call ends its run early
    assert rows["good"][2] == rows["slow"][2] == "3.00"
    assert float(rows["flaky"][2]) < 3.0
    assert float(rows["slow"][3]) > float(rows["good"][3]) and float(rows["slow"][3]) >= 2 * SLOW_LATENCY
    # max_concurrency 2: at most two runs (and two requests) of each model at once, the models side by side
    assert 2 <= fake.max_in_flight <= 6

    data = json.loads((tmp_path / "out" / "bench.json").read_text(encoding="utf-8"))
    assert data["n"] == n and data["tasks"] == [task.name for task in tasks]
    by_model = {row["model"]: row for row in data["models"]}
    assert by_model["flaky"]["passed"] == runs - broken and by_model["good"]["passed"] == runs
    assert by_model["good"]["by_task"] == dict.fromkeys(data["tasks"], 1.0)
    assert len(data["runs"]) == 3 * runs
    failed = [run for run in data["runs"] if not run["passed"]]
    assert len(failed) == broken and {run["model"] for run in failed} == {"flaky"}
    assert all(any(check.startswith("must_call") for check in run["failed"]) for run in failed)

    with (tmp_path / "out" / "bench.csv").open(encoding="utf-8") as file:
        csv_rows = {row["model"]: row for row in csv.DictReader(file)}
    assert list(csv_rows) == MODELS
    assert float(csv_rows["flaky"]["success_rate"]) == pytest.approx(expected_success["flaky"])
    assert csv_rows["slow"]["avg_cost"] == "" and float(csv_rows["good"]["avg_cost"]) == pytest.approx(
        3 * CALL_COST
    )

    svg = ElementTree.parse(tmp_path / "out" / "bench.svg").getroot()
    assert svg.tag == "{http://www.w3.org/2000/svg}svg"
    texts = [element.text for element in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert {"success rate", "avg steps", "avg latency (s)", "avg tokens", "avg cost"} <= set(texts)
    assert texts.count("good") == 5 and f"{expected_success['flaky']:.1%}" in texts
    bars = [
        rect for rect in svg.iter("{http://www.w3.org/2000/svg}rect") if rect.find("{*}title") is not None
    ]
    assert len(bars) == 5 * 3
    assert f"{runs * 3}/{runs * 3} runs" in captured.err  # the progress bar reached the end


def test_the_flaky_model_succeeds_exactly_as_often_as_the_fake_let_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(textwrap.dedent(CALCULATION_ONLY), encoding="utf-8")
    with fake_models() as fake:
        args = ["--config", str(write_config(tmp_path, max_concurrency=4)), "--base-url", fake.base_url]
        code = cli.main([*args, "bench", "--models", "flaky", "--tasks", str(tasks), "-n", "10"])
    out = capsys.readouterr().out
    assert code == 0
    # one tool call per run, 3 of every 10 broken on the fake's fixed schedule: 70%, each run two calls
    assert fake.broken["flaky"] == 3 and fake.tool_replies["flaky"] == 10
    assert table(out)["flaky"][:4] == ["10", "70.0%", "2.00", table(out)["flaky"][3]]
    assert (tmp_path / "bench-results" / "bench.svg").is_file()


@pytest.mark.slow
def test_bench_as_a_subprocess(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.yaml"
    prices = "prices:\n  good: {prompt: 1.0, completion: 1.0}\n"  # in the tasks file this time
    tasks.write_text(textwrap.dedent(CALCULATION_ONLY) + prices, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
    with fake_models() as fake:
        command = [sys.executable, "-m", "hermes_core", "--config", str(write_config(tmp_path))]
        command += ["--base-url", fake.base_url, "bench", "--models", "good,slow", "--tasks", str(tasks)]
        done = subprocess.run(
            [*command, "-n", "3", "--out", "results"],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = table(done.stdout)
    assert rows["good"][:3] == ["3", "100.0%", "2.00"] and rows["slow"][:3] == ["3", "100.0%", "2.00"]
    assert rows["good"][5] == f"{2 * 110 / 1000:.6f}" and rows["slow"][5] == "-"  # 220 tokens at 1.0 per 1k
    assert requests_for(fake, "good") == requests_for(fake, "slow") == 6
    assert "6/6 runs" in done.stderr
    written = json.loads((tmp_path / "results" / "bench.json").read_text(encoding="utf-8"))
    assert [row["success_rate"] for row in written["models"]] == [1.0, 1.0]
    assert ElementTree.parse(tmp_path / "results" / "bench.svg").getroot().tag.endswith("svg")


def test_progress_is_plain_text_and_bad_input_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stream = io.StringIO()
    progress = Progress({"a": 2, "b": 2}, stream, width=8)
    for model in ("a", "b", "a", "b"):
        progress.advance(model)
    progress.finish()
    lines = stream.getvalue().splitlines()
    assert lines[-1] == "bench [########] 4/4 runs  a 2/2  b 2/2"
    assert all(re.fullmatch(r"bench \[[#-]{8}\] \d/4 runs  a \d/2  b \d/2", line) for line in lines)

    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks:\n  - input: x\n", encoding="utf-8")
    assert cli.main(["bench", "--models", "m", "--tasks", str(bad)]) == 2
    assert "tasks[0] needs a name" in capsys.readouterr().err
    bad.write_text("tasks: [{name: a, input: x}]\nprices: {m: {prompt: 1}}\n", encoding="utf-8")
    assert cli.main(["bench", "--models", "m", "--tasks", str(bad)]) == 2
    assert "prices: m.completion: Field required" in capsys.readouterr().err
    assert cli.main(["bench", "--models", "m", "-n", "0"]) == 2


ROUTED_TASKS = """
    prices:
      good: {prompt: 1.0, completion: 1.0}
      cheap: {prompt: 0.1, completion: 0.1}
    tasks:
      - name: greeting
        input: hello
        checks: {reply_matches: ['Hello']}
      - name: calculation
        input: What is (1234 + 5678) * 3 - 17? Use the calculator.
        checks: {must_call: [calculator], reply_matches: ['20,?719'], max_steps: 4}
"""


def test_bench_compares_routed_with_unrouted_per_answering_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Attack: the saving of `model.routes` must be visible in the bench: with routes configured each
    model runs unrouted and routed (`good+routes`); the small talk goes to the cheap model in the
    routed row only, the tokens-by-model column says so, each model's tokens are priced at its own
    price, and a comparison line gives the routed cost as a ratio of the unrouted one."""
    config = write_config(tmp_path)
    config.write_text(
        config.read_text(encoding="utf-8") + "  routes: [{when: small_talk, model: cheap}]\n",
        encoding="utf-8",
    )
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(textwrap.dedent(ROUTED_TASKS), encoding="utf-8")
    with fake_models() as fake:
        args = ["--config", str(config), "--base-url", fake.base_url, "bench", "--models", "good"]
        code = cli.main([*args, "--tasks", str(tasks), "-n", "2", "--out", "out"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("good")}
    # unrouted: greeting 1 call + calculation 2 calls on good = 330 tokens per 2 tasks → 165 a run
    assert lines["good"][1:3] == ["4", "100.0%"] and lines["good"][6] == f"{0.165:.6f}"
    assert lines["good"][7] == "good:165.0"
    # routed: the greeting's 110 tokens are the cheap model's (at a tenth of the price)
    assert lines["good+routes"][1:3] == ["4", "100.0%"]
    assert lines["good+routes"][6] == f"{(220 * 1.0 + 110 * 0.1) / 2 / 1000:.6f}"
    assert lines["good+routes"][7:] == ["cheap:55.0", "good:110.0"]
    assert requests_for(fake, "cheap") == 2 and requests_for(fake, "good") == 2 * 3 + 2 * 2
    assert f"routes: good+routes cost per run {0.1155 / 0.165:.2f}x of good (success 100.0% vs 100.0%)" in out
    data = json.loads((tmp_path / "out" / "bench.json").read_text(encoding="utf-8"))
    assert [row["model"] for row in data["models"]] == ["good", "good+routes"]
    assert data["models"][1]["tokens_by_model"] == {"cheap": 55.0, "good": 110.0}


def cached_answers(request: RecordedRequest) -> FakeReply:
    """The calculation task, answered with usage as DeepSeek reports it: the second call of a run
    finds most of its prompt in the provider's cache."""
    if request.messages[-1]["role"] == "tool":
        usage = {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020,
                 "prompt_cache_hit_tokens": 900, "prompt_cache_miss_tokens": 100}  # fmt: skip
        return FakeReply.text("(1234 + 5678) * 3 - 17 = 20719.", usage=usage)
    usage = {"prompt_tokens": 800, "completion_tokens": 30, "total_tokens": 830,
             "prompt_cache_hit_tokens": 0, "prompt_cache_miss_tokens": 800}  # fmt: skip
    return FakeReply.tool_call("calculator", {"expression": "(1234 + 5678) * 3 - 17"}, usage=usage)


def test_bench_prices_cached_prompt_tokens_at_their_own_price(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cases: DeepSeek's context-caching guide (cache hits reported as `prompt_cache_hit_tokens`,
    billed at the cache-hit price). A run of two calls: 1,800 prompt tokens of which 900 cached, 50
    completion tokens; at 0.5 per 1k prompt, 0.05 per 1k cached and 2.0 per 1k completion it costs
    (900 * 0.5 + 900 * 0.05 + 50 * 2.0) / 1000. A model without a `cached` price pays the prompt
    price for them."""
    tasks = tmp_path / "tasks.yaml"
    prices = "prices:\n  good: {prompt: 0.5, completion: 2.0, cached: 0.05}\n"
    prices += "  plain: {prompt: 0.5, completion: 2.0}\n"  # no cached price: the prompt price
    tasks.write_text(textwrap.dedent(CALCULATION_ONLY) + prices, encoding="utf-8")
    with FakeOpenAIServer(handler=cached_answers) as fake:
        code = cli.main(
            ["--config", str(write_config(tmp_path)), "--base-url", fake.base_url]
            + ["bench", "--models", "good,plain", "--tasks", str(tasks), "-n", "2", "--out", "out"]
        )
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    data = {row["model"]: row for row in json.loads((tmp_path / "out" / "bench.json").read_text())["models"]}
    assert data["good"]["avg_cached_tokens"] == 900
    assert data["good"]["avg_cost"] == pytest.approx((900 * 0.5 + 900 * 0.05 + 50 * 2.0) / 1000)
    assert data["plain"]["avg_cost"] == pytest.approx((1800 * 0.5 + 50 * 2.0) / 1000)
    header = next(line for line in captured.out.splitlines() if line.startswith("model"))
    assert "avg cached" in header and "avg cost" in header


def test_bench_prices_a_published_model_unless_the_run_prices_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cases: DeepSeek's published USD prices (api-docs.deepseek.com/quick_start/pricing-details-usd:
    deepseek-chat $0.27 per 1M input tokens on a cache miss, $0.07 on a hit, $1.10 output), the
    same two-call run as above. A model the tasks file prices is priced as the file says."""
    from hermes_core.evals.bench import PUBLISHED

    tasks = tmp_path / "tasks.yaml"
    prices = "prices:\n  gpt-4o-mini: {prompt: 1.0, completion: 1.0}\n"
    tasks.write_text(textwrap.dedent(CALCULATION_ONLY) + prices, encoding="utf-8")
    with FakeOpenAIServer(handler=cached_answers) as fake:
        code = cli.main(
            ["--config", str(write_config(tmp_path)), "--base-url", fake.base_url]
            + ["bench", "--models", "deepseek-chat,gpt-4o-mini,unpriced", "--tasks", str(tasks), "-n", "1"]
            + ["--out", "out"]
        )
    captured = capsys.readouterr()
    assert code == 0, captured.out + captured.err
    data = {row["model"]: row for row in json.loads((tmp_path / "out" / "bench.json").read_text())["models"]}
    assert PUBLISHED["deepseek-chat"].cached == 0.00007
    assert data["deepseek-chat"]["avg_cost"] == pytest.approx((900 * 0.27 + 900 * 0.07 + 50 * 1.10) / 1e6)
    assert data["gpt-4o-mini"]["avg_cost"] == pytest.approx((1800 + 50) / 1000)  # the file's price
    assert data["unpriced"]["avg_cost"] is None
