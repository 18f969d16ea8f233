"""Approvals and pauses, declared once: the record and the three seams it crosses.

A call that needs a person (a `confirm=True` tool, every level-2 tool, the `clarify` tool) does not
run when the model asks for it; the kernel asks for an approval or an answer instead and, when
none is in yet, the task pauses (tasks/pending.py tells the whole story). Three parties meet here,
each seeing only what it needs:

- the kernel (kernel/tools/registry.py, tools/clarify.py) asks: `Interactions` — `approval`, `question`;
- the store where pauses wait (the gateway's database): `PendingStore`, an `Interactions` that
  also records decisions and answers, expires, lists, and remembers the message to run again;
- the gateway, which takes a person's decision from a channel by user id and channel and expires
  what is due: `ApprovalDesk` (gateway/runner.py's `AgentRunner` is one), handed to the `Gateway`.

Why one module: the record and these protocols used to be spread over the tasks, tools and gateway
packages, with the gateway probing its runner for methods; now each side is typed against one
declaration. `tasks/pending.py` keeps the SQLite and terminal implementations.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Protocol

from .messages import JSON, ToolCall
from .tools.permissions import ADMIN, Caller, qualified

APPROVAL_TTL = 600.0  # seconds an approval waits for a decision


@dataclass
class Pending:
    """One approval or question, as stored."""

    id: str
    kind: str  # "approval" | "question"
    task_id: str
    call_id: str
    tool: str
    arguments: str  # JSON text of the call's arguments; for a question, the question
    requested_by: str
    channel: str = ""
    conversation: str | None = None
    created_at: float = field(default_factory=time.time)
    expires_at: float | None = None
    status: str = "pending"
    decided_by: str | None = None
    decided_at: float | None = None
    answer: str | None = None
    resume: dict[str, JSON] | None = None

    @property
    def open(self) -> bool:
        return self.status == "pending"

    def covers(self, call: ToolCall) -> bool:
        """Whether this approval is the one of `call`: the same tool with the same arguments (in
        any spelling). A decision covers exactly one call of its task, never a look-alike that
        reuses its id."""
        return self.kind == "approval" and ToolCall(self.call_id, self.tool, self.arguments).key == call.key

    @property
    def requester(self) -> str:
        """Who asked, qualified by channel (`feishu:ou_abc`, as `Caller.identity`); "" for nobody."""
        return qualified(self.channel, self.requested_by) if self.requested_by else ""

    def summary(self) -> dict[str, JSON]:
        """What a channel shows: never the resume data (it holds the whole original message)."""
        data = asdict(self)
        data.pop("resume")
        return data


class DecisionRefused(Exception):
    """A decision that is not taken: `reason` is a key of kernel/replies.py (approval_*)."""

    def __init__(self, reason: str, pending: Pending | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.pending = pending


class Interactions(ABC):
    """Where approvals and questions wait. Keyed by (task id, call id), so a re-run finds its own."""

    @abstractmethod
    async def approval(self, task_id: str, call_id: str, tool: str, arguments: str, caller: Caller | None,
                       conversation: str | None) -> Pending:  # fmt: skip
        """The approval of this call: decided, or pending (created now if it did not exist)."""

    @abstractmethod
    async def question(self, task_id: str, call_id: str, question: str, caller: Caller | None,
                       conversation: str | None) -> Pending:  # fmt: skip
        """The question of this call: answered, or pending (created now if it did not exist)."""


class PendingStore(Interactions):
    """Where pauses wait and are decided: the gateway's side of the record (tasks/pending.py)."""

    @abstractmethod
    async def decide(self, pending_id: str, decider: Caller, approve: bool) -> Pending:
        """Approve or reject; raises `DecisionRefused` (who may decide, expiry, decided already)."""

    @abstractmethod
    async def answer(self, conversation: str, sender: str, text: str, *, channel: str) -> Pending | None:
        """Record `text` as the answer to the open question that `sender` on `channel` was asked in
        `conversation`, if there is one."""

    @abstractmethod
    async def expire_due(self, now: float | None = None) -> list[Pending]:
        """Expire the undecided approvals past their time; the expired ones."""

    @abstractmethod
    async def get(self, pending_id: str) -> Pending | None:
        """One record by id."""

    @abstractmethod
    async def open_for_task(self, task_id: str) -> list[Pending]:
        """The task's records still waiting, oldest first."""

    @abstractmethod
    async def list(self, status: str | None = "pending", limit: int = 100) -> list[Pending]:
        """For consoles: the most recent records, optionally of one status."""

    @abstractmethod
    async def set_resume(self, task_id: str, resume: dict[str, JSON]) -> None:
        """Remember the message that runs the task again once its pauses are decided."""

    @abstractmethod
    async def close(self) -> None:
        """Release the store."""


class ApprovalDesk(Protocol):
    """What the gateway needs to take decisions from channels: passed to the `Gateway`."""

    async def decide(self, pending_id: str, user_id: str, channel: str, approve: bool) -> Pending:
        """A person's decision (by platform id and channel); raises `DecisionRefused`."""
        ...

    async def expire_due(self) -> list[Pending]:
        """Expire what is past its time; the expired records (their tasks resume)."""
        ...


def may_decide(pending: Pending, decider: Caller) -> bool:
    """Only the person who started the task — the same id on the same channel — or an admin (whose
    role, too, comes from a channel-qualified identity: kernel/tools/permissions.py)."""
    if decider.role == ADMIN:
        return True
    return bool(decider.identity) and decider.identity == pending.requester
