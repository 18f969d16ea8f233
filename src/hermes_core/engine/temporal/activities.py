"""The steps a `hermes-kernel worker` runs for the conversation workflows, with the configured agent.

- `prepare_task` (a local activity): what the workflow needs to run the loop for one message: the
  system prompt, the window and notes of the conversation stored in PostgreSQL (`ConversationMemory.
  prepare`: folded when it no longer fits, long-term examples), the tools this sender may be
  offered (with their levels), the limits, greeting and language, and the worker's configured
  task queue (a run started on an older one moves there: `configured_queue` says it too).
- `model_call`: the agent's model stack (`Agent.client`: text tool calls, redaction, fallbacks,
  the client's own retries), one response in kernel/records.py's format; the message whose turn
  it is is `CURRENT_MESSAGE` meanwhile, as in the embedded runner's turn.
- `tool_call`: `ToolRegistry.execute` for one call (permissions, argument checks, approvals,
  timeouts), its outcome in kernel/records.py's format. The journal's rule for interrupted calls
  (tasks/journal.py) holds: an attempt after the first one — the worker that ran it died or lost
  its heartbeat — runs again only a read-only (level 0) or idempotent tool; any other answers
  `outcome_unknown`, and the model decides what to do.
- `send_reply`: one reply through its channel, with its idempotency key (Feishu `uuid`, the
  webhook's `Idempotency-Key`), so a send retried after a crash is not a second message. The
  platform's "wait" is waited for here (heartbeating), not counted as a failed attempt.

- `command`: a conversation command's fixed reply (gateway/commands.py `answer`, on the stored
  conversation: `/new`, `/memory`, `/forget` change it), as the embedded runner gives it.
- `record_turn`, `record_pending`, `dead_letter`: what the workflow hands over to be kept in
  PostgreSQL (state.py): a finished turn (messages, long-term outcome, trace), an approval or
  question as asked and decided, a reply given up on. A dead letter sent again is marked sent by
  `send_reply`.

A database outage is waited out, never turned into an apology: `prepare_task` and `command` raise a
retryable `StoreUnavailable` while PostgreSQL cannot be reached, which the workflow retries for as
long as it lasts; any other failure of theirs is theirs after `STEP_ATTEMPTS` tries (`waited_out`).

The model, tool and send steps heartbeat while it runs, so a worker killed mid-step is noticed within the
`heartbeat_timeout` and the step moves to another worker.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import logging
import re
import time
from collections.abc import Awaitable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from ...channels.base import DeliveryError
from ...channels.seam import OutboundMessage, inbound_of
from ...kernel.approvals import Interactions, Pending
from ...kernel.messages import ToolCall
from ...kernel.model import offering
from ...kernel.records import outcome_record, record_of
from ...kernel.replies import detect_language
from ...kernel.tools.permissions import ADMIN, Caller
from ...kernel.tools.registry import RegistryWrapper, ToolOutcome
from ...kernel.tools.results import error_result
from ...schedule.jobs import ScheduleStore
from ...schedule.tools import CURRENT_MESSAGE, JOB_WITHHELD
from ...tasks.journal import UNKNOWN_OUTCOME
from ...tools import ToolContext
from .workflow import COMMAND, DEAD, MODEL, PENDING, PREPARE, QUEUE, RECORD, ROLE, SEND, TOOL

if TYPE_CHECKING:
    from .state import SharedState

log = logging.getLogger("hermes_core.engine.temporal")
T = TypeVar("T")
_URLSAFE = re.compile(r"[A-Za-z0-9_-]*")
HEARTBEAT_EVERY = 1.0  # seconds; the SDK sends at most one per 0.8 × heartbeat_timeout
STEP_ATTEMPTS = 5  # tries of a step that fails otherwise than by a database outage (then: the apology)


async def heartbeating(step: Awaitable[T], every: float = HEARTBEAT_EVERY) -> T:
    """Await `step`, heartbeating meanwhile: the server sees that this worker is alive."""
    task = asyncio.ensure_future(step)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every)
            if done:
                return task.result()
            if not activity.info().is_local:  # a local step has no heartbeat: its workflow task's
                activity.heartbeat()
    finally:
        if not task.done():
            task.cancel()


def store_outage(exc: BaseException) -> bool:
    """Whether `exc` says PostgreSQL cannot be reached just now (down, restarting, connections cut)."""
    from ...storage import StoreUnavailable

    if isinstance(exc, StoreUnavailable):
        return True
    try:
        import psycopg
    except ImportError:
        return False
    return isinstance(exc, psycopg.OperationalError)


async def waited_out(step: Awaitable[T]) -> T:
    """`await step`: a database outage is a retryable `StoreUnavailable` (retried without a cap by
    the workflow), any other failure is tried `STEP_ATTEMPTS` times, then non-retryable `StepFailed`."""
    try:
        return await step
    except ApplicationError:
        raise
    except Exception as exc:
        if store_outage(exc):
            raise ApplicationError(f"the database is unavailable: {exc}", type="StoreUnavailable") from None
        if activity.info().attempt >= STEP_ATTEMPTS:
            failure = f"{type(exc).__name__}: {exc}"
            raise ApplicationError(failure, type="StepFailed", non_retryable=True) from exc
        raise


def approval_id(conversation: str, task_id: str, call_id: str) -> str:
    """An approval's id: its conversation (so any node finds the workflow that waits for it) and
    a digest of its task and call (the same call asks under the same id when run again)."""
    where = base64.urlsafe_b64encode(conversation.encode()).decode().rstrip("=")
    digest = hashlib.sha256(f"{task_id}|{call_id}".encode()).hexdigest()[:16]
    return f"ap_{where}.{digest}"


def conversation_of(pending_id: str) -> str | None:
    """The conversation an approval id names (`approval_id`), or None when it names none."""
    if not pending_id.startswith("ap_") or "." not in pending_id:
        return None
    where = pending_id[3:].rsplit(".", 1)[0]
    if not _URLSAFE.fullmatch(where):
        return None
    try:
        return base64.b64decode(where + "=" * (-len(where) % 4), altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeDecodeError):  # binascii.Error is a ValueError
        return None


class StepInteractions(Interactions):
    """Approvals and questions of one tool step: the decision or answer the workflow holds (given
    with the step), else a new pending record that the step hands back to the workflow."""

    def __init__(self, ttl: float, decision: dict[str, Any] | None = None, answer: str | None = None) -> None:
        self.ttl, self.decision, self.answer = ttl, decision, answer
        self.asked: dict[str, Any] | None = None

    async def approval(
        self,
        task_id: str,
        call_id: str,
        tool: str,
        arguments: str,
        caller: Caller | None,
        conversation: str | None,
    ) -> Pending:
        if self.decision is not None and self.decision.get("call_id") == call_id:
            return Pending(**self.decision)
        now = time.time()
        pending = Pending(
            approval_id(conversation or "", task_id, call_id),
            "approval",
            task_id,
            call_id,
            tool,
            arguments,
            caller.user_id if caller else "",
            caller.channel if caller else "",
            conversation,
            now,
            now + self.ttl,
        )
        self.asked = dataclasses.asdict(pending)
        return pending

    async def question(
        self, task_id: str, call_id: str, question: str, caller: Caller | None, conversation: str | None
    ) -> Pending:
        asker, channel = (caller.user_id, caller.channel) if caller else ("", "")
        pending_id = "q" + approval_id(conversation or "", task_id, call_id)[2:]
        pending = Pending(
            pending_id, "question", task_id, call_id, "clarify", question, asker, channel, conversation
        )
        if self.answer is not None:
            pending.status, pending.answer = "answered", self.answer
            return pending
        self.asked = dataclasses.asdict(pending)
        return pending


CONSOLE = ("console", "web")  # who decides in a serve node's console (console/app.py)


class TurnActivities:
    """The activities, bound to the worker's agent and its senders (channel name → `send`)."""

    def __init__(
        self,
        agent: Any,
        senders: dict[str, Any],
        *,
        chat_rate: float = 5.0,
        approval_ttl: float,
        state: SharedState | None = None,
        schedules: ScheduleStore | None = None,
        task_queue: str | None = None,
    ) -> None:
        self.agent, self.senders = agent, senders
        self.task_queue = task_queue  # `temporal.task_queue`: where runs on an older queue move
        self.chat_rate, self.approval_ttl = chat_rate, approval_ttl
        self.state = state
        self.schedules = schedules  # the jobs in PostgreSQL (`/jobs`), when scheduling is on
        if agent.interactions is None:  # tools that need a person are offered: the workflow asks
            agent.use_interactions(StepInteractions(approval_ttl))
        if state is not None:  # the `remember` tool, on the conversation's stored state
            state.memory.attach(agent)

    def turn_steps(self) -> list[Any]:
        return [
            self.prepare_task, self.model_call, self.tool_call, self.command,
            self.record_turn, self.record_pending, self.dead_letter, self.decider_role, self.configured_queue,
            self.send_reply,  # a local step of the workflow's (workflow.py `_deliver`, LOCAL_SEND)
        ]  # fmt: skip

    def send_steps(self) -> list[Any]:
        return [self.send_reply]

    def _caller(self, data: dict[str, Any]) -> Caller:
        caller: Caller = self.agent.permissions.caller(data["sender"], data["channel"])
        if data.get("kind") == "scheduled":  # a job's turn schedules nothing (schedule/tools.py)
            caller = dataclasses.replace(caller, withheld=JOB_WITHHELD)
        return caller

    @activity.defn(name=ROLE)
    async def decider_role(self, data: dict[str, Any]) -> str:
        """The role of whoever decides an approval, by this worker's permissions: never what the
        request says, since anyone who reaches the Temporal frontend can send one (docs/security.md).
        The console of a `serve` node decides as an admin (`console` on channel `web`): its pages
        are behind their own login, and the frontend must be behind TLS or an API key."""
        user, channel = str(data.get("user_id", "")), str(data.get("channel", ""))
        if (user, channel) == CONSOLE:
            return ADMIN
        return self._caller({"sender": user, "channel": channel}).role

    @activity.defn(name=QUEUE)
    async def configured_queue(self) -> str | None:
        """This worker's `temporal.task_queue`: a run on another one moves there (workflow.py)."""
        return self.task_queue

    @activity.defn(name=PREPARE)
    async def prepare_task(self, data: dict[str, Any]) -> dict[str, Any]:
        return await waited_out(self._prepare(data))

    async def _prepare(self, data: dict[str, Any]) -> dict[str, Any]:
        agent, text = self.agent, data["text"]
        if agent.mcp is not None:  # cheap once connected; a server that is down is retried later
            await agent.mcp.attach(agent.registry)
        client = agent.client
        offered = {
            s["function"]["name"] for s in agent.registry.schemas((), self._caller(data), client.models)
        }
        tools = [
            {
                "name": t.name,
                "schema": t.schema(),
                "level": t.level,
                "idempotent": t.idempotent,
                "read_only_hint": t.read_only_hint,
                "timeout": t.timeout,
            }
            for t in agent.registry
            if t.name in offered
        ]
        prompt, steps = agent.turn_prompt(text)  # as the embedded loop's (agent.py)
        window: list[Any] = []
        notes = ""
        if self.state is not None and data.get("conversation"):  # the stored conversation, folded
            loaded = await self.state.memory.prepare(str(data["conversation"]), text, client)
            window, notes = loaded.window, "\n\n".join(part for part in (loaded.notes, loaded.hints) if part)
        notes = "\n\n".join(part for part in (notes, steps) if part)  # the turn's context (agent.py)
        return {
            "system": prompt,
            "window": window,
            "notes": notes,
            "caller": dataclasses.asdict(self._caller(data)),
            "tools": tools,
            "limits": dataclasses.asdict(agent.limits),
            "greeting": agent.is_greeting(text),
            "language": agent.language or detect_language(text),
            "model": client.name,
            "models": list(client.models),
            "chat_rate": self.chat_rate,
            "task_queue": self.task_queue,
        }

    @activity.defn(name=MODEL)
    async def model_call(self, data: dict[str, Any]) -> dict[str, Any]:
        registry = self.agent.registry
        asked = data.get("message")  # absent in steps scheduled by an earlier release
        token = CURRENT_MESSAGE.set(inbound_of(asked)) if asked else None
        try:
            with offering(registry.offer(set(data["withdrawn"]), self._caller(data))):
                response = await heartbeating(self.agent.client.complete(data["messages"], data["tools"]))
        finally:
            if token is not None:
                CURRENT_MESSAGE.reset(token)
        return record_of(response)

    @activity.defn(name=TOOL)
    async def tool_call(self, data: dict[str, Any]) -> dict[str, Any]:
        call = ToolCall(**data["call"])
        registry = self.agent.registry
        declared = registry.get(call.name)
        attempt = activity.info().attempt
        if attempt > 1 and declared is not None and not (declared.level == 0 or declared.idempotent):
            log.warning(
                "tool %s (%s) was interrupted mid-call: its outcome is unknown, not run again",
                call.name,
                call.id,
            )
            unknown = ToolOutcome(call, error_result(UNKNOWN_OUTCOME), ok=False, error="outcome_unknown")
            return {"outcome": outcome_record(unknown), "pending": None}
        asks = StepInteractions(self.approval_ttl, data.get("decision"), data.get("answer"))
        tools = RegistryWrapper(registry)
        tools.interactions = asks  # this step's decisions only: concurrent steps share the registry
        context = ToolContext(
            call.id,
            call.name,
            data["task_id"],
            data["conversation"],
            caller=self._caller(data),
            model=data["model"],
            spent=[],
        )
        origin = data.get("origin")  # the message whose turn this is: for the scheduling tools
        token = CURRENT_MESSAGE.set(inbound_of({"text": "", **origin})) if origin else None
        try:
            outcome = await heartbeating(
                tools.execute(call, timeout=data["timeout"], max_chars=data["max_chars"], context=context)
            )
        finally:
            if token is not None:
                CURRENT_MESSAGE.reset(token)
        return {"outcome": outcome_record(outcome), "pending": asks.asked}

    @activity.defn(name=COMMAND)
    async def command(self, data: dict[str, Any]) -> str:
        """A conversation command's fixed reply (gateway/commands.py, as the embedded runner answers it)."""
        from ...gateway import commands

        if self.state is None:
            raise ApplicationError("this worker keeps no conversations (database.url)", non_retryable=True)
        message = inbound_of(data["message"])
        agent = self.agent
        caller = self._caller({"sender": message.sender, "channel": message.channel})
        answer = await waited_out(heartbeating(commands.answer(
            message.text, conversation=message.conversation, memory=self.state.memory,
            registry=agent.registry, caller=caller,
            models=agent.client.models, language=agent.language, schedules=self.schedules, message=message,
        )))  # fmt: skip
        return answer or ""

    @activity.defn(name=RECORD)
    async def record_turn(self, data: dict[str, Any]) -> None:
        """A finished turn in the shared store: its messages, long-term outcome and trace (state.py)."""
        if self.state is not None:
            await heartbeating(self.state.record_turn(data))

    @activity.defn(name=PENDING)
    async def record_pending(self, data: dict[str, Any]) -> None:
        """An approval or question as the approvals list shows it: asked, decided, answered, expired."""
        if self.state is not None:
            await heartbeating(self.state.record_pending(data))

    @activity.defn(name=DEAD)
    async def dead_letter(self, data: dict[str, Any]) -> int | None:
        """A reply given up on, kept in the dead letters every node's console lists."""
        if self.state is None:
            return None
        return await heartbeating(self.state.dead_letter(data["reply"], str(data["error"])))

    @activity.defn(name=SEND)
    async def send_reply(self, data: dict[str, Any]) -> str | None:
        reply = OutboundMessage(**data)
        sender = self.senders.get(reply.channel)
        if sender is None:
            raise ApplicationError(
                f"no channel named {reply.channel!r} is configured on this worker",
                type="PermanentDelivery",
                non_retryable=True,
            )
        while True:
            try:
                sent: str | None = await heartbeating(sender.send(reply))
                if reply.id is not None and self.state is not None:  # a dead letter sent again
                    await self.state.mark_sent(reply.id, sent)
                return sent
            except DeliveryError as exc:
                if exc.throttled:  # the platform said wait: not a failed attempt
                    await heartbeating(asyncio.sleep(min(exc.retry_after or 1.0, 60.0)))
                    continue
                if exc.permanent:
                    raise ApplicationError(str(exc), type="PermanentDelivery", non_retryable=True) from None
                delay = timedelta(seconds=exc.retry_after) if exc.retry_after else None
                raise ApplicationError(str(exc), type="DeliveryError", next_retry_delay=delay) from None


__all__ = [
    "StepInteractions", "TurnActivities", "approval_id", "conversation_of", "heartbeating", "waited_out",
]  # fmt: skip
