"""What `engine: temporal` keeps in PostgreSQL (`database.url`), in the embedded engine's own rows,
so that the stores' readers — the console of any `serve` node, `hermes-kernel sessions`, doctor —
show the Temporal engine's conversations as they show the embedded one's.

- conversations: `ConversationMemory` over `PostgresSessionStore` (memory/conversation.py), as the
  embedded runner uses it: `prepare` builds a turn's window and notes (folding what no longer
  fits), a finished turn is appended once under its task id, the `remember` tool and `/memory`,
  `/forget`, `/new` change the conversation's state, long-term outcomes are recorded and offered
  as examples (`memory.long_term`);
- a turn's reply, read back from its stored messages (`stored_reply`, `SessionStore.turn_reply`) by
  the node that answers a webhook retry once the workflow no longer carries the text (workflow.py
  `carried`);
- traces: the record of each finished turn (observe/traces.py's format) in `PostgresTraceStore`;
  a failed one also as an X-ray file on the worker (`observe.xray_dir`, as `serve` writes them);
- approvals and questions: one `pending` row per request (`PendingRecords.record`,
  tasks/pending.py), its status set when the workflow gets the decision, the answer or the expiry —
  the approvals list reads it;
  the decision itself is the workflow's (`decide` update, client.py);
- dead letters: a reply whose every send attempt failed becomes an `outbox` row marked dead and a
  `dead_letters` row (`GatewayStore.dead_letter_reply`), listed by the console; its Resend (or
  `hermes-kernel deadletters resend`) hands it back to the conversation's workflow (`resend`
  signal, server.py) under the same uuid, and `send_reply` marks it sent.

Only activities (activities.py) and `serve` (server.py) call this: workflow code does no I/O. It
writes through the stores' protocols only, no SQL of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...channels.seam import OutboundMessage
from ...kernel.approvals import Pending
from ...kernel.loop import RunResult
from ...kernel.messages import Message
from ...kernel.records import outcome_from
from ...observe.traces import is_failure, write_xray

if TYPE_CHECKING:
    from ...config import Settings
    from ...gateway.store import GatewayStore
    from ...memory.conversation import ConversationMemory
    from ...observe.traces import TraceStore
    from ...tasks.pending import PendingRecords


log = logging.getLogger("hermes_core.engine.temporal")


class SharedState:
    """The PostgreSQL stores a worker or gateway node of this engine writes and reads."""

    def __init__(
        self,
        memory: ConversationMemory,
        traces: TraceStore | None,
        pending: PendingRecords,
        gateway: GatewayStore,
        *,
        xray_dir: str | None = None,
    ) -> None:
        self.memory, self.traces, self.pending, self.gateway = memory, traces, pending, gateway
        self.xray_dir = xray_dir

    @classmethod
    def of(cls, settings: Settings) -> SharedState:
        from ...config import require_database
        from ...gateway.server import build_memory
        from ...postgres.gateway import PostgresGatewayStore
        from ...postgres.pending import PostgresInteractions
        from ...postgres.traces import PostgresTraceStore

        url = require_database(settings)
        observe = settings.observe
        keep_traces = observe.traces is not False  # on by default, as for `serve` (tracer_for)
        xray_dir = observe.xray_dir
        if xray_dir is None:
            xray_dir = str(Path(settings.gateway.data_dir) / "xray") if keep_traces else ""
        return cls(
            build_memory(settings),
            PostgresTraceStore(url) if keep_traces else None,
            PostgresInteractions(url, approval_ttl=settings.permissions.approval_ttl),
            PostgresGatewayStore(url),
            xray_dir=xray_dir or None,
        )

    # -- a finished turn ------------------------------------------------------------------------

    async def record_turn(self, data: dict[str, Any]) -> None:
        """The turn's trace, its messages and its long-term outcome — once per task id, however
        often the step runs (a worker that died after writing is replaced, and the step retried)."""
        conversation, task_id = str(data["conversation"]), str(data["task_id"])
        messages: list[Message] = data["messages"]
        trace = data.get("trace")
        if self.traces is not None and trace:  # stored again under its task id: replaced
            await self.traces.record(trace)
        if self.xray_dir is not None and trace and is_failure(trace):
            path = await asyncio.to_thread(write_xray, self.xray_dir, trace)
            log.info("failed task %s: X-ray written to %s", task_id, path)
        if not await self.memory.store.append(conversation, messages, turn_id=task_id):
            return  # this step run again: stored and learned already
        result = RunResult(
            str(data["reply"]),
            messages,
            [outcome_from(record) for record in data.get("tool_calls") or []],
            stop_reason=str(data["stop_reason"]),
        )
        await self.memory.learn(conversation, result)

    async def stored_reply(self, conversation: str, task_id: str) -> str | None:
        """The reply of the turn stored under `task_id`: its last message, which the workflow
        checked is the reply (workflow.py `stored`); None when the turn is not (or no longer) there.
        Read for a webhook retry whose reply text the workflow no longer carries."""
        return await self.memory.store.turn_reply(conversation, task_id)

    # -- approvals and questions ----------------------------------------------------------------

    async def record_pending(self, pending: dict[str, Any]) -> None:
        """Insert the request, or set its status (decided, answered, expired) as the workflow has it."""
        known = {f.name for f in dataclasses.fields(Pending)}
        record = Pending(**{key: value for key, value in pending.items() if key in known})
        record.resume = None  # the workflow resumes itself: no message is kept to run again
        await self.pending.record(record)

    # -- dead letters ---------------------------------------------------------------------------

    async def dead_letter(self, reply: dict[str, Any], error: str) -> int:
        """Keep a reply given up on as a dead letter (its outbox row, if it has one, else a new one
        marked dead); its outbox id. A second call for the same uuid keeps one dead letter."""
        return await self.gateway.dead_letter_reply(OutboundMessage(**reply), error)

    async def mark_sent(self, outbox_id: int, platform_id: str | None) -> None:
        await self.gateway.mark_sent(outbox_id, platform_id)

    async def close(self) -> None:
        await self.memory.close()
        for store in (self.traces, self.pending, self.gateway):
            if store is not None:
                await store.close()


async def schema_components(settings: Settings) -> frozenset[str]:
    """The schema components (postgres/migrations.py) the nodes and workers of this engine apply:
    those of the stores they build — `SharedState.of`, and the jobs' store when scheduling is on.
    `doctor` expects these, not the embedded engine's (which keeps a journal too)."""
    from ... import stores

    state = SharedState.of(settings)
    built: list[Any] = [state.memory.store, state.traces, state.pending, state.gateway]
    if settings.schedule.enabled:
        built.append(stores.schedule_store(settings, inbox=False))
    try:
        return frozenset().union(*(store.db.components for store in built if store is not None))
    finally:
        await state.close()
        if settings.schedule.enabled:
            await built[-1].close()


def reply_data(reply: OutboundMessage) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(reply), ensure_ascii=False))


__all__ = ["SharedState", "reply_data", "schema_components"]
