"""A new user's first hour, end to end, as the README tells it: a fresh clone, installed into a fresh
virtual environment, `hermes-kernel init` for a Feishu bot, `.env` filled in from `.env.example`,
`serve` started in the bot's folder, the first Feishu message answered, then a reminder asked for
in the console chat that shows up in the open console page when it fires — and in the
conversation's history when the page is opened again.

No real platform or model: the fake Feishu platform and the fake model are started by their own
commands from the installed package (`python -m hermes_core.testing.fake_feishu --serve`,
`python -m hermes_core.testing.fake_openai --script`), as docs/feishu.md shows a new user. Where the
steps come from: README.md's "Set-up: two commands" (init, `.env`, serve, the console link) and
docs/console.md (the chat's live messages and history).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from clone import fresh_clone
from serve_process import Program, clean_environ, free_port, start_serve, stop_serve

pytestmark = pytest.mark.slow

# The model's replies, in the order the conversation asks for them (the fake's script file).
SCRIPT = """\
- 你好！我是你的新助手。
- tool_call: schedule_task
  arguments: {prompt: Remind the user to stand up and stretch, delay_minutes: 1}
- I will remind you in a minute.
- Time to stand up and stretch!
"""


def run(*command: str | Path, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{command}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def installed(tmp_path: Path) -> Path:
    """Clone, then `pip install "<clone>[feishu]"` into a fresh venv; the venv's bin folder."""
    clone = fresh_clone(tmp_path / "clone")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv, cwd=tmp_path, env=clean_environ())
    env = clean_environ(PIP_CONSTRAINT=str(clone / "constraints.txt"))
    env.pop("PYTHONPATH", None)
    run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", f"{clone}[feishu]", cwd=tmp_path, env=env)
    return venv / "bin"


def filled(example: str, values: dict[str, str]) -> str:
    """`.env.example` with its empty `NAME=` lines filled in, and the values it does not name added."""
    lines, named = [], set()
    for line in example.splitlines():
        name = line.split("=", 1)[0]
        if line.endswith("=") and name in values:
            line, _ = f"{name}={values[name]}", named.add(name)
        lines.append(line)
    lines += [f"{name}={value}" for name, value in values.items() if name not in named]
    return "\n".join(lines) + "\n"


class Events:
    """The console's server-sent events for one conversation, read in the background."""

    def __init__(self, url: str) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.response = urllib.request.urlopen(url, timeout=60)  # noqa: S310 - a loopback URL
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for raw in self.response:
                self.lines.put(raw.decode("utf-8").rstrip("\n"))
        except (OSError, ValueError):
            pass  # the server stopped

    def next_message(self, timeout: float) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line.startswith("data: "):
                event: dict[str, object] = json.loads(line[len("data: ") :])
                return event
        raise AssertionError("no message reached the open console page")


def post_chat(base: str, text: str, conversation: str) -> list[dict[str, object]]:
    body = json.dumps({"message": text, "conversation": conversation}).encode()
    request = urllib.request.Request(f"{base}/console/api/chat", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310 - a loopback URL
        return [json.loads(line) for line in answer.read().decode("utf-8").splitlines() if line.strip()]


def test_a_new_users_first_hour(tmp_path: Path) -> None:
    bin_dir = installed(tmp_path)
    python = bin_dir / "python"
    env = clean_environ()
    env.pop("PYTHONPATH", None)

    # init, as the README shows it, for a Feishu bot on HTTP callbacks
    init = ["init", "--dir", "bot", "--provider", "vllm", "--model", "scripted",
            "--channel", "feishu-webhook", "--timezone", "Asia/Shanghai", "--yes"]  # fmt: skip
    written = run(bin_dir / "hermes-kernel", *init, cwd=tmp_path, env=env)
    bot = tmp_path / "bot"
    assert "wrote bot/hermes.yaml" in written and "doctor" in written
    example = (bot / ".env.example").read_text(encoding="utf-8")
    assert "FEISHU_APP_ID=" in example and "FEISHU_APP_SECRET=" in example

    (tmp_path / "replies.yaml").write_text(SCRIPT, encoding="utf-8")
    model = Program("hermes_core.testing.fake_openai", "--script", "replies.yaml", cwd=tmp_path, env=env,
                    python=python)  # fmt: skip
    port = free_port()
    bot_url = f"http://127.0.0.1:{port}/feishu/events"
    feishu = Program("hermes_core.testing.fake_feishu", "--serve", "--bot-url", bot_url,
                     cwd=tmp_path, env=env, python=python)  # fmt: skip
    serve = None
    try:
        model_url = model.wait_for("READY").split()[1]
        feishu.wait_for("fake Feishu serving on")
        pointed = dict(feishu.wait_for(f"FEISHU_{name}=").strip().split("=", 1) for name in
                       ("BASE_URL", "APP_ID", "APP_SECRET", "VERIFICATION_TOKEN"))  # fmt: skip
        # cp .env.example .env, and fill in the values (the fake's, and where the model answers)
        (bot / ".env").write_text(
            filled(example, {**pointed, "HERMES_BASE_URL": model_url}), encoding="utf-8"
        )

        serve_env = {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"}
        serve, serving = start_serve("serve", "--port", str(port), cwd=bot, env=serve_env, python=python)
        base = serving.group(1)

        # the first Feishu message, typed at the fake platform's prompt
        feishu.wait_for("Ctrl-D ends")
        feishu.type("你好")
        assert "你好！我是你的新助手。" in feishu.wait_for("bot:")

        # the console chat: a reminder, and the open page sees it arrive
        events = Events(f"{base}/console/api/events?conversation=first-hour")
        answered = post_chat(base, "remind me in a minute to stand up", "first-hour")
        assert any(e.get("text") == "I will remind you in a minute." for e in answered), answered
        fired = events.next_message(timeout=120)  # a one-time job is a minute ahead at least
        assert fired["type"] == "message" and fired["text"] == "Time to stand up and stretch!", fired

        with urllib.request.urlopen(f"{base}/console/api/history?conversation=first-hour", timeout=30) as got:  # noqa: S310
            history = json.load(got)["messages"]
        texts = [m["text"] for m in history]
        assert texts[0] == "remind me in a minute to stand up"
        assert texts[1:] == ["I will remind you in a minute.", "Time to stand up and stretch!"], history
    finally:
        if serve is not None:
            stop_serve(serve)
        feishu.stop()
        model.stop()
