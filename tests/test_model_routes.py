"""`model.routes`: short and small-talk questions go to a cheaper model, end to end.

The gateway is the one serve runs (`build_gateway` from a YAML file, webhook on 127.0.0.1); the
models are the fake OpenAI-compatible server scripted per model, and its recorded requests say
which model each call went to and which tools it was offered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

import route_tools
from gateway_harness import gateway_for
from hermes_core.config import ConfigError, build_agent, load_settings
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from serve_process import clean_environ

ROUTES = [
    {"when": "small_talk", "model": "cheap-model"},
    {"when": "short", "max_chars": 30, "model": "cheap-model"},
]
TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def _reset() -> None:
    route_tools.CALLED.clear()


def write_config(tmp_path: Path, fake: FakeOpenAIServer, routes: list[dict[str, Any]] = ROUTES) -> Path:
    config = {
        "model": {"name": "main-model", "base_url": fake.base_url, "max_retries": 0, "routes": routes},
        "gateway": {"data_dir": str(tmp_path / "data")},
        "tools": ["route_tools"],
    }
    path = tmp_path / "hermes.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


async def ask(url: str, message: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url}/webhook", json={"message": message, "user_id": "u1"}) as response:
            assert response.status == 200
            return await response.json()


def offered(request: Any) -> list[str]:
    return sorted(tool["function"]["name"] for tool in request.tools)


async def test_a_short_question_goes_to_the_cheap_model_and_a_long_one_to_the_main(tmp_path: Path) -> None:
    """Attack: with `model.routes`, a short question must be answered by the cheaper model (one call,
    nothing sent to the main model) and a long one by the main model; the tool limited to the main
    model by `allowed_models` must not be offered to the cheap one."""
    async with FakeOpenAIServer() as fake:
        fake.script_for("cheap-model", FakeReply.text("Paris."))
        fake.script_for("main-model", FakeReply.text("A long answer."))
        async with gateway_for(write_config(tmp_path, fake)) as url:
            short = await ask(url, "Capital of France?")
            long = await ask(url, "Please explain in detail why the sky looks blue during the day.")
        requests = list(fake.requests)
    assert short["reply"] == "Paris." and long["reply"] == "A long answer."
    assert [r.model for r in requests] == ["cheap-model", "main-model"]
    scheduling = ["cancel_scheduled", "list_scheduled", "schedule_task"]  # serve's own (schedule/tools.py)
    assert offered(requests[0]) == sorted(
        ["clarify", "lookup_order", "remember", *scheduling]
    )  # no salary_report
    assert "salary_report" in offered(requests[1])
    answered = await answering_models(tmp_path)
    assert answered["Capital of France?"] == ["cheap-model"] and len(answered) == 2
    assert answered["Please explain in detail why the sky looks blue during the day."] == ["main-model"]


async def answering_models(tmp_path: Path) -> dict[str, list[str]]:
    """From each recorded task (the gateway's traces): the model that answered each call."""
    from hermes_core.observe.traces import SQLiteTraceStore

    store = SQLiteTraceStore(tmp_path / "data" / "gateway.db")
    found = {}
    for summary in await store.list():
        trace = await store.get(summary["task_id"])
        assert trace is not None
        found[trace["input"]] = [call["response"]["answered_by"] for call in trace["model_calls"]]
    return found


async def test_small_talk_goes_to_the_cheap_model(tmp_path: Path) -> None:
    """Attack: a greeting (small talk) must be answered by the cheaper model, with no tools."""
    async with FakeOpenAIServer() as fake:
        fake.script_for("cheap-model", FakeReply.text("Hello!"))
        config = write_config(tmp_path, fake, routes=[{"when": "small_talk", "model": "cheap-model"}])
        async with gateway_for(config) as url:
            answer = await ask(url, "hello")
            other = await ask(url, "Where is my order?")  # short, but not small talk
        requests = list(fake.requests)
    assert answer["reply"] == "Hello!" and requests[0].model == "cheap-model" and requests[0].tools == []
    assert other["reply"] and requests[1].model == "main-model"


async def test_a_routed_question_that_needs_a_tool_escalates_to_the_main_model(tmp_path: Path) -> None:
    """Attack: a short question that turns out to need a tool must still be answered: the cheap
    model's tool call is dropped (it never runs), the main model answers the same request, runs the
    tool once and writes the reply; the whole task after the escalation stays on the main model."""
    async with FakeOpenAIServer() as fake:
        fake.script_for("cheap-model", FakeReply.tool_call("lookup_order", {"order": "A1"}))
        fake.script_for(
            "main-model",
            FakeReply.tool_call("salary_report", {"team": "ops"}),
            FakeReply.text("Ops salaries total 1,000,000."),
        )
        async with gateway_for(write_config(tmp_path, fake)) as url:
            answer = await ask(url, "Ops salaries?")
        requests = list(fake.requests)
    assert answer["reply"] == "Ops salaries total 1,000,000."
    assert [r.model for r in requests] == ["cheap-model", "main-model", "main-model"]
    assert route_tools.CALLED == ["salary_report ops"]  # the cheap model's call never ran
    assert "salary_report" not in offered(requests[0]) and "salary_report" in offered(requests[1])
    assert await answering_models(tmp_path) == {"Ops salaries?": ["main-model", "main-model"]}


@pytest.mark.slow
def test_run_json_shows_the_usage_per_answering_model(tmp_path: Path) -> None:
    """Attack: the saving must be visible in the task's usage: `hermes-kernel run --json` reports the
    tokens per answering model, and the routed question's tokens are the cheap model's."""
    with FakeOpenAIServer() as fake:
        fake.script_for(
            "cheap-model", FakeReply.text("4", usage={"prompt_tokens": 7, "completion_tokens": 1})
        )
        config = write_config(tmp_path, fake)
        env = clean_environ()
        env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
        done = subprocess.run(
            [sys.executable, "-m", "hermes_core", "--config", str(config), "run", "--json", "2+2?"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["reply"] == "4"
    assert summary["usage_by_model"] == {"cheap-model": {"prompt_tokens": 7, "completion_tokens": 1,
                                                          "total_tokens": 8, "cached_tokens": 0}}  # fmt: skip


def test_routes_need_a_model_endpoint(tmp_path: Path) -> None:
    """Attack: routes configured for the offline demo model must be a clear error, not a crash."""
    path = tmp_path / "hermes.yaml"
    path.write_text(yaml.safe_dump({"model": {"routes": ROUTES}}), encoding="utf-8")
    with pytest.raises(ConfigError, match="model.routes: needs a model endpoint"):
        build_agent(load_settings(path, env={}, dotenv=None))


def test_a_bad_route_is_refused_naming_the_key(tmp_path: Path) -> None:
    """Attack: a route with an unknown rule or no model must stop the start naming the key."""
    path = tmp_path / "hermes.yaml"
    path.write_text(yaml.safe_dump({"model": {"routes": [{"when": "cheap", "mode": "x"}]}}), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, env={}, dotenv=None)
    assert "model.routes.0.when" in str(caught.value) and "model.routes.0.mode: unknown key" in str(
        caught.value
    )
