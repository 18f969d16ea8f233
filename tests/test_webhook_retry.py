"""A synchronous webhook caller whose request was cut by a crash asks again and gets its reply.

Attack (reported from outside): a caller POSTs /webhook and waits; the gateway is SIGKILLed while
the turn runs, so the HTTP request fails; the caller retries with the same `message_id`, as the
module docstring tells it to, and was answered `{"duplicate": true}` with no reply: the answer
was lost for it. Now the retry gets the reply: awaited while the message still runs (it is run
again after the restart), read from the outbox once it has finished. Neither a replay of the very
same signed request (still 409) nor another user's request with that id gets it.

Also: a task that failed says so (`"ok": false`, `"error": "model_unavailable"`, the apology as
`reply`), in the HTTP answer and in the callback body, which carries the request's `message_id`.

Everything is real: `hermes-kernel serve` as a subprocess (SQLite on disk), the fake OpenAI-compatible
model on 127.0.0.1, HTTP from this process; the kill is SIGKILL by pid.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hermes_core.channels.webhook import sign
from hermes_core.kernel.replies import fixed_reply
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import clean_environ
from waiting import wait_for

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")

SECRET = "retry-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Serve:
    """`hermes-kernel serve` in `workdir`, started and killed by the test."""

    def __init__(self, workdir: Path, model: FakeOpenAIServer, *, secret: str | None = None) -> None:
        self.workdir, self.port = workdir, free_port()
        config = "model:\n  max_retries: 0\nwebhook:\n  callback_hosts: ['127.0.0.1']\n"
        (workdir / "hermes.yaml").write_text(config, encoding="utf-8")
        self.env = clean_environ()
        self.env.update(HERMES_BASE_URL=model.base_url, HERMES_MODEL="m")
        if secret:
            self.env["HERMES_WEBHOOK_SECRET"] = secret
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        command = [
            sys.executable,
            "-m",
            "hermes_core",
            "--config",
            "hermes.yaml",
            "serve",
            "--port",
            str(self.port),
        ]
        self.process = subprocess.Popen(
            command, cwd=self.workdir, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        wait_for(self.healthy)

    def healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"serve exited with {self.process.returncode}")
        return self.health() is not None

    def health(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as response:
                return dict(json.loads(response.read()))
        except OSError:
            return None

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


@contextmanager
def serving(workdir: Path, model: FakeOpenAIServer, *, secret: str | None = None) -> Iterator[Serve]:
    serve = Serve(workdir, model, secret=secret)
    try:
        yield serve
    finally:
        serve.stop()


def post(
    url: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 60
) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{url}/webhook", data=body, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def signed(body: bytes, timestamp: str | None = None) -> dict[str, str]:
    timestamp = timestamp or str(int(time.time()))
    return {"X-Hermes-Timestamp": timestamp, "X-Hermes-Signature": sign(SECRET, timestamp, body)}


def cut_by_a_crash(serve: Serve, model: FakeOpenAIServer, body: bytes, headers: dict[str, str]) -> str:
    """POST `body` and SIGKILL the gateway while its turn waits for the model; how the request ended."""
    outcome: list[str] = []
    asked = len(model.requests)

    def call() -> None:
        try:
            outcome.append(f"answered {post(serve.url, body, headers)}")
        except OSError as exc:
            outcome.append(f"cut: {type(exc).__name__}")

    caller = threading.Thread(target=call)
    caller.start()
    text = json.loads(body)["message"]  # not serve's start-up probe of the model: this message's turn
    wait_for(lambda: any(r.messages[-1].get("content") == text for r in model.requests[asked:]))  # in flight
    serve.kill()
    caller.join(timeout=10)
    return outcome[0]


def slow_echo(request: RecordedRequest) -> FakeReply:
    return FakeReply.text(f"echo: {request.messages[-1]['content']}", delay=1.0)


@pytest.fixture
def model() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer(handler=slow_echo).start_in_thread()
    yield server
    server.stop()


def test_retry_after_a_crash_waits_for_the_rerun_and_gets_the_reply(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Attack: the sync request is cut by SIGKILL mid-turn; the caller retries with the same
    message_id as soon as the gateway is back, while the message is being run again: the retry
    waits and gets the reply (not `{"duplicate": true}` alone). Another user's request with that
    message_id gets nothing of it."""
    body = json.dumps({"message": "weekly numbers", "user_id": "u1", "message_id": "m-crash-1"}).encode()
    with serving(tmp_path, model) as serve:
        serve.start()
        assert cut_by_a_crash(serve, model, body, {}).startswith("cut")
        serve.start()  # the message is run again from the inbox
        assert (serve.health() or {}).get("turns_done") == 0  # still running: the retry must wait
        status, answer = post(serve.url, body)
        other = json.dumps({"message": "mine?", "user_id": "u2", "message_id": "m-crash-1"}).encode()
        other_status, other_answer = post(serve.url, other)
    assert status == 200, answer
    assert answer["reply"] == "echo: weekly numbers" and answer["ok"] is True
    assert answer["message_id"] == "m-crash-1" and answer["duplicate"] is True
    assert "reply" not in other_answer and other_status == 200  # not u2's message: no reply shown


def test_retry_after_the_rerun_finished_gets_the_stored_reply(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Attack: as above, but the caller comes back only after the restarted gateway has finished
    the message (its reply was "sent" to nobody): the retry gets the reply stored in the outbox,
    and the turn is not run a third time."""
    body = json.dumps({"message": "monthly numbers", "user_id": "u1", "message_id": "m-crash-2"}).encode()
    with serving(tmp_path, model) as serve:
        serve.start()
        assert cut_by_a_crash(serve, model, body, {}).startswith("cut")
        serve.start()
        wait_for(lambda: (serve.health() or {}).get("replies_sent", 0) >= 1)
        asked = len(model.requests)
        status, answer = post(serve.url, body)
        assert len(model.requests) == asked  # answered from the store, not run again
    assert status == 200, answer
    assert answer == {
        "reply": "echo: monthly numbers",
        "ok": True,
        "message_id": "m-crash-2",
        "duplicate": True,
    }


def test_signed_retry_gets_the_reply_and_an_identical_replay_is_refused(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Attack: with a webhook secret, the cut request is retried signed afresh (same message_id):
    it gets the reply. The very same signed request sent again (same timestamp and signature) is
    still a replay: 409, no reply."""
    body = json.dumps({"message": "signed numbers", "user_id": "u1", "message_id": "m-crash-3"}).encode()
    first = signed(body, str(int(time.time()) - 2))
    with serving(tmp_path, model, secret=SECRET) as serve:
        serve.start()
        assert cut_by_a_crash(serve, model, body, first).startswith("cut")
        serve.start()
        status, answer = post(serve.url, body, signed(body))
        replay_status, replay = post(serve.url, body, first)
    assert status == 200 and answer["reply"] == "echo: signed numbers" and answer["ok"] is True, answer
    assert replay_status == 409 and "reply" not in replay


class Callbacks(ThreadingHTTPServer):
    """Records the bodies POSTed to it (the webhook's callback target)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the http.server API)
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


def test_a_failed_task_says_so_in_the_response_and_the_callback(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Attack: the model is unavailable (503). The caller must be able to tell the apology from an
    answer: `"ok": false` and `"error": "model_unavailable"` beside the apology, in the HTTP answer
    and in the callback body, which also names the request's message_id."""
    model.unavailable.add("m")
    callbacks = Callbacks()
    apology = fixed_reply("model_unavailable", "en")
    try:
        with serving(tmp_path, model) as serve:
            serve.start()
            sync = json.dumps({"message": "any news?", "user_id": "u1", "message_id": "m-fail-1"}).encode()
            status, answer = post(serve.url, sync)
            later = {
                "message": "any news?",
                "user_id": "u1",
                "message_id": "m-fail-2",
                "callback_url": callbacks.url,
            }
            accepted, _ = post(serve.url, json.dumps(later).encode())
            wait_for(lambda: bool(callbacks.bodies))
    finally:
        callbacks.shutdown()
    assert status == 200 and answer == {"reply": apology, "ok": False, "error": "model_unavailable",
                                        "message_id": "m-fail-1"}  # fmt: skip
    assert accepted == 202
    body = callbacks.bodies[0]
    assert body["message_id"] == "m-fail-2" and body["ok"] is False and body["error"] == "model_unavailable"
    assert body["reply"] == apology
