"""Text tool calls in a streamed reply: show the text that is safe to show, hand over each call
as soon as its block closes, and end with exactly what `parse_text_calls` says of the whole reply.

    parser = StreamingTextCallParser()
    for piece in pieces:
        update = parser.feed(piece)      # update.text: show it; update.calls: closed calls
    last = parser.flush()                # the rest of the text and calls
    parsed = parser.finish()             # == parse_text_calls(whole reply, think_open=False)

What is held back: a tail that may be the start of a tag (`<tool_c…`, `<thi…`, `[TOOL_CA…`), every
open block until it closes, whitespace until text follows it, and the whole reply while it may
still be one whole-message call (it starts with `{`, `[` or a code fence). Shown text is never taken
back: everything shown, plus `flush().text`, is `finish().content`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .parsers import (
    SLOW_READ_BUDGET,
    ContentBuilder,
    MessageParser,
    ParsedText,
    TextCall,
    ThinkSplitter,
    holds_whole_message,
    may_be_whole_message,
    may_end_in_word,
    open_block_closers,
    parse_selected,
    partial_opening,
    release,
    scan_blocks,
    select_parsers,
    slow_read_budget,
    tags_of,
    typed_by_schema,
    typed_call,
    word_pattern,
)
from .schema import tool_properties

_LONGEST_CLOSER = 64  # characters: every format's closing tags are shorter


@dataclass
class StreamUpdate:
    """What a piece of the stream released: text to show and calls whose block closed."""

    text: str = ""
    calls: list[TextCall] = field(default_factory=list)


class StreamingTextCallParser:
    """Parses a reply piece by piece, agreeing exactly with `parse_text_calls` on the whole of it.

    `think_open` must be known up front here (see `parse_text_calls`): a stream cannot take back
    text it has shown when a stray `</think>` later turns it into reasoning.
    """

    def __init__(
        self,
        formats: Sequence[str] | None = None,
        *,
        think_open: bool = False,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        """`tools` (the request's) type the values a format writes as text, as in `parse_text_calls`."""
        self._parsers = select_parsers(formats)
        self._tags = tags_of(self._parsers)
        self._words = word_pattern(self._tags)  # tag starts that hold no `<` or `[`
        self._tools = tools
        self._schemas = tool_properties(tools)
        self._think_open = think_open
        self._thoughts = ThinkSplitter(think_open)
        self._content = ContentBuilder()
        self._pieces: list[str] = []
        self._pending = ""  # think-stripped text not released yet
        self._offset = 0  # where `_pending` starts in the whole think-stripped text
        self._scanning = not any(isinstance(parser, MessageParser) for _, parser in self._parsers)
        self._shown = 0  # characters of content released so far
        self._calls_sent = 0
        self._result: ParsedText | None = None
        self._flushed = False
        self._budget = dict(SLOW_READ_BUDGET)  # spent on the blocks in the order a whole parse spends it
        self._unread: list[str] = []  # think-stripped text held without being read (see _still_held)
        self._tail = ""  # the last characters fed, where a closer may have begun
        self._closers: tuple[str, ...] | None = None  # what the open block at `_pending`'s start waits for
        self._whole = False  # the reply starts like a whole-message call: held to the end
        self._blank = True  # nothing but whitespace so far

    def feed(self, piece: str) -> StreamUpdate:
        """Add the next piece of the reply; return what can be released now."""
        if self._result is not None:
            raise RuntimeError("the stream has ended: feed() after finish() or flush()")
        if self._plain(piece):
            return self._release_plain(piece)
        self._pieces.append(piece)
        new = self._thoughts.feed(piece)
        if not new or self._still_held(new):
            return StreamUpdate()
        self._pending += "".join(self._unread)
        self._unread = []
        if not self._scanning:  # held until it cannot be a whole-message call any more
            self._whole = holds_whole_message(self._pending)
            self._scanning = not self._whole and not may_be_whole_message(self._pending)
            if not self._scanning:
                return StreamUpdate()
        with slow_read_budget(self._budget):
            segments, used = scan_blocks(self._pending, self._parsers, final=False, offset=self._offset)
        self._pending, self._offset = self._pending[used:], self._offset + used
        self._closers = open_block_closers(self._pending, self._parsers)
        text, calls = release(segments, self._content)
        return self._sent(text, [typed_call(call, self._schemas) for call in calls])

    def _plain(self, piece: str) -> bool:
        """Whether `piece` is prose that follows released text: nothing is held or open and it has
        no `<`, `[` or letter-led tag start, so no tag or thought can begin in it but at its end."""
        return (
            not self._pending
            and self._closers is None
            and self._scanning
            and not self._unread
            and "<" not in piece
            and "[" not in piece
            and self._thoughts.idle
            and not (self._words and self._words.search(piece))
        )

    def _release_plain(self, piece: str) -> StreamUpdate:
        """`feed` for a plain piece, as the general path would read it (about 4× cheaper per piece,
        which is most of a long reply's cost): only a tail that may start a letter-led tag is held."""
        self._pieces.append(piece)
        self._tail = (self._tail + piece)[-_LONGEST_CLOSER:]
        held = partial_opening(piece, 0, self._tags) if may_end_in_word(piece, self._tags) else len(piece)
        self._pending, self._offset = piece[held:], self._offset + held
        return self._sent(self._content.add(piece[:held]), [])

    def _still_held(self, new: str) -> bool:
        """Whether `new` cannot release anything, so it is only kept (in `_unread`): the reply is a
        whole-message call, or blank so far, or an open block's closer is not in it. Reading the
        held text again at every piece would cost time quadratic in its length."""
        self._unread.append(new)
        tail, self._tail = self._tail + new, (self._tail + new)[-_LONGEST_CLOSER:]
        if self._closers is not None:
            return not any(closer in tail for closer in self._closers)
        if not self._scanning:
            self._blank = self._blank and new.isspace()
            return self._whole or self._blank
        return False

    def flush(self) -> StreamUpdate:
        """End the stream: the text and calls not released yet (empty when called again)."""
        parsed = self.finish()
        if self._flushed:
            return StreamUpdate()
        self._flushed = True
        return self._sent(parsed.content[self._shown :], parsed.calls[self._calls_sent :])

    def finish(self) -> ParsedText:
        """The whole reply parsed; exactly `parse_text_calls(reply, formats, think_open=…, tools=…)`."""
        if self._result is None:
            parsed = parse_selected("".join(self._pieces), self._parsers, self._think_open)
            self._result = typed_by_schema(parsed, self._tools)
        return self._result

    def _sent(self, text: str, calls: list[TextCall]) -> StreamUpdate:
        self._shown += len(text)
        self._calls_sent += len(calls)
        return StreamUpdate(text, calls)
