"""`chat` and `run` in a real terminal: what they show while the model works, and Ctrl-C.

Every test runs `hermes-kernel` as a subprocess against the fake OpenAI-compatible server (with
latency, streaming its text in chunks). The interactive ones run it on a pseudo-terminal made its
controlling terminal (`pty.fork`), and Ctrl-C is the byte a keyboard sends (0x03), turned into
SIGINT by the terminal driver as on any desktop.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from serve_process import CLEAN_ENV
from waiting import wait_for

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")

LONG = (
    "Here is a reply long enough to arrive in many pieces: the model writes it a few words at a time, "
    "and the terminal shows each piece as it comes, not all of it at the end."
)
APPROVED_TOOL = '''
from pathlib import Path
from hermes_core import tool

@tool(confirm=True)
def send_invoice(customer: str) -> str:
    """Send an invoice to a customer (needs approval)."""
    Path("sent.txt").write_text(customer)
    return "sent"
'''
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    server = FakeOpenAIServer().start_in_thread()
    try:
        yield server
    finally:
        server.stop()


def environment(fake: FakeOpenAIServer) -> dict[str, str]:
    return {**CLEAN_ENV, "HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "fake", "TERM": "xterm"}


class Screen:
    """A `hermes-kernel` process on a pseudo-terminal: what it wrote, keys typed into it."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the terminal is its controlling terminal
            os.chdir(cwd)
            os.execve(sys.executable, [sys.executable, "-m", "hermes_core", *argv], env)
        self.text = ""
        self.status: int | None = None

    def expect(self, pattern: str, timeout: float = 30.0) -> float:
        """Wait until `pattern` (a regex) is on the screen; the time it appeared."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.plain):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._read(remaining):
                raise AssertionError(f"{pattern!r} never appeared; the screen:\n{self.plain}")
        return time.monotonic()

    def type(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                self._read(0.2)
                return self.status
            self._read(0.1)
        raise AssertionError(f"hermes-kernel did not exit; the screen:\n{self.plain}")

    def close(self) -> None:
        if self.status is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)

    @property
    def plain(self) -> str:
        """Everything written, without colours; a line rewritten in place (`\\r`) as a new line."""
        return ANSI.sub("", self.text).replace("\r\n", "\n").replace("\r", "\n")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # the child has gone: its side of the terminal is closed
            return False
        self.text += chunk.decode("utf-8", "replace")
        return bool(chunk)


@pytest.fixture
def screens() -> Iterator[list[Screen]]:
    opened: list[Screen] = []
    yield opened
    for screen in opened:
        screen.close()


def test_chat_shows_status_and_streams_the_reply_before_the_turn_ends(
    fake: FakeOpenAIServer, screens: list[Screen], tmp_path: Path
) -> None:
    """Attack: a person types a message at a real endpoint that takes a second to answer and then
    writes slowly; before, the terminal stayed blank until the whole turn was over."""
    fake.script(
        FakeReply.tool_call("calculator", {"expression": "(12+34)*2"}, delay=0.8),
        FakeReply.text(LONG, delay=0.8, chunk_delay=0.06),
    )
    screen = Screen(["chat"], environment(fake), tmp_path)
    screens.append(screen)
    screen.expect(r"> $")
    screen.type("what is (12+34)*2\n")
    thinking = screen.expect("thinking…")
    tool = screen.expect(r'→ calculator\(\{"expression": "\(12\+34\)\*2"\}\)')
    first_words = screen.expect("Here is a reply long")
    assert "not all of it at the end." not in screen.plain  # shown while the model still writes
    done = screen.expect(r"not all of it at the end\.\n")
    assert thinking < tool < first_words < done
    assert done - first_words > 0.3
    screen.expect(r"> $")
    assert screen.plain.count(LONG) == 1 and "Traceback" not in screen.plain
    screen.type("\x04")  # Ctrl-D
    assert screen.wait() == 0


def test_ctrl_c_cancels_the_turn_then_the_next_message_works_and_ctrl_c_leaves(
    fake: FakeOpenAIServer, screens: list[Screen], tmp_path: Path
) -> None:
    """Attack: Ctrl-C while the model is answering (a slow endpoint). Before, it was a traceback
    and the end of the session; now the turn is cancelled, the prompt comes back, the next message
    is answered, and Ctrl-C at the prompt leaves cleanly."""
    fake.script(
        FakeReply.slow(20.0, FakeReply.text("too late")), FakeReply.text("the second answer", delay=0.3)
    )
    screen = Screen(["chat"], environment(fake), tmp_path)
    screens.append(screen)
    screen.expect(r"> $")
    screen.type("a slow question\n")
    screen.expect("thinking…")
    wait_for(lambda: fake.requests, what="the question at the model")
    screen.type("\x03")  # Ctrl-C
    screen.expect(r"cancelled")
    screen.expect(r"> $")
    screen.type("and now?\n")
    screen.expect(r"the second answer\n")
    screen.expect(r"> $")
    screen.type("\x03")
    assert screen.wait() == 0
    assert "Traceback" not in screen.plain and "too late" not in screen.plain
    assert "KeyboardInterrupt" not in screen.plain


def test_a_second_ctrl_c_leaves_without_a_traceback(
    fake: FakeOpenAIServer, screens: list[Screen], tmp_path: Path
) -> None:
    """Attack: Ctrl-C twice in a row during a slow turn (the usual way out of a stuck program)."""
    fake.script(FakeReply.slow(20.0, FakeReply.text("too late")))
    screen = Screen(["chat"], environment(fake), tmp_path)
    screens.append(screen)
    screen.expect(r"> $")
    screen.type("a slow question\n")
    screen.expect("thinking…")
    screen.type("\x03")
    screen.expect("cancelled")
    screen.type("\x03")
    assert screen.wait() == 0
    assert "Traceback" not in screen.plain and "KeyboardInterrupt" not in screen.plain


def test_ctrl_c_at_an_approval_prompt_cancels_the_turn_and_the_next_line_is_a_message(
    fake: FakeOpenAIServer, screens: list[Screen], tmp_path: Path
) -> None:
    """Attack: Ctrl-C at the y/N approval prompt. A prompt read by a thread blocked in `input()`
    would stay behind and swallow the next line typed at the chat prompt."""
    (tmp_path / "approved_tools.py").write_text(APPROVED_TOOL, encoding="utf-8")
    (tmp_path / "hermes.yaml").write_text("tools: [approved_tools]\n", encoding="utf-8")
    fake.script(
        FakeReply.tool_call("send_invoice", {"customer": "ACME"}),
        FakeReply.text("a reply after the cancelled turn"),
    )
    screen = Screen(["--config", "hermes.yaml", "chat"], environment(fake), tmp_path)
    screens.append(screen)
    screen.expect(r"> $")
    screen.type("invoice ACME\n")
    screen.expect(r"Approve send_invoice\(")
    screen.type("\x03")
    screen.expect("cancelled")
    screen.expect(r"> $")
    screen.type("y\n")  # a person's next line: a message, not the answer to the cancelled prompt
    screen.expect(r"a reply after the cancelled turn\n")
    assert fake.requests[-1].messages[-1]["content"] == "y"
    assert not (tmp_path / "sent.txt").exists()
    screen.type("exit\n")
    assert screen.wait() == 0


def test_run_piped_prints_only_the_reply_and_the_status_goes_to_the_terminal(
    fake: FakeOpenAIServer, tmp_path: Path
) -> None:
    """Attack: `hermes-kernel run "…" | next-program` from a terminal: the status line must reach
    the person (stderr is the terminal) and never the pipe, which gets the reply alone."""
    fake.script(
        FakeReply.tool_call("calculator", {"expression": "2+3"}, delay=0.3),
        FakeReply.text(LONG, chunk_delay=0.01),
    )
    master, slave = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hermes_core", "run", "what is 2+3"],
            cwd=tmp_path, env=environment(fake), stdout=subprocess.PIPE, stderr=slave, timeout=60,
        )  # fmt: skip
        os.close(slave)
        terminal = b""
        while select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            terminal += chunk
    finally:
        os.close(master)
    assert done.returncode == 0
    assert done.stdout.decode() == LONG + "\n"
    status = ANSI.sub("", terminal.decode()).replace("\r", "\n")
    assert "thinking…" in status and "→ calculator" in status
    quiet = subprocess.run(
        [sys.executable, "-m", "hermes_core", "run", "--quiet", "hello"],
        cwd=tmp_path, env=environment(fake), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert quiet.returncode == 0 and quiet.stdout == "hello\n" and quiet.stderr == ""


def test_run_streams_on_a_terminal_and_ctrl_c_exits_130_with_one_line(
    fake: FakeOpenAIServer, screens: list[Screen], tmp_path: Path
) -> None:
    """Attack: Ctrl-C during `hermes-kernel run` against a slow endpoint: one line and exit status
    130 (the shell's convention for SIGINT), never a traceback."""
    fake.script(FakeReply.text(LONG, delay=0.5, chunk_delay=0.06), FakeReply.slow(20.0))
    streamed = Screen(["run", "write something"], environment(fake), tmp_path)
    screens.append(streamed)
    first_words = streamed.expect("Here is a reply long")
    assert "not all of it at the end." not in streamed.plain
    assert streamed.expect(r"not all of it at the end\.") - first_words > 0.3
    assert streamed.wait() == 0
    slow = Screen(["run", "a slow question"], environment(fake), tmp_path)
    screens.append(slow)
    slow.expect("thinking…")
    wait_for(lambda: len(fake.requests) == 2, what="the slow question at the model")
    slow.type("\x03")
    assert slow.wait() == 130
    said = [line for line in slow.plain.splitlines() if line.strip() and "thinking" not in line]
    assert said == ["hermes-kernel: cancelled"], slow.plain
