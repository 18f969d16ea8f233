"""The tools an agent may use, and the one path every tool call is executed through.

`execute` never raises: unknown names, unparseable or invalid arguments, exceptions, business
errors and timeouts all come back as a `ToolOutcome` whose `content` is what the model reads.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import difflib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..messages import Message, ToolCall
from ..redaction import redact_text
from .arguments import ArgumentError, parse_arguments, required_fields_missing, validate_arguments
from .declare import TaskPaused, Tool, ToolContext, ToolError, tool_from_entry, tool_from_function
from .permissions import Caller, Policy
from .results import DEFAULT_MAX_CHARS, error_result, is_error_value, render_result

log = logging.getLogger("hermes_core.tools")

# Sync tools run here, never on the event loop. A thread cannot be killed, so a timed-out sync
# tool keeps its worker until it returns; the pool is sized so that a few stuck tools do not
# starve the rest.
_SYNC_TOOL_POOL = ThreadPoolExecutor(max_workers=32, thread_name_prefix="hermes-tool")


@dataclass
class ToolOutcome:
    """The result of one tool call, as recorded for the run and as shown to the model."""

    call: ToolCall
    content: str
    ok: bool
    arguments: dict[str, Any] | None = None
    elapsed: float = 0.0
    error: str | None = None  # "unknown_tool", "bad_arguments", "exception", "timeout", "tool_error", …

    def to_message(self) -> Message:
        return {"role": "tool", "tool_call_id": self.call.id, "content": self.content}


class ToolRegistry:
    def __init__(
        self,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        policy: Policy | None = None,
        interactions: Any = None,
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self.policy = policy or Policy()
        self.interactions = interactions  # tasks/pending.Interactions: who approves, who answers
        for item in tools:
            self.add(item)

    def add(self, item: Tool | Callable[..., Any] | Mapping[str, Any], name: str | None = None) -> Tool:
        """Register a `@tool`, a plain documented function, or a dict-style entry."""
        if isinstance(item, Tool):
            declared = item
        elif isinstance(item, Mapping):
            entry_name = name or item.get("name")
            if not entry_name:
                raise TypeError("a dict-style tool entry needs a name (pass name=… or a 'name' key)")
            declared = tool_from_entry(str(entry_name), item)
        elif callable(item):
            declared = tool_from_function(item, name=name)
        else:
            raise TypeError(f"cannot register {item!r} as a tool")
        if declared.name in self._tools and self._tools[declared.name] is not declared:
            raise ValueError(f"a tool named {declared.name!r} is already registered")
        self._tools[declared.name] = declared
        return declared

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Any:
        return iter(self._tools.values())

    def schemas(
        self, exclude: Iterable[str] = (), caller: Caller | None = None, model: str | Sequence[str] = ""
    ) -> list[dict[str, Any]]:
        """The tools to offer: not excluded, permitted for this caller and model, and — for tools
        that need a person (approval, a question) — only when there is someone to ask.

        Given several models (a client with fallbacks), the tools any of them may use: the client
        offers each model its own share (models/base.py `offered_to`)."""
        skipped = set(exclude)
        return [
            t.schema()
            for t in self._tools.values()
            if t.name not in skipped
            and self.permitted(t, caller, model)
            and (self.interactions is not None or not t.needs_person)
        ]

    def permitted(self, declared: Tool, caller: Caller | None, model: str | Sequence[str]) -> bool:
        """Whether the policy lets `caller` run `declared` with `model` (or with one of several)."""
        models = (model,) if isinstance(model, str) else tuple(model) or ("",)
        return any(self.policy.refusal(declared, caller, name) is None for name in models)

    def offer(self, exclude: Iterable[str] = (), caller: Caller | None = None) -> Callable[[str], set[str]]:
        """Per model, the names of the tools `schemas` offers it (for models/base.py `offering`)."""
        return lambda model: {schema["function"]["name"] for schema in self.schemas(exclude, caller, model)}

    def closest(self, name: str, limit: int = 3) -> list[str]:
        close = difflib.get_close_matches(name, self.names, n=limit, cutoff=0.4)
        return close or self.names[:limit]

    async def execute(
        self,
        call: ToolCall,
        *,
        timeout: float = 30.0,
        max_chars: int = DEFAULT_MAX_CHARS,
        context: ToolContext | None = None,
    ) -> ToolOutcome:
        started = time.perf_counter()
        outcome = await self._execute(call, timeout, max_chars, context)
        outcome.elapsed = time.perf_counter() - started
        outcome.content = redact_text(outcome.content)  # a tool that read a secret does not hand it on
        return outcome

    async def _execute(
        self, call: ToolCall, timeout: float, max_chars: int, context: ToolContext | None
    ) -> ToolOutcome:
        declared = self._tools.get(call.name)
        if declared is None:
            message = f"unknown tool {call.name!r}; available tools: {', '.join(self.closest(call.name))}"
            return ToolOutcome(call, error_result(message), ok=False, error="unknown_tool")
        context = context or ToolContext(call_id=call.id, tool_name=call.name)
        refusal = self.policy.refusal(declared, context.caller, context.model)
        if refusal is not None:  # the one choke point: refused calls never run, whatever they say
            log.warning(
                "refused %s for %s: %s", call.name, context.caller or "an unidentified caller", refusal
            )
            return ToolOutcome(call, error_result(refusal), ok=False, error="permission_denied")
        try:
            arguments = parse_arguments(call.arguments)
            kwargs = self._bind(declared, arguments)
        except ArgumentError as exc:
            message = f"invalid arguments for {call.name}: {exc}. Fix the arguments and call again."
            return ToolOutcome(call, error_result(message), ok=False, error="bad_arguments")
        if declared.confirm or declared.level >= 2:
            held = await self._approval(declared, call, arguments, context)
            if held is not None:
                return held
        if declared.context_param:
            context.interactions = self.interactions
            kwargs[declared.context_param] = context
        limit = declared.timeout if declared.timeout is not None else timeout
        try:
            value = await asyncio.wait_for(_invoke(declared, kwargs), timeout=limit)
            if declared.extractor is not None:
                value = declared.extractor(value)
        except TaskPaused as paused:
            return ToolOutcome(call, paused.message, False, arguments, error=paused.reason)
        except asyncio.TimeoutError:
            message = f"tool {call.name} timed out after {limit:g} s"
            return ToolOutcome(call, error_result(message), False, arguments, error="timeout")
        except ToolError as exc:
            return ToolOutcome(call, error_result(str(exc)), False, arguments, error="tool_error")
        except Exception as exc:  # a tool's crash is data for the model, never the user's problem
            message = f"tool {call.name} failed: {type(exc).__name__}: {exc}"
            return ToolOutcome(call, error_result(message), False, arguments, error="exception")
        if is_error_value(value):
            return ToolOutcome(call, render_result(value, max_chars), False, arguments, error="tool_error")
        return ToolOutcome(call, render_result(value, max_chars), True, arguments)

    async def _approval(
        self, declared: Tool, call: ToolCall, arguments: dict[str, Any], context: ToolContext
    ) -> ToolOutcome | None:
        """None when a person approved this call; otherwise the outcome that stands in for it."""
        if self.interactions is None:
            message = f"{declared.name} needs a person's approval, and this run has no one to ask"
            log.warning("refused %s: %s", call.name, message)
            return ToolOutcome(call, error_result(message), False, arguments, error="permission_denied")
        approval = await self.interactions.approval(
            context.task_id, call.id, declared.name, call.arguments, context.caller, context.session_id
        )
        if not approval.covers(call):  # an id that named another call: its approval is not this one's
            message = (
                f"the call to {declared.name} was not run: its id {call.id!r} already belongs to a "
                "different call in this task, and every call needs its own approval"
            )
            log.warning("refused %s: call id %s reused for other arguments", call.name, call.id)
            return ToolOutcome(call, error_result(message), False, arguments, error="approval_mismatch")
        if approval.status == "approved":
            log.info("%s approved by %s (%s)", call.name, approval.decided_by, approval.id)
            return None
        if approval.status == "pending":
            log.info("%s waits for approval %s", call.name, approval.id)
            return ToolOutcome(call, approval.id, False, arguments, error="awaiting_approval")
        word = "rejected" if approval.status == "rejected" else "expired without a decision"
        message = f"the call to {declared.name} was not run: the user's approval {word}"
        return ToolOutcome(call, error_result(message), False, arguments, error=f"approval_{approval.status}")

    @staticmethod
    def _bind(declared: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
        """Validated keyword arguments; a private copy, so concurrent calls cannot share objects."""
        if declared.arguments_model is None:
            missing = required_fields_missing(declared.parameters, arguments)
            if missing:
                raise ArgumentError("; ".join(f"field '{name}' is required but missing" for name in missing))
            return copy.deepcopy(arguments)
        validated = validate_arguments(declared.arguments_model, arguments)
        return {name: getattr(validated, name) for name in type(validated).model_fields}


class RegistryWrapper(ToolRegistry):
    """Another registry's tools, policy and interactions, shared rather than copied: a subclass
    changes only `execute` (the journal, the tracer, replay) and may call `inner`'s."""

    def __init__(self, inner: ToolRegistry) -> None:
        super().__init__(policy=inner.policy, interactions=inner.interactions)
        self._tools = inner._tools
        self.inner = inner


async def _invoke(declared: Tool, kwargs: dict[str, Any]) -> Any:
    if declared.is_async:
        return await declared.handler(**kwargs)
    loop = asyncio.get_running_loop()
    # copy_context: the tool sees the caller's context variables but its changes stay its own
    run = functools.partial(contextvars.copy_context().run, declared.handler, **kwargs)
    result = await loop.run_in_executor(_SYNC_TOOL_POOL, run)
    if asyncio.iscoroutine(result):  # a sync wrapper that returned a coroutine
        result = await result
    return result
