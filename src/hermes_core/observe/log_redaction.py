"""Logs carry no secret: every record redacted as it is made, whichever handler emits it.

`install_log_redaction` wraps the log record factory (each record's message, arguments, exception
and stack are formatted, then redacted by the process's `Redactor`, kernel/redaction.py), adds a
`RedactingFilter` to the root handlers and wraps `sys.excepthook`, so an uncaught traceback is
redacted too. `RedactingFormatter` is for a handler whose formatter renders more than that.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ..kernel.redaction import Redactor, default_redactor

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
