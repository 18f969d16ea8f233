"""Memory that outlives a conversation: past task outcomes, offered to the model as dated examples."""

from .longterm import LongTermMemory, Outcome

__all__ = ["LongTermMemory", "Outcome"]
