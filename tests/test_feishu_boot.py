"""`hermes-kernel serve` with Feishu configured while the Feishu Open API is down (a platform or
network outage at boot).

Attack: the bot's start-up fetch of its own profile fails. Before, `serve` crashed and systemd
restart-looped it; a group message that arrived meanwhile could not be matched against the bot's
open_id and was dropped. Now the process comes up degraded, answers /healthz and the
url_verification challenge, holds the events that need the bot's open_id durably, retries the
platform in the background, and answers them once it is back.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermes_core.testing.fake_feishu import FakeFeishu
from serve_process import CLEAN_ENV, Serve
from waiting import wait_for


def closed_port() -> int:
    """A port nothing listens on (for now): the platform is 'down' there until the fake starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = json.dumps(body, ensure_ascii=False).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET", headers=headers or {})
    with urllib.request.urlopen(request, timeout=15) as response:
        return response.status, json.loads(response.read())


def feishu_env(feishu_port: int) -> dict[str, str]:
    return {
        **CLEAN_ENV, "FEISHU_APP_ID": "cli_fake", "FEISHU_APP_SECRET": "fake-secret",
        "FEISHU_VERIFICATION_TOKEN": "fake-vt", "FEISHU_BASE_URL": f"http://127.0.0.1:{feishu_port}",
    }  # fmt: skip


def start_serve(cwd: Path, feishu_port: int) -> tuple[subprocess.Popen[str], str, str]:
    """serve on a free port named in hermes.yaml (so that `doctor` with the same file finds it)."""
    (cwd / "hermes.yaml").write_text(f"gateway:\n  port: {closed_port()}\n", encoding="utf-8")
    env = feishu_env(feishu_port)
    process = subprocess.Popen(
        [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "serve"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    seen = []
    deadline = time.monotonic() + 60
    for line in process.stdout:
        seen.append(line)
        found = re.search(r"hermes-kernel serving on (http://\S+) \((.*)\)", line)
        if found:
            return process, found.group(1), found.group(2)
        if time.monotonic() > deadline:
            break
    process.kill()
    raise AssertionError(f"serve did not start: exit {process.wait()}\n{''.join(seen)}")


@pytest.fixture
def down_platform(tmp_path: Path) -> Iterator[tuple[FakeFeishu, subprocess.Popen[str], str, str, Path]]:
    """A serve process whose Feishu base URL is a closed port, and the (not yet started) fake."""
    port = closed_port()
    feishu = FakeFeishu(port=port, time_scale=0.001)
    process, address, routes = start_serve(tmp_path, port)
    try:
        yield feishu, process, address, routes, tmp_path
    finally:
        feishu.stop()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        assert process.stdout is not None
        print(process.stdout.read())  # the server's log, shown when the test fails


@pytest.mark.slow
def test_serve_comes_up_degraded_and_recovers_when_feishu_returns(
    down_platform: tuple[FakeFeishu, subprocess.Popen[str], str, str, Path],
) -> None:
    """Attack: Feishu unreachable at boot. The process must stay up (no crash, no restart loop),
    answer the challenge and /healthz (200, `degraded` naming feishu.bot_info), acknowledge a
    group @-mention that needs the bot's open_id without losing it, and answer it — and a new
    message — once the platform comes back on the same port."""
    feishu, process, address, routes, folder = down_platform
    assert "/feishu/events" in routes
    status, answer = http(f"{address}/feishu/events", {"type": "url_verification", "token": "fake-vt",
                                                       "challenge": "c-123"})  # fmt: skip
    assert (status, answer) == (200, {"challenge": "c-123"})
    status, health = http(f"{address}/healthz")
    assert status == 200 and health["ok"] is True
    assert [part["component"] for part in health["degraded"]] == ["feishu.bot_info"]
    assert "cannot fetch the bot's profile" in health["degraded"][0]["detail"]

    held = feishu.user_message("计算 (12+34)*2", chat_type="group", chat_id="oc_group", mention_bot=True)
    status, ack = http(f"{address}/feishu/events", held)
    assert status == 200 and ack == {"msg": "success"}  # acknowledged: it must not be lost now
    _, health = http(f"{address}/healthz")
    assert health["degraded"][0]["held_events"] == 1
    assert process.poll() is None  # still serving
    doctor = subprocess.run(
        [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", "doctor"], cwd=folder,
        env=feishu_env(feishu.port), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    line = next(line for line in doctor.stdout.splitlines() if "feishu credentials" in line)
    assert line.startswith("FAIL") and "the running gateway at" in line and "feishu.bot_info" in line, line
    assert "1 event(s) held" in line and "retries in the background" in line, line

    feishu.start_in_thread()  # the platform is back, on the same address
    wait_for(lambda: http(f"{address}/healthz")[1]["degraded"] == [], 60, "degraded to clear")
    replies = wait_for(lambda: [m for m in feishu.messages_in("oc_group")  # the streamed card, once complete
                                if m.sender != "ou_user1" and "92" in m.text], 30,
                       "the held message to be answered")  # fmt: skip
    assert "92" in replies[0].text and replies[0].reply_to == held["event"]["message"]["message_id"]

    later = feishu.user_message("计算 6*7", chat_type="group", chat_id="oc_group", mention_bot=True)
    assert http(f"{address}/feishu/events", later)[0] == 200
    answered = lambda: any("42" in m.text for m in feishu.messages_in("oc_group"))  # noqa: E731
    wait_for(answered, 30, "the new message's reply")


def test_the_console_checklist_names_what_the_channel_needs() -> None:
    """Attack (a set-up mistake, not a request): the approval buttons need the `card.action.trigger`
    callback, which docs/feishu.md never said to add, so a person following it got dead buttons.
    The checklist, in both languages, must name each event type the channel handles, the scopes
    for receiving and sending, and the channel's real request URL path."""
    from hermes_core.channels.feishu.channel import FeishuChannel

    text = (Path(__file__).resolve().parents[1] / "docs" / "feishu.md").read_text("utf-8")
    checklist = text[text.index("## Developer console checklist") : text.index("## What the bot guarantees")]
    english, chinese = checklist.split("**中文**")
    handled = ["im.message.receive_v1", "card.action.trigger"]  # events.py, channel.py
    scopes = ["im:message.p2p_msg:readonly", "im:message.group_at_msg:readonly", "im:message:send_as_bot"]
    scopes.append("im:message:readonly")  # resources, quoted messages, forwarded logs (media.md)
    [route] = FeishuChannel(None, app_id="cli_x", app_secret="s").routes()  # type: ignore[arg-type]
    path = route.path
    for half in (english, chinese):
        for needed in [*handled, *scopes, path, "FEISHU_VERIFICATION_TOKEN", "FEISHU_ENCRYPT_KEY"]:
            assert needed in half, needed
    for menu in ("回调配置", "卡片回传交互", "版本管理与发布"):
        assert menu in chinese, menu


def plain_serve(serve: Serve, cwd: Path, config: str) -> tuple[str, str]:
    """`serve` (the conftest fixture: stopped with SIGTERM after the test) with `config`: URL, routes."""
    (cwd / "hermes.yaml").write_text(config, encoding="utf-8")
    _, found = serve("--config", "hermes.yaml", "serve", "--port", "0", cwd=cwd)
    return found.group(1), found.group(2)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_root_page_and_start_up_line_name_only_the_routes_served(tmp_path: Path, serve: Serve) -> None:
    """Attack (a first-contact trap): `GET /` was a 404 and the start-up line listed /feishu/events
    with Feishu off. Now, console off: `/` is a short plain-text page of what is served where, and
    neither it nor the line names a route that is not served; console on: `/` redirects to it."""
    address, routes = plain_serve(serve, tmp_path, "console:\n  enabled: false\n")
    assert "/feishu/events" not in routes and "/console" not in routes
    assert "POST /webhook, /webhook/approvals/{id}" in routes and "/healthz" in routes
    with urllib.request.urlopen(f"{address}/", timeout=15) as response:
        page = response.read().decode()
        assert response.status == 200 and response.headers["Content-Type"].startswith("text/plain")
    assert "POST /webhook" in page and "/healthz" in page and "/feishu/events" not in page
    console_on = tmp_path / "console-on"
    console_on.mkdir()
    address, routes = plain_serve(serve, console_on, "gateway:\n  shutdown_grace: 1\n")
    assert "/console/" in routes and "/feishu/events" not in routes
    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as redirected:
        opener.open(f"{address}/", timeout=15)
    assert redirected.value.code == 302 and redirected.value.headers["Location"] == "/console/"


@pytest.mark.slow
def test_an_event_held_during_the_outage_survives_a_restart(tmp_path: Path) -> None:
    """Attack: the process is stopped (deploy, crash loop, reboot) while a group @-mention is held
    waiting for the bot's open_id. The acknowledged event was written to the data folder before the
    ack, so the next start, with the platform back, answers it: Feishu will not push it again."""
    port = closed_port()
    feishu = FakeFeishu(port=port, time_scale=0.001)
    process, address, _ = start_serve(tmp_path, port)
    held = feishu.user_message("计算 (12+34)*2", chat_type="group", chat_id="oc_restart", mention_bot=True)
    try:
        assert http(f"{address}/feishu/events", held) == (200, {"msg": "success"})
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    assert (tmp_path / ".hermes" / "feishu-held.jsonl").is_file()

    feishu.start_in_thread()
    process, address, _ = start_serve(tmp_path, port)
    try:
        replies = wait_for(lambda: [m for m in feishu.messages_in("oc_restart")  # the card, once complete
                                    if m.sender == "app" and "92" in m.text], 30,
                           "the held message to be answered after the restart")  # fmt: skip
        assert "92" in replies[0].text and replies[0].reply_to == held["event"]["message"]["message_id"]
        wait_for(lambda: not (tmp_path / ".hermes" / "feishu-held.jsonl").exists(), 10, "the file to go")
    finally:
        feishu.stop()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
