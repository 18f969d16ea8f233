"""The one extension point for model back-ends: something that turns messages into a response."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ..messages import Message, ModelResponse

TextCallback = Callable[[str], Any]


class ModelError(Exception):
    """A model call failed in a way the loop turns into a fixed reply for the user."""


class ModelUnavailable(ModelError):
    """Transient failures (network, timeouts, 429, 5xx, garbage bodies) outlasted every retry."""


class ModelRequestRejected(ModelError):
    """The endpoint refused the request itself (a 4xx other than 429): retrying would not help."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ModelClient(ABC):
    """Send a conversation and the tool schemas to a model, return its decoded response.

    `tools=None` means "offer no tools" (the greeting fast path uses it). When `on_text` is given
    the client may stream and call it with each piece of visible text as it arrives.
    """

    name: str = "model"

    @abstractmethod
    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse: ...

    async def aclose(self) -> None:
        """Release connections. Safe to call more than once; clients without any keep this no-op."""
        return None


async def emit_text(on_text: TextCallback, piece: str) -> None:
    """Hand a piece of visible text to a callback that may be sync or async."""
    result = on_text(piece)
    if inspect.isawaitable(result):
        await result
