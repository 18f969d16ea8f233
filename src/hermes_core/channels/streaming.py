"""A turn as it runs, the way a channel shows it: the text written so far and the tool steps.

A channel that streams replies (Feishu patches a card, the webhook sends Server-Sent Events) gets a
`TurnProgress` from its `Channel.watch` for each turn; the runner feeds it (gateway/runner.py): the
model's text pieces through the `on_text` callback the terminal display also uses (cli_display.py),
the tool calls through the loop's hooks (kernel/hooks.py). The progress keeps, in order:

- text blocks: what the model wrote before each tool call and after the last one;
- tool steps: name and state (`running`, then `done` or `failed`).

Streamed text is what the model writes, not yet the reply, so it is redacted as a whole each time a
piece arrives and only what could still be the start of a secret is held until more follows
(`streamable`, also used by console/channel.py and the terminal, cli_display.py): a secret split
across two pieces is never shown, nor the start of one, and a short reply ("好的，已经为你记下了。") is shown
as it is written. A text block is shown whole once a tool call ends it. Tool steps show the tool's
name only, never its arguments.

Listeners are told of each change as an event (a dict): `{"type": "text", "delta": …}` for text
that extends what was shown (all blocks, joined by a blank line), `{"type": "tool", "name", "id",
"status"}` for a step. If redaction changes text already shown, no more deltas follow; the
finished reply (sent by the gateway, from the outbox) is what counts in the end.

Every method returns at once and never raises into the turn: the turn never waits for a platform.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..kernel.redaction import Redactor, default_redactor
from ..kernel.replies import Language, fixed_reply

log = logging.getLogger("hermes_core.channels")

# The text's last word of printable ASCII, held back: a secret is such a word (a key, a token, a
# password, a JWT, a `user:password@` URL), or ends with one after its label (`Bearer `,
# `password = `, `密码是`), so until the word has ended it may still become one.
_WORD_CHARS = "".join(map(chr, range(0x21, 0x7F)))  # printable ASCII but the space
BLOCK_GAP = "\n\n"  # between the text blocks of a turn

Event = dict[str, Any]
StepState = Literal["running", "done", "failed"]


@dataclass
class ToolStep:
    name: str
    call_id: str
    state: StepState = "running"

    def line(self, language: Language) -> str:
        """The status line: `⏳ running search…`, then `✓ search` (or `✗ search`)."""
        key = {"running": "stream_tool_running", "done": "stream_tool_done", "failed": "stream_tool_failed"}
        return fixed_reply(key[self.state], language).format(tool=self.name)


def streamable(redactor: Redactor, written: str) -> str:
    """What of `written`, a reply still being written, may be shown now: redacted as a whole, less
    its last word of printable ASCII, with the start of a known secret left at that edge redacted too
    (`Redactor.cut_redacted`). Text that ends in a space, CJK or its punctuation is shown whole."""
    redacted = redactor.redact(written)
    return redactor.cut_redacted(redacted, len(redacted.rstrip(_WORD_CHARS)))


class TurnProgress:
    """The text and tool steps of one turn so far (a `channels.seam.TurnWatcher`)."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        self.redactor = redactor or default_redactor()
        self.blocks: list[str | ToolStep] = []  # shown text (redacted) and tool steps, in order
        self.version = 0  # counts changes: a channel compares it to what it last showed
        self._written: list[str] = []  # the raw pieces of the open text block
        self._open = False  # the last block is text still being written
        self._emitted = ""  # the text given out as deltas so far
        self._diverged = False
        self._listeners: list[Callable[[Event], None]] = []

    def listen(self, listener: Callable[[Event], None]) -> None:
        self._listeners.append(listener)

    def unlisten(self, listener: Callable[[Event], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    # -- what the runner tells (channels.seam.TurnWatcher) --------------------------------------
    def text(self, piece: str) -> None:
        if not piece:
            return
        self._written.append(piece)
        self._show_text(streamable(self.redactor, "".join(self._written)))

    def tool_started(self, name: str, call_id: str) -> None:
        self._close_text()
        self.blocks.append(ToolStep(name, call_id))
        self._changed({"type": "tool", "name": name, "id": call_id, "status": "running"})

    def tool_finished(self, name: str, call_id: str, ok: bool) -> None:
        step = next((b for b in self.blocks if isinstance(b, ToolStep) and b.call_id == call_id), None)
        if step is None:
            step = ToolStep(name, call_id)
            self.blocks.append(step)
        step.state = "done" if ok else "failed"
        self._changed({"type": "tool", "name": name, "id": call_id, "status": step.state})

    # -- what a channel reads -------------------------------------------------------------------
    @property
    def shown_text(self) -> str:
        """All text shown so far, the blocks joined by a blank line."""
        return BLOCK_GAP.join(b for b in self.blocks if isinstance(b, str) and b)

    @property
    def emitted(self) -> str:
        """The text given out as deltas so far (what a listener joining now has missed)."""
        return self._emitted

    def markdown(self, language: Language) -> str:
        """The turn so far as Markdown: the text blocks, each tool step on its own line."""
        parts: list[str] = []
        for block in self.blocks:
            if isinstance(block, ToolStep):
                parts.append(block.line(language))
            elif block:
                parts.append(block)
        return BLOCK_GAP.join(parts) or fixed_reply("stream_thinking", language)

    # -- inside ---------------------------------------------------------------------------------
    def _show_text(self, shown: str) -> None:
        if self._open:
            if shown == self.blocks[-1]:
                return
            self.blocks[-1] = shown
        else:
            self.blocks.append(shown)
            self._open = True
        self._changed(None)

    def _close_text(self) -> None:
        if self._open:
            self.blocks[-1] = self.redactor.redact("".join(self._written))
            self._changed(None)
        self._written, self._open = [], False

    def _changed(self, event: Event | None) -> None:
        self.version += 1
        events = [event] if event is not None else []
        delta = self._delta()
        if delta:
            events.insert(0, {"type": "text", "delta": delta})
        for one in events:
            for listener in list(self._listeners):
                try:
                    listener(one)
                except Exception:  # a listener's failure must not reach the turn
                    log.exception("a streamed reply's listener failed")

    def _delta(self) -> str:
        if self._diverged:
            return ""
        text = self.shown_text
        if not text.startswith(self._emitted):  # redaction changed what was shown: stop here
            self._diverged = True
            return ""
        delta, self._emitted = text[len(self._emitted) :], text
        return delta


__all__ = ["TurnProgress", "ToolStep", "streamable"]
