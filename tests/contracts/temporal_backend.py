"""The "temporal" contract backend: `engine: temporal` itself behind the inbox contract.

Its stores are the PostgreSQL ones (what this engine keeps, engine/temporal/state.py), on a fresh
database of the run's private server. Its dispatcher is the engine as a `serve` node and a
`worker` run it: `TemporalInbox` (what the channels call: signal-with-start of the
conversation's `ConversationWorkflow`) and, in this process, the two Temporal workers of
worker.py — the workflow with the turn's steps (`TurnActivities`) on the test's own task queue,
the sends on its `-sends` queue — with the test's channels as the senders of their names, and
`SharedState` over the test's database. The test's runner answers each turn: it is the model of
the worker's agent (a `ScriptedModel`), handed the message whose turn it is (`CURRENT_MESSAGE`,
set by the model step). Starting and stopping the dispatcher start and stop the inbox and both
workers; a dispatcher built again is a restarted node: a new inbox and new workers on the same
task queue and database.

One Temporal dev server (tests/temporal_dev.py, state in memory) serves the whole run; each test
has a task queue of its own, and its conversations' workflows are terminated when it ends, since
a workflow's id is its conversation key and the tests reuse the same keys. Skipped, with the
reason, where the `temporal` binary, the temporalio package or PostgreSQL is missing.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from contract_backends import Backend, Dispatcher, _postgres_url, postgres_stores

from hermes_core.channels.base import Channel
from hermes_core.channels.seam import InboundMessage
from hermes_core.gateway.dispatcher import Runner
from hermes_core.gateway.store import GatewayStore
from hermes_core.kernel.approvals import ApprovalDesk

# where this engine differs from the embedded one by design (docs/scale-out.md, "Limits and
# differences"): the contract's tests of these skip on it, with the reason
DIFFERS = frozenset({"duplicate_acknowledged", "one_reply_per_turn", "approval_waits_in_workflow"})

_STOPPED: list[Any] = []  # the workers of stopped nodes (TemporalEngine.stop)
atexit.register(gc.freeze)  # …and never collected at the exit either (a process that ends leaves them)
_SERVER: list[Any] = []  # the run's Temporal dev server, started by the first test that needs it


async def _temporal_address() -> str:
    pytest.importorskip("temporalio", reason="the `temporal` extra is not installed")
    from temporal_dev import DevServer, temporal_binary

    if not _SERVER:
        binary, reason = temporal_binary()
        if binary is None:
            pytest.skip(reason)
        server = DevServer(binary, Path(tempfile.mkdtemp(prefix="temporal-contract-")), persistent=False)
        atexit.register(server.stop)
        await asyncio.to_thread(server.wait_ready)
        _SERVER.append(server)
    return str(_SERVER[0].address)


class TemporalEngine:
    """The contract's `Dispatcher`: a `TemporalInbox` and the in-process workers of one node."""

    def __init__(
        self, address: str, queue: str, url: str, folder: Path, runner: Runner, started: set[str]
    ) -> None:
        self.address, self.queue, self.url, self.folder = address, queue, url, folder
        self.runner = runner
        self.started = started  # the workflows (conversations) this test's messages went to
        self.channels: dict[str, Channel] = {}
        self._inbox: Any = None
        self._workers: list[Any] = []
        self._running: list[asyncio.Task[None]] = []
        self._closers: list[Callable[[], Any]] = []
        self.gateway_store: GatewayStore | None = None  # the test's store, closed at the stop

    @property
    def accepting(self) -> bool:
        return self._inbox is not None and bool(self._inbox.accepting)

    @property
    def store(self) -> Any:  # channels/seam.py `Records`: the inbox's own (replies_of, claim_nonce)
        if self._inbox is None:
            raise RuntimeError("not started")
        return self._inbox

    def add_channel(self, channel: Channel) -> None:
        self.channels[channel.name] = channel

    async def delivered(self, conversation: str) -> None:
        """The workflow sends a conversation's replies in order itself: nothing to wait for here."""
        return None

    async def accept(self, message: InboundMessage) -> int | None:
        if self._inbox is None:
            raise RuntimeError("the gateway is not accepting messages (starting or shutting down)")
        self.started.add(message.conversation)
        accepted: int | None = await self._inbox.accept(message)
        return accepted

    async def decide(self, pending_id: str, user_id: str, channel: str, approve: bool) -> Any:
        if self._inbox is None:
            raise RuntimeError("not started")
        return await self._inbox.decide(pending_id, user_id, channel, approve)

    async def _turn(self, messages: Any, tools: Any) -> str:
        """The worker's model: the runner, on the message whose turn this is."""
        from hermes_core.schedule.tools import CURRENT_MESSAGE

        message = CURRENT_MESSAGE.get()
        assert message is not None, "the model step was not told whose turn it is"
        answer = await self.runner(message)
        replies = answer.replies if hasattr(answer, "replies") else answer
        texts = [reply if isinstance(reply, str) else reply.text for reply in replies]
        if len(texts) != 1:  # the turn is the kernel's loop: one reply (DIFFERS, one_reply_per_turn)
            raise ValueError(f"a turn of this engine has one reply, the runner gave {len(texts)}")
        return texts[0]

    async def start(self) -> None:
        from temporalio.client import Client
        from temporalio.worker import Worker

        from hermes_core import Agent
        from hermes_core.config import Settings
        from hermes_core.engine.temporal.activities import TurnActivities
        from hermes_core.engine.temporal.client import TemporalInbox
        from hermes_core.engine.temporal.state import SharedState
        from hermes_core.engine.temporal.worker import workflow_runner
        from hermes_core.engine.temporal.workflow import ConversationWorkflow, sends_queue
        from hermes_core.testing import ScriptedModel

        settings = Settings.model_validate({
            "engine": "temporal", "database": {"url": self.url}, "gateway": {"data_dir": str(self.folder)},
            "temporal": {"address": self.address, "task_queue": self.queue, "heartbeat_timeout": 2.0},
        })  # fmt: skip
        client = await Client.connect(self.address)
        agent = Agent(model=ScriptedModel(self._turn))
        state = SharedState.of(settings)
        ttl = settings.permissions.approval_ttl
        steps = TurnActivities(agent, dict(self.channels), chat_rate=1000.0, approval_ttl=ttl, state=state)
        self._closers = [state.close, agent.aclose]
        self._workers = [
            Worker(
                client,
                task_queue=self.queue,
                workflows=[ConversationWorkflow],
                activities=steps.turn_steps(),
                workflow_runner=workflow_runner(),
                sticky_queue_schedule_to_start_timeout=timedelta(seconds=1),
                graceful_shutdown_timeout=timedelta(seconds=0.2),
            ),
            Worker(
                client,
                task_queue=sends_queue(self.queue),
                activities=steps.send_steps(),
                graceful_shutdown_timeout=timedelta(0),
            ),
        ]
        self._running = [asyncio.create_task(worker.run()) for worker in self._workers]
        inbox = TemporalInbox(client, settings.temporal, agent.permissions)
        for channel in self.channels.values():
            inbox.add_channel(channel)
        await inbox.start()
        self._inbox = inbox

    async def stop(self, grace: float = 10.0) -> None:
        inbox, self._inbox = self._inbox, None
        if inbox is not None:
            await inbox.stop()
        for worker in self._workers:
            await worker.shutdown()
            # kept: its cached workflows, a turn in flight among them, are dropped without an
            # eviction at a shutdown, and closed by the garbage collector outside their event loop
            # they would raise there (as a `worker` process that ends, they are simply left)
            _STOPPED.append(worker)
        for task in self._running:
            with suppress(Exception):
                await task
        for close in self._closers:
            await close()
        self._workers, self._running, self._closers = [], [], []
        if self.gateway_store is not None:
            await self.gateway_store.close()


async def _terminate(address: str, conversations: set[str]) -> None:
    from temporalio.client import Client
    from temporalio.service import RPCError

    client = await Client.connect(address)
    for conversation in conversations:
        with suppress(RPCError):
            await client.get_workflow_handle(conversation).terminate("the test is over")


@asynccontextmanager
async def temporal(folder: Path) -> AsyncIterator[Backend]:
    """`engine: temporal`: the PostgreSQL stores, and the engine itself as the dispatcher."""
    address = await _temporal_address()
    url = _postgres_url()
    queue = f"contract-{uuid.uuid4().hex[:10]}"
    started: set[str] = set()

    def dispatcher(store: GatewayStore, runner: Runner, desk: ApprovalDesk | None) -> Dispatcher:
        # the gateway store is the database's, read by the console; the engine's inbox is the
        # workflows'. Decisions go to the workflow that waits (`TemporalInbox.decide`), not a desk.
        engine = TemporalEngine(address, queue, url, folder, runner, started)
        engine.gateway_store = store
        return engine

    try:
        yield Backend(**postgres_stores(url), dispatcher=dispatcher, differs=DIFFERS)
    finally:
        await _terminate(address, started)


BACKENDS = {"temporal": temporal}
