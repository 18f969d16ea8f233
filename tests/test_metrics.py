"""GET /metrics on a real `hermes-kernel serve` process: what happened, in Prometheus' text format.

Each test starts `python -m hermes_core serve` (a fresh process: every counter starts at zero)
against the fake OpenAI-compatible server, sends webhook traffic over HTTP, scrapes /metrics and
parses it with prometheus_client's parser (a reference implementation, test-only dependency).
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from serve_process import CLEAN_ENV, start_serve

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")


def start_server(cwd: Path, config: dict[str, Any], env: dict[str, str], *args: str) -> tuple[Any, str]:
    (cwd / "hermes.yaml").write_text(json.dumps(config), encoding="utf-8")
    process, found = start_serve(
        "--config", "hermes.yaml", "serve", "--port", "0", *args, cwd=cwd, env={**CLEAN_ENV, **env}
    )  # fmt: skip
    port = found.group(1).rsplit(":", 1)[1]
    return process, f"http://127.0.0.1:{port}"


def stop(process: Any) -> None:
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def request(
    url: str, body: dict | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes, Any]:
    data = json.dumps(body).encode() if body is not None else None
    call = urllib.request.Request(url, data=data, method="POST" if data else "GET", headers=headers or {})
    try:
        with urllib.request.urlopen(call, timeout=30) as response:
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


def scrape(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of the exposition, by (sample name, labels)."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_metrics_count_what_happened(tmp_path: Path) -> None:
    """Attack/case: after known traffic — three webhook messages, one resent with the same id, one
    model request failing with 503 once — the scrape must say exactly that: 3 acks accepted and
    1 duplicate, 3 turns replied, 6 model calls and 3 calculator calls in the latency histograms,
    1 model retry, 3 replies sent, and empty queues; and it must parse as text format 0.0.4."""
    with FakeOpenAIServer() as model:
        model.script(FakeReply.error(503, headers={"Retry-After": "0"}))
        for _ in range(3):
            model.script(FakeReply.tool_call("calculator", {"expression": "1+1"}), FakeReply.text("two"))
        config = {"model": {"name": "fake", "base_url": model.base_url}, "gateway": {"shutdown_grace": 1}}
        process, base = start_server(tmp_path, config, {"HERMES_API_KEY": "x"})
        try:
            for i in range(3):
                status, body, _ = request(f"{base}/webhook", {"message": "1+1?", "user_id": "u1",
                                                              "message_id": f"m{i}"})  # fmt: skip
                assert status == 200 and json.loads(body)["reply"] == "two", body
            status, body, _ = request(
                f"{base}/webhook", {"message": "1+1?", "user_id": "u1", "message_id": "m0"}
            )
            assert json.loads(body).get("duplicate") is True
            status, body, headers = request(f"{base}/metrics")
        finally:
            stop(process)
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    s = scrape(body.decode())
    assert value(s, "hermes_acks_total", channel="webhook", outcome="accepted") == 3
    assert value(s, "hermes_acks_total", channel="webhook", outcome="duplicate") == 1
    assert value(s, "hermes_turns_total", channel="webhook", outcome="replied") == 3
    assert value(s, "hermes_turn_seconds_count", channel="webhook") == 3
    assert value(s, "hermes_model_call_seconds_count", outcome="ok") == 6
    assert value(s, "hermes_model_call_seconds_bucket", outcome="ok", le="+Inf") == 6
    assert value(s, "hermes_tool_call_seconds_count", tool="calculator", outcome="ok") == 3
    assert value(s, "hermes_model_retries_total", model="fake") == 1
    assert value(s, "hermes_send_attempts_total", channel="webhook", outcome="sent") == 3
    for gauge in (
        "hermes_inbox_depth",
        "hermes_outbox_depth",
        "hermes_dead_letters",
        "hermes_turns_in_flight",
    ):
        assert value(s, gauge) == 0, gauge
    buckets = sorted(
        (float(dict(k[1])["le"]), v) for k, v in s.items() if k[0] == "hermes_model_call_seconds_bucket"
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets), "buckets are cumulative"


def test_metrics_refused_without_token_beyond_loopback(tmp_path: Path) -> None:
    """Attack: scrape /metrics of a gateway bound to 0.0.0.0 without credentials, with a wrong
    token, and with the console's cookie name but no token. Without HERMES_METRICS_TOKEN every scrape
    is refused; with it set, only `Authorization: Bearer <token>` is let in."""
    config = {"gateway": {"shutdown_grace": 1}}  # no model: the offline demo
    env = {"HERMES_WEBHOOK_SECRET": "s" * 32}
    process, base = start_server(tmp_path, config, env, "--host", "0.0.0.0")
    try:
        status, _, _ = request(f"{base}/metrics")
        assert status == 403
    finally:
        stop(process)
    env["HERMES_METRICS_TOKEN"] = token = "metrics-token-0123456789"
    process, base = start_server(tmp_path, config, env, "--host", "0.0.0.0")
    try:
        assert request(f"{base}/metrics")[0] == 401
        started = time.monotonic()
        assert request(f"{base}/metrics", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert time.monotonic() - started >= 0.15, "a wrong token is answered slowly"
        status, body, _ = request(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"})
        assert status == 200 and value(scrape(body.decode()), "hermes_inbox_depth") == 0
    finally:
        stop(process)


def test_metrics_on_loopback_answer_only_local_requests(tmp_path: Path) -> None:
    """Attack: on the default loopback bind without a token, a scrape relayed by a proxy (it adds
    X-Forwarded-For) or naming another host (DNS rebinding) is refused; a local one is served."""
    config = {"gateway": {"shutdown_grace": 1}}  # no model: the offline demo
    process, base = start_server(tmp_path, config, {})
    try:
        assert request(f"{base}/metrics")[0] == 200
        assert request(f"{base}/metrics", headers={"X-Forwarded-For": "203.0.113.9"})[0] == 403
        assert request(f"{base}/metrics", headers={"Host": "evil.example"})[0] == 403
    finally:
        stop(process)
