"""Run an async test double from synchronous code: its own event loop in a daemon thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any


def serve_in_thread(
    start: Callable[[], Awaitable[Any]], aclose: Callable[[], Awaitable[Any]], name: str, timeout: float
) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    """Run `start()` in a new loop on a daemon thread and return once it has finished; the loop then
    runs until stopped (`loop.call_soon_threadsafe(loop.stop)`), after which `aclose()` runs there."""
    loop = asyncio.new_event_loop()
    started: concurrent.futures.Future[None] = concurrent.futures.Future()

    def serve() -> None:
        try:
            loop.run_until_complete(start())
        except BaseException as exc:  # e.g. the port is taken: re-raised in the caller
            started.set_exception(exc)
            loop.close()
            return
        started.set_result(None)
        loop.run_forever()
        loop.run_until_complete(aclose())
        loop.close()

    thread = threading.Thread(target=serve, name=name, daemon=True)
    thread.start()
    started.result(timeout)
    return loop, thread
