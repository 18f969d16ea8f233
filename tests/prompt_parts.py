"""A request's parts as `turn_messages` (agent.py) lays them out: the system prompt, the history,
the turn's context message (notes, triggered skills), the user's message. Shared by the tests that
check what reaches the model."""

from __future__ import annotations

from typing import Any

from hermes_core.agent import CONTEXT_HEADING


def is_context(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return message.get("role") == "user" and isinstance(content, str) and content.startswith(CONTEXT_HEADING)


def context_of(messages: list[dict[str, Any]]) -> str:
    """The turn's context (without its heading); "" when the request has none."""
    found = [str(m["content"]) for m in messages if is_context(m)]
    assert len(found) <= 1, "more than one context message in a request"
    return found[0][len(CONTEXT_HEADING) :].strip() if found else ""


def without_context(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if not is_context(m)]
