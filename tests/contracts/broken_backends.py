"""Implementations with one bug each, so that every contract test is seen to fail.

Each class is a real store (a SQLite one, or the in-memory session store) with one plausible
mistake a second implementation could make: deduplicating by one key only, checking and then
writing in two steps, marking a message done apart from its replies, a prefix matched with LIKE…
`BROKEN` registers each as a backend named `broken-<seam>-<bug>`;
test_contracts_fail_when_broken.py runs the suites against them (HERMES_CONTRACT_BACKENDS) and
checks that every contract test fails against at least one, and that each of them fails some test.
A backend here runs only its own seam's suite (`SUITES`): its other stores are the real ones.
Nothing in the project imports this module.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from contract_backends import Backend, BackendFactory, Dispatcher, gateway_dispatcher

from hermes_core.channels.seam import Earlier, InboundMessage, OutboundMessage
from hermes_core.gateway.dispatcher import Gateway, Lanes, Runner
from hermes_core.gateway.messages import Turn
from hermes_core.gateway.schedules import SQLiteScheduleStore, _held, _job_of, _record, _write
from hermes_core.gateway.store import GatewayStore, SQLiteGatewayStore
from hermes_core.kernel.approvals import ApprovalDesk, Pending
from hermes_core.kernel.messages import Message
from hermes_core.kernel.tools.permissions import ADMIN, Caller
from hermes_core.observe.traces import SQLiteTraceStore, TraceSummary
from hermes_core.schedule.jobs import Fire, Job, JobLimits, RefusalCheck, plan_claim
from hermes_core.sessions.store import (
    Conversation,
    ConversationState,
    InMemorySessionStore,
    SQLiteSessionStore,
    StateChange,
    TurnAppend,
    reply_text,
)
from hermes_core.tasks.journal import JournalEntry, SQLiteTaskJournal
from hermes_core.tasks.pending import SQLiteInteractions

# --- gateway stores --------------------------------------------------------------------------------


class NoIdOnAccept(SQLiteGatewayStore):
    """Returns the row id but leaves `message.id` unset."""

    async def accept(self, message: InboundMessage) -> int | None:
        inbound_id = await super().accept(message)
        message.id = None
        return inbound_id


class DedupByEventOnly(SQLiteGatewayStore):
    """Forgets that a message id is a dedup key: a resent message is a new one."""

    async def accept(self, message: InboundMessage) -> int | None:
        message.message_id = f"{message.message_id}~{uuid.uuid4().hex[:6]}"
        return await super().accept(message)


class DedupByMessageOnly(SQLiteGatewayStore):
    """Forgets the event id: a platform's redelivery under a new message id runs again."""

    async def accept(self, message: InboundMessage) -> int | None:
        message.event_id = None
        return await super().accept(message)


class CheckThenInsert(SQLiteGatewayStore):
    """Looks for the message first, then inserts: two deliveries at once both pass the check."""

    async def accept(self, message: InboundMessage) -> int | None:
        if await self.replies_of(message.channel, message.message_id) is not None:
            return None
        await asyncio.sleep(0)
        payload = json.dumps({k: v for k, v in dataclasses.asdict(message).items() if k != "id"})

        def insert(db: sqlite3.Connection) -> int | None:
            return db.execute(
                "INSERT INTO inbox (channel, conversation, message_id, payload, received_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (message.channel, message.conversation, message.message_id, payload, time.time()),
            ).lastrowid

        message.id = await self.db.transaction(insert)
        return message.id


class PendingNewestFirst(SQLiteGatewayStore):
    async def pending_inbound(self) -> list[InboundMessage]:
        return list(reversed(await super().pending_inbound()))


class WithdrawnStillRuns(SQLiteGatewayStore):
    """Takes a recall as done but keeps no mark of it: the message runs all the same."""

    async def withdraw(self, channel: str, message_id: str, conversation: str) -> bool:
        return True


class LeftChatsInMemory(SQLiteGatewayStore):
    """Remembers the chats the bot left in the process only: a restart sends there again."""

    def __init__(self, path: Any) -> None:
        super().__init__(path)
        self.left: set[tuple[str, str]] = set()

    async def set_chat_left(self, channel: str, chat_id: str, left: bool, at: float) -> None:
        (self.left.add if left else self.left.discard)((channel, chat_id))

    async def chat_left(self, channel: str, chat_id: str) -> bool:
        return (channel, chat_id) in self.left


class RepliesLoseTheirTopic(SQLiteGatewayStore):
    """Reads replies back with the fields it knew before topics: after a restart a reply in a topic
    falls out of it."""

    async def pending_outbound(self) -> list[OutboundMessage]:
        return [dataclasses.replace(reply, thread_id=None) for reply in await super().pending_outbound()]


class LastMembershipWins(SQLiteGatewayStore):
    """Takes the last change it is told of, however old: a late redelivery of "removed" silences
    the bot in a group it was added back to."""

    async def set_chat_left(self, channel: str, chat_id: str, left: bool, at: float) -> None:
        await self.db.transaction(lambda db: db.execute("DELETE FROM chat_membership"))
        await super().set_chat_left(channel, chat_id, left, at)


class NoBacklog(SQLiteGatewayStore):
    """Keeps no list of what is still to answer: a restart answers nothing."""

    async def pending_inbound(self) -> list[InboundMessage]:
        return []


class KeepsWhatItWasGiven(SQLiteGatewayStore):
    """Stores the message as it came, secrets and all."""

    async def accept(self, message: InboundMessage) -> int | None:
        text, extra = message.text, dict(message.extra)
        inbound_id = await super().accept(message)
        message.text, message.extra = text, extra
        payload = json.dumps({k: v for k, v in dataclasses.asdict(message).items() if k != "id"})
        await self.db.transaction(
            lambda db: db.execute("UPDATE inbox SET payload = ? WHERE id = ?", (payload, inbound_id))
        )
        return inbound_id


async def queued_alone(store: SQLiteGatewayStore, inbound_id: int, reply: OutboundMessage) -> OutboundMessage:
    """`reply` put in the outbox in a transaction of its own."""
    reply.inbound_id = inbound_id
    payload = json.dumps({k: v for k, v in dataclasses.asdict(reply).items() if k not in ("id", "attempts")})

    def insert(db: sqlite3.Connection) -> None:
        reply.id = db.execute(
            "INSERT INTO outbox (inbound_id, channel, conversation, payload, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (inbound_id, reply.channel, reply.conversation, payload, time.time()),
        ).lastrowid

    await store.db.transaction(insert)
    return reply


class DoneApartFromReplies(SQLiteGatewayStore):
    """Marks the message done, then stores the history, then queues the replies: three steps."""

    async def complete(
        self, inbound_id: int, replies: list[OutboundMessage], history: TurnAppend | None = None
    ) -> list[OutboundMessage]:
        await self.db.transaction(
            lambda db: db.execute("UPDATE inbox SET status = 'done' WHERE id = ?", (inbound_id,))
        )
        if history is not None:
            await history.apply()
        return [await queued_alone(self, inbound_id, reply) for reply in replies]


class HistoryDropped(SQLiteGatewayStore):
    async def complete(
        self, inbound_id: int, replies: list[OutboundMessage], history: TurnAppend | None = None
    ) -> list[OutboundMessage]:
        return await super().complete(inbound_id, replies, None)


class DoneOnceSeen(SQLiteGatewayStore):
    """Tells a retry that its message is done as soon as it was accepted."""

    async def replies_of(self, channel: str, message_id: str) -> Earlier | None:
        found = await super().replies_of(channel, message_id)
        return dataclasses.replace(found, done=True) if found is not None else None


class SentStaysPending(SQLiteGatewayStore):
    async def mark_sent(self, outbox_id: int, platform_id: str | None) -> None:
        return None


class AttemptsNotCounted(SQLiteGatewayStore):
    async def record_attempt(self, outbox_id: int, error: str) -> None:
        return None


class DeadStaysInOutbox(SQLiteGatewayStore):
    async def dead_letter(self, outbox_id: int, error: str) -> None:
        await super().dead_letter(outbox_id, error)
        await self.db.transaction(
            lambda db: db.execute("UPDATE outbox SET status = 'pending' WHERE id = ?", (outbox_id,))
        )


class DeadLetteredAgain(SQLiteGatewayStore):
    """Queues a reply it has no row of before burying it: given up on twice, it is two dead letters."""

    async def dead_letter_reply(self, reply: OutboundMessage, error: str) -> int:
        if reply.id is None:
            reply = dataclasses.replace(
                reply, id=(await self.complete(await self._row_for(reply), [reply]))[0].id
            )
        return await super().dead_letter_reply(reply, error)

    async def _row_for(self, reply: OutboundMessage) -> int:
        inbound = InboundMessage(reply.channel, reply.conversation, "", "", uuid.uuid4().hex)
        inbound_id = await self.accept(inbound)
        assert inbound_id is not None
        return inbound_id


class DeadLettersOldestFirst(SQLiteGatewayStore):
    async def dead_letters(self, limit: int | None = None) -> list[Any]:
        return list(reversed(await super().dead_letters(limit)))


class ResendWithNewKey(SQLiteGatewayStore):
    """Resends a dead letter as a new message: a new idempotency key, so the platform may show it twice."""

    async def resend(self, outbox_id: int) -> OutboundMessage | None:
        reply = await super().resend(outbox_id)
        if reply is not None:
            reply.uuid = uuid.uuid4().hex
        return reply


class ResendsNeverClaimed(SQLiteGatewayStore):
    """Lists the resends asked for without taking them: every poll resends them again."""

    async def claim_resends(self) -> list[OutboundMessage]:
        asked = [row for row in await self.dead_letters() if row["resend_requested_at"] is not None]
        known = {f.name for f in dataclasses.fields(OutboundMessage)}
        return [
            OutboundMessage(
                **{k: v for k, v in json.loads(row["payload"]).items() if k in known}, id=row["outbox_id"]
            )
            for row in asked
        ]


class AttemptsNeverReleased(SQLiteGatewayStore):
    async def release_attempt(self, inbound_id: int) -> None:
        return None


class CrashedIgnoresCount(SQLiteGatewayStore):
    async def crashed_inbound(self, min_attempts: int) -> list[tuple[InboundMessage, int]]:
        return await super().crashed_inbound(0)


class SetAsideStillPending(SQLiteGatewayStore):
    async def set_aside(
        self, inbound_id: int, reason: str, replies: list[OutboundMessage]
    ) -> list[OutboundMessage]:
        return [await queued_alone(self, inbound_id, reply) for reply in replies]  # the message stays pending


class CountsForgetSetAside(SQLiteGatewayStore):
    async def counts(self) -> dict[str, int]:
        return {**await super().counts(), "dead_letters": 0}


class PruneDeletesWork(SQLiteGatewayStore):
    async def prune(self, older_than: float) -> None:
        await super().prune(older_than)
        await self.db.transaction(
            lambda db: db.execute("DELETE FROM inbox WHERE received_at < ?", (older_than,))
        )


class NonceAlwaysFresh(SQLiteGatewayStore):
    async def claim_nonce(self, channel: str, nonce: str, keep_seconds: float) -> bool:
        return True


class NoncesInMemory(SQLiteGatewayStore):
    """Keeps the signatures it saw in the process: a restart forgets them."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self.seen: dict[tuple[str, str], float] = {}

    async def claim_nonce(self, channel: str, nonce: str, keep_seconds: float) -> bool:
        if self.seen.get((channel, nonce), 0.0) > time.time():
            return False
        self.seen[(channel, nonce)] = time.time() + keep_seconds
        return True


# --- dispatchers -----------------------------------------------------------------------------------


class EveryMessageItsOwnLane(Lanes[InboundMessage]):
    def push(self, key: str, item: InboundMessage) -> None:
        super().push(f"{key}#{item.message_id}", item)


def two_turns_at_once(store: GatewayStore, runner: Runner, desk: ApprovalDesk | None) -> Dispatcher:
    """Runs each message as it comes: two turns of one conversation at once."""
    gateway = Gateway(store, runner, desk=desk, send_backoff=0.01)
    gateway._inbound = EveryMessageItsOwnLane(gateway._process)
    return gateway


class AlwaysAccepting(Gateway):
    def __init__(self, store: GatewayStore, runner: Runner, desk: ApprovalDesk | None) -> None:
        super().__init__(store, runner, desk=desk, send_backoff=0.01)
        self.accepting = True

    async def stop(self, grace: float = 10.0) -> None:
        await super().stop(grace)
        self.accepting = True


def replies_backwards(store: GatewayStore, runner: Runner, desk: ApprovalDesk | None) -> Dispatcher:
    async def backwards(message: InboundMessage) -> list[str | Any] | Turn:
        replies = await runner(message)
        return list(reversed(replies.replies if isinstance(replies, Turn) else replies))

    return Gateway(store, backwards, desk=desk, send_backoff=0.01)


def sends_once(store: GatewayStore, runner: Runner, desk: ApprovalDesk | None) -> Dispatcher:
    """Gives a reply up at its first failed send: a busy platform loses it."""
    return Gateway(store, runner, desk=desk, send_backoff=0.01, send_attempts=1)


class DecisionWithoutResume(Gateway):
    def __init__(self, store: GatewayStore, runner: Runner, desk: ApprovalDesk | None) -> None:
        super().__init__(store, runner, desk=desk, send_backoff=0.01)

    async def decide(
        self, pending_id: str, user_id: str, channel: str, approve: bool
    ) -> tuple[Pending, int | None]:
        assert self.desk is not None
        return await self.desk.decide(pending_id, user_id, channel, approve), None


# --- session stores --------------------------------------------------------------------------------


class OneLogForAll(InMemorySessionStore):
    async def load(self, conversation: str) -> Conversation:
        return await super().load("")

    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> bool:
        return await super().append("", messages, turn_id=turn_id)

    async def update_state(self, conversation: str, change: StateChange) -> ConversationState:
        return await super().update_state("", change)


class ReplyOfTheLastTurn(InMemorySessionStore):
    """Reads the conversation's last message for any turn it has stored."""

    async def turn_reply(self, conversation: str, turn_id: str) -> str | None:
        messages = (await self.load(conversation)).messages
        stored = turn_id in self._entry(conversation).turns and messages
        return reply_text(messages[-1]) if stored else None


class LogNewestFirst(InMemorySessionStore):
    async def load(self, conversation: str) -> Conversation:
        found = await super().load(conversation)
        return dataclasses.replace(found, messages=list(reversed(found.messages)))


class TurnIdIgnored(InMemorySessionStore):
    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> bool:
        return await super().append(conversation, messages)


class TurnCheckedThenAppended(InMemorySessionStore):
    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> bool:
        seen = turn_id is not None and turn_id in self._entry(conversation).turns
        await asyncio.sleep(0)
        if not seen:
            await super().append(conversation, messages)
            self._entry(conversation).turns[turn_id or ""] = 0
        return not seen


class WindowIgnored(InMemorySessionStore):
    async def load(self, conversation: str) -> Conversation:
        found = await super().load(conversation)
        log = self._entry(conversation).messages
        return dataclasses.replace(found, messages=json.loads(json.dumps(log)))


class UpdateReturnsTheOldState(InMemorySessionStore):
    async def update_state(self, conversation: str, change: StateChange) -> ConversationState:
        before = (await self.load(conversation)).state
        await super().update_state(conversation, change)
        return before


class ReadYieldWrite(InMemorySessionStore):
    """Reads the state, lets others run, writes it back whole: concurrent updates overwrite each other."""

    async def update_state(self, conversation: str, change: StateChange) -> ConversationState:
        state = (await self.load(conversation)).state
        await asyncio.sleep(0)
        change(state)
        return await super().update_state(conversation, lambda stored: stored.__dict__.update(state.__dict__))


class ChangesTheStoredState(InMemorySessionStore):
    """Applies the change to the stored state itself: a change that fails halfway stays half done."""

    async def update_state(self, conversation: str, change: StateChange) -> ConversationState:
        change(self._entry(conversation).state)
        return (await self.load(conversation)).state


class HandsOutTheStoredLog(InMemorySessionStore):
    async def load(self, conversation: str) -> Conversation:
        entry = self._entry(conversation)
        log, state = entry.messages, entry.state
        return Conversation(conversation, log[state.folded :] if state.folded else log, state)


class UpdateOnlyAdds(InMemorySessionStore):
    """Merges an update into the stored lists: nothing is ever removed."""

    async def update_state(self, conversation: str, change: StateChange) -> ConversationState:
        before = (await self.load(conversation)).state

        def merged(state: ConversationState) -> None:
            change(state)
            for name in ("facts", "pending", "done"):
                kept = getattr(before, name)
                setattr(state, name, kept + [n for n in getattr(state, name) if n not in kept])

        return await super().update_state(conversation, merged)


class KeepsSecrets(InMemorySessionStore):
    """Appends the messages as they came, secrets and all."""

    async def append(self, conversation: str, messages: list[Message], *, turn_id: str | None = None) -> bool:
        entry = self._entry(conversation)
        if turn_id is not None and turn_id in entry.turns:
            return False
        entry.turns[turn_id or ""] = 0
        entry.messages.extend(json.loads(json.dumps(messages)))
        entry.stamps.extend([time.time()] * len(messages))
        return True


class ForgetsOnClose(InMemorySessionStore):
    async def close(self) -> None:
        self._logs.clear()


class PruneLeavesTheFold(InMemorySessionStore):
    """Deletes old messages without moving the fold: what is left is read from the wrong place."""

    async def prune(self, older_than: float) -> int:
        deleted = 0
        for entry in self._logs.values():
            gone = sum(1 for stamp in entry.stamps if stamp < older_than)
            del entry.messages[:gone], entry.stamps[:gone]
            deleted += gone
        return deleted


class PruneForgetsTheState(InMemorySessionStore):
    """Deletes old messages and, with them, the state of every conversation that lost some."""

    async def prune(self, older_than: float) -> int:
        lost = {name for name, entry in self._logs.items() if entry.stamps and entry.stamps[0] < older_than}
        deleted = await super().prune(older_than)
        for name in lost & set(self._logs):
            self._logs[name].state = ConversationState()
        return deleted


# --- journals --------------------------------------------------------------------------------------


class EntriesByPrefix(SQLiteTaskJournal):
    async def entries(self, task_id: str) -> list[JournalEntry]:
        rows = await self.db.transaction(
            lambda db: db.execute(
                "SELECT kind, data FROM task_journal WHERE task_id LIKE ? ORDER BY task_id, seq",
                (f"{task_id}%",),
            ).fetchall()
        )
        return [JournalEntry(kind, json.loads(data)) for kind, data in rows]


class EntriesNewestFirst(SQLiteTaskJournal):
    async def entries(self, task_id: str) -> list[JournalEntry]:
        return list(reversed(await super().entries(task_id)))


class SequenceCountedFirst(SQLiteTaskJournal):
    """Counts the entries, then writes the next one: two writers at once take the same number."""

    async def append(self, task_id: str, kind: str, data: dict[str, Any]) -> None:
        seq = len(await self.entries(task_id)) + 1
        await asyncio.sleep(0)
        await self.db.transaction(
            lambda db: db.execute(
                "INSERT OR REPLACE INTO task_journal (task_id, seq, kind, data, at) VALUES (?, ?, ?, ?, ?)",
                (task_id, seq, kind, json.dumps(data), time.time()),
            )
        )


class TurnDropped(SQLiteTaskJournal):
    async def append(self, task_id: str, kind: str, data: dict[str, Any]) -> None:
        await super().append(task_id, kind, {k: v for k, v in data.items() if k != "turn"})


class TurnAssumed(SQLiteTaskJournal):
    """Fills in a turn the row did not have: an old journal's rows all land in turn 0."""

    async def append(self, task_id: str, kind: str, data: dict[str, Any]) -> None:
        await super().append(task_id, kind, {"turn": 0, **data} if "id" in data else data)


class PruneNothing(SQLiteTaskJournal):
    async def prune(self, older_than: float) -> None:
        return None


class JournalForgetsOnClose(SQLiteTaskJournal):
    async def close(self) -> None:
        await self.db.transaction(lambda db: db.execute("DELETE FROM task_journal"))
        await super().close()


# --- trace stores ----------------------------------------------------------------------------------


class GetByPrefix(SQLiteTraceStore):
    async def get(self, task_id: str) -> dict[str, Any] | None:
        found = await self.ids_starting(task_id, 1)
        return await super().get(found[0]) if found else None


class FirstRecordWins(SQLiteTraceStore):
    async def record(self, trace: dict[str, Any]) -> None:
        if await self.get(trace["task_id"]) is None:
            await super().record(trace)


class TracesOldestFirst(SQLiteTraceStore):
    async def list(self, **filters: Any) -> builtins.list[TraceSummary]:
        return builtins.list(reversed(await super().list(**filters)))


class PausedCountsAsFailed(SQLiteTraceStore):
    async def list(self, **filters: Any) -> builtins.list[TraceSummary]:
        if filters.pop("failed", None) is True:
            return [s for s in await super().list(**filters) if not s["ok"]]
        return await super().list(**filters)


class PrefixAsLike(SQLiteTraceStore):
    async def ids_starting(self, prefix: str, limit: int = 10) -> builtins.list[str]:
        rows = await self.db.transaction(
            lambda db: db.execute(
                "SELECT task_id FROM traces WHERE task_id LIKE ? ORDER BY task_id LIMIT ?",
                (f"{prefix}%", limit),
            ).fetchall()
        )
        return [row[0] for row in rows]


class PruneOneTooMany(SQLiteTraceStore):
    async def prune(self, older_than: float) -> None:
        await super().prune(older_than + 1e-3)


class TraceKeepsSecrets(SQLiteTraceStore):
    async def record(self, trace: dict[str, Any]) -> None:
        await super().record(trace)
        await self.db.transaction(
            lambda db: db.execute(
                "UPDATE traces SET data = ?, reply = ? WHERE task_id = ?",
                (json.dumps(trace), trace.get("reply") or "", trace["task_id"]),
            )
        )


class TracesForgetOnClose(SQLiteTraceStore):
    async def close(self) -> None:
        await self.db.transaction(lambda db: db.execute("DELETE FROM traces"))
        await super().close()


# --- approvals stores ------------------------------------------------------------------------------


class ApprovalEveryTime(SQLiteInteractions):
    """Makes a new approval each time a call asks: a re-run never finds its decision."""

    async def approval(self, task_id: str, call_id: str, tool: str, arguments: str, caller: Caller | None,
                       conversation: str | None) -> Pending:  # fmt: skip
        return await super().approval(task_id, f"{call_id}~{uuid.uuid4().hex[:6]}", tool, arguments, caller,
                                      conversation)  # fmt: skip


class ApproveAlways(SQLiteInteractions):
    async def decide(self, pending_id: str, decider: Caller, approve: bool) -> Pending:
        return await super().decide(pending_id, decider, True)


class DecidesAgain(SQLiteInteractions):
    async def decide(self, pending_id: str, decider: Caller, approve: bool) -> Pending:
        await self.db.transaction(
            lambda db: db.execute(
                "UPDATE pending SET status = 'pending' WHERE id = ? AND status IN ('approved', 'rejected')",
                (pending_id,),
            )
        )
        return await super().decide(pending_id, decider, approve)


class DecisionReadThenWritten(SQLiteInteractions):
    """Checks the record, lets others run, then writes the decision: racing decisions all win."""

    async def decide(self, pending_id: str, decider: Caller, approve: bool) -> Pending:
        found = await self.get(pending_id)
        if found is None or not found.open:
            return await super().decide(pending_id, decider, approve)  # refused as usual
        await asyncio.sleep(0)
        status = "approved" if approve else "rejected"
        await self.db.transaction(
            lambda db: db.execute(
                "UPDATE pending SET status = ?, decided_by = ? WHERE id = ?",
                (status, decider.user_id, pending_id),
            )
        )
        return dataclasses.replace(found, status=status, decided_by=decider.user_id)


class AnyoneDecides(SQLiteInteractions):
    async def decide(self, pending_id: str, decider: Caller, approve: bool) -> Pending:
        return await super().decide(pending_id, Caller(decider.user_id, ADMIN, decider.channel), approve)


class QuestionsDecided(SQLiteInteractions):
    async def decide(self, pending_id: str, decider: Caller, approve: bool) -> Pending:
        found = await self.get(pending_id)
        if found is not None and found.kind == "question":
            return dataclasses.replace(found, status="approved")
        return await super().decide(pending_id, decider, approve)


class NeverExpires(SQLiteInteractions):
    async def expire_due(self, now: float | None = None) -> list[Pending]:
        return []


class ExpiryOnlyBySweep(SQLiteInteractions):
    """Checks expiry only in `expire_due`: a decision that comes late, before the sweep, is taken."""

    async def decide(self, pending_id: str, decider: Caller, approve: bool) -> Pending:
        now, self.now = self.now, lambda: 0.0
        try:
            return await super().decide(pending_id, decider, approve)
        finally:
            self.now = now


class AnyoneAnswers(SQLiteInteractions):
    async def answer(self, conversation: str, sender: str, text: str, *, channel: str) -> Pending | None:
        for asked in await self.list("pending"):
            if asked.kind == "question" and asked.conversation == conversation:
                return await super().answer(conversation, asked.requested_by, text, channel=asked.channel)
        return None


class ListedOldestFirst(SQLiteInteractions):
    async def list(self, status: str | None = "pending", limit: int = 100) -> builtins.list[Pending]:
        return builtins.list(reversed(await super().list(status, limit)))


class ResumeOnEveryRecord(SQLiteInteractions):
    async def set_resume(self, task_id: str, resume: dict[str, Any]) -> None:
        payload = json.dumps(resume)
        await self.db.transaction(
            lambda db: db.execute("UPDATE pending SET resume = ? WHERE task_id = ?", (payload, task_id))
        )


class RecordedOnce(SQLiteInteractions):
    """Inserts a record decided elsewhere but never updates it: the list shows it waiting forever."""

    async def record(self, pending: Pending) -> None:
        if await self.get(pending.id) is None:
            await super().record(pending)


class ApprovalsForgetOnClose(SQLiteInteractions):
    async def close(self) -> None:
        await self.db.transaction(lambda db: db.execute("DELETE FROM pending"))
        await super().close()


# --- schedule stores -------------------------------------------------------------------------------


class AddReplaces(SQLiteScheduleStore):
    """`add` overwrites: a tool call run again after a crash reschedules the job it created."""

    async def add(self, job: Job, limits: JobLimits | None = None) -> Job:
        return await self.replace(job)


class QuotaCountedApart(SQLiteScheduleStore):
    """Counts the creator's jobs in one transaction and inserts in another: adds racing in between
    all see room, and all are stored."""

    async def add(self, job: Job, limits: JobLimits | None = None) -> Job:
        if limits is not None:
            held = await self.db.transaction(lambda db: _held(db, job))
            await asyncio.sleep(0.01)
            if (refused := limits.refusal(*held)) is not None:
                raise refused
        return await super().add(job)


class ReplaceKeepsTheOld(SQLiteScheduleStore):
    """`replace` adds only: an operator's changed job keeps its old definition."""

    async def replace(self, job: Job) -> Job:
        return await self.add(job)


class JobsByCreation(SQLiteScheduleStore):
    """Lists jobs in the order they were created, not by their next fire time."""

    async def jobs(self, conversation: str | None = None, *, active_only: bool = True) -> list[Job]:
        return sorted(await super().jobs(conversation, active_only=active_only), key=lambda j: j.created_at)


class ListsEveryStatus(SQLiteScheduleStore):
    """Lists cancelled and finished jobs among the active ones."""

    async def jobs(self, conversation: str | None = None, *, active_only: bool = True) -> list[Job]:
        return await super().jobs(conversation, active_only=False)


class CancelNotStored(SQLiteScheduleStore):
    """Answers "cancelled" but never writes it: the job fires on."""

    async def cancel(self, job_id: str) -> Job | None:
        job = await self.get(job_id)
        if job is None or job.status != "active":
            return None
        job.status, job.next_fire = "cancelled", None
        return job


class MessageNotKept(SQLiteScheduleStore):
    """Hands the fire's message to the caller but keeps it out of the inbox: a crash after the claim
    loses the fire."""

    async def claim_due(
        self, now: float, grace: float, limit: int, refusal: RefusalCheck | None = None
    ) -> list[Fire]:
        fires = await super().claim_due(now, grace, limit, refusal)
        ids = [fire.message.id for fire in fires if fire.message is not None]
        await self.db.transaction(
            lambda db: db.executemany("DELETE FROM inbox WHERE id = ?", [(i,) for i in ids])
        )
        return fires


class ClaimsEarly(SQLiteScheduleStore):
    """Fires what is due within the next minute, early."""

    async def claim_due(
        self, now: float, grace: float, limit: int, refusal: RefusalCheck | None = None
    ) -> list[Fire]:
        return await super().claim_due(now + 60, grace, limit, refusal)


class GraceIgnored(SQLiteScheduleStore):
    """Runs a missed fire however late it is."""

    async def claim_due(
        self, now: float, grace: float, limit: int, refusal: RefusalCheck | None = None
    ) -> list[Fire]:
        return await super().claim_due(now, float("inf"), limit, refusal)


class RefusalIgnored(SQLiteScheduleStore):
    """Never asks whether the creator still holds the role the job was created with."""

    async def claim_due(
        self, now: float, grace: float, limit: int, refusal: RefusalCheck | None = None
    ) -> list[Fire]:
        return await super().claim_due(now, grace, limit, None)


class LimitIgnored(SQLiteScheduleStore):
    """Claims everything due in one transaction, however many."""

    async def claim_due(
        self, now: float, grace: float, limit: int, refusal: RefusalCheck | None = None
    ) -> list[Fire]:
        return await super().claim_due(now, grace, 1_000_000, refusal)


class FiresOldestFirst(SQLiteScheduleStore):
    async def fires(self, job_id: str, limit: int = 20) -> list[Fire]:
        return list(reversed(await super().fires(job_id, limit)))


class PrunesNothing(SQLiteScheduleStore):
    async def prune(self, older_than: float) -> int:
        return 0


class DueReadThenClaimed(SQLiteScheduleStore):
    """Reads the due jobs in one transaction and claims each in another, from what it read: a
    claimer racing it in between has moved the job on, and this one claims the fire again."""

    async def claim_due(
        self, now: float, grace: float, limit: int, refusal: RefusalCheck | None = None
    ) -> list[Fire]:
        rows = await self.db.transaction(
            lambda db: db.execute(
                "SELECT job FROM schedule_jobs WHERE status = 'active' AND next_fire <= ? "
                "ORDER BY next_fire, id LIMIT ?",
                (now, limit),
            ).fetchall()
        )
        fires: list[Fire] = []
        for (data,) in rows:
            await asyncio.sleep(0)
            job = _job_of(data)
            fires += await self.db.transaction(lambda db, job=job: _claim_once(db, job, now, grace, refusal))
        return fires


def _claim_once(
    db: sqlite3.Connection, job: Job, now: float, grace: float, refusal: RefusalCheck | None
) -> list[Fire]:
    """The fires of `job` as read earlier, written without looking whether it moved on since."""
    fires = [_record(db, fire) for fire in plan_claim(job, now, grace, refusal)]
    _write(db, job)
    return fires


# --- the backends ----------------------------------------------------------------------------------


Dispatch = Callable[[GatewayStore, Runner, ApprovalDesk | None], Dispatcher]


def gateway(store: Callable[[Path], GatewayStore] = SQLiteGatewayStore,
            dispatcher: Dispatch = gateway_dispatcher) -> BackendFactory:  # fmt: skip
    """The SQLite backend with `store` for its gateway store and `dispatcher` for its inbox (its
    session and approvals stores are the real ones: the gateway and inbox suites use them)."""

    @asynccontextmanager
    async def factory(folder: Path) -> AsyncIterator[Backend]:
        path = folder / "gateway.db"
        yield Backend(
            gateway_store=lambda: store(path), dispatcher=dispatcher,
            session_store=lambda: SQLiteSessionStore(path),
            pending_store=lambda ttl, clock: SQLiteInteractions(path, approval_ttl=ttl, now=clock),
        )  # fmt: skip

    return factory


def sessions(store: type[InMemorySessionStore]) -> BackendFactory:
    @asynccontextmanager
    async def factory(folder: Path) -> AsyncIterator[Backend]:
        instance = store()
        yield Backend(session_store=lambda: instance)

    return factory


def journal(store: type[SQLiteTaskJournal]) -> BackendFactory:
    @asynccontextmanager
    async def factory(folder: Path) -> AsyncIterator[Backend]:
        yield Backend(journal=lambda: store(folder / "gateway.db"))

    return factory


def traces(store: type[SQLiteTraceStore]) -> BackendFactory:
    @asynccontextmanager
    async def factory(folder: Path) -> AsyncIterator[Backend]:
        yield Backend(trace_store=lambda: store(folder / "gateway.db"))

    return factory


def approvals(store: type[SQLiteInteractions]) -> BackendFactory:
    @asynccontextmanager
    async def factory(folder: Path) -> AsyncIterator[Backend]:
        yield Backend(
            pending_store=lambda ttl, clock: store(folder / "gateway.db", approval_ttl=ttl, now=clock)
        )

    return factory


def schedules(store: type[SQLiteScheduleStore]) -> BackendFactory:
    """The SQLite backend with `store` for its schedule store (its gateway store is the real one:
    the suite reads the inbox through it)."""

    @asynccontextmanager
    async def factory(folder: Path) -> AsyncIterator[Backend]:
        path = folder / "gateway.db"
        yield Backend(schedule_store=lambda: store(path), gateway_store=lambda: SQLiteGatewayStore(path))

    return factory


def _named(
    seam: str, classes: list[type[Any]], wrap: Callable[[Any], BackendFactory]
) -> dict[str, BackendFactory]:
    return {f"broken-{seam}-{cls.__name__}": wrap(cls) for cls in classes}


GATEWAY_STORES: list[type[SQLiteGatewayStore]] = [
    NoIdOnAccept, DedupByEventOnly, DedupByMessageOnly, CheckThenInsert,
    PendingNewestFirst, NoBacklog, KeepsWhatItWasGiven, DoneApartFromReplies, HistoryDropped, DoneOnceSeen,
    SentStaysPending, AttemptsNotCounted, DeadStaysInOutbox, DeadLetteredAgain, DeadLettersOldestFirst,
    ResendWithNewKey, ResendsNeverClaimed, AttemptsNeverReleased, CrashedIgnoresCount, SetAsideStillPending,
    CountsForgetSetAside, PruneDeletesWork, NonceAlwaysFresh, NoncesInMemory, WithdrawnStillRuns,
    LeftChatsInMemory, RepliesLoseTheirTopic, LastMembershipWins,
]  # fmt: skip
SESSION_STORES: list[type[InMemorySessionStore]] = [
    OneLogForAll, ReplyOfTheLastTurn, LogNewestFirst, TurnIdIgnored,
    TurnCheckedThenAppended, WindowIgnored, UpdateReturnsTheOldState, ReadYieldWrite, ChangesTheStoredState,
    HandsOutTheStoredLog, UpdateOnlyAdds, KeepsSecrets, ForgetsOnClose, PruneLeavesTheFold,
    PruneForgetsTheState,
]  # fmt: skip
JOURNALS: list[type[SQLiteTaskJournal]] = [
    EntriesByPrefix, EntriesNewestFirst, SequenceCountedFirst, TurnDropped, TurnAssumed, PruneNothing,
    JournalForgetsOnClose,
]  # fmt: skip
TRACE_STORES: list[type[SQLiteTraceStore]] = [
    GetByPrefix, FirstRecordWins, TracesOldestFirst, PausedCountsAsFailed, PrefixAsLike, PruneOneTooMany,
    TraceKeepsSecrets, TracesForgetOnClose,
]  # fmt: skip
APPROVALS_STORES: list[type[SQLiteInteractions]] = [
    ApprovalEveryTime, ApproveAlways, DecidesAgain, DecisionReadThenWritten, AnyoneDecides, QuestionsDecided,
    NeverExpires, ExpiryOnlyBySweep, AnyoneAnswers, ListedOldestFirst, ResumeOnEveryRecord, RecordedOnce,
    ApprovalsForgetOnClose,
]  # fmt: skip
SCHEDULE_STORES: list[type[SQLiteScheduleStore]] = [
    AddReplaces, ReplaceKeepsTheOld, JobsByCreation, ListsEveryStatus, CancelNotStored, MessageNotKept,
    ClaimsEarly, GraceIgnored, RefusalIgnored, LimitIgnored, FiresOldestFirst, DueReadThenClaimed,
    PrunesNothing, QuotaCountedApart,
]  # fmt: skip
DISPATCHERS: dict[str, Dispatch] = {
    "TwoTurnsAtOnce": two_turns_at_once, "AlwaysAccepting": AlwaysAccepting,
    "RepliesBackwards": replies_backwards, "DecisionWithoutResume": DecisionWithoutResume,
    "SendsOnce": sends_once,
}  # fmt: skip

# which suite each kind of backend below is for (test_contracts_fail_when_broken.py selects them)
SUITES = {
    "gw": "test_gateway_store_contract", "dispatch": "test_inbox_contract",
    "sessions": "test_session_store_contract", "journal": "test_journal_contract",
    "traces": "test_trace_store_contract", "approvals": "test_approvals_desk_contract",
    "schedules": "test_schedule_store_contract",
}  # fmt: skip
BROKEN: dict[str, BackendFactory] = {
    **_named("gw", GATEWAY_STORES, gateway),
    # the inbox suite, over stores whose bugs a channel would see and over dispatchers with one bug
    **_named("dispatch", [DedupByMessageOnly, NoBacklog, NonceAlwaysFresh], gateway),
    **{f"broken-dispatch-{name}": gateway(dispatcher=make) for name, make in DISPATCHERS.items()},
    **_named("sessions", SESSION_STORES, sessions),
    **_named("journal", JOURNALS, journal),
    **_named("traces", TRACE_STORES, traces),
    **_named("approvals", APPROVALS_STORES, approvals),
    **_named("schedules", SCHEDULE_STORES, schedules),
}
