"""Cheaper-model routing (`model.routes`): short or small-talk questions go to a cheaper model.

    model:
      provider: deepseek
      name: deepseek-v4-pro          # the main model
      routes:
        - {when: small_talk, model: deepseek-v4-flash}
        - {when: short, max_chars: 40, model: deepseek-v4-flash}

Why here, as a client: the loop, plan mode and the team run their model calls through one
`ModelClient`, and permissions already follow the model that answered (`answered_by`), so a
client that picks the model per call keeps every mode and every check as it was.

The decision is made before a task's first model call, from the conversation alone (no state):
- a request whose last message is the user's (a task's first call) goes to the first route whose
  rule matches that message: `short` (at most `max_chars` characters) or `small_talk` (a greeting
  of `agent.greeting_patterns`, at most `max_chars` characters); no match: the main model;
- every later call of the task (after a tool result, a plan step) goes to the main model.

A routed question that turns out to need tools *escalates*: the routed model is offered the tools
it may use (`offered_to`, so a tool limited by `allowed_models` to the main model is never offered
to it), and when it answers with tool calls its answer is dropped and the main model answers the
same request instead; the task then stays on the main model, which makes (and is checked for)
every tool call. The dropped answer's tokens are added to the main model's answer, so a task's
usage never hides them (priced at the main model's price: a conservative figure).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from ..kernel.messages import Message, ModelResponse, Usage
from ..kernel.model import ModelClient, TextCallback

if TYPE_CHECKING:
    from ..kernel.loop import RunResult

log = logging.getLogger("hermes_core.model")

RouteRule = Literal["short", "small_talk"]


@dataclass(frozen=True)
class Route:
    """Questions that `when` matches (at most `max_chars` characters) go to `model`."""

    when: RouteRule
    model: str
    max_chars: int = 40

    def matches(self, text: str, is_small_talk: Callable[[str], bool]) -> bool:
        text = text.strip()
        if not text or len(text) > self.max_chars:
            return False
        return self.when == "short" or is_small_talk(text)


class RoutedModel(ModelClient):
    """The main client, and a cheaper client per route; see the module docstring."""

    def __init__(
        self,
        main: ModelClient,
        routes: Sequence[tuple[Route, ModelClient]],
        is_small_talk: Callable[[str], bool] = lambda text: False,
    ) -> None:
        self.main = main
        self.routes = list(routes)
        self.is_small_talk = is_small_talk
        self.name = main.name

    @property
    def models(self) -> tuple[str, ...]:
        """Every model a request may go to: the loop offers what any of them may use, and each
        client narrows a request to its own model's tools."""
        names = list(self.main.models)
        for _, client in self.routes:
            names += [name for name in client.models if name not in names]
        return tuple(names)

    def choose(self, messages: list[Message]) -> ModelClient:
        """The client for this request: a route's for a task's first call that matches it."""
        last = messages[-1] if messages else {}
        if last.get("role") != "user" or not isinstance(last.get("content"), str):
            return self.main
        for route, client in self.routes:
            if route.matches(last["content"], self.is_small_talk):
                return client
        return self.main

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        client = self.choose(messages)
        if client is self.main:
            return await self.main.complete(messages, tools, on_text=on_text)
        response = await client.complete(messages, tools, on_text=None if tools else on_text)
        if not response.tool_calls:
            return response
        log.info("routed model %s asked for tools: the main model %s answers", client.name, self.main.name)
        answer = await self.main.complete(messages, tools, on_text=on_text)
        return replace(answer, usage=answer.usage + response.usage)

    async def aclose(self) -> None:
        await self.main.aclose()
        for _, client in self.routes:
            await client.aclose()


def answering_model(response: ModelResponse) -> str:
    """The configured model that answered (`answered_by`), else what the endpoint wrote."""
    return response.answered_by or response.model or "model"


def usage_by_model(result: RunResult) -> dict[str, Usage]:
    """A task's token usage per answering model, in the order the models first answered."""
    usage: dict[str, Usage] = {}
    for response in result.responses:
        name = answering_model(response)
        usage[name] = usage.get(name, Usage()) + response.usage
    return usage


__all__ = ["Route", "RouteRule", "RoutedModel", "answering_model", "usage_by_model"]
