"""The implementations the contract suites run against: one `Backend` per storage engine.

A backend factory takes the test's own folder and yields a `Backend`: functions that each open one
store onto that test's storage (a file in the folder, a database schema made for the test). Calling
one again opens another instance onto the same storage — what a restarted process finds. A field
left None is a store the engine does not have; the suites for it skip on that backend.

Registered here: "sqlite" (the embedded default: every store in one database file, as `serve`
builds them) and "memory" (`InMemorySessionStore`, the terminal's session store). Another engine
plugs in either way:

- in this repository: add its factory to `BACKENDS` below (skip inside the factory, with
  `pytest.skip`, when its server is not reachable);
- from anywhere on the import path: `HERMES_CONTRACT_BACKENDS=package.module:NAME` (several,
  comma-separated), where NAME is a dict of backend name → factory, merged into `BACKENDS` when the
  suites are collected. tests/contracts/broken_backends.py is registered that way by the self-check.

`dispatcher` builds the inbox/dispatch side (channels/seam.py's `Inbox`) over the backend's gateway
store; the default is the `Gateway` of gateway/dispatcher.py. An engine that dispatches otherwise
(a workflow engine) replaces it, and test_inbox_contract.py runs against it unchanged.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from hermes_core.channels.base import Channel
from hermes_core.channels.seam import Inbox
from hermes_core.gateway.dispatcher import Gateway, Runner
from hermes_core.gateway.store import GatewayStore, SQLiteGatewayStore
from hermes_core.kernel.approvals import ApprovalDesk, PendingStore
from hermes_core.observe.traces import SQLiteTraceStore, TraceStore
from hermes_core.sessions.store import InMemorySessionStore, SessionStore, SQLiteSessionStore
from hermes_core.tasks.journal import SQLiteTaskJournal, TaskJournal
from hermes_core.tasks.pending import SQLiteInteractions

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
    pending_store: Callable[[float, Callable[[], float]], PendingStore] | None = None  # (ttl, clock)
    dispatcher: Callable[[GatewayStore, Runner, ApprovalDesk | None], Dispatcher] = gateway_dispatcher


BackendFactory = Callable[[Path], AbstractAsyncContextManager[Backend]]


@asynccontextmanager
async def sqlite(folder: Path) -> AsyncIterator[Backend]:
    """Every store in one database file, as `hermes-core serve` builds them (gateway/server.py)."""
    path = folder / "gateway.db"
    yield Backend(
        gateway_store=lambda: SQLiteGatewayStore(path),
        session_store=lambda: SQLiteSessionStore(path),
        journal=lambda: SQLiteTaskJournal(path),
        trace_store=lambda: SQLiteTraceStore(path),
        pending_store=lambda ttl, clock: SQLiteInteractions(path, approval_ttl=ttl, now=clock),
    )


@asynccontextmanager
async def memory(folder: Path) -> AsyncIterator[Backend]:
    """The terminal's session store: one instance is this test's storage."""
    store = InMemorySessionStore()
    yield Backend(session_store=lambda: store)


BACKENDS: dict[str, BackendFactory] = {"sqlite": sqlite, "memory": memory}


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
