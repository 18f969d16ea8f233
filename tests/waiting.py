"""Waiting in tests: for a condition, never for a fixed time.

`wait_for(condition)` (in a thread or a plain test) and `await eventually(condition)` (on the event
loop) ask `condition()` every `interval` seconds until it returns something true, and return that
value. An async condition is awaited by `eventually`. On timeout the test fails with what was awaited
(`what`, or the condition's name or source line) and the last value seen, so a failure says how far
things got rather than only that they did not get there.

tests/conftest.py re-exports both; the test files and the helper modules (serve_process.py,
pg_server.py, …) import them from here, since conftest.py is not importable by name from every
folder of tests (tests/contracts has a conftest.py of its own) and conftest.py itself imports those
helper modules.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

TIMEOUT = 30.0  # seconds; only a failing test waits this long
INTERVAL = 0.02  # seconds between two looks at the condition


def wait_for(
    condition: Callable[[], T],
    timeout: float = TIMEOUT,
    what: str | None = None,
    *,
    interval: float = INTERVAL,
) -> T:
    """Block until `condition()` is true; its value. Fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(timed_out(condition, timeout, what, value))
        time.sleep(interval)


async def eventually(
    condition: Callable[[], T | Awaitable[T]],
    timeout: float = TIMEOUT,
    what: str | None = None,
    *,
    interval: float = INTERVAL,
) -> T:
    """Until `condition()` (awaited if it returns an awaitable) is true, letting the event loop run;
    its value. Fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            raise AssertionError(timed_out(condition, timeout, what, value))
        await asyncio.sleep(interval)


def timed_out(condition: Callable[..., object], timeout: float, what: str | None, value: object) -> str:
    return f"timed out after {timeout:g} s waiting for {what or described(condition)}; last seen: {value!r}"


def described(condition: Callable[..., object]) -> str:
    """A lambda's source line (the test's own words), else the function's name."""
    name = getattr(condition, "__qualname__", repr(condition))
    if "<lambda>" not in name:
        return name
    try:
        return " ".join(inspect.getsource(condition).split())
    except (OSError, TypeError):
        return name
