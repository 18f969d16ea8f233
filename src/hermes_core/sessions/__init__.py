"""Conversations that outlive a process and a context window (MISSION S1–S5).

- `store.py`: `SessionStore` (the seam), `SQLiteSessionStore` (embedded default, in the gateway's
  database file), `InMemorySessionStore`; a conversation is a message log plus a `ConversationState`.
- `context.py`: turns, the token estimate, the window, `prompt_bytes`.
- `memory.py`: `ConversationMemory` — prepare a turn (fold, window, notes), commit it; the `remember`
  tool; the `/memory` and `/forget` commands.
"""

from ..memory.conversation import REMEMBER, SUMMARY_INSTRUCTIONS, ConversationMemory, LongTermHook, Prompt
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
