"""Secrets stay out of what the process writes: logs, traces, error replies and prompts.

A `Redactor` knows the secret values to hide: the secret environment variables (HERMES_API_KEY,
FEISHU_APP_SECRET, FEISHU_VERIFICATION_TOKEN, FEISHU_ENCRYPT_KEY, HERMES_WEBHOOK_SECRET, and any
`*_API_KEY`, `*_SECRET`, `*_TOKEN`, `*_PASSWORD`, `*_ENCRYPT_KEY` of at least 8 characters), plus
values added at run time (`redactor.add(token)`, e.g. a freshly fetched Feishu tenant token). It
replaces with `[REDACTED]`:

- each known value, as is and in its URL-encoded and JSON-escaped forms;
- the credentials of an `Authorization:` header, and the token after `Bearer`;
- the usual shapes of unknown credentials: `sk-…` API keys, Feishu `t-…`/`u-…` access tokens.

Where it is installed:
- `install_log_redaction()`: every log record, before any handler sees it (`cli.py`);
- `RedactingModelClient`: the prompt sent to the model and the answer it gives back;
- `redact_text` / `redact_data`: anything else shown or stored (the gateway's replies, traces).

One compiled regular expression does the work, so a 200-character line costs a few µs.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote, quote_plus

from .messages import Message, ModelResponse, ToolCall
from .models.base import ModelClient, TextCallback

REDACTED = "[REDACTED]"
SECRET_VARIABLES = (
    "HERMES_API_KEY",
    "FEISHU_APP_SECRET",
    "FEISHU_VERIFICATION_TOKEN",
    "FEISHU_ENCRYPT_KEY",
    "HERMES_WEBHOOK_SECRET",
)
SECRET_SUFFIXES = ("_API_KEY", "_SECRET", "_TOKEN", "_PASSWORD", "_ENCRYPT_KEY")
MIN_SECRET_CHARS = 8  # a shorter value of a `*_TOKEN`-like variable is rarely a secret (`TRUE`, `0`)
MIN_NAMED_SECRET_CHARS = 4  # the named variables always hold secrets; shorter would mangle any text

# Shapes of credentials nobody registered. Each branch starts with a literal, which lets the regex
# engine skip quickly to where one could start; each needs a digit, so words in prose never match.
# A header or Bearer shape keeps its prefix: only its last group (the credentials) is replaced.
_CREDENTIALS = r"(?!\[REDACTED\])(?=[\w.~+/=-]*\d)[\w.~+/=-]"  # RFC 6750 token chars, base64
_QUOTE = r"(?:\\?[\"'])?"  # 'key', "key" or \"key\" (JSON inside JSON)
_HEADER = rf"{_QUOTE}\s*[:=]\s*{_QUOTE}(?:(?i:bearer|basic|token|digest)\s+)?"  # `: Bearer `, `": "`
_CREDENTIAL_SHAPES = (
    *(
        rf"{word}{_HEADER}(?P<header{n}>{_CREDENTIALS}{{8,}})"
        for n, word in enumerate(("authorization", "Authorization", "AUTHORIZATION"))
    ),
    rf"Bearer\s+(?P<bearer>{_CREDENTIALS}{{12,}})",
    r"sk-(?<![\w-]sk-)(?=[\w-]*\d)[\w-]{20,}",  # OpenAI-style keys: sk-…, sk-proj-…
    r"t-(?<![\w-]t-)(?=[A-Za-z0-9]*\d)[A-Za-z0-9]{20,}\b",  # Feishu tenant_access_token
    r"u-(?<![\w-]u-)(?=[A-Za-z0-9]*\d)[A-Za-z0-9]{20,}\b",  # Feishu user_access_token
)

T = TypeVar("T")


class Redactor:
    """Replaces known secret values, and things shaped like credentials, with `[REDACTED]`.

    Thread-safe: `add` may run while other threads redact.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self._lock = threading.Lock()
        self._pattern = _compile(self._secrets)
        self.add(*secrets)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Redactor:
        """A redactor for the secret variables of `environ` (default: `os.environ`)."""
        redactor = cls()
        redactor.add_environment(environ)
        return redactor

    def add_environment(self, environ: Mapping[str, str] | None = None) -> None:
        """Add the values of the secret variables (see the module docstring)."""
        environ = os.environ if environ is None else environ
        self.add(*(value for name, value in environ.items() if _is_secret_variable(name, value)))

    def add(self, *secrets: str) -> None:
        """Hide these values too from now on (e.g. a token fetched at run time). Empty values and
        values shorter than 4 characters are ignored."""
        new = {secret for secret in secrets if len(secret) >= MIN_NAMED_SECRET_CHARS} - self._secrets
        if new:
            with self._lock:
                self._secrets |= new
                self._pattern = _compile(self._secrets)

    def __len__(self) -> int:
        return len(self._secrets)

    def __repr__(self) -> str:  # never the values themselves
        return f"Redactor({len(self._secrets)} secret(s))"

    def redact(self, text: str) -> str:
        """`text` with every secret and credential replaced by `[REDACTED]`."""
        return self._pattern.sub(_replacement, text)

    def redact_data(self, value: T) -> T:
        """Every string inside `value` (JSON-like: dicts, lists, tuples, strings) redacted.
        Whatever contains no secret is returned as is, not copied."""
        redacted: Any
        if isinstance(value, str):
            redacted = self.redact(value)
        elif isinstance(value, dict):
            redacted = {key: self.redact_data(item) for key, item in value.items()}
            redacted = value if all(redacted[k] is value[k] for k in value) else redacted
        elif isinstance(value, (list, tuple)):
            items = [self.redact_data(item) for item in value]
            changed = any(new is not old for new, old in zip(items, value, strict=True))
            redacted = (tuple(items) if isinstance(value, tuple) else items) if changed else value
        else:
            redacted = value
        return redacted


def _is_secret_variable(name: str, value: str) -> bool:
    if name in SECRET_VARIABLES:
        return len(value) >= MIN_NAMED_SECRET_CHARS
    secret_name = name.endswith(SECRET_SUFFIXES) or f"_{name}" in SECRET_SUFFIXES
    return secret_name and len(value) >= MIN_SECRET_CHARS


def _encodings(secret: str) -> set[str]:
    """The forms a value takes in a URL (path or query), in JSON and in a Python repr."""
    return {
        secret,
        quote(secret),
        quote(secret, safe=""),
        quote_plus(secret, safe=""),
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        repr(secret)[1:-1],
    }


def _compile(secrets: set[str]) -> re.Pattern[str]:
    forms = {form for secret in secrets for form in _encodings(secret)}
    # Longest first, so that a value containing another one is replaced whole.
    known = "|".join(re.escape(form) for form in sorted(forms, key=len, reverse=True))
    return re.compile("|".join([known, *_CREDENTIAL_SHAPES] if known else _CREDENTIAL_SHAPES))


def _replacement(match: re.Match[str]) -> str:
    """`[REDACTED]`, after the `Authorization: Bearer ` or `Bearer ` prefix of a credential shape."""
    credentials = match.lastgroup  # None for a known value, `sk-…`, `t-…`: all of it goes
    kept = match[0][: match.start(credentials) - match.start()] if credentials else ""
    return kept + REDACTED


# --- one process-wide redactor --------------------------------------------------------------------

_default: Redactor | None = None
_default_lock = threading.Lock()


def default_redactor() -> Redactor:
    """The process's redactor, built from `os.environ` on first use.

    Build it after `.env` is loaded (`config.load_settings` loads it); code that learns a secret
    at run time adds it here: `default_redactor().add(token)`.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = Redactor.from_environment()
        return _default


def redact_text(text: str) -> str:
    """`text` redacted by the process's redactor: for error replies, trace dumps, printed output."""
    return default_redactor().redact(text)


def redact_data(value: T) -> T:
    """`value` (JSON-like) redacted by the process's redactor."""
    return default_redactor().redact_data(value)


# --- logging ---------------------------------------------------------------------------------------

_exception_formatter = logging.Formatter()


def redact_record(record: logging.LogRecord, redactor: Redactor) -> None:
    """Format the message with its arguments, then redact it; the same for the exception and stack.

    Afterwards `record.args` is empty and `record.exc_text` holds the (redacted) traceback, which
    every `logging.Formatter` prints instead of formatting `exc_info` again.
    """
    try:
        message = record.getMessage()
    except Exception:  # a broken call (`log.info("%d", "x")`) must not show its arguments unredacted
        message = f"{record.msg} (arguments that do not fit the format: {record.args!r})"
    record.msg, record.args = redactor.redact(message), ()
    if record.exc_info and not record.exc_text:
        record.exc_text = _exception_formatter.formatException(record.exc_info)
    if record.exc_text:
        record.exc_text = redactor.redact(record.exc_text)
    if record.stack_info:
        record.stack_info = redactor.redact(record.stack_info)


class RedactingFilter(logging.Filter):
    """A handler filter that redacts each record it lets through (it drops none)."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record, self.redactor)
        return True


class RedactingFormatter(logging.Formatter):
    """Wraps a handler's formatter and redacts its whole output: for a handler whose formatter
    renders more than the message and traceback (extra fields, `exc_info` of its own)."""

    def __init__(self, inner: logging.Formatter | None, redactor: Redactor) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()
        self.redactor = redactor

    def format(self, record: logging.LogRecord) -> str:
        return self.redactor.redact(self.inner.format(record))


class _RedactingRecordFactory:
    """The log record factory, wrapped: each record is redacted as it is made, whatever logger
    made it and whichever handlers (present or added later) will emit it."""

    def __init__(self, inner: Callable[..., logging.LogRecord], redactor: Redactor) -> None:
        self.inner = inner
        self.redactor = redactor

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.inner(*args, **kwargs)
        redact_record(record, self.redactor)
        return record


class _RedactingExceptHook:
    """`sys.excepthook`, wrapped: the traceback of an uncaught exception is redacted too."""

    def __init__(self, inner: Callable[..., Any], redactor: Redactor) -> None:
        self.inner = inner
        self.redactor = redactor

    def __call__(self, kind: type[BaseException], value: BaseException, trace: TracebackType | None) -> None:
        text = "".join(traceback.format_exception(kind, value, trace))
        sys.stderr.write(self.redactor.redact(text))


def install_log_redaction(redactor: Redactor | None = None) -> Redactor:
    """Redact every log record of the process, and uncaught tracebacks; returns the redactor.

    Three layers, so nothing depends on when a handler was added: the record factory redacts each
    record as it is created (every logger, every handler, even ones added later); the root
    logger's present handlers get a `RedactingFilter` (records made before installation, or by
    `logging.makeLogRecord`); `sys.excepthook` prints a redacted traceback. Idempotent: calling it
    again only switches to the given redactor. `uninstall_log_redaction()` undoes it.
    """
    redactor = redactor or default_redactor()
    for handler in logging.getLogger().handlers:
        filters = [f for f in handler.filters if isinstance(f, RedactingFilter)]
        if filters:
            filters[0].redactor = redactor
        else:
            handler.addFilter(RedactingFilter(redactor))
    factory = logging.getLogRecordFactory()
    if isinstance(factory, _RedactingRecordFactory):
        factory.redactor = redactor
    else:
        logging.setLogRecordFactory(_RedactingRecordFactory(factory, redactor))
    if isinstance(sys.excepthook, _RedactingExceptHook):
        sys.excepthook.redactor = redactor
    else:
        sys.excepthook = _RedactingExceptHook(sys.excepthook, redactor)
    return redactor


def uninstall_log_redaction() -> None:
    """Undo `install_log_redaction` (for tests)."""
    for handler in logging.getLogger().handlers:
        for log_filter in [f for f in handler.filters if isinstance(f, RedactingFilter)]:
            handler.removeFilter(log_filter)
    factory = logging.getLogRecordFactory()
    if isinstance(factory, _RedactingRecordFactory):
        logging.setLogRecordFactory(factory.inner)
    if isinstance(sys.excepthook, _RedactingExceptHook):
        sys.excepthook = sys.excepthook.inner


# --- the model seam --------------------------------------------------------------------------------


class RedactingModelClient(ModelClient):
    """A model client whose prompts carry no secret and whose answers cannot leak one.

    The messages are redacted before they are sent (a tool result or a user message may contain a
    secret); the answer is redacted before anything stores it, runs a tool with it or shows it
    (a prompt-injected model may echo one). Streamed pieces are redacted one by one, so a secret
    split across two pieces reaches `on_text` unrecognised; the returned answer is always redacted.
    """

    def __init__(self, inner: ModelClient, redactor: Redactor | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.redactor = redactor or default_redactor()

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        redact = self.redactor.redact
        shown = None if on_text is None else (lambda piece: on_text(redact(piece)))
        response = await self.inner.complete(self.redactor.redact_data(messages), tools, on_text=shown)
        return replace(
            response,
            content=None if response.content is None else redact(response.content),
            tool_calls=[ToolCall(c.id, c.name, redact(c.arguments)) for c in response.tool_calls],
            refusal=None if response.refusal is None else redact(response.refusal),
            reasoning=None if response.reasoning is None else redact(response.reasoning),
        )

    async def aclose(self) -> None:
        await self.inner.aclose()
