"""A console conversation's earlier messages, as the chat page shows them again after a reload.

They are read from the session store (sessions/store.py), where every finished turn is kept in the
transaction that queues its replies — never from the browser. What a person saw is kept, in order:

- a user message: its text (a picture it carried is named, not sent back);
- a reply: the assistant's text;
- proactive ones, marked so: a scheduled job's reply (its prompt, the `[scheduled task …]` line
  the model read, is not shown: nobody typed it) and a `send_message` post, shown as the console
  shows it when it is sent (`→ target: text`, gateway/dispatcher.py `posted_elsewhere`).

Tool calls and results, and the summary of folded turns, stay in the task's trace. The list is
bounded: the last `limit` items.
"""

from __future__ import annotations

import json
from typing import Any

from ..kernel.messages import Message
from ..schedule.jobs import SCHEDULED_PROMPT

SCHEDULED = SCHEDULED_PROMPT.split("{", 1)[0]  # "[scheduled task ": how a job's fire starts
POST_TOOL = "send_message"  # gateway/outgoing.py: its posts are shown where the console shows them
LIMIT = 50

Item = dict[str, Any]


def chat_items(messages: list[Message], limit: int = LIMIT) -> list[Item]:
    """The chat as it was shown: `{"role": "user" | "agent", "text", "proactive"}`, oldest first.
    A turn's posts come after its reply, as they are sent (the reply is the turn's first message)."""
    items: list[Item] = []
    results = {m.get("tool_call_id"): _text(m.get("content")) for m in messages if m.get("role") == "tool"}
    proactive = False  # within a scheduled job's turn
    posts: list[Item] = []  # the turn's posts, shown after its reply
    for message in messages:
        role = message.get("role")
        if role == "user":
            items += posts
            posts = []
            text = _text(message.get("content"))
            proactive = text.startswith(SCHEDULED)
            if not proactive:
                items.append({"role": "user", "text": text, "proactive": False})
        elif role == "assistant":
            posts += _posts(message, results)
            content = _text(message.get("content"))
            if content.strip() and not message.get("tool_calls"):
                items.append({"role": "agent", "text": content, "proactive": proactive})
                items += posts
                posts = []
    return (items + posts)[-limit:]


def _posts(message: Message, results: dict[Any, str]) -> list[Item]:
    """The `send_message` calls an assistant message made that were queued (their result says so),
    as the console showed their posts."""
    posts = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        if function.get("name") != POST_TOOL or '"queued": true' not in results.get(call.get("id"), ""):
            continue
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            continue
        if isinstance(arguments, dict) and arguments.get("text"):
            target, text = str(arguments.get("target", "")).strip(), str(arguments["text"]).strip()
            posts.append({"role": "agent", "text": f"→ {target}: {text}", "proactive": True})
    return posts


def _text(content: Any) -> str:
    """A message's text; a picture part is named ("[picture]"), its bytes left out."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    pieces = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            pieces.append(str(part.get("text", "")))
        elif isinstance(part, dict) and part.get("type") == "image_url":
            pieces.append("[picture]")
    return "\n".join(piece for piece in pieces if piece)
