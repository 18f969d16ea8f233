"""What `chat` and `run` show while a turn runs, and how Ctrl-C ends one.

Against a real endpoint a turn is seconds of silence: the terminal shows what is happening instead.
On stderr, when it is a terminal, one status line rewritten in place (`thinking…`, then each tool
call by name with its arguments, shortened); on stdout, the model's text as it arrives when the
endpoint streams. What `run` writes to a pipe stays exactly the reply (status only on a terminal,
none with `--quiet`; streamed text only when stdout is a terminal).

Streamed text is redacted as a whole each time a piece arrives and only what could still be the
start of a secret is held until more follows (channels/streaming.py `streamable`, as the console and
Feishu do), so a secret split across two pieces is never shown; what was printed cannot be taken
back, so if the redacted text stops extending what is on the screen, the reply is printed again
whole, redacted, at the end.

Ctrl-C: `Terminal` catches SIGINT in the event loop. During a turn it cancels that turn (the
prompt comes back); at the prompt, or a second time while a turn is being cancelled, it leaves.
Lines are read by one reader thread for the whole session (`os.read` on stdin, never `input()`):
the prompt, approvals and questions all take their lines from it, so a cancelled approval prompt
leaves no thread behind that would swallow the next line.
"""

from __future__ import annotations

import asyncio
import codecs
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, TextIO, TypeVar

from .channels.streaming import streamable
from .kernel.hooks import TaskHooks
from .kernel.messages import ToolCall
from .kernel.redaction import Redactor, cut_text, default_redactor
from .kernel.tools.registry import ToolOutcome

if TYPE_CHECKING:
    from .agent import Agent

T = TypeVar("T")

ARGUMENTS_SHOWN = 80  # characters of a tool call's arguments on its status line
CLEAR_LINE = "\r\x1b[2K"
THINKING = "thinking… 思考中"
CANCELLED = "cancelled — 已取消 (Ctrl-C again to leave)"


class TurnCancelled(Exception):
    """Ctrl-C cancelled the turn; `leaving` when the person also asked to leave."""

    def __init__(self, leaving: bool) -> None:
        super().__init__("cancelled")
        self.leaving = leaving


class StatusLine:
    """One transient line on stderr, rewritten in place; nothing at all when `enabled` is off."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream, self.enabled = stream, enabled
        self._shown = False

    def show(self, text: str) -> None:
        if self.enabled:
            self.stream.write(f"{CLEAR_LINE}\x1b[2m{text}\x1b[0m")
            self.stream.flush()
            self._shown = True

    def note(self, text: str) -> None:
        """A line that stays (a tool call), in place of the transient one."""
        if self.enabled:
            self.stream.write(f"{CLEAR_LINE}\x1b[2m{text}\x1b[0m\n")
            self.stream.flush()
            self._shown = False

    def clear(self) -> None:
        if self._shown:
            self.stream.write(CLEAR_LINE)
            self.stream.flush()
            self._shown = False


class TurnDisplay:
    """One turn at a time: the status line, and the model's text streamed to `out`."""

    def __init__(self, status: StatusLine, out: TextIO, *, stream: bool, redactor: Redactor | None = None):
        self.status, self.out, self.streams = status, out, stream
        self.redactor = redactor or default_redactor()
        self._written: list[str] = []  # the current piece of text (since the turn or the last tool call)
        self._printed = ""  # what of it is on the screen
        self._diverged = False
        self._open_line = False  # stdout's cursor is after streamed text, not at a line start
        self._running = 0

    @classmethod
    def for_terminal(cls, *, quiet: bool, stream: bool) -> TurnDisplay:
        status = StatusLine(sys.stderr, enabled=not quiet and sys.stderr.isatty())
        return cls(status, sys.stdout, stream=stream)

    def start(self) -> None:
        self._written, self._printed, self._diverged, self._running = [], "", False, 0
        self.status.show(THINKING)

    def on_text(self, piece: str) -> None:
        """The `on_text` callback: the text so far, redacted, shown but for its last characters."""
        if not self.streams:
            return
        self._written.append(piece)
        self._extend(streamable(self.redactor, "".join(self._written)))

    def tool_started(self, call: ToolCall) -> None:
        self._flush_text()
        self._end_line()
        self._written, self._printed, self._diverged = [], "", False
        self._running += 1
        arguments, total = cut_text(" ".join(call.arguments.split()), ARGUMENTS_SHOWN)
        self.status.note(f"→ {call.name}({arguments}{'…' if total > ARGUMENTS_SHOWN else ''})")
        self.status.show(f"running {call.name}…")

    def tool_finished(self, outcome: ToolOutcome | None) -> None:
        """A call is over: its outcome, or None when it raised or the turn was cancelled."""
        self._running -= 1
        if outcome is not None and outcome.error == "awaiting_approval":
            self.status.note(f"  {outcome.call.name} waits for approval 等待批准")
        if self._running <= 0:
            self.status.show(THINKING)

    def prompting(self) -> None:
        """A question for the person follows (an approval): the status line makes room for it."""
        self.status.clear()
        self._end_line()

    def finish(self, reply: str) -> None:
        """The turn's reply: the rest of it if the streamed text is its beginning, else whole."""
        self.status.clear()
        shown = self.redactor.redact(reply)
        if self._printed and not self._diverged and shown.startswith(self._printed):
            self.out.write(shown[len(self._printed) :] + "\n")
        else:
            self._end_line()
            self.out.write(shown + "\n")
        self.out.flush()
        self._written, self._printed, self._open_line = [], "", False

    def cancelled(self) -> None:
        self.status.clear()
        self._end_line()
        sys.stderr.write(CANCELLED + "\n")
        sys.stderr.flush()

    def _extend(self, text: str) -> None:
        if self._diverged or text == self._printed:
            return
        if not text.startswith(self._printed):  # redaction changed what is already shown
            self._diverged = True
            return
        self.status.clear()
        self.out.write(text[len(self._printed) :])
        self.out.flush()
        self._printed, self._open_line = text, True

    def _flush_text(self) -> None:
        """Text the model wrote before a tool call: all of it now (no more will follow it)."""
        if self.streams and self._written:
            self._extend(self.redactor.redact("".join(self._written)))

    def _end_line(self) -> None:
        if self._open_line:
            self.out.write("\n")
            self.out.flush()
            self._open_line = False


class ShownTools(TaskHooks):
    """Hooks (kernel/hooks.py) that show each tool call on the status line while it runs."""

    def __init__(self, display: TurnDisplay) -> None:
        self.display = display

    async def on_tool_start(self, call: ToolCall) -> None:
        self.display.tool_started(call)

    async def on_tool_end(
        self, call: ToolCall, outcome: ToolOutcome | None, error: BaseException | None
    ) -> None:
        self.display.tool_finished(outcome)

    async def on_tool_cancelled(self, call: ToolCall) -> None:
        self.display.tool_finished(None)


def show_tool_calls(agent: Agent, display: TurnDisplay) -> None:
    """Show the tool calls of `agent`'s tasks on `display`: its hooks get a `ShownTools`."""
    agent.hooks = [*agent.hooks, ShownTools(display)]


class Terminal:
    """Lines from stdin and Ctrl-C, for a session in the running event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.leaving = False
        self._ended = False  # stdin is at its end
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._reader: threading.Thread | None = None
        self._turn: asyncio.Task[object] | None = None
        self._cancelling = False
        self._reading: asyncio.Future[str | None] | None = None
        try:
            self.loop.add_signal_handler(signal.SIGINT, self._interrupt)
            self._handles_sigint = True
        except (NotImplementedError, RuntimeError, ValueError):  # Windows, or not the main thread
            self._handles_sigint = False

    def close(self) -> None:
        if self._handles_sigint:
            self.loop.remove_signal_handler(signal.SIGINT)
            self._handles_sigint = False

    async def read_line(self, prompt: str) -> str | None:
        """The next line typed (without its newline); None at end of input or when leaving."""
        if self.leaving or self._ended:
            return None
        sys.stdout.write(prompt)
        sys.stdout.flush()
        self._start_reader()
        self._reading = asyncio.ensure_future(self._lines.get())
        try:
            line = await self._reading
            self._ended = line is None
            return line
        except asyncio.CancelledError:
            if self.leaving and self._turn is None:  # Ctrl-C at the prompt
                return None
            raise
        finally:
            self._reading = None

    async def turn(self, work: Awaitable[T]) -> T:
        """Run one turn; TurnCancelled when Ctrl-C cancelled it."""
        turn = asyncio.ensure_future(work)
        self._turn, self._cancelling = turn, False
        try:
            return await turn
        except asyncio.CancelledError:
            if not self._cancelling:  # cancelled from outside, not by Ctrl-C
                raise
            raise TurnCancelled(self.leaving) from None
        finally:
            self._turn = None

    def _interrupt(self) -> None:
        if self._turn is not None and not self._turn.done():
            if self._cancelling:  # Ctrl-C again while the turn is being cancelled: leave
                self.leaving = True
            self._cancelling = True
            self._turn.cancel()
            return
        self.leaving = True  # at the prompt
        if self._reading is not None:
            self._reading.cancel()

    def _start_reader(self) -> None:
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, name="hermes-stdin", daemon=True)
            self._reader.start()

    def _read(self) -> None:
        """The reader thread: stdin's bytes into lines. `os.read` takes no lock of `sys.stdin`, so
        the thread still blocked in it when the session ends cannot hold up the interpreter's exit."""
        decoder = codecs.getincrementaldecoder(sys.stdin.encoding or "utf-8")(errors="replace")
        pending = ""
        fd = sys.stdin.fileno()
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                chunk = b""
            pending += decoder.decode(chunk, final=not chunk)
            *lines, pending = pending.split("\n")
            if not chunk:
                lines += [pending] if pending else []
            if not self._hand_over([line.rstrip("\r") for line in lines]) or not chunk:
                self._hand_over([None])
                return

    def _hand_over(self, lines: Sequence[str | None]) -> bool:
        """Queue lines for the event loop; False once the session's loop is closed."""
        try:
            for line in lines:
                self.loop.call_soon_threadsafe(self._lines.put_nowait, line)
        except RuntimeError:  # the loop is closed: the session is over
            return False
        return True
