"""Conversations that outlive a process and a context window (MISSION S1–S5).

- `store.py`: `SessionStore` (the seam), `SQLiteSessionStore` (embedded default, in the gateway's
  database file), `InMemorySessionStore`; a conversation is a message log plus a `ConversationState`.
- `context.py`: turns, the token estimate, the window, `prompt_bytes`.
- `ConversationMemory` (memory/conversation.py) — prepare a turn (fold, window, notes), commit it;
  the `remember` tool; the `/memory` and `/forget` commands — is named here too, for the callers
  that import it from this package, but loaded only when asked for: memory/conversation.py builds
  on this package, so importing it here would make the two a cycle (either imported first fails).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .context import estimate_tokens, prompt_bytes, split_turns
from .store import (
    Conversation,
    ConversationState,
    Fold,
    InMemorySessionStore,
    SessionStore,
    SQLiteSessionStore,
    TurnAppend,
)

if TYPE_CHECKING:
    from ..memory.conversation import REMEMBER, SUMMARY_INSTRUCTIONS, ConversationMemory, LongTermHook, Prompt

_FROM_MEMORY = ("REMEMBER", "SUMMARY_INSTRUCTIONS", "ConversationMemory", "LongTermHook", "Prompt")


def __getattr__(name: str) -> Any:
    if name not in _FROM_MEMORY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("..memory.conversation", __name__), name)


__all__ = [
    "REMEMBER",
    "SUMMARY_INSTRUCTIONS",
    "Conversation",
    "ConversationMemory",
    "ConversationState",
    "Fold",
    "InMemorySessionStore",
    "LongTermHook",
    "Prompt",
    "SQLiteSessionStore",
    "SessionStore",
    "TurnAppend",
    "estimate_tokens",
    "prompt_bytes",
    "split_turns",
]
