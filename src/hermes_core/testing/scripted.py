"""`ScriptedModel`: a model whose answers a test writes in advance.

    model = ScriptedModel([call("add", {"a": 1, "b": 2}), reply("3")])
    agent = Agent(model=model, tools=[add])

Each entry is used for one model call, in order: a `ModelResponse`, a plain string (a text
reply), or a function of (messages, tools) returning either. Pass a single function instead of a
list to compute every answer from the conversation. Every call is recorded in `model.calls`.
"""

from __future__ import annotations

import inspect
import itertools
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from ..kernel.messages import JSON, Message, ModelResponse, ToolCall, Usage
from ..kernel.model import ModelClient, TextCallback

Tools = list[dict[str, JSON]] | None
Answer = ModelResponse | str | BaseException  # a response, a text reply, or an exception the call raises
StepFunction = Callable[[list[Message], Tools], Answer | Awaitable[Answer]]  # sync or async
Step = Answer | StepFunction


_call_ids = itertools.count(1)  # unique within the process, like a real model's call ids


def reply(text: str, *, usage: Usage | None = None) -> ModelResponse:
    """A text answer."""
    return ModelResponse(content=text, usage=usage or Usage(10, 5, 15), finish_reason="stop")


def call(
    name: str, arguments: dict[str, JSON] | str = "{}", *more: tuple[str, dict[str, JSON] | str]
) -> ModelResponse:
    """A turn with one tool call (or several: `call("a", {...}, ("b", {...}))`)."""
    pairs = [(name, arguments), *more]
    calls = [
        ToolCall(f"call_{next(_call_ids)}", n, a if isinstance(a, str) else json.dumps(a, ensure_ascii=False))
        for n, a in pairs
    ]
    return ModelResponse(content=None, tool_calls=calls, usage=Usage(10, 5, 15), finish_reason="tool_calls")


@dataclass
class RecordedCall:
    messages: list[Message]
    tools: Tools


class ScriptedModel(ModelClient):
    name = "scripted"

    def __init__(self, script: Iterable[Step] | StepFunction) -> None:
        self._function = script if callable(script) else None
        self._steps: list[Step] = [] if callable(script) else list(script)
        self.calls: list[RecordedCall] = []

    async def complete(
        self, messages: list[Message], tools: Tools = None, *, on_text: TextCallback | None = None
    ) -> ModelResponse:
        snapshot = json.loads(json.dumps(messages, default=str))  # what the model saw at this moment
        self.calls.append(RecordedCall(snapshot, tools))
        if self._function is not None:
            step: Step = self._function
        elif self._steps:
            step = self._steps.pop(0)
        else:
            raise AssertionError(f"ScriptedModel ran out of answers at call {len(self.calls)}")
        given = step(snapshot, tools) if callable(step) and not isinstance(step, ModelResponse) else step
        answer: Answer = await given if inspect.isawaitable(given) else given
        if isinstance(answer, BaseException):
            raise answer
        response: ModelResponse = reply(answer) if isinstance(answer, str) else answer
        if on_text is not None and response.content:
            delivered = on_text(response.content)
            if inspect.isawaitable(delivered):
                await delivered
        return response

    @property
    def remaining(self) -> int:
        return len(self._steps)
