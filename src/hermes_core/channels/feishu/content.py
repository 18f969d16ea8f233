"""The text of Feishu message contents beyond plain text: a post's nodes, a card, a shared chat or
contact (FEISHU.md §4, "content per type").

What the vendor's own channel layer makes of each type is the reference
(lark_oapi/channel/normalize/converters/post.py, interactive.py, share.py); the lines here are
written for a model to read, so they say what the thing is in words rather than in tags. Every
function takes any JSON value and never raises: the content comes from whoever sent the message.
"""

from __future__ import annotations

from typing import Any

MAX_CARD_CHARS = 10_000  # the text of one card: far more than a card shows, within a message's cap
MAX_CARD_NODES = 2_000  # nodes visited in one card: bounds the work a hostile card can cause


def post_node_text(node: dict[str, Any]) -> str:
    """One node of a post paragraph as text: `text`/`md`, a link as `[text](href)`, a mention (its
    `@_user_N` key, which `strip_mentions` replaces, or its name), a code block fenced with its
    language, an emoji as `:TYPE:`, a rule as `---`. Pictures and videos are read as attachments."""
    tag = node.get("tag")
    text = _str(node.get("text"))
    if tag in ("text", "md"):
        return text
    if tag == "a":
        href = _str(node.get("href"))
        return f"[{text or href}]({href})" if href else text
    if tag == "at":
        key, name = _str(node.get("user_id")), _str(node.get("user_name"))
        return key if key.startswith("@_") or not name else f"@{name}"
    if tag == "code_block":
        return f"\n```{_str(node.get('language')).lower()}\n{text}\n```\n"
    if tag == "emotion":
        return f":{_str(node.get('emoji_type'))}:"
    if tag == "hr":
        return "\n---\n"
    return ""


def card_text(content: dict[str, Any]) -> str:
    """A card as received (a simplified card, `{"title", "elements": [[node, …], …]}`, FEISHU.md §4),
    or a card's JSON (1.0 `elements`, 2.0 `body.elements`, as the bot's own cards read back): its
    title, then the text of its elements, one paragraph or element a line."""
    title = _str(content.get("title"))
    header = content.get("header")
    if not title and isinstance(header, dict):
        title = " ".join(_strings(header.get("title"), [MAX_CARD_NODES]))
    lines: list[str] = []
    budget = [MAX_CARD_NODES]
    body = content.get("body")  # a JSON 2.0 card keeps its elements under `body`
    elements = _list(content.get("elements")) or _list(
        body.get("elements") if isinstance(body, dict) else None
    )
    for paragraph in elements[:MAX_CARD_NODES]:
        if isinstance(paragraph, list):  # the simplified shape: paragraphs of post-like nodes
            nodes = [node for node in paragraph if isinstance(node, dict)]
            line = "".join(post_node_text(node) or _str(node.get("text")) or _str(node.get("content"))
                           for node in nodes)  # fmt: skip
        else:
            line = " ".join(_strings(paragraph, budget))
        if line.strip():
            lines.append(line.strip())
    text = "\n".join(lines)[:MAX_CARD_CHARS]
    head = f"[card: {title}]" if title else "[card]"
    return f"{head}\n{text}" if text else head


def shared_text(kind: str, content: dict[str, Any]) -> str:
    """A shared group chat (`share_chat`, `{"chat_id"}`) or contact (`share_user`, `{"user_id"}`)."""
    if kind == "share_chat":
        return f"[shared a group chat: {_str(content.get('chat_id')) or 'unknown'}]"
    return f"[shared a contact: {_str(content.get('user_id')) or 'unknown'}]"


def _strings(value: Any, budget: list[int]) -> list[str]:
    """The `content` and `text` strings under `value`, in document order, visiting at most
    `budget[0]` nodes. Iterative: a card nested a thousand levels deep cannot exhaust the stack."""
    found: list[str] = []
    stack = [value]
    while stack and budget[0] > 0:
        node = stack.pop()
        budget[0] -= 1
        if isinstance(node, dict):
            found += [node[key] for key in ("content", "text") if isinstance(node.get(key), str)]
            stack += reversed([item for item in node.values() if isinstance(item, (dict, list))])
        elif isinstance(node, list):
            stack += reversed(node)
    return found


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


__all__ = ["card_text", "post_node_text", "shared_text"]
