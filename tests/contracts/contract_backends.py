"""The implementations the contract suites run against: one `Backend` per storage engine.

A backend factory takes the test's own folder and yields a `Backend`: functions that each open one
store onto that test's storage (a file in the folder, a database schema made for the test). Calling
one again opens another instance onto the same storage — what a restarted process finds. A field
left None is a store the engine does not have; the suites for it skip on that backend.

Registered here: "sqlite" (the embedded default: every store in one database file, as `serve`
builds them), "memory" (`InMemorySessionStore`, the terminal's session store), "postgres"
(hermes_core/postgres/, `database.url`: a fresh database per test on one private server started
for the run, tests/pg_server.py; skipped where PostgreSQL is not installed) and "temporal"
(`engine: temporal` itself as the dispatcher, over the PostgreSQL stores: temporal_backend.py;
its tests are slow, and skipped without the `temporal` binary). Another engine plugs in either way:

- in this repository: add its factory to `BACKENDS` below (skip inside the factory, with
  `pytest.skip`, when its server is not reachable);
- from anywhere on the import path: `HERMES_CONTRACT_BACKENDS=package.module:NAME` (several,
  comma-separated), where NAME is a dict of backend name → factory, merged into `BACKENDS` when the
  suites are collected. tests/contracts/broken_backends.py is registered that way by the self-check.

`dispatcher` builds the inbox/dispatch side (channels/seam.py's `Inbox`) over the backend's gateway
store; the default is the `Gateway` of gateway/dispatcher.py. An engine that dispatches otherwise
(a workflow engine) replaces it, and test_inbox_contract.py runs against it unchanged; where it
differs by design, `differs` names the differences (`DIFFERENCES`) and their tests skip on it.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import pytest

from hermes_core.channels.base import Channel
from hermes_core.channels.seam import Inbox
from hermes_core.gateway.dispatcher import Gateway, Runner
from hermes_core.gateway.schedules import SQLiteScheduleStore
from hermes_core.gateway.store import GatewayStore, SQLiteGatewayStore
from hermes_core.kernel.approvals import ApprovalDesk
from hermes_core.observe.traces import SQLiteTraceStore, TraceStore
from hermes_core.schedule.jobs import ScheduleStore
from hermes_core.sessions.store import InMemorySessionStore, SessionStore, SQLiteSessionStore
from hermes_core.tasks.journal import SQLiteTaskJournal, TaskJournal
from hermes_core.tasks.pending import PendingRecords, SQLiteInteractions

ENV = "HERMES_CONTRACT_BACKENDS"


class Dispatcher(Inbox, Protocol):
    """The inbox as a channel sees it, plus what starts and stops it (the `Gateway` is one)."""

    def add_channel(self, channel: Channel) -> None: ...

    async def start(self) -> None: ...

    async def stop(self, grace: float = 10.0) -> None: ...


class Closes(Protocol):
    async def close(self) -> None: ...


S = TypeVar("S", bound=Closes)


class Opener(Generic[S]):
    """Opens stores of one implementation onto one test's storage, and closes them afterwards."""

    def __init__(self, open_store: Callable[[], S]) -> None:
        self._open = open_store
        self.open: list[S] = []

    def __call__(self) -> S:
        store = self._open()
        self.open.append(store)
        return store

    async def reopen(self, store: S) -> S:
        """Close `store` and open its storage again, as a restarted process does."""
        self.open.remove(store)
        await store.close()
        return self()

    async def close_all(self) -> None:
        while self.open:
            await self.open.pop().close()


class Clock:
    """The approvals' clock, moved by the test (expiry without waiting)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def gateway_dispatcher(store: GatewayStore, runner: Runner, desk: ApprovalDesk | None) -> Dispatcher:
    return Gateway(store, runner, desk=desk, send_backoff=0.01)


@dataclass
class Backend:
    gateway_store: Callable[[], GatewayStore] | None = None
    session_store: Callable[[], SessionStore] | None = None
    journal: Callable[[], TaskJournal] | None = None
    trace_store: Callable[[], TraceStore] | None = None
    pending_store: Callable[[float, Callable[[], float]], PendingRecords] | None = None  # (ttl, clock)
    schedule_store: Callable[[], ScheduleStore] | None = None  # its fires go into gateway_store's inbox
    dispatcher: Callable[[GatewayStore, Runner, ApprovalDesk | None], Dispatcher] = gateway_dispatcher
    # where this engine differs from the embedded one by design, named in `DIFFERENCES`: the
    # contract's test of each skips on it with the reason (documented in docs/scale-out.md)
    differs: frozenset[str] = frozenset()

    def skip_where_it_differs(self, difference: str) -> None:
        if difference in self.differs:
            pytest.skip(f"{difference}: {DIFFERENCES[difference]}")


DIFFERENCES = {  # docs/scale-out.md, "Limits and differences from the embedded engine"
    "duplicate_acknowledged": (
        "engine temporal acknowledges every delivery (signal-with-start needs no worker) and drops a "
        "duplicate in the conversation's workflow, so `accept` never answers None"
    ),
    "one_reply_per_turn": (
        "engine temporal's turn is the kernel's loop, one reply per turn, and a retried message id "
        "waits for the workflow's reply instead of reading it back (`replies_of` is None)"
    ),
    "approval_waits_in_workflow": (
        "engine temporal's approval waits inside the workflow that asked it, and its decision (the "
        "`decide` update) runs the same call on: no approvals-store row resumed as a message "
        "(tests/test_temporal_engine.py covers the decision)"
    ),
}


BackendFactory = Callable[[Path], AbstractAsyncContextManager[Backend]]


@asynccontextmanager
async def sqlite(folder: Path) -> AsyncIterator[Backend]:
    """Every store in one database file, as `hermes-kernel serve` builds them (gateway/server.py)."""
    path = folder / "gateway.db"
    yield Backend(
        gateway_store=lambda: SQLiteGatewayStore(path),
        session_store=lambda: SQLiteSessionStore(path),
        journal=lambda: SQLiteTaskJournal(path),
        trace_store=lambda: SQLiteTraceStore(path),
        pending_store=lambda ttl, clock: SQLiteInteractions(path, approval_ttl=ttl, now=clock),
        schedule_store=lambda: SQLiteScheduleStore(path),
    )


@asynccontextmanager
async def memory(folder: Path) -> AsyncIterator[Backend]:
    """The terminal's session store: one instance is this test's storage."""
    store = InMemorySessionStore()
    yield Backend(session_store=lambda: store)


_SERVER: list[Any] = []  # the run's private PostgreSQL server, started by the first test that needs it


def _postgres_url() -> str:
    import atexit

    from pg_server import PostgresServer
    from pg_server import missing as postgres_missing

    if not _SERVER:
        reason = postgres_missing()
        if reason is not None:
            pytest.skip(reason)
        _SERVER.append(PostgresServer().start())
        atexit.register(_SERVER[0].stop)
    return str(_SERVER[0].fresh_database())


def postgres_stores(url: str) -> dict[str, Any]:
    """The PostgreSQL stores onto the database `url`, as `Backend` fields."""
    from hermes_core.postgres.gateway import PostgresGatewayStore
    from hermes_core.postgres.journal import PostgresTaskJournal
    from hermes_core.postgres.pending import PostgresInteractions
    from hermes_core.postgres.schedules import PostgresScheduleStore
    from hermes_core.postgres.sessions import PostgresSessionStore
    from hermes_core.postgres.traces import PostgresTraceStore

    return {
        "gateway_store": lambda: PostgresGatewayStore(url),
        "session_store": lambda: PostgresSessionStore(url),
        "journal": lambda: PostgresTaskJournal(url),
        "trace_store": lambda: PostgresTraceStore(url),
        "pending_store": lambda ttl, clock: PostgresInteractions(url, approval_ttl=ttl, now=clock),
        "schedule_store": lambda: PostgresScheduleStore(url),
    }


@asynccontextmanager
async def postgres(folder: Path) -> AsyncIterator[Backend]:
    """The stores for several nodes on one database (`database.url`, hermes_core/postgres/)."""
    yield Backend(**postgres_stores(_postgres_url()))


@asynccontextmanager
async def temporal(folder: Path) -> AsyncIterator[Backend]:
    """`engine: temporal` (engine/temporal/): the PostgreSQL stores, and as the dispatcher the
    engine itself — its inbox and in-process workers on a Temporal dev server (temporal_backend.py)."""
    from temporal_backend import temporal as engine

    async with engine(folder) as found:
        yield found


BACKENDS: dict[str, BackendFactory] = {
    "sqlite": sqlite, "memory": memory, "postgres": postgres, "temporal": temporal,
}  # fmt: skip
SLOW = {"temporal"}  # backends that start servers of their own: their tests are marked slow


def registered() -> dict[str, BackendFactory]:
    """`BACKENDS` with the ones `HERMES_CONTRACT_BACKENDS` names."""
    found = dict(BACKENDS)
    for spec in filter(None, (part.strip() for part in os.environ.get(ENV, "").split(","))):
        module, _, name = spec.partition(":")
        extra = getattr(importlib.import_module(module), name or "BACKENDS")
        if not isinstance(extra, dict):
            raise TypeError(f"{ENV}: {spec} is not a dict of backend name -> factory")
        found.update(extra)
    return found
