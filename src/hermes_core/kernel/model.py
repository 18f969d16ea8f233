"""The one extension point for model back-ends: something that turns messages into a response.

Also what every back-end shares about tools and models: a client that may answer with more than
one model (fallbacks) says which in `models`, offers each model only the tools that model may use
(`offered_to`, with the offer the loop set for the turn) and names the model that answered in
`ModelResponse.answered_by`, so that permissions are checked against it.
"""

from __future__ import annotations

import contextvars
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Literal

from .messages import JSON, Message, ModelResponse, request_digest

TextCallback = Callable[[str], object]  # called with each piece of text; may return an awaitable
ToolMode = Literal["native", "text", "auto"]  # how tools reach the model (textcalls/wrapper.py)
ToolOffer = Callable[[str], Collection[str]]  # model name → the names of the tools it may be offered

_offer: contextvars.ContextVar[ToolOffer | None] = contextvars.ContextVar("hermes_tool_offer", default=None)


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

    @property
    def models(self) -> tuple[str, ...]:
        """The models this client may answer with, in the order it tries them (a wrapper: its inner's)."""
        return (self.name,)

    @abstractmethod
    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, JSON]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse: ...

    async def aclose(self) -> None:
        """Release connections. Safe to call more than once; clients without any keep this no-op."""
        return None


class ModelWrapper(ModelClient):
    """A client that adds one thing around another (`inner`): the routing of tools, text-mode
    calls, the journal, spacing… It answers under the inner client's name and with its models,
    passes `complete` through unless it overrides it, and closes the inner client."""

    def __init__(self, inner: ModelClient) -> None:
        self.inner = inner
        self.name = inner.name

    @property
    def models(self) -> tuple[str, ...]:
        return self.inner.models

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, JSON]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        return await self.inner.complete(messages, tools, on_text=on_text)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def emit_text(on_text: TextCallback, piece: str) -> None:
    """Hand a piece of visible text to a callback that may be sync or async."""
    result = on_text(piece)
    if inspect.isawaitable(result):
        await result


class offering:  # noqa: N801 — used as `with offering(…):`, like a contextlib manager
    """Within this block, a request to model M offers only the tools `offer(M)` names. (A class,
    not a `contextlib.contextmanager`: it is entered for every model call.)"""

    __slots__ = ("offer", "token")

    def __init__(self, offer: ToolOffer) -> None:
        self.offer = offer

    def __enter__(self) -> None:
        self.token = _offer.set(self.offer)

    def __exit__(self, *exc: object) -> None:
        _offer.reset(self.token)


def offered_to(model: str, tools: list[dict[str, JSON]] | None) -> list[dict[str, JSON]] | None:
    """The tools of a request to `model`: those of `tools` that the current offer gives it."""
    offer = _offer.get()
    if offer is None or not tools:
        return tools
    allowed = offer(model)
    return [schema for schema in tools if schema.get("function", {}).get("name") in allowed]


def name_unnamed_calls(response: ModelResponse, messages: list[Message]) -> ModelResponse:
    """Ids for the calls an endpoint sent without one (some local servers and proxies do).

    They are unique within the task — an approval or a journaled result of one turn must never
    be found again by another turn's call — and the same when the same conversation is sent
    again, so a task run again names its calls as it did the first time.
    """
    if all(call.id for call in response.tool_calls):
        return response
    prefix = f"call_{request_digest(messages)}"
    calls = [c if c.id else replace(c, id=f"{prefix}_{i}") for i, c in enumerate(response.tool_calls)]
    return replace(response, tool_calls=calls)
