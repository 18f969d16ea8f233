"""The fakes as programs: `python -m hermes_core.testing.fake_openai --script FILE` answers from a
script file, and `python -m hermes_core.testing.fake_feishu --serve` is a Feishu a person can type
into — a new user's first Feishu message, end to end, with no real platform or model.

Cases: the issue's ("no way to see the Feishu path without writing a driver"; "the fake model can
only call the first tool with fixed arguments"); the reply shapes are the OpenAI chat-completions
wire format (text, tool_calls, an error object) as `FakeReply` sends them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_process import Program, clean_environ, free_port, start_serve, stop_serve

SCRIPT = """\
- Hello from the script!
- tool_call: current_time
  arguments: {timezone: Asia/Shanghai}
- tool_calls: [{name: calculator, arguments: {expression: "2+3"}}, {name: current_time}]
- error: 429
  message: slow down
"""


@pytest.fixture
def scripted_model(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "replies.yaml").write_text(SCRIPT, encoding="utf-8")
    model = Program("hermes_core.testing.fake_openai", "--script", "replies.yaml", cwd=tmp_path)
    try:
        yield model.wait_for("READY").split()[1]
    finally:
        model.stop()


def ask(base_url: str) -> dict[str, object]:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(
        f"{base_url}/chat/completions", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return {"status": response.status, **json.load(response)}
    except urllib.error.HTTPError as exc:
        return {"status": exc.code, **json.load(exc)}


def test_the_model_follows_its_script_then_the_default(scripted_model: str) -> None:
    """Each scripted reply in order, over HTTP, then the built-in default."""
    answers = [ask(scripted_model) for _ in range(5)]
    messages = [a["choices"][0]["message"] for a in answers if a["status"] == 200]  # type: ignore[index]
    assert messages[0]["content"] == "Hello from the script!"
    call = messages[1]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("current_time", {"timezone": "Asia/Shanghai"})
    assert [c["function"]["name"] for c in messages[2]["tool_calls"]] == ["calculator", "current_time"]
    assert answers[3]["status"] == 429 and answers[3]["error"]["message"] == "slow down"  # type: ignore[index]
    assert messages[3]["content"] == "hello"  # the script is used up: the default


@pytest.mark.parametrize(
    ("script", "says"),
    [
        ("just: text\n", "a script is a list"),
        ("- {tool_call: 7}\n", "reply 1: each tool call needs a name"),
        ("- ok\n- {text: a, error: 500}\n", "reply 2: give a text, or exactly one of"),
        ("- {error: 200}\n", "error is an HTTP status from 400 to 599"),
        ("- [unclosed\n", "is not valid YAML"),
    ],
)
def test_a_bad_script_is_one_line_and_exit_2(script: str, says: str, tmp_path: Path) -> None:
    (tmp_path / "replies.yaml").write_text(script, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "hermes_core.testing.fake_openai", "--script", "replies.yaml"],
        cwd=tmp_path, env=clean_environ(), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2 and says in result.stderr and len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize("mode", ["webhook", "longconn"])
def test_a_first_feishu_message_typed_into_the_fake(mode: str, scripted_model: str, tmp_path: Path) -> None:
    """The new user's path: the fake Feishu started by its command, `hermes-kernel serve` pointed at
    it with the environment the fake printed, a line typed at its prompt reaches the bot as a p2p
    message (POSTed to the bot's URL, or over the long connection the bot opens), and the scripted
    model's reply is printed by the fake."""
    port = free_port()
    bot_url = ["--bot-url", f"http://127.0.0.1:{port}/feishu/events"] if mode == "webhook" else []
    feishu = Program("hermes_core.testing.fake_feishu", "--serve", *bot_url, cwd=tmp_path)
    serve = None
    try:
        feishu.wait_for("fake Feishu serving on")
        pointed = dict(feishu.wait_for(f"FEISHU_{name}=").strip().split("=", 1) for name in
                       ("BASE_URL", "APP_ID", "APP_SECRET", "VERIFICATION_TOKEN", "MODE"))  # fmt: skip
        assert pointed["FEISHU_MODE"] == mode
        env = clean_environ(HERMES_BASE_URL=scripted_model, HERMES_MODEL="scripted", **pointed)
        serve, _ = start_serve("serve", "--port", str(port), cwd=tmp_path, env=env)
        feishu.wait_for("Ctrl-D ends")
        feishu.type("hello")
        assert "Hello from the script!" in feishu.wait_for("bot:")
    finally:
        if serve is not None:
            stop_serve(serve)
        assert feishu.stop() in (0, -15)


def test_without_serve_it_says_what_to_add(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hermes_core.testing.fake_feishu"],
        cwd=tmp_path, env=clean_environ(), capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 2 and "add --serve" in result.stderr
