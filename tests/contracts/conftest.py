"""Fixtures of the contract suites: each seam's implementations, one test run per backend.

`backend` is parametrised over tests/contracts/contract_backends.py's registered backends (its docstring
says how another one plugs in); each seam's fixture below opens that backend's store, and skips
when the backend has none. A test id names the backend: `test_…[sqlite]`, `test_…[memory]`.

Every fixture yields an `Opener`: call it for a store onto this test's storage, `reopen(store)` to
close one and open the same storage again (a restart); whatever is open is closed after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from contract_backends import SLOW, Backend, Clock, Closes, Opener, registered

from hermes_core.gateway.store import GatewayStore
from hermes_core.observe.traces import TraceStore
from hermes_core.schedule.jobs import ScheduleStore
from hermes_core.sessions.store import SessionStore
from hermes_core.tasks.journal import TaskJournal
from hermes_core.tasks.pending import PendingRecords

S = TypeVar("S", bound=Closes)


@pytest.fixture(
    params=[
        pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name for name in sorted(registered())
    ]
)
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    async with registered()[request.param](tmp_path) as found:
        yield found


async def _opener(open_store: Callable[[], S] | None, seam: str) -> AsyncIterator[Opener[S]]:
    if open_store is None:
        pytest.skip(f"this backend has no {seam}")
    opener = Opener(open_store)
    try:
        yield opener
    finally:
        await opener.close_all()


@pytest.fixture
async def gateway_stores(backend: Backend) -> AsyncIterator[Opener[GatewayStore]]:
    async for opener in _opener(backend.gateway_store, "gateway store"):
        yield opener


@pytest.fixture
async def session_stores(backend: Backend) -> AsyncIterator[Opener[SessionStore]]:
    async for opener in _opener(backend.session_store, "session store"):
        yield opener


@pytest.fixture
async def journals(backend: Backend) -> AsyncIterator[Opener[TaskJournal]]:
    async for opener in _opener(backend.journal, "task journal"):
        yield opener


@pytest.fixture
async def trace_stores(backend: Backend) -> AsyncIterator[Opener[TraceStore]]:
    async for opener in _opener(backend.trace_store, "trace store"):
        yield opener


@pytest.fixture
async def schedule_stores(backend: Backend) -> AsyncIterator[Opener[ScheduleStore]]:
    async for opener in _opener(backend.schedule_store, "schedule store"):
        yield opener


@pytest.fixture
def clock() -> Clock:
    return Clock()


APPROVAL_TTL = 600.0  # seconds: an approval's time to be decided


@pytest.fixture
async def pending_stores(backend: Backend, clock: Clock) -> AsyncIterator[Opener[PendingRecords]]:
    make = backend.pending_store
    opened = (lambda: make(APPROVAL_TTL, clock)) if make is not None else None
    async for opener in _opener(opened, "approvals store"):
        yield opener
