"""What one `hermes-kernel serve` node leaves to the other, on one PostgreSQL database.

The cases come from the report of issue 33 ("Scale-out that holds"), tried with two real nodes:
a synchronous webhook retry that reaches the node that did not run the turn must get the reply the
other node stores (it waited 120 s and answered 202). Every test starts real `serve` processes on
a private PostgreSQL server (tests/pg_server.py) with the fake model over HTTP (tests/serve_process.py).
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import hermes_core
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import Folder, Server

pytestmark = pytest.mark.slow  # real PostgreSQL, real processes

SOURCE = str(Path(hermes_core.__file__).parent.parent)  # the nodes run the code under test
MODEL_SECONDS = 1.0  # the fake model's latency: the duplicate reaches the other node meanwhile


def answer_slowly(request: RecordedRequest) -> FakeReply:
    return FakeReply.text(f"answer: {request.messages[-1].get('content')}", delay=MODEL_SECONDS)


def turn_calls(model: FakeOpenAIServer) -> list[RecordedRequest]:
    """The model calls of turns (not the nodes' one-token start-up checks)."""
    return [request for request in model.requests if request.body.get("max_tokens") != 1]


def nodes(tmp_path: Path, model: FakeOpenAIServer, pg_url: str, config: str = "", **env: str) -> list[Server]:
    """Two serve nodes on `pg_url`, each in its own folder with `config`."""
    started = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        folder = Folder(tmp_path / name, "", config, model.base_url, HERMES_DATABASE_URL=pg_url, **env)
        folder.env["PYTHONPATH"] += os.pathsep + SOURCE
        started.append(folder.serve())
    return started


def post(url: str, body: dict[str, str], timeout: float = 30.0) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def test_a_webhook_retry_on_the_other_node_gets_the_reply_that_node_stores(
    pg_url: str, tmp_path: Path
) -> None:
    """Six messages, each sent to both nodes at the same moment (a client retrying through a load
    balancer), the model taking a second: every one of the twelve requests is answered with the
    message's reply within seconds — the node that did not run the turn reads the reply the other
    one stored — none with 202 "pending", and each turn ran once."""
    model = FakeOpenAIServer(handler=answer_slowly).start_in_thread()
    servers: list[Server] = []
    try:
        servers = nodes(tmp_path, model, pg_url)
        answers: list[tuple[str, int, dict]] = []
        lock = threading.Lock()

        def send(server: Server, text: str) -> None:
            got = post(f"{server.url}/webhook", {"message": text, "user_id": text, "message_id": text})
            with lock:
                answers.append((text, *got))

        texts = [f"question {n}" for n in range(6)]
        threads = [threading.Thread(target=send, args=(server, text)) for text in texts for server in servers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(answers) == 12
        for text, status, body in answers:
            assert status == 200 and body.get("reply") == f"answer: {text}", (text, status, body)
        assert sorted(t for t, _, body in answers if not body.get("duplicate")) == texts  # one ran each
        assert sorted(str(request.messages[-1]["content"]) for request in turn_calls(model)) == texts
    finally:
        for server in servers:
            server.stop()
        model.stop()
