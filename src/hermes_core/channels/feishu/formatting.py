"""Turn a reply into Feishu message parts: the message type, the content and the size limits.

- Plain, short replies go out as `text`, whose content is `{"text": …}` (FEISHU.md §6).
- Replies with Markdown structure (code blocks, lists, headings, links, bold, tables, quotes) or
  longer than `LONG_REPLY_CHARS` go out as an `interactive` card in **JSON 2.0** holding one
  `markdown` element. JSON 2.0 because only its rich-text component renders headings, quotes,
  tables, inline code and footnote numbers; a JSON 1.0 card shows them as raw `##`, `| --- |`,
  `>` and backticks (the rich-text component page: "标题、引用、行内引用、表格、数字角标等语法
  仅支持在 JSON 2.0 结构的富文本组件中使用"; FEISHU.md §11). A card rather than a `post` with an
  `md` tag because only cards can be updated in place (PATCH, or CardKit for streaming), which
  streaming and approval cards need: one rich format serves every reply. JSON 2.0 needs Feishu
  7.20 or later; older clients show the card's title and an upgrade prompt instead of its body
  (the platform's behaviour, docs/feishu.md).
- A reply over the limit (text 150 KB, card 30 KB, §6; over it the platform answers 230025) is
  split into parts on paragraph, then line, then word boundaries; a code fence open at a cut is
  closed at the end of the part and reopened, with its language, at the start of the next. A card
  also takes at most `MAX_TABLES` tables (more is refused: 230099, sub-code 11310), so a reply with
  more is cut before its sixth table.

Sizes are measured as the content takes room in the request body, `encoded_size`: the content
string JSON-escaped once more, in UTF-8 bytes. That is never less than the content's own size,
whichever of the two the platform counts. Splitting works on Python strings, so a cut never falls
inside a UTF-8 character. Everything here is pure and deterministic: the same reply always yields
the same parts, which is what makes the per-part `uuid` idempotency of a resend work.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...kernel.redaction import redact_data
from ...kernel.replies import Language, fixed_reply
from ..inert import shown_arguments, visible

TEXT_LIMIT = 150_000  # bytes of encoded content (§6: 150 KB; counted in thousands to be safe)
CARD_LIMIT = 30_000  # bytes of encoded content (§6: 30 KB)
LONG_REPLY_CHARS = 2000  # longer replies read better in a card than as one text bubble
MAX_TABLES = 5  # tables one JSON 2.0 card may hold (FEISHU.md §11)
REPLY_ELEMENT = "reply"  # the element_id of a card's markdown: a streaming card's text goes there

_MARKDOWN = re.compile(
    r"^\s{0,3}(```|~~~)"  # code fence
    r"|^\s{0,3}#{1,6}\s"  # heading
    r"|^\s*([-*+]|\d{1,3}[.)])\s+\S"  # list item
    r"|^\s{0,3}>\s"  # quote
    r"|^\s*\|.*\|\s*$"  # table row
    r"|\[[^\]\n]+\]\([^)\s]+\)"  # link
    r"|\*\*[^*\n]+\*\*",  # bold
    re.MULTILINE,
)
_FENCE = re.compile(r"^\s{0,3}(```+|~~~+)")
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")  # | --- | :-: |
_SOFT_BREAKS = (" ", "\t", "。", "！", "？", "；", "，", "、")  # cut after one of these if we can


@dataclass(frozen=True)
class Part:
    """One message to send: `msg_type` and its `content`, already a JSON string."""

    msg_type: str  # "text" | "interactive"
    content: str


def format_reply(text: str, msg_type: str | None = None) -> list[Part]:
    """The parts to send for a reply, in order; empty when there is nothing visible to send.

    `msg_type` ("text" or "interactive") overrides the choice `wants_card` would make.
    """
    if not text.strip():
        return []
    msg_type = msg_type or ("interactive" if wants_card(text) else "text")
    if msg_type == "interactive":
        return [Part("interactive", card_content(chunk)) for chunk in card_chunks(text)]
    if msg_type == "text":
        return [Part("text", text_content(chunk)) for chunk in _split(text, text_content, TEXT_LIMIT)]
    raise ValueError(f"cannot format a reply as {msg_type!r}: use 'text' or 'interactive'")


def wants_card(text: str) -> bool:
    """True for replies with Markdown structure or longer than `LONG_REPLY_CHARS`."""
    return len(text) > LONG_REPLY_CHARS or _MARKDOWN.search(text) is not None


def text_content(text: str) -> str:
    return json.dumps({"text": text}, ensure_ascii=False)


def markdown_card(markdown: str, *, summary: str | None = None) -> dict[str, Any]:
    """A JSON 2.0 card with one markdown element (`REPLY_ELEMENT`); shared (`update_multi`), so it
    can be patched later (§6). `summary`: what the chat list shows for it."""
    config: dict[str, Any] = {"update_multi": True}
    if summary is not None:
        config["summary"] = {"content": summary}
    element = {"tag": "markdown", "content": markdown, "element_id": REPLY_ELEMENT}
    return {"schema": "2.0", "config": config, "body": {"elements": [element]}}


def streaming_card(markdown: str, summary: str) -> dict[str, Any]:
    """The card of a CardKit card entity that streams (FEISHU.md §6 B, §11): text that extends what
    was shown is typed out, `STREAM_PRINT_MS` per character; the chat list shows `summary`."""
    card = markdown_card(markdown, summary=summary)
    card["config"]["streaming_mode"] = True
    card["config"]["streaming_config"] = {
        "print_frequency_ms": {"default": STREAM_PRINT_MS}, "print_step": {"default": 1},
        "print_strategy": "fast",
    }  # fmt: skip
    return card


STREAM_PRINT_MS = 30  # ms between typed characters: keeps up with a model writing ~30 characters/s


def card_content(markdown: str) -> str:
    return json.dumps(markdown_card(markdown), ensure_ascii=False)


def card_chunks(markdown: str) -> list[str]:
    """`markdown` cut into pieces that each fit one card (`CARD_LIMIT`, `MAX_TABLES`), fences balanced."""
    return [piece for chunk in _split(markdown, card_content, CARD_LIMIT) for piece in _at_most_tables(chunk)]


def count_tables(markdown: str) -> int:
    """Markdown tables in `markdown` (their `| --- |` rules), not counting code blocks."""
    return len(_table_rules(markdown.splitlines(keepends=True)))


def _table_rules(lines: list[str]) -> list[int]:
    """Indexes of the lines that are a table's rule (below its header row), outside code fences."""
    found, fenced = [], False
    for index, line in enumerate(lines):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and index > 0 and "|" in lines[index - 1] and _TABLE_RULE.match(line):
            found.append(index)
    return found


def _at_most_tables(chunk: str) -> list[str]:
    """`chunk` cut before every `MAX_TABLES + 1`-th table (at its header row)."""
    lines = chunk.splitlines(keepends=True)
    rules = _table_rules(lines)
    if len(rules) <= MAX_TABLES:
        return [chunk]
    cut = rules[MAX_TABLES] - 1  # the header row of the first table that does not fit
    return ["".join(lines[:cut]), *_at_most_tables("".join(lines[cut:]))]


def encoded_size(content: str) -> int:
    """UTF-8 bytes the content string takes inside the JSON request body."""
    return len(json.dumps(content, ensure_ascii=False).encode("utf-8"))


def split_text(text: str, budget: int, cost: Callable[[str], int]) -> list[str]:
    """Cut `text` into chunks with `cost(chunk) <= budget`, keeping Markdown code fences balanced.

    `cost` must be additive (the cost of a concatenation is the sum of the costs), which holds
    for the size a string adds to its encoded content. Chunks are cut at the last blank line when
    that keeps at least half a chunk, otherwise at a line end; a line too long on its own is cut
    after a space or CJK punctuation, or anywhere if it has none.
    """
    openers = [_reopener(line) for line in text.splitlines(keepends=True) if _FENCE.match(line)]
    # Room for a fence reopened at the start of a chunk and closed at its end ("\n```\n").
    reserve = 2 * max((cost(line) for line in openers), default=0) + cost("\n") if openers else 0
    room = budget - reserve
    if room < 64:
        raise ValueError("the size budget is too small to split into")
    chunks = _pack(_pieces(text, room, cost), room, cost)
    return _balance_fences(chunks)


def _split(text: str, render: Callable[[str], str], limit: int) -> list[str]:
    overhead = encoded_size(render(""))

    def cost(chunk: str) -> int:  # additive: each character is escaped on its own
        return encoded_size(render(chunk)) - overhead

    return split_text(text, limit - overhead, cost)


def _pieces(text: str, room: int, cost: Callable[[str], int]) -> list[str]:
    """The lines of `text` (with their line ends), with any line costing more than `room` cut up."""
    pieces: list[str] = []
    for line in text.splitlines(keepends=True):
        while cost(line) > room:
            cut = _longest_prefix(line, room, cost)
            soft = max(line.rfind(mark, 0, cut) for mark in _SOFT_BREAKS)
            if soft >= cut // 2:
                cut = soft + 1
            pieces.append(line[:cut])
            line = line[cut:]
        pieces.append(line)
    return pieces


def _longest_prefix(line: str, room: int, cost: Callable[[str], int]) -> int:
    """The largest n with cost(line[:n]) <= room (binary search; at least 1)."""
    low, high = 1, len(line)
    while low < high:
        middle = (low + high + 1) // 2
        if cost(line[:middle]) <= room:
            low = middle
        else:
            high = middle - 1
    return low


def _pack(pieces: list[str], room: int, cost: Callable[[str], int]) -> list[str]:
    chunks: list[list[tuple[str, int]]] = [[]]
    used = 0
    for piece in pieces:
        size = cost(piece)
        if used + size > room and chunks[-1]:
            current = chunks[-1]
            keep = _paragraph_end([line for line, _ in current])
            carried = current[keep:]
            if sum(n for _, n in carried) + size > room:
                keep, carried = len(current), []
            chunks[-1] = current[:keep]
            chunks.append(carried)
            used = sum(n for _, n in carried)
        chunks[-1].append((piece, size))
        used += size
    return ["".join(line for line, _ in chunk) for chunk in chunks if chunk]


def _paragraph_end(lines: list[str]) -> int:
    """Where to end a full chunk: after its last blank line if that keeps at least half of it."""
    for index in range(len(lines) - 1, len(lines) // 2 - 1, -1):
        if not lines[index].strip() and index > 0:
            return index + 1
    return len(lines)


def _balance_fences(chunks: list[str]) -> list[str]:
    """Close a code fence left open at the end of a chunk and reopen it at the next one."""
    balanced: list[str] = []
    opener: str | None = None  # the fence line (with language) open at the end of the last chunk
    for chunk in chunks:
        if opener is not None:
            chunk, opener = opener + chunk, None
        for line in chunk.splitlines(keepends=True):
            if _FENCE.match(line):
                opener = None if opener is not None else _reopener(line)
        if opener is not None:
            fence = _FENCE.match(opener)
            marker = fence.group(1) if fence else "```"
            chunk += ("" if chunk.endswith("\n") else "\n") + marker + "\n"
        balanced.append(chunk)
    return balanced


def _reopener(fence_line: str) -> str:
    """The line that reopens a fence in the next part: its marker and language, kept short."""
    return fence_line.strip()[:40] + "\n"


def approval_card(
    approval: dict[str, Any], language: Language, decision: str | None = None
) -> dict[str, Any]:
    """The approval request as a JSON 2.0 card with Approve / Reject buttons (tasks/pending.py).

    The arguments are shown as inert text: in a code block (no Markdown of theirs is rendered), one
    line, every bidi or zero-width control written out (`<U+202E>`, channels/inert.py), redacted.
    Each button's callback `value` names the approval and the decision; the click comes back as a
    `card.action.trigger` event (the button component's `behaviors`: `callback`). With `decision`
    (a line saying who decided what) the buttons are replaced by that line: the card is updated to
    it once the decision is taken.
    """
    arguments = shown_arguments(redact_data(approval.get("arguments")))
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", arguments)), default=0))
    text = fixed_reply("approval_request", language).format(
        tool=visible(str(approval.get("tool"))),
        arguments=f"\n{fence}json\n{arguments}\n{fence}\n",
        id=visible(str(approval.get("id"))),
    )
    elements: list[dict[str, Any]] = [{"tag": "markdown", "content": text, "element_id": REPLY_ELEMENT}]
    if decision is not None:
        elements.append({"tag": "markdown", "content": f"**{decision}**", "element_id": "decision"})
    else:
        buttons = [("批准 Approve", "approve", "primary"), ("拒绝 Reject", "reject", "danger")]
        elements += [
            {"tag": "button", "element_id": value, "text": {"tag": "plain_text", "content": label},
             "type": kind, "behaviors": [{"type": "callback", "value": {"approval_id": approval.get("id"),
                                                                      "decision": value}}]}
            for label, value, kind in buttons
        ]  # fmt: skip
    return {"schema": "2.0", "config": {"update_multi": True}, "body": {"elements": elements}}
