"""Secret handles: a credential a user pastes reaches the model as `[secret:1:<kind>]`, and a tool
declared to accept it gets the value back.

- `hide(conversation, text)` (the gateway's `accept`, `Agent.run`): each credential recognised by
  its shape (kernel/redaction.py `CREDENTIAL_RULES`: API keys, tokens, private keys, `password=…`)
  becomes a handle, numbered per conversation, the same value always the same handle. The value is
  kept in this process's memory only (`HELD`), never written: the inbox, the session history, the
  journal, traces, logs and the prompts hold the handle. A known process secret (the redactor's
  known values: API keys, app secrets from the environment) becomes `[REDACTED]`, never a handle,
  so it is substituted nowhere.
- `accepts_secrets("password")` on a tool function (or a `Tool`): a handle in one of those
  parameters is replaced by its value when the tool runs, in the conversation it was pasted in
  (`secrets_of`, set by `Agent.run` around the loop). Every other parameter and every other tool
  gets the handle as the model wrote it; a handle this process no longer holds (a restart, another
  node) is an error result asking for the credential again.

Tool-call arguments the model writes are not rewritten by a key-name rule either: `password`,
`token` or `api_key` arguments reach the tool as written (kernel/redaction.py `redact_known`).
"""

from __future__ import annotations

import functools
import inspect
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..kernel.redaction import CREDENTIAL_RULES, REDACTED, default_redactor
from ..kernel.tools.declare import Tool, ToolDefinitionError, ToolError

HANDLE = re.compile(r"\[secret:(\d+)(?::[a-z-]+)?\]")
MAX_CONVERSATIONS = 10_000  # held at once, the least recently used forgotten first
MAX_PER_CONVERSATION = 200

F = TypeVar("F", bound=Callable[..., Any])
_conversation: ContextVar[str | None] = ContextVar("hermes_secret_conversation", default=None)


@dataclass
class _Held:
    handles: dict[str, str] = field(default_factory=dict)  # value → handle number
    values: dict[str, str] = field(default_factory=dict)  # handle number → value


class SecretHandles:
    """The pasted values of each conversation, by handle; in memory only."""

    def __init__(self) -> None:
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the values
        return f"SecretHandles({len(self._held)} conversation(s))"

    def hide(self, conversation: str, text: str) -> str:
        """`text` with each credential shape replaced by its handle (a known secret by `[REDACTED]`)."""
        if default_redactor().redact(text) == text:  # one cached pass finds nothing: most messages
            return text
        spans = credential_spans(text)
        if not spans:
            return text
        pieces, last = [], 0
        for start, end, kind in spans:
            pieces += [text[last:start], self._handle(conversation, text[start:end], kind)]
            last = end
        return "".join([*pieces, text[last:]])

    def reveal(self, conversation: str, text: str) -> str:
        """`text` with each handle of `conversation` replaced by its value; ToolError for one not held."""
        with self._lock:
            held = self._held.get(conversation, _Held())

        def value(match: re.Match[str]) -> str:
            if match[1] not in held.values:
                raise ToolError(
                    f"{match[0]} is no longer held (the service restarted, or it was pasted in another "
                    "conversation): ask the user to paste the credential again"
                )
            return held.values[match[1]]

        return HANDLE.sub(value, text)

    def forget(self, conversation: str) -> None:
        with self._lock:
            self._held.pop(conversation, None)

    def _handle(self, conversation: str, value: str, kind: str) -> str:
        if default_redactor().redact(value) == REDACTED:
            return REDACTED  # a secret of this process: never a handle, never substituted
        with self._lock:
            held = self._held.setdefault(conversation, _Held())
            self._held.move_to_end(conversation)
            while len(self._held) > MAX_CONVERSATIONS:
                self._held.popitem(last=False)
            number = held.handles.get(value)
            if number is None and len(held.values) >= MAX_PER_CONVERSATION:
                return f"[REDACTED:{kind}]"
            if number is None:
                number = held.handles[value] = str(len(held.values) + 1)
                held.values[number] = value
        return f"[secret:{number}:{kind}]"


HELD = SecretHandles()  # the process's


def hide(conversation: str, text: str) -> str:
    """`SecretHandles.hide` on the process's handles."""
    return HELD.hide(conversation, text)


@contextmanager
def secrets_of(conversation: str) -> Iterator[None]:
    """Tools run inside this block reveal the handles of `conversation` (`accepts_secrets`)."""
    token = _conversation.set(conversation)
    try:
        yield
    finally:
        _conversation.reset(token)


@functools.cache
def _rules() -> list[tuple[str, re.Pattern[str]]]:
    return [(kind, re.compile(rule)) for kind, rule in CREDENTIAL_RULES]


def credential_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of each credential in `text` (its value part: `password=` stays), by the
    redactor's rules; overlapping matches give way to the earliest, then the longest, then the more
    specific rule (the rules' order: `token: ghp_…` is a github-token)."""
    found = []
    for order, (kind, pattern) in enumerate(_rules()):
        for match in pattern.finditer(text):
            start, end = match.span("v") if "v" in pattern.groupindex else match.span()
            found.append((start, -end, order, kind))
    spans: list[tuple[int, int, str]] = []
    reach = 0
    for start, negative_end, _, kind in sorted(found):
        if start >= reach and -negative_end > start:
            spans.append((start, -negative_end, kind))
            reach = -negative_end
    return spans


def accepts_secrets(*names: str) -> Callable[[F], F]:
    """Let the parameters `names` of a tool function (or a `Tool`) receive pasted credentials: a
    handle written there is replaced by its value when the tool runs. Put it under or over `@tool`."""

    def decorate(func: F) -> F:
        if isinstance(func, Tool):
            return replace(func, handler=decorate(func.handler))
        unknown = set(names) - set(inspect.signature(func).parameters)
        if unknown:
            raise ToolDefinitionError(f"accepts_secrets: {func.__name__} has no parameter {sorted(unknown)}")
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await func(*args, **_revealed(kwargs, names))

            return run_async  # type: ignore[return-value]

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            return func(*args, **_revealed(kwargs, names))

        return run  # type: ignore[return-value]

    return decorate


def _revealed(kwargs: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    conversation = _conversation.get()
    for name in names:
        value = kwargs.get(name)
        if isinstance(value, str) and HANDLE.search(value):
            if conversation is None:
                raise ToolError(f"{name}: a secret handle works only inside a conversation's run")
            kwargs[name] = HELD.reveal(conversation, value)
    return kwargs


__all__ = ["HANDLE", "HELD", "SecretHandles", "accepts_secrets", "credential_spans", "hide", "secrets_of"]
