"""What one `hermes-kernel serve` node leaves to the other, on one PostgreSQL database.

The cases come from the report of issue 33 ("Scale-out that holds"), tried with two real nodes:
a synchronous webhook retry that reaches the node that did not run the turn must get the reply the
other node stores (it waited 120 s and answered 202); a message that kills its node, restarted
within the lease, must take it down at most twice (it crashed 8–12 times); a reply a node queued
and could not send before it died must be sent by the other node, without a restart (it waited
for the dead node's restart). Every test starts real `serve` processes on a private PostgreSQL
server (tests/pg_server.py) with the fake model over HTTP (tests/serve_process.py).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import hermes_core
from hermes_core.kernel.replies import REPLIES
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from serve_process import Folder, Server, follow_the_words
from test_poison import KILLING_TOOLS
from waiting import wait_for

pytestmark = pytest.mark.slow  # real PostgreSQL, real processes

SOURCE = str(Path(hermes_core.__file__).parent.parent)  # the nodes run the code under test
MODEL_SECONDS = 1.0  # the fake model's latency: the duplicate reaches the other node meanwhile


def answer_slowly(request: RecordedRequest) -> FakeReply:
    return FakeReply.text(f"answer: {request.messages[-1].get('content')}", delay=MODEL_SECONDS)


def turn_calls(model: FakeOpenAIServer) -> list[RecordedRequest]:
    """The model calls of turns (not the nodes' one-token start-up checks)."""
    return [request for request in model.requests if request.body.get("max_tokens") != 1]


def node_folder(
    path: Path, tools: str, config: str, model: FakeOpenAIServer, pg_url: str, **env: str
) -> Folder:
    """A folder to start serve nodes on `pg_url` in, with `tools` and `config`."""
    path.mkdir(exist_ok=True)
    folder = Folder(path, tools, config, model.base_url, HERMES_DATABASE_URL=pg_url, **env)
    folder.env["PYTHONPATH"] += os.pathsep + SOURCE
    return folder


def nodes(tmp_path: Path, model: FakeOpenAIServer, pg_url: str, config: str = "", **env: str) -> list[Server]:
    """Two serve nodes on `pg_url`, each in its own folder with `config`."""
    return [node_folder(tmp_path / name, "", config, model, pg_url, **env).serve() for name in ("a", "b")]


def feishu_env(feishu: FakeFeishu) -> dict[str, str]:
    return {
        "FEISHU_APP_ID": feishu.app_id, "FEISHU_APP_SECRET": feishu.app_secret,
        "FEISHU_VERIFICATION_TOKEN": feishu.verification_token, "FEISHU_BASE_URL": feishu.base_url,
    }  # fmt: skip


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


POISON_LEASE = 4.0  # database.lease_seconds: the node is started again well within it (~1 s)


def test_a_message_that_kills_its_node_restarted_within_the_lease_crashes_it_at_most_twice(
    pg_url: str, tmp_path: Path
) -> None:
    """The poison case of tests/test_poison.py on PostgreSQL, with the node started again as soon as
    it dies (as systemd does, well within the lease): the crashed process's claim still looks live
    at each start, so start-up leaves the message to its lane, which runs it once the claim has
    expired. Before: it ran (and killed the node) at every start. Now the node dies twice, the
    third start sets the message aside with its polite reply, once, and the conversation's next
    message is answered."""
    model = FakeOpenAIServer(handler=follow_the_words).start_in_thread()
    feishu = FakeFeishu(time_scale=0.001).start_in_thread()
    config = f"database: {{lease_seconds: {POISON_LEASE}}}\n"
    folder = node_folder(tmp_path, KILLING_TOOLS, config, model, pg_url, **feishu_env(feishu))
    envelope = feishu.user_message("call explode now", chat_id="oc_poison")
    message_id = envelope["event"]["message"]["message_id"]
    answered = lambda: [m.text for m in feishu.sent if m.reply_to == message_id]  # noqa: E731
    set_aside = [REPLIES["set_aside"]["en"]]  # (written into the card the first run streamed into)
    server = folder.serve()
    crashes = 0
    try:
        feishu.deliver(envelope, f"{server.url}/feishu/events")

        def set_aside_restarting_the_node() -> bool:
            nonlocal server, crashes
            if server.process.poll() is not None:
                assert server.process.returncode == -9, server.output()
                crashes += 1
                assert crashes <= 2, "the poison message took the node down a third time"
                server = folder.serve()  # at once: the dead process's claim is still live
            return answered() == set_aside

        wait_for(set_aside_restarting_the_node, 8 * POISON_LEASE + 30, "the set-aside reply")
        later = feishu.user_message("hello again", chat_id="oc_poison")
        feishu.deliver(later, f"{server.url}/feishu/events")
        later_id = later["event"]["message"]["message_id"]
        wait_for(lambda: any(m.reply_to == later_id for m in feishu.sent), what="the next reply")
        wait_for(server.idle, what="the node to be idle")  # a second set-aside reply is out by then
        counts = server.get("/healthz")[1]
    finally:
        server.stop()
        feishu.stop()
        model.stop()
    assert crashes == 2 and counts["set_aside"] == 1
    assert answered() == set_aside
    assert [m.text for m in feishu.sent if m.reply_to == later_id] == ["ok: hello again"]


TAKEOVER_LEASE = 2.0  # database.lease_seconds of the two nodes: a sweep every third of it


class Callbacks(ThreadingHTTPServer):
    """A webhook client's callback endpoint that answers 503 until `accept` is set, then 200;
    it keeps (Idempotency-Key, body, status) of every POST."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict, int]] = []
        self.accept = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status = 200 if outer.accept.is_set() else 503
                outer.received.append((self.headers.get("Idempotency-Key", ""), body, status))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_a_reply_a_killed_node_could_not_send_is_sent_by_the_other_node(pg_url: str, tmp_path: Path) -> None:
    """Node A answers a webhook message whose reply goes to a callback that refuses it for now
    (503: A keeps trying); A is SIGKILLed with the reply queued. Before: the reply stayed bound to
    A until A was started again. Now node B, never restarted, takes it over once A's hold has
    expired and sends it — once, under the idempotency key A was sending it with."""
    model = FakeOpenAIServer(handler=follow_the_words).start_in_thread()
    callbacks = Callbacks()
    port = callbacks.server_address[1]
    config = (f"database: {{lease_seconds: {TAKEOVER_LEASE}}}\n"
              f"webhook: {{callback_hosts: ['127.0.0.1:{port}']}}\n")  # fmt: skip
    servers: list[Server] = []
    try:
        servers = nodes(tmp_path, model, pg_url, config)
        first, second = servers
        body = {"message": "hello", "user_id": "u1", "message_id": "m-1",
                "callback_url": f"http://127.0.0.1:{port}/hook"}  # fmt: skip
        assert post(f"{first.url}/webhook", body)[0] == 202
        wait_for(lambda: callbacks.received, what="node A's first try")  # refused: A tries again later
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(timeout=10)
        killed = time.monotonic()
        callbacks.accept.set()
        delivered = lambda: [r for r in callbacks.received if r[2] == 200]  # noqa: E731
        wait_for(delivered, timeout=TAKEOVER_LEASE + TAKEOVER_LEASE / 3 * 1.25 + 5.0, what="node B's send")
        took = time.monotonic() - killed
        print(f"\nsent by the other node {took:.2f} s after the kill (lease {TAKEOVER_LEASE} s)")
        wait_for(second.idle, what="node B to be idle")  # a second send is out by then
        assert second.process.poll() is None
        assert "sending 1 reply(ies) a stopped node left unsent" in second.output()
    finally:
        for server in servers:
            server.stop()
        callbacks.shutdown()
        model.stop()
    [(key, reply, _)] = delivered()
    assert reply["reply"] == "ok: hello" and reply["message_id"] == "m-1"
    assert {r[0] for r in callbacks.received} == {key}  # A's tries and B's send: one idempotency key
