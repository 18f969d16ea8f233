"""A request's parts as `turn_messages` (agent.py) lays them out: the system prompt, the history,
the turn's context message (notes, triggered skills), the user's message. Shared by the tests that
check what reaches the model."""

from __future__ import annotations

from typing import Any

from hermes_core.agent import CONTEXT_HEADING


def is_context(message: dict[str, Any]) -> bool:
    content = message.get("content")
    return message.get("role") == "user" and isinstance(content, str) and content.startswith(CONTEXT_HEADING)


def contexts_of(messages: list[dict[str, Any]]) -> list[str]:
    """The context messages of a request (without their heading), oldest first."""
    return [str(m["content"])[len(CONTEXT_HEADING) :].strip() for m in messages if is_context(m)]


def context_of(messages: list[dict[str, Any]]) -> str:
    """All the request's context messages tell the model (earlier turns' ones stay where they were
    given: agent.py `context_update`), joined; "" when the request has none."""
    return "\n\n".join(contexts_of(messages))


def without_context(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in messages if not is_context(m)]
