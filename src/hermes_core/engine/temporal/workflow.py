"""`ConversationWorkflow`: one conversation, as durable workflow code.

Its id is the conversation key (`feishu:oc_…`, `webhook:u1`), so every node that receives an
event of a conversation reaches the same workflow: `serve` delivers each message by
signal-with-start (client.py), which needs no worker and is durable once it returns.

- Duplicates: the message id and the event id (per channel) are remembered, the last `dedup_ids`
  of them, across continue-as-new; a second push of a message — same event id, or the same
  message id under a new event id, on any node — is dropped here.
- Order: messages wait in `queue` and are answered one at a time, in arrival order.
- A turn is the kernel's `run_loop` (kernel/loop.py) itself, with its guards and limits. Its model client
  (`ActivityModel`) and its tools (`ActivityTools`) make each model call and each tool call an
  activity (activities.py) run by whichever worker is alive: a worker that dies mid-step stops
  heartbeating, and the step is retried on another one; completed steps are in the history and
  never run again, and a level ≥ 1 call interrupted mid-way answers "outcome unknown"
  (activities.py, the journal's rule).
- Approvals and questions pause inside the workflow: the request goes out as a reply, then the
  workflow waits for the `decide` update (any node, checked by its validator: who may decide,
  expiry) or for the asker's next message, and the same call runs on with the decision. Meanwhile
  the conversation's other messages wait: one turn in flight.
- Replies go out through the `send_reply` step, each with its idempotency key, spaced per chat
  here: a local step (since `LOCAL_SEND`) run by the worker that runs the workflow task, the
  app-wide limits counted in PostgreSQL for every worker together (worker.py); a worker that dies
  mid-send loses the workflow task, and the one that takes it over sends again under the same
  key, which the platform answers once. Runs that began before it send through the
  `<task_queue>-sends` queue, rate-limited app-wide by the server. The webhook's synchronous
  replies are read by the node that holds the request (`replies`).
- The conversation lives in PostgreSQL (state.py), not here: `prepare_task` builds each turn's
  window and notes from it, and `record_turn` stores the finished turn (both local steps: run by
  the worker that runs the workflow task, no task queue round trip) — its messages once per
  task id, its long-term outcome, its trace (`TurnTrace`, observe/traces.py's record) — before the
  reply goes out. Approvals and questions are `pending` rows (`record_pending`) as they are asked
  and decided; a reply given up on is a dead letter there (`dead_letter`), which the console's
  Resend hands back (`resend` signal).
- A changed `task_queue`: a run started on another queue than the one its worker is configured
  with (`prepare_task` says which, and so does `configured_queue` when an idle run continues)
  continues as new onto the configured one after its turn, while the workers also poll the old
  queue (`temporal.previous_task_queues`, worker.py), so no conversation is left unanswered.
- Commands (gateway/commands.py) are answered by the `command` activity, with no model call; a
  `/stop` from the asker cancels the turn in flight (`message`: the turn's task is cancelled, so
  are its steps) and is answered as the embedded gateway answers it.
- History: after `turns_per_run` turns, when the server suggests it, or when this run's history
  passes `HISTORY_EVENTS` events or `HISTORY_BYTES`, the workflow continues as new with its state
  — queue, remembered ids, recent replies — so its history stays bounded however long the
  conversation lasts. What is carried is bounded by bytes too (`carry_bytes`, `carried`): a
  Temporal payload over 2 MB fails the workflow task on every retry, and a conversation with long
  replies reached that with the texts of its last 500 replies. A turn's reply is carried as its
  ids; its text only while it fits (the node that answers a webhook retry reads it back from the
  stored turn, state.py `stored_reply`).

Workflow code must be deterministic: the kernel's modules are passed through the sandbox (they
are replayed as they ran: no clock, randomness or I/O is consulted in the loop's decisions), and
everything that reads the configuration, the clock or the network runs in activities.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from ...agent import turn_messages
    from ...channels.seam import InboundMessage, OutboundMessage, Reply, inbound_of, new_task_id
    from ...gateway.commands import is_stop, parse
    from ...gateway.dispatcher import reply_for
    from ...kernel.approvals import APPROVAL_TTL, Pending, may_decide
    from ...kernel.hooks import TaskHooks
    from ...kernel.loop import Limits, RunResult, pause_reply, run_loop
    from ...kernel.messages import Message, ModelResponse, ToolCall
    from ...kernel.model import ModelClient, ModelRequestRejected, ModelUnavailable, TextCallback
    from ...kernel.records import outcome_from, outcome_record, record_of, response_from
    from ...kernel.replies import REPLIES, Language, detect_language, fixed_reply
    from ...kernel.tools.permissions import MEMBER, Caller
    from ...kernel.tools.registry import DEFAULT_TOOL_TIMEOUT, ToolOutcome
    from ...kernel.tools.results import DEFAULT_MAX_CHARS, error_result
    from ...schedule.jobs import scheduled_prompt
    from ...tools import ToolContext, ToolRegistry

WORKFLOW = "HermesConversation"
SIGNAL = "message"
DECIDE = "decide"
REPLIES_QUERY = "replies"
STATUS_QUERY = "status"
RESEND = "resend"
PREPARE, MODEL, TOOL, SEND = (
    "hermes.prepare_task",
    "hermes.model_call",
    "hermes.tool_call",
    "hermes.send_reply",
)
COMMAND, RECORD, PENDING, DEAD = (
    "hermes.command",
    "hermes.record_turn",
    "hermes.record_pending",
    "hermes.dead_letter",
)
ROLE = "hermes.decider_role"  # the decider's role, by the worker's permissions (activities.py)
QUEUE = "hermes.configured_queue"  # the worker's `temporal.task_queue`, where a run moves (activities.py)
DECIDER_ROLE = "decider-role"  # the patch after which a decision's role is never the request's
SHARED_STATE = "shared-state"  # the patch that added the command and record steps (`_shared`)
SYNCHRONOUS = ("webhook", "web")  # channels whose reply the node holding the request reads (client.py)
KEPT_REPLIES = 500  # messages whose replies are kept for the webhook's retries
HISTORY_EVENTS = 10_000  # a run continues as new past this many events or bytes of history, whether
HISTORY_BYTES = 8 * 1024 * 1024  # or not the server suggests it (Temporal refuses at 50 MB / 50K)
BOUNDED = "bounded-history"  # the patch after which a run also continues by its history's size
MOVES = "moves-queue"  # the patch after which an idle run asks for the configured queue before continuing
LOCAL_RECORD = "local-record"  # the patch after which a turn is recorded by a local step (`_record`)
LOCAL_SEND = "local-send"  # the patch after which a reply is sent by a local step (`_deliver`)
KEPT_DECISIONS = 100
DEDUP_AGE = 48 * 3600.0  # seconds an id is remembered at least (Feishu retries for about 7 h)
ORIGIN = ("channel", "conversation", "sender", "message_id", "kind", "chat_id", "chat_type", "callback_url")


# the steps that read the stored conversation: a database outage is retried as long as it lasts, any
# other failure gives up after activities.py's STEP_ATTEMPTS (`StepFailed`, non-retryable)
UNTIL_THE_DATABASE_ANSWERS = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=5), maximum_attempts=0
)


def sends_queue(task_queue: str) -> str:
    """The task queue of the send step: its workers are limited app-wide (worker.py)."""
    return f"{task_queue}-sends"


@dataclasses.dataclass
class Options:
    """What the workflow needs of `temporal:` (config.py TemporalConfig), passed at its start."""

    task_queue: str = "hermes-turns"
    heartbeat_timeout: float = 5.0
    model_timeout: float = 300.0
    send_attempts: int = 8
    turns_per_run: int = 100
    carry_bytes: int = 512 * 1024
    dedup_ids: int = 2000
    window_turns: int = 20
    idle_days: float = 2.0

    @classmethod
    def of(cls, data: dict[str, Any]) -> Options:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclasses.dataclass
class ToolFacts:
    """What the workflow knows of a tool (prepare_task): enough for the loop's guards and the
    journal's rule, never the tool itself."""

    name: str
    schema: dict[str, Any]
    level: int = 1
    idempotent: bool = False
    read_only_hint: bool | None = None
    timeout: float | None = None


def payload_size(value: Any) -> int:
    """Bytes of `value` as Temporal's JSON converter writes it (compact, ASCII)."""
    return len(json.dumps(value, separators=(",", ":")))


def carried(state: dict[str, Any], budget: int) -> dict[str, Any] | None:
    """`state` trimmed to at most `budget` bytes, or None when the work alone (the queue, the
    resends) does not fit: then the run answers more of it before it continues. Trimmed in
    order, oldest first: the texts of replies stored with their turn (`stored`: read back from
    PostgreSQL), whole reply entries (a retry of their message id then waits as for one never
    seen), dead letters (PostgreSQL keeps them; only their count is shown here), remembered ids."""
    state = {**state, "replies": {key: [dict(r) for r in kept] for key, kept in state["replies"].items()}}
    state["seen"], state["dead_letters"] = dict(state["seen"]), list(state["dead_letters"])
    over = payload_size(state) - budget
    for kept in state["replies"].values():
        for reply in kept:
            if over > 0 and reply.get("stored") and reply.get("text") is not None:
                over -= payload_size(reply["text"]) - payload_size(None)
                reply["text"] = None
    over = _drop_oldest(state["replies"], over)
    while over > 0 and state["dead_letters"]:
        over -= payload_size(state["dead_letters"].pop(0)) + 1
    over = _drop_oldest(state["seen"], over)
    if over > 0 or payload_size(state) > budget:
        return None
    return state


def _drop_oldest(entries: dict[str, Any], over: int) -> int:
    """Delete the oldest of `entries` while `over` > 0; what is still over."""
    while over > 0 and entries:
        key = next(iter(entries))
        over -= payload_size(key) + payload_size(entries.pop(key)) + 2  # `"key":value,`
    return over


def message_keys(data: dict[str, Any]) -> list[str]:
    """The dedup keys of a message: its message id and its event id, per channel."""
    keys = [f"m:{data['channel']}:{data['message_id']}"]
    if data.get("event_id"):
        keys.append(f"e:{data['channel']}:{data['event_id']}")
    return keys


@workflow.defn(name=WORKFLOW)
class ConversationWorkflow:
    @workflow.init
    def __init__(self, start: dict[str, Any]) -> None:
        self.options = Options.of(start.get("options") or {})
        state = start.get("state") or {}
        self.queue: list[dict[str, Any]] = list(state.get("queue", []))
        self.seen: dict[str, float] = dict(state.get("seen", {}))  # key → when; oldest first
        self.replies: dict[str, list[dict[str, Any]]] = dict(state.get("replies", {}))
        self.turns: int = int(state.get("turns", 0))
        self.last_sent: float = float(state.get("last_sent", 0.0))
        self.chat_rate: float = float(state.get("chat_rate", 5.0))
        self.dead_letters: list[dict[str, Any]] = list(state.get("dead_letters", []))
        self.duplicates: int = int(state.get("duplicates", 0))
        self.runs: int = int(state.get("runs", 1))  # this run's number: 1 + the times it continued as new
        self.pending: dict[str, dict[str, Any]] = {}  # approvals of the turn in flight, and recent ones
        self.turns_this_run = 0
        self.target: InboundMessage | None = None  # whom the turn in flight answers
        self.language: Language = "en"
        self.turn_task: asyncio.Task[None] | None = None
        self.stop_requested = False  # a /stop of the asker cancels the turn in flight
        # while the turn's loop runs: a command's reply, or a reply already sent, is not stopped
        self.stoppable = False
        self.resends: list[dict[str, Any]] = list(state.get("resends", []))  # dead letters sent again
        self.recorded: int = int(state.get("recorded", 0))  # turns recorded in the shared store
        self.carried_bytes = payload_size(start)  # what this run was started with
        self.configured_queue: str | None = None  # the workers' `task_queue`, once a step has said it

    # --- what the nodes send ------------------------------------------------------------------

    @workflow.signal(name=SIGNAL)
    def message(self, data: dict[str, Any]) -> None:
        if str(data.get("conversation", "")) != workflow.info().workflow_id:  # nodes signal its own only
            workflow.logger.warning("a message of another conversation was signalled here: dropped")
            return
        keys = message_keys(data)
        if any(key in self.seen for key in keys):
            self.duplicates += 1
            workflow.logger.info("duplicate %s message %s dropped", data["channel"], data["message_id"])
            return
        now = self._now()
        for key in keys:
            self.seen[key] = now
        while len(self.seen) > self.options.dedup_ids:
            del self.seen[next(iter(self.seen))]
        extra = data.setdefault("extra", {})
        target, task = self.target, self.turn_task
        if (
            data.get("kind", "text") == "text"
            and is_stop(str(data.get("text", "")))
            and target is not None
            and task is not None
            and self.stoppable
            and (target.sender, target.channel) == (data.get("sender"), data.get("channel"))
        ):  # said before the turn is cancelled: its reply says what it stopped
            extra["stopping"] = target.extra.get("task_id") or target.message_id
            self.stop_requested = True
            task.cancel()
        if not extra.get("task_id"):  # the gateway assigns one; a message sent without gets its own
            channel, message_id = str(data["channel"]), str(data["message_id"])
            extra["task_id"] = new_task_id(channel, message_id, workflow.uuid4().hex[:12])
        self.queue.append(data)

    @workflow.signal(name=RESEND)
    def resend(self, reply: dict[str, Any]) -> None:
        """A dead letter sent again (the console's Resend): the same reply, its uuid unchanged."""
        self.resends.append(reply)

    @workflow.update(name=DECIDE)
    async def decide(self, data: dict[str, Any]) -> dict[str, Any]:
        if workflow.patched(DECIDER_ROLE):  # whoever reaches the frontend may send any role: ask the worker
            role = await workflow.execute_local_activity(
                ROLE,
                {"user_id": str(data.get("user_id", "")), "channel": str(data.get("channel", ""))},
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5),
            )
            refusal = self._refusal(data, str(role))  # checked again: another decision came meanwhile?
            if refusal is not None:
                raise ApplicationError(refusal, non_retryable=True)
        pending = self.pending[data["id"]]
        pending.update(
            status="approved" if data["approve"] else "rejected",
            decided_by=data["user_id"],
            decided_at=self._now(),
        )
        target = self.target
        message_id = target.message_id if target is not None else ""
        resume = {"text": target.text, "callback_url": target.callback_url} if target is not None else None
        return {
            "pending": {**pending, "resume": resume},  # what the channels read of the original message
            "message_id": message_id,
            "replies": len(self.replies.get(message_id, [])),
        }

    @decide.validator
    def _decision_allowed(self, data: dict[str, Any]) -> None:
        """Refusals name a key of kernel/replies.py, as `DecisionRefused` does (kernel/approvals.py).
        Whether the decider may decide is checked in `decide`, with the role the worker's
        permissions give it: a role sent with the request never counts."""
        refusal = self._refusal(data, None)
        if refusal is not None:
            raise ValueError(refusal)

    def _refusal(self, data: dict[str, Any], role: str | None) -> str | None:
        pending = self.pending.get(str(data.get("id")))
        if pending is None or pending.get("kind") != "approval":
            return "approval_unknown"
        decider = Caller(str(data.get("user_id", "")), role or MEMBER, str(data.get("channel", "")))
        if role is not None and not may_decide(Pending(**pending), decider):
            return "approval_not_allowed"
        if pending["status"] == "expired" or (
            pending["status"] == "pending" and (pending.get("expires_at") or float("inf")) <= self._now()
        ):
            return "approval_expired"
        if pending["status"] != "pending":
            return "approval_already_decided"
        return None

    @workflow.query(name=REPLIES_QUERY)
    def replies_of(self, message_id: str) -> list[dict[str, Any]]:
        return list(self.replies.get(message_id, []))

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> dict[str, Any]:
        return {
            "queued": len(self.queue),
            "turns": self.turns,
            "duplicates": self.duplicates,
            "dead_letters": len(self.dead_letters),
            "in_flight": self.target.message_id if self.target else None,
            "recorded_turns": self.recorded,
            "runs": self.runs,
            "history_length": workflow.info().get_current_history_length(),
            "carried_bytes": self.carried_bytes,
        }

    # --- the conversation ---------------------------------------------------------------------

    @workflow.run
    async def run(self, start: dict[str, Any]) -> None:
        while True:
            try:
                await workflow.wait_condition(
                    lambda: bool(self.queue or self.resends), timeout=self.options.idle_days * 86400
                )
            except asyncio.TimeoutError:  # idle: forget old ids, start a fresh history
                cutoff = self._now() - max(DEDUP_AGE, self.options.idle_days * 86400)
                self.seen = {key: at for key, at in self.seen.items() if at >= cutoff}
                if workflow.patched(MOVES):
                    self.configured_queue = await workflow.execute_local_activity(
                        QUEUE, start_to_close_timeout=timedelta(seconds=30), retry_policy=RetryPolicy()
                    )
                await self._continue_as_new()
                continue
            if self.resends:
                await self._send_again(self.resends.pop(0))
                continue
            message = self.queue.pop(0)
            self.turn_task = asyncio.create_task(self._answer(inbound_of(message)))
            try:
                await self.turn_task
            except asyncio.CancelledError:
                if not self.stop_requested:  # the workflow itself is cancelled
                    raise
                workflow.logger.info(
                    "turn for %s message %s stopped", message["channel"], message["message_id"]
                )
                await self._withdraw(str(message["extra"]["task_id"]))
            finally:
                self.stop_requested, self.stoppable, self.turn_task, self.target = False, False, None, None
            self.turns += 1
            self.turns_this_run += 1
            if self._history_full() or self._moving():
                await self._continue_as_new()

    def _moving(self) -> bool:
        """Whether the workers are configured with another task queue than this run's."""
        return self.configured_queue not in (None, workflow.info().task_queue)

    def _history_full(self) -> bool:
        """Whether this run has answered enough: `turns_per_run` turns, the server's suggestion,
        or (runs since `BOUNDED`) a history past `HISTORY_EVENTS` events or `HISTORY_BYTES`."""
        info = workflow.info()
        if self.turns_this_run >= self.options.turns_per_run or info.is_continue_as_new_suggested():
            return True
        large = (
            info.get_current_history_length() >= HISTORY_EVENTS
            or info.get_current_history_size() >= HISTORY_BYTES
        )
        return large and workflow.patched(BOUNDED)

    async def _withdraw(self, task_id: str) -> None:
        """The approvals and questions a stopped turn waited for: expired, in the list too."""
        for pending in list(self.pending.values()):
            if pending.get("task_id") == task_id and pending.get("status") == "pending":
                pending.update(status="expired", decided_at=self._now())
                await self._step(PENDING, {key: value for key, value in pending.items() if key != "resume"})

    async def _continue_as_new(self) -> None:
        """Continue as new with the state, bounded by `carry_bytes` (`carried`); when the messages
        waiting to be answered do not fit by themselves, go on answering them in this run."""
        await workflow.wait_condition(workflow.all_handlers_finished)
        queue = self.configured_queue or workflow.info().task_queue
        options = {**dataclasses.asdict(self.options), "task_queue": queue}
        state = carried(self._state(), self.options.carry_bytes - payload_size(options))
        if state is None:
            workflow.logger.warning(
                "%d queued messages are more than temporal.carry_bytes: continued once fewer wait",
                len(self.queue),
            )
            return
        workflow.continue_as_new({"options": options, "state": state}, task_queue=queue)

    def _state(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "seen": self.seen,
            "resends": self.resends,
            "recorded": self.recorded,
            "replies": self.replies,
            "turns": self.turns,
            "last_sent": self.last_sent,
            "chat_rate": self.chat_rate,
            "dead_letters": self.dead_letters[-100:],
            "duplicates": self.duplicates,
            "runs": self.runs + 1,
        }

    async def _answer(self, message: InboundMessage) -> None:
        self.target = message
        self.language = detect_language(message.text)
        try:
            await self._turn(message)
        except Exception:  # the loop does not raise; this guards a broken step or worker
            if self.stop_requested:  # a step cancelled by /stop: the turn ends here, unanswered
                raise asyncio.CancelledError() from None
            workflow.logger.exception("turn for %s message %s failed", message.channel, message.message_id)
            apology = fixed_reply("internal_error", self.language)
            await self._send(Reply(apology, error="internal_error"))
        finally:
            self.target = None

    async def _turn(self, message: InboundMessage) -> None:
        if message.kind not in ("text", "scheduled"):  # images, files…: we cannot read them
            await self._send(Reply(f"{REPLIES['non_text']['zh']}\n{REPLIES['non_text']['en']}"))
            return
        if not message.text.strip():  # a bare @mention
            await self._send(Reply(fixed_reply("how_can_i_help", self.language)))
            return
        if parse(message.text) is not None and self._shared():  # /new, /help, /stop, /jobs, /memory…
            answer = await workflow.execute_activity(
                COMMAND,
                {"message": dataclasses.asdict(message)},
                start_to_close_timeout=timedelta(seconds=60),
                heartbeat_timeout=timedelta(seconds=self.options.heartbeat_timeout),
                retry_policy=UNTIL_THE_DATABASE_ANSWERS,
            )
            await self._send(Reply(str(answer)))
            return
        text = message.text
        if message.kind == "scheduled":  # a job's fire (schedules.py): its prompt, said to be one
            text = scheduled_prompt(message, message.speaker)
        asked = {
            "sender": message.sender,
            "channel": message.channel,
            "text": text,
            "conversation": message.conversation,
            "kind": message.kind,  # a job's fire is not offered schedule_task (activities.py)
        }
        # a local activity: run by the worker that runs this workflow task, recorded as a marker
        # (no task queue round trip); a worker that dies in it loses the workflow task, and the
        # worker that takes it over prepares again (it reads the configuration and the stored
        # conversation; a fold's summary call may be made twice)
        prepared = await workflow.execute_local_activity(
            PREPARE,
            asked,
            start_to_close_timeout=timedelta(seconds=self.options.model_timeout + 30),
            retry_policy=UNTIL_THE_DATABASE_ANSWERS,
        )
        self.chat_rate = float(prepared.get("chat_rate") or self.chat_rate)
        self.configured_queue = prepared.get("task_queue") or self.configured_queue
        self.language = prepared.get("language") or self.language
        limits = Limits(**prepared["limits"]) if not prepared["greeting"] else Limits(max_turns=1)
        earlier: list[Message] = list(prepared.get("window") or [])
        request: Message = {"role": "user", "content": text}
        messages = turn_messages(prepared["system"], earlier, prepared.get("notes") or "", request)
        first = len(messages) - 1
        tools = ActivityTools(self, [ToolFacts(**facts) for facts in prepared["tools"]], message)
        model = ActivityModel(self, prepared["model"], tuple(prepared["models"]), tools)
        task_id = str(message.extra["task_id"])
        trace = TurnTrace(self, task_id, message, messages, prepared)
        self.stoppable = True
        try:
            result = await run_loop(
                model,
                tools,
                messages,
                limits,
                self.language,
                offer_tools=not prepared["greeting"],
                task_id=task_id,
                session_id=message.conversation,
                hooks=trace,
            )
        finally:
            self.stoppable = False
        turn = messages[first:]
        if not result.ok:  # keep the history answerable: close the turn with what the user saw
            turn.append({"role": "assistant", "content": result.reply})
        record = {
            "conversation": message.conversation,
            "task_id": task_id,
            "messages": turn,
            "reply": result.reply,
            "stop_reason": result.stop_reason,
            "tool_calls": [outcome_record(outcome) for outcome in result.tool_calls],
            "trace": trace.record(result),
        }
        # stored before the reply goes out, as the embedded gateway stores the turn with its done mark
        await self._record(record)
        self.recorded += 1
        # the text can be read back from the stored turn when it is its last message (state.py)
        last = turn[-1] if turn else {}
        readable = self._shared() and (last.get("role"), last.get("content")) == ("assistant", result.reply)
        stored = task_id if readable else None
        await self._send(Reply(result.reply, error=None if result.ok else result.stop_reason), stored=stored)

    def stop_point(self) -> None:
        """Where a turn /stop asked to cancel ends, after each step it awaited: the cancellation
        of a step that completed in the same activation as the /stop is not raised by the SDK
        (the step's result arrives instead), so the turn checks for itself."""
        if self.stop_requested and self.stoppable:
            raise asyncio.CancelledError()

    def _shared(self) -> bool:
        """Whether this run keeps its state in the shared store: False only while a run started by
        a release without these steps is replayed (`workflow.patched`), which then finishes as it
        began; its next run (continue-as-new) has them."""
        return workflow.patched(SHARED_STATE)

    async def _record(self, record: dict[str, Any]) -> None:
        """Store the finished turn: a local step (since `LOCAL_RECORD`), run by the worker that runs
        this workflow task and recorded as a marker, as `prepare_task` is — no activity task and
        no workflow task of its own, a third fewer of each per turn. A worker that dies in it
        loses the workflow task; the worker that takes it over records again (the record is
        written once per task id, state.py)."""
        if not self._shared():
            return
        if not workflow.patched(LOCAL_RECORD):  # a run that recorded with an activity goes on so
            await self._step(RECORD, record)
            return
        await workflow.execute_local_activity(
            RECORD,
            record,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=30)
            ),
        )
        self.stop_point()

    async def _step(self, name: str, data: Any) -> Any:
        """A step that writes the shared store: retried until PostgreSQL takes it (a database down
        for a while delays the conversation, loses nothing)."""
        if not self._shared():
            return None
        done = await workflow.execute_activity(
            name,
            data,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=self.options.heartbeat_timeout),  # a dead worker's: moved
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=30)
            ),
        )
        self.stop_point()
        return done

    # --- steps --------------------------------------------------------------------------------

    async def run_tool(self, call: ToolCall, facts: ToolFacts | None, payload: dict[str, Any]) -> ToolOutcome:
        """One tool call as an activity; a pause (approval, question) is waited for here and the
        same call run again with the decision or the answer."""
        limit = (facts.timeout if facts is not None and facts.timeout else payload["timeout"]) + 30
        while True:
            try:
                result = await workflow.execute_activity(
                    TOOL,
                    payload,
                    start_to_close_timeout=timedelta(seconds=limit),
                    heartbeat_timeout=timedelta(seconds=self.options.heartbeat_timeout),
                    retry_policy=RetryPolicy(
                        initial_interval=timedelta(milliseconds=200), maximum_attempts=4
                    ),
                )
            except ActivityError as exc:
                if self.stop_requested:  # cancelled by /stop (the step was told to stop)
                    raise asyncio.CancelledError() from None
                message = f"tool {call.name} could not be run: {exc.cause or exc}"
                return ToolOutcome(call, error_result(message), ok=False, error="exception")
            self.stop_point()
            outcome = outcome_from(result["outcome"])
            if outcome.error == "awaiting_approval":
                payload = {**payload, "decision": await self._decision(result["pending"], outcome)}
            elif outcome.error == "awaiting_answer":
                payload = {**payload, "answer": await self._answer_to(result["pending"], outcome)}
            else:
                return outcome

    async def _decision(self, pending: dict[str, Any], outcome: ToolOutcome) -> dict[str, Any]:
        """Send the approval request, wait for the `decide` update or the expiry; the record."""
        pending_id = str(pending["id"])
        self.pending[pending_id] = pending
        while len(self.pending) > KEPT_DECISIONS:
            del self.pending[next(iter(self.pending))]
        summary = {key: value for key, value in pending.items() if key != "resume"}
        await self._step(PENDING, summary)  # in the approvals list of every node's console
        await self._send(Reply(pause_reply(outcome, self.language), approval=summary))
        left = (pending.get("expires_at") or self._now() + APPROVAL_TTL) - self._now()
        try:
            await workflow.wait_condition(
                lambda: pending["status"] != "pending" or self.stop_requested, timeout=max(left, 0.001)
            )
        except asyncio.TimeoutError:
            pending.update(status="expired", decided_at=self._now())
        self.stop_point()
        await self._step(PENDING, {key: value for key, value in pending.items() if key != "resume"})
        return dict(pending)

    async def _answer_to(self, pending: dict[str, Any], outcome: ToolOutcome) -> str:
        """Send the question; the asker's next message in the conversation is the answer (and
        the one the turn's reply then answers)."""
        asker = self.target
        assert asker is not None
        self.pending[str(pending["id"])] = pending
        await self._step(PENDING, pending)
        await self._send(Reply(outcome.content))

        def answer_at() -> int | None:
            return next(
                (
                    i
                    for i, m in enumerate(self.queue)
                    if m.get("kind", "text") == "text"
                    and (m["sender"], m["channel"]) == (asker.sender, asker.channel)
                ),
                None,
            )

        left = (pending.get("expires_at") or self._now() + self.options.idle_days * 86400) - self._now()
        try:
            await workflow.wait_condition(
                lambda: answer_at() is not None or self.stop_requested, timeout=max(left, 0.001)
            )
            self.stop_point()
        except asyncio.TimeoutError:
            pending.update(status="expired", decided_at=self._now())
            await self._step(PENDING, pending)
            return ""
        index = answer_at()
        assert index is not None
        answer = inbound_of(self.queue.pop(index))
        self.target = answer
        pending.update(
            status="answered", answer=answer.text, decided_by=answer.sender, decided_at=self._now()
        )
        await self._step(PENDING, pending)
        return answer.text

    async def _send(self, reply: Reply, *, stored: str | None = None) -> None:
        """Record reply (its index the next of the message it answers) and send it, paced per chat.
        `stored`: the task id of the turn stored with this reply as its last message, from which a
        node reads the text when it is not carried across continue-as-new (`carried`)."""
        message = self.target
        assert message is not None
        kept = self.replies.setdefault(message.message_id, [])
        outbound = reply_for(message, reply, len(kept))
        kept.append(
            {
                "index": outbound.index,
                "text": outbound.text,
                "approval": outbound.approval,
                "error": outbound.error,
                "uuid": outbound.uuid,
                "stored": stored,
            }
        )
        while len(self.replies) > KEPT_REPLIES:
            del self.replies[next(iter(self.replies))]
        if message.channel in SYNCHRONOUS and not message.callback_url:
            return  # the synchronous answer: the node that holds the request reads it (client.py)
        await self._deliver(dataclasses.asdict(outbound), message.message_id)

    async def _send_again(self, reply: dict[str, Any]) -> None:
        """A dead letter the console sends again: delivered like a reply, kept again if it fails."""
        await self._deliver(reply, str(reply.get("message_id") or ""))

    async def _deliver(self, data: dict[str, Any], message_id: str) -> None:
        """One reply by the send step, paced per chat; given up on: a dead letter."""
        outbound = OutboundMessage(**data)
        wait = self.last_sent + 1.0 / self.chat_rate - self._now()
        if wait > 0:
            await workflow.sleep(wait)
        retry = RetryPolicy(
            initial_interval=timedelta(seconds=1),
            maximum_interval=timedelta(seconds=300),
            maximum_attempts=self.options.send_attempts,
            non_retryable_error_types=["PermanentDelivery"],
        )
        try:
            if workflow.patched(LOCAL_SEND):  # a local step: no task queue round trip (docstring)
                await workflow.execute_local_activity(
                    SEND, data, start_to_close_timeout=timedelta(seconds=120), retry_policy=retry
                )
            else:  # a run that sent through the sends' queue goes on so
                await workflow.execute_activity(
                    SEND,
                    data,
                    task_queue=sends_queue(self.options.task_queue),
                    start_to_close_timeout=timedelta(seconds=120),
                    heartbeat_timeout=timedelta(seconds=self.options.heartbeat_timeout),
                    retry_policy=retry,
                )
            self.stop_point()
        # kept, never dropped silently; a local step's failure comes as the step's own error (an
        # ApplicationError, or a TimeoutError once its time is up), not wrapped in an ActivityError
        except FailureError as exc:
            if self.stop_requested:  # the send was cancelled with its turn (/stop): no dead letter
                raise asyncio.CancelledError() from None
            error = str(exc.cause or exc)[:500]
            self.dead_letters.append({"uuid": outbound.uuid, "message_id": message_id, "error": error})
            del self.dead_letters[:-100]
            workflow.logger.error(
                "reply %s to %s dead-lettered: %s", outbound.uuid, outbound.conversation, error
            )
            # the console's list on every node (a dead letter's Resend comes back as `resend`)
            await self._step(
                DEAD, {"reply": {**data, "attempts": self.options.send_attempts}, "error": error}
            )
        self.last_sent = self._now()

    def _now(self) -> float:
        return workflow.now().timestamp()


class TurnTrace(TaskHooks):
    """The turn's record in observe/traces.py's format (the embedded `TaskTrace`'s), built from
    what the loop reports, timed by the workflow's clock; stored by the `record_turn` step."""

    def __init__(
        self,
        flow: ConversationWorkflow,
        task_id: str,
        message: InboundMessage,
        messages: list[Message],
        prepared: dict[str, Any],
    ) -> None:
        self.flow, self.task_id, self.message, self.messages = flow, task_id, message, messages
        self.prepared = prepared
        self.history = list(messages[:-1])  # the messages before the input, as sent
        self.started_at = flow._now()
        self.turn = 0
        self.model_calls: list[dict[str, Any]] = []
        self.started_calls: dict[str, tuple[int, float]] = {}
        self._call: tuple[int, float, int, list[str]] = (0, 0.0, 0, [])

    async def on_model_start(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> None:
        self.turn += 1
        names = [str(schema.get("function", {}).get("name")) for schema in tools or []]
        self._call = (self.turn, self.flow._now(), len(messages), names)

    async def on_model_end(self, response: ModelResponse | None, error: BaseException | None) -> None:
        turn, started_at, count, names = self._call
        self.model_calls.append({
            "turn": turn, "started_at": started_at, "elapsed": self.flow._now() - started_at,
            "request_messages_count": count, "tools": names,
            "response": record_of(response) if response is not None else None,
            "error": f"{type(error).__name__}: {error}" if error is not None else None,
        })  # fmt: skip

    async def on_tool_start(self, call: ToolCall) -> None:
        self.started_calls[call.id] = (self.turn, self.flow._now())

    def record(self, result: RunResult) -> dict[str, Any]:
        calls = []
        for outcome in result.tool_calls:
            turn, started_at = self.started_calls.get(outcome.call.id, (None, None))
            calls.append({"turn": turn, **outcome_record(outcome), "started_at": started_at})
        approvals = [
            {key: value for key, value in pending.items() if key != "resume"}
            for pending in self.flow.pending.values()
            if pending.get("task_id") == self.task_id
        ]
        message = self.message
        return {
            "task_id": self.task_id,
            "conversation": message.conversation,
            "channel": message.channel,
            "caller": self.prepared.get("caller"),
            "model": self.prepared.get("model", ""),
            "input": message.text,
            "history": self.history,
            "messages": list(self.messages),
            "model_calls": self.model_calls,
            "tool_calls": calls,
            "approvals": approvals,
            "reply": result.reply,
            "stop_reason": result.stop_reason,
            "ok": result.ok,
            "usage": dataclasses.asdict(result.usage),
            "timings": dict(result.timings),
            "started_at": self.started_at,
            "finished_at": self.flow._now(),
            "error": None,
        }


class ActivityModel(ModelClient):
    """The loop's model client: each `complete` is a `model_call` activity (the worker's agent
    stack: text tool calls, redaction, fallbacks, retries)."""

    def __init__(self, flow: ConversationWorkflow, name: str, models: tuple[str, ...], tools: ActivityTools):
        self.flow, self.name, self._models, self.tools = flow, name, models, tools

    @property
    def models(self) -> tuple[str, ...]:
        return self._models

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        target = self.tools.message
        payload = {
            "messages": messages,
            "tools": tools,
            "withdrawn": sorted(self.tools.withdrawn),
            "sender": target.sender,
            "channel": target.channel,
            # the message whose turn this is (`CURRENT_MESSAGE` on the worker, as in the embedded
            # runner's turn); an input only, so histories recorded without it replay unchanged
            "message": dataclasses.asdict(self.flow.target or target),
        }
        options = self.flow.options
        try:
            record = await workflow.execute_activity(
                MODEL,
                payload,
                start_to_close_timeout=timedelta(seconds=options.model_timeout),
                heartbeat_timeout=timedelta(seconds=options.heartbeat_timeout),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(milliseconds=200),
                    maximum_attempts=5,
                    non_retryable_error_types=["ModelUnavailable", "ModelRequestRejected"],
                ),
            )
        except ActivityError as exc:
            if self.flow.stop_requested:  # cancelled by /stop
                raise asyncio.CancelledError() from None
            cause = exc.cause
            if getattr(cause, "type", None) == "ModelRequestRejected":
                raise ModelRequestRejected(str(getattr(cause, "message", cause))) from None
            raise ModelUnavailable(str(getattr(cause, "message", None) or cause or exc)) from None
        self.flow.stop_point()
        return response_from(record)


class ActivityTools(ToolRegistry):
    """The loop's registry: the worker's tools as `prepare_task` described them; each `execute`
    is a `tool_call` activity (ToolRegistry.execute on the worker: permissions, approvals,
    timeouts)."""

    def __init__(self, flow: ConversationWorkflow, catalog: list[ToolFacts], message: InboundMessage) -> None:
        super().__init__()
        self.flow, self.message = flow, message
        self.catalog = {facts.name: facts for facts in catalog}
        self.withdrawn: set[str] = set()

    def get(self, name: str) -> Any:  # ToolFacts: the level and hints the guards read
        return self.catalog.get(name)

    @property
    def names(self) -> list[str]:
        return list(self.catalog)

    def schemas(
        self, exclude: Any = (), caller: Caller | None = None, model: Any = ""
    ) -> list[dict[str, Any]]:
        self.withdrawn = set(exclude)
        return [facts.schema for name, facts in self.catalog.items() if name not in self.withdrawn]

    async def execute(
        self,
        call: ToolCall,
        *,
        timeout: float = DEFAULT_TOOL_TIMEOUT,
        max_chars: int = DEFAULT_MAX_CHARS,
        context: ToolContext | None = None,
    ) -> ToolOutcome:
        target = self.flow.target or self.message
        payload = {
            "call": {"id": call.id, "name": call.name, "arguments": call.arguments},
            "task_id": context.task_id if context is not None else "",
            "conversation": target.conversation,
            "sender": self.message.sender,
            "channel": self.message.channel,
            "model": context.model if context is not None else "",
            "timeout": timeout,
            "max_chars": max_chars,
            "decision": None,
            "answer": None,
            # where the scheduling tools create a job (schedule/tools.py CURRENT_MESSAGE)
            "origin": {key: getattr(target, key) for key in ORIGIN},
        }
        return await self.flow.run_tool(call, self.catalog.get(call.name), payload)


__all__ = ["DECIDE", "SIGNAL", "WORKFLOW", "ConversationWorkflow", "Options", "message_keys", "sends_queue"]
