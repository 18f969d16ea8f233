"""Shared by every test that runs `hermes-kernel serve` (or `run`) as a real process: an environment
without the machine's HERMES_*/FEISHU_* variables, "start serve and read its output up to the
`serving on` line", "stop it with SIGTERM", and, for the poison and stuck-tool tests, a folder with
a tools module and a configuration, its output in a file, and a scripted model.

The model (the fake OpenAI-compatible server) follows the user's words: "call <tool> <arg>" asks
for that tool with {"arg": <arg>}; "parallel <tool> <n>" asks for n calls of it at once; once a
tool result is in, it answers "tool said: <result>" (each result on its own line); anything else
is answered "ok: <text>".
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from hermes_core.testing.fake_openai import FakeReply, RecordedRequest
from waiting import wait_for


def clean_environ(**extra: str) -> dict[str, str]:
    """This process's environment without HERMES_*/FEISHU_* (the machine's own) and in the UTC zone
    (the default of `schedule.timezone` is the machine's: the same times on every machine), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_", "FEISHU_"))}
    env["TZ"] = "UTC"
    env.update(extra)
    return env


CLEAN_ENV = clean_environ()
Serve = Callable[..., "tuple[subprocess.Popen[str], re.Match[str]]"]  # the conftest `serve` fixture
SERVING = re.compile(r"serving on (http://\S+) \((.*)\)")


def start_serve(
    *args: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    stderr: int | None = subprocess.STDOUT,
    python: str | Path = sys.executable,
) -> tuple[subprocess.Popen[str], re.Match[str]]:
    """`python -m hermes_core <args>` in `cwd`, read up to its `serving on <url> (<routes>)` line.

    Returns the process and that line's match (group 1 the base URL, group 2 the routes). With
    `stderr=subprocess.PIPE` the log stays apart from stdout (read it after `stop_serve`)."""
    process = subprocess.Popen(
        [str(python), "-m", "hermes_core", *args], cwd=cwd, env=dict(CLEAN_ENV if env is None else env),
        stdout=subprocess.PIPE, stderr=stderr, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    seen: list[str] = []
    for line in process.stdout:
        seen.append(line)
        found = SERVING.search(line)
        if found:
            return process, found
    errors = process.stderr.read() if process.stderr is not None else ""
    raise AssertionError(f"serve did not start: exit {process.wait()}\n{''.join(seen)}{errors}")


def stop_serve(process: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """SIGTERM, wait for the exit (kill it if it does not come); what is left on its stderr."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        _, errors = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        _, errors = process.communicate()
    return errors or ""


def quietly(function: Callable[..., object], *args: object) -> Callable[[], None]:
    """`function(*args)` as a thread target that ignores connection errors (a request cut off by a kill)."""

    def run() -> None:
        try:
            function(*args)
        except OSError:
            pass

    return run


def follow_the_words(request: RecordedRequest) -> FakeReply:
    messages = request.messages
    last = messages[-1]
    if last["role"] == "tool":
        results: list[str] = []
        for message in reversed(messages):
            if message["role"] != "tool":
                break
            results.insert(0, str(message["content"]))
        return FakeReply.text("tool said: " + "\n".join(results))
    words = str(last.get("content") or "").split()
    if len(words) >= 3 and words[0] == "call":
        return FakeReply.tool_call(words[1], {"arg": words[2]})
    if len(words) >= 3 and words[0] == "parallel":
        return FakeReply.parallel_tool_calls([(words[1], {"arg": str(i)}) for i in range(int(words[2]))])
    return FakeReply.text(f"ok: {last.get('content')}")


def address_in(log: Path, process: subprocess.Popen) -> str:
    """The address a `serve` writing its output to the file `log` serves on, once it says so."""

    def address() -> str | None:
        found = SERVING.search(log.read_text(errors="replace"))
        assert found or process.poll() is None, f"serve exited with {process.returncode}"
        return found.group(1) if found else None

    return wait_for(address, what="serve to start")


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on `port`."""
    with socket.socket() as probe:
        return probe.connect_ex((host, port)) == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Folder:
    """A working folder: tools module, configuration, environment; starts `hermes-kernel` in it."""

    def __init__(self, path: Path, tools: str, config: str, model_url: str, **env: str) -> None:
        self.path = path
        (path / "test_tools_mod.py").write_text(textwrap.dedent(tools), encoding="utf-8")
        (path / "hermes.yaml").write_text(
            "tools: [test_tools_mod]\n" + textwrap.dedent(config), encoding="utf-8"
        )
        self.env = clean_environ(PYTHONPATH=str(path), HERMES_BASE_URL=model_url, HERMES_MODEL="m", **env)
        self.port = free_port()
        self.runs = 0

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "hermes_core", "--config", "hermes.yaml", *args]

    def serve(self) -> Server:
        self.runs += 1
        log = self.path / f"serve-{self.runs}.log"
        process = subprocess.Popen(
            self.command("serve", "--port", str(self.port)), cwd=self.path, env=self.env,
            stdout=log.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        server = Server(process, f"http://127.0.0.1:{self.port}", log)
        wait_for(lambda: server.healthy() or process.poll() is not None, what="serve to start")
        return server


IDLE = ("conversations_busy", "messages_waiting", "replies_waiting", "inbox_pending", "outbox_pending")


def health_at(url: str) -> dict | None:
    """The /healthz answer of the `serve` at `url` (its base URL) while it answers 200; else None."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/healthz", timeout=2) as response:
            return json.loads(response.read()) if response.status == 200 else None
    except (OSError, ValueError):
        return None


def idle_at(url: str) -> bool:
    """Whether the `serve` at `url` has nothing left to do, by its /healthz: no turn running or
    waiting, no reply queued, nothing pending in its store (with a shared database: in any node's).
    From then on nothing more is sent without a new event: the moment a test can check that nothing
    was answered twice."""
    health = health_at(url)
    return health is not None and all(health.get(key) == 0 for key in IDLE)


class Server:
    def __init__(self, process: subprocess.Popen, url: str, log: Path) -> None:
        self.process, self.url, self.log = process, url, log

    def healthy(self) -> bool:
        return health_at(self.url) is not None

    def idle(self) -> bool:
        return idle_at(self.url)

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def webhook(self, text: str, user: str = "u1", timeout: float = 30.0) -> dict:
        body = json.dumps({"message": text, "user_id": user}).encode()
        request = urllib.request.Request(self.url + "/webhook", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self, timeout: float = 30.0) -> float:
        """SIGTERM; the seconds until the process exited."""
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            finally:
                if self.process.poll() is None:
                    self.process.kill()
                    self.process.wait()
        return time.monotonic() - started


class Program:
    """A `python -m` program whose output lines are read in the background."""

    def __init__(
        self, *args: str, cwd: Path, env: dict[str, str] | None = None, python: str | Path = sys.executable
    ) -> None:
        self.process = subprocess.Popen(
            [str(python), "-m", *args], cwd=cwd, env=env or clean_environ(), text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        """The first line (from here on) holding `text`."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line with {text!r} in:\n{''.join(self.seen)}") from None
            self.seen.append(line)
            if text in line:
                return line

    def type(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def stop(self) -> int:
        self.process.terminate()
        try:
            return self.process.wait(timeout=15)
        finally:
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    stream.close()
