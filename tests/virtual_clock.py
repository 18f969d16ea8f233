"""Virtual time for tests that would otherwise measure a wall-clock window.

A window like "these two 0.4 s and 0.1 s waits overlapped: the whole took < 0.45 s" holds on an
idle machine and fails on a loaded one. On this clock the waits take exactly their virtual
seconds, whatever the load: `run` lets every runnable task reach its next `sleep`, then moves the
clock to the earliest wake-up. Code under test takes it as its `clock` (and `sleep`) parameter;
a test's own tools can `await clock.sleep(...)`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import TypeVar

T = TypeVar("T")


class VirtualClock:
    """Virtual time: `sleep` parks a task until `run` advances the clock to it."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._order), future))
        await future

    @property
    def sleeping(self) -> int:
        """How many tasks are parked in `sleep` now."""
        return sum(not future.done() for _, _, future in self._sleepers)

    async def run(
        self, *coroutines: Awaitable[T], settled: Callable[[], bool] | None = None, grace: float = 2.0
    ) -> list[T]:
        """Run `coroutines` to the end, advancing the clock whenever they all wait on it.

        Work that arrives over a socket is not "runnable" yet when the loop is idle: `settled`
        says when everything expected has reached its sleep (say, one sleeper per busy
        conversation). The clock then waits up to `grace` real seconds for it, and moves on
        regardless, so code that fails to get there shows up as virtual time lost, not a hang."""
        tasks = [asyncio.ensure_future(c) for c in coroutines]
        while not all(task.done() for task in tasks):
            for _ in range(20):  # let every runnable task reach its next sleep
                await asyncio.sleep(0)
            deadline = time.monotonic() + grace
            while settled is not None and not settled() and time.monotonic() < deadline:
                if all(task.done() for task in tasks):
                    break
                await asyncio.sleep(0.005)
            if self.sleeping:
                self.wake_next()
        return [task.result() for task in tasks]

    def wake_next(self) -> float:
        """Move the clock to the earliest wake-up of a task parked in `sleep` and wake it; the new
        time. (A sleep cancelled meanwhile is passed over.)"""
        while self._sleepers:
            wake, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                self.now = max(self.now, wake)
                future.set_result(None)
                return self.now
        raise AssertionError("no task sleeps on this clock")


def utc(text: str) -> float:
    """The epoch seconds of an ISO date and time read as UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()


class Clock:
    """A scheduler's wall clock, moved by the test (`clock.now = …`)."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
