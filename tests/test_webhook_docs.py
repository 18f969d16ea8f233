"""docs/webhook.md's examples, run as written against a real `hermes-kernel serve` on a free port.

Attack: a protocol page that rots. The curl and Python blocks are extracted from the Markdown and
run unchanged (bash, python) with only HERMES_URL and HERMES_WEBHOOK_SECRET set, so a wrong header
name, signing string, field or limit on the page fails here. The stated limits are checked against
the code and the shipped nginx site.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_core.channels import webhook
from serve_process import CLEAN_ENV

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "webhook.md"
SECRET = "docs-webhook-secret"


def example(name: str, language: str) -> str:
    pattern = rf"<!-- webhook-example: {name} -->\s*```{language}\n(.*?)```"
    found = re.search(pattern, PAGE.read_text("utf-8"), re.DOTALL)
    assert found, f"docs/webhook.md example {name!r} is missing"
    return found.group(1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A signed webhook on a free port, callbacks allowed to 127.0.0.1: the examples' environment."""
    folder = tmp_path_factory.mktemp("webhook-docs")
    port = free_port()
    (folder / "hermes.yaml").write_text(
        f"gateway:\n  port: {port}\n  data_dir: {folder / 'data'}\n  shutdown_grace: 1\n"
        "webhook:\n  callback_hosts: ['127.0.0.1']\n", encoding="utf-8",
    )  # fmt: skip
    env = {**CLEAN_ENV, "HERMES_WEBHOOK_SECRET": SECRET}
    process = subprocess.Popen(
        [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "serve"], cwd=folder, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if "serving on" in line:
                break
        else:
            raise AssertionError(f"serve did not start: exit {process.wait()}")
        yield {**CLEAN_ENV, "HERMES_URL": f"http://127.0.0.1:{port}", "HERMES_WEBHOOK_SECRET": SECRET}
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


@pytest.mark.slow
def test_curl_example_gets_the_reply(served: dict[str, str]) -> None:
    """The page's curl block (openssl HMAC over `timestamp.body`) is accepted and answered."""
    if shutil.which("curl") is None or shutil.which("openssl") is None:
        pytest.skip("curl or openssl is not installed")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", example("curl", "bash")], env=served,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert "92" in answer["reply"] and answer["message_id"] == "curl-1"


@pytest.mark.slow
def test_python_example_gets_the_reply_then_the_same_reply_again(served: dict[str, str]) -> None:
    """The Python block: a signed request, then a fresh signature with the same message_id, which the
    gateway must answer as a duplicate with the same reply (not a replay 409, not a second run)."""
    result = subprocess.run([sys.executable, "-c", example("python", "python")], env=served,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert "92" in first
    answer = ast.literal_eval(second)
    assert answer["duplicate"] is True and answer["message_id"] == "py-1" and answer["ok"] is True
    assert answer["reply"] == first  # the stored reply, not a second run


@pytest.mark.slow
def test_stream_example_prints_the_events_and_ends_with_done(served: dict[str, str]) -> None:
    """The streaming block: events read line by line as they arrive; the last is `done`, whose reply
    is what the text deltas add up to."""
    result = subprocess.run([sys.executable, "-c", example("stream", "python")], env=served,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    events = [line.split(" ", 1) for line in result.stdout.splitlines()]
    names = [name for name, _ in events]
    assert names[-1] == "done" and set(names) <= {"text", "tool", "done"}
    done = ast.literal_eval(events[-1][1])
    assert "92" in done["reply"] and done["message_id"] == "sse-1" and done["ok"] is True
    assert done["task_id"].startswith("webhook:sse-1~")
    deltas = "".join(ast.literal_eval(data)["delta"] for name, data in events if name == "text")
    assert deltas == done["reply"]


@pytest.mark.slow
def test_callback_example_verifies_the_signed_callback(served: dict[str, str]) -> None:
    """The callback block: 202 at once, then the reply POSTed to the receiver, whose check of the
    documented signature passes (a receiver that rejected it would answer 401 and never print)."""
    result = subprocess.run([sys.executable, "-c", example("callback", "python")], env=served,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    accepted, reply = result.stdout.splitlines()
    assert accepted.startswith("202 {'accepted': True")
    assert "42" in reply


@pytest.mark.slow
def test_a_replayed_request_and_an_oversized_body_are_refused_as_documented(served: dict[str, str]) -> None:
    """Attack: the same signed request twice (409), and a body one byte over the documented 1 MiB (413)."""
    body = json.dumps({"message": "hi", "user_id": "u3"}).encode()
    stamp = str(int(time.time()))
    headers = {"X-Hermes-Timestamp": stamp, "X-Hermes-Signature": webhook.sign(SECRET, stamp, body)}
    url = served["HERMES_URL"] + "/webhook"
    urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=60).close()
    with pytest.raises(urllib.error.HTTPError) as replay:
        urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=60)
    assert replay.value.code == 409
    big = b" " * (1024 * 1024 + 1)
    headers = {"X-Hermes-Timestamp": stamp, "X-Hermes-Signature": webhook.sign(SECRET, stamp, big)}
    with pytest.raises(urllib.error.HTTPError) as too_large:
        urllib.request.urlopen(urllib.request.Request(url, data=big, headers=headers), timeout=60)
    assert too_large.value.code == 413 and json.loads(too_large.value.read()) == {"error": "body too large"}


def test_the_stated_limits_are_the_code_and_nginx_limits() -> None:
    """The page, the webhook code and the nginx site agree on the limits (before: 2 MB vs 1 MiB)."""
    text = PAGE.read_text("utf-8")
    assert webhook.MAX_BODY == 1024 * 1024 and "1 MiB (1,048,576 bytes)" in text
    assert f"{webhook.MAX_MESSAGE_CHARS:,} characters" in text
    assert f"±{webhook.SIGNATURE_WINDOW:.0f} s" in text
    site = (ROOT / "deploy" / "nginx" / "hermes-kernel.conf").read_text("utf-8")
    assert re.search(r"client_max_body_size 1m;", site)
    assert "2 MB" not in (ROOT / "docs" / "deploy.md").read_text("utf-8")
