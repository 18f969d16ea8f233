"""Durable task state (S7): every step of a running task is journaled before the next one.

A task is one run of the loop for one message. Before the loop takes its next step, the model's
response or the tool's result is on disk. When a process dies mid-task and the message is run
again under the same task id, the loop replays the journal instead of repeating work:

- recorded model responses are returned in order instead of calling the model again;
- a tool call with a recorded result gets that result back; the tool does not run again. A
  result is found by its turn (the model response it answers) and its call id, and only for the
  same tool and arguments: two turns that reuse an id never get each other's results. Rows written
  before turns were journaled are matched by their id's order of appearance;
- a tool call that started but has no result (the crash hit while it ran) runs again only if
  it is read-only (level 0) or declared idempotent; otherwise the model is told that its outcome
  is unknown, and decides what to do;
- a task that had finished returns its recorded reply;
- a call that paused the task for a person (tasks/pending.py) is journaled as paused, not as
  done: run again, it asks its approval or question anew, and finds the decision or the answer.

The loop itself knows nothing of this: `resume` wraps the model client and the tool registry.
Where nodes share the journal (PostgreSQL), a turn's writes are fenced by its claim (tasks/fence.py):
a write once another node has taken the conversation raises `ClaimLost`, which ends the task —
the tool's start is written before it runs, so a node that lost its claim runs no tool.
`TaskJournal` is the seam, a protocol of four methods (docs/seams.md; every implementation passes
tests/contracts/test_journal_contract.py); `SQLiteTaskJournal` is the embedded default.
Responses and results are journaled in the one record format of kernel/records.py (rows written before
it still read).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..kernel.loop import PAUSES
from ..kernel.messages import ModelResponse, ToolCall
from ..kernel.model import ModelClient, ModelWrapper, TextCallback
from ..kernel.records import outcome_from, outcome_record, record_of, response_from
from ..kernel.tools import ToolContext, ToolRegistry
from ..kernel.tools.registry import DEFAULT_TOOL_TIMEOUT, RegistryWrapper, ToolOutcome
from ..kernel.tools.results import DEFAULT_MAX_CHARS, error_result
from ..storage import SQLiteDatabase

MIGRATIONS = {
    1: """
    CREATE TABLE task_journal (
        task_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,          -- model_response | tool_started | tool_paused | tool_result | finished
        data TEXT NOT NULL,
        at REAL NOT NULL,
        PRIMARY KEY (task_id, seq)
    )
    """,
}

UNKNOWN_OUTCOME = (
    "the outcome of this call is unknown: the service restarted while the tool was running, and it "
    "may or may not have taken effect. Do not assume either; check before calling it again."
)


@dataclass
class JournalEntry:
    kind: str
    data: dict[str, Any]


class TaskJournal(Protocol):
    """Each task's steps, in the order they were written. `data` is a JSON object (kernel/records.py)."""

    async def entries(self, task_id: str) -> list[JournalEntry]:
        """The task's entries in the order they were appended ([] for a task never journaled)."""
        ...

    async def append(self, task_id: str, kind: str, data: dict[str, Any]) -> None:
        """Add one entry after the task's last one; durable when it returns."""
        ...

    async def prune(self, older_than: float) -> None:
        """Forget the tasks whose last entry is older than `older_than`: whole tasks, never a part."""
        ...

    async def close(self) -> None:
        """Release the journal (another instance may open the same storage again)."""
        ...


async def export_task(journal: TaskJournal, task_id: str) -> dict[str, Any]:
    """A task's whole state as JSON-ready data (a snapshot that `load_task` accepts)."""
    entries = await journal.entries(task_id)
    return {"task_id": task_id, "entries": [{"kind": e.kind, "data": e.data} for e in entries]}


async def load_task(journal: TaskJournal, snapshot: dict[str, Any]) -> str:
    """Import an exported snapshot (its task must not exist in `journal` yet); returns the task id."""
    task_id = str(snapshot["task_id"])
    if await journal.entries(task_id):
        raise ValueError(f"task {task_id!r} already has a journal")
    for entry in snapshot["entries"]:
        await journal.append(task_id, str(entry["kind"]), dict(entry["data"]))
    return task_id


class SQLiteTaskJournal(TaskJournal):
    def __init__(self, path: str | Path) -> None:
        self.db = SQLiteDatabase.shared(path)
        self.db.migrate("journal", MIGRATIONS)

    async def entries(self, task_id: str) -> list[JournalEntry]:
        rows = await self.db.transaction(
            lambda db: db.execute(
                "SELECT kind, data FROM task_journal WHERE task_id = ? ORDER BY seq", (task_id,)
            ).fetchall()
        )
        return [JournalEntry(kind, json.loads(data)) for kind, data in rows]

    async def append(self, task_id: str, kind: str, data: dict[str, Any]) -> None:
        payload = json.dumps(data, ensure_ascii=False)

        def insert(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO task_journal (task_id, seq, kind, data, at) SELECT ?, "
                "COALESCE(MAX(seq), 0) + 1, ?, ?, ? FROM task_journal WHERE task_id = ?",
                (task_id, kind, payload, time.time(), task_id),
            )

        await self.db.transaction(insert)

    async def prune(self, older_than: float) -> None:
        await self.db.transaction(
            lambda db: db.execute(
                "DELETE FROM task_journal WHERE task_id IN "
                "(SELECT task_id FROM task_journal GROUP BY task_id HAVING MAX(at) < ?)",
                (older_than,),
            )
        )

    async def close(self) -> None:
        await self.db.close()


CallKey = tuple[int | None, str]  # (turn, call id); turn None: a row journaled before turns were


@dataclass
class Replay:
    """What a journal says about a task, ready for the wrappers."""

    responses: list[ModelResponse]
    results: dict[CallKey, list[ToolOutcome]]  # a turn's own results; an old row's id: in order
    started: set[CallKey]  # calls that started and have no result
    finished: dict[str, Any] | None

    def result(self, turn: int, call: ToolCall) -> ToolOutcome | None:
        """The recorded result of this turn's `call`, if the same tool ran with the same arguments."""
        own, old = self.results.get((turn, call.id)), self.results.get((None, call.id))
        found = own or old
        if not found or found[0].call.key != call.key:
            return None
        return found[0] if own else found.pop(0)  # an old row answers the id's next use only

    def was_started(self, turn: int, call: ToolCall) -> bool:
        return (turn, call.id) in self.started or (None, call.id) in self.started


def replay_of(entries: list[JournalEntry]) -> Replay:
    replay = Replay([], {}, set(), None)
    for entry in entries:
        data = entry.data
        key: CallKey = (data.get("turn"), data["id"]) if "id" in data else (None, "")
        if entry.kind == "model_response":
            replay.responses.append(response_from(data))
        elif entry.kind == "tool_started":
            replay.started.add(key)
        elif entry.kind == "tool_paused":
            replay.started.discard(key)
        elif entry.kind == "tool_result":
            replay.started.discard(key)
            replay.results.setdefault(key, []).append(outcome_from(data))
        elif entry.kind == "finished":
            replay.finished = data
    return replay


class JournaledModel(ModelWrapper):
    """Returns the journal's responses in order, then calls the model and journals each answer."""

    def __init__(self, inner: ModelClient, journal: TaskJournal, task_id: str, recorded: list[ModelResponse]):
        super().__init__(inner)
        self.journal, self.task_id = journal, task_id
        self._recorded = list(recorded)
        self.turn = -1  # the index of the latest response, recorded or new: the turn its calls belong to

    async def complete(
        self,
        messages: list[Any],
        tools: list[dict[str, Any]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        self.turn += 1
        if self._recorded:
            return self._recorded.pop(0)
        response = await self.inner.complete(messages, tools, on_text=on_text)
        await self.journal.append(self.task_id, "model_response", record_of(response))
        return response


class JournaledTools(RegistryWrapper):
    """The agent's tools, with every execution journaled (start, then result) and replayed on resume."""

    def __init__(
        self,
        registry: ToolRegistry,
        journal: TaskJournal,
        task_id: str,
        replay: Replay,
        model: JournaledModel | None = None,
    ) -> None:
        super().__init__(registry)  # only `execute` differs
        self.journal, self.task_id, self.replay = journal, task_id, replay
        self.model = model  # whose `turn` the calls belong to; none (a workflow's steps): turn -1

    async def execute(
        self,
        call: ToolCall,
        *,
        timeout: float = DEFAULT_TOOL_TIMEOUT,
        max_chars: int = DEFAULT_MAX_CHARS,
        context: ToolContext | None = None,
    ) -> ToolOutcome:
        turn = self.model.turn if self.model is not None else -1
        recorded = self.replay.result(turn, call)
        if recorded is not None:
            return recorded
        declared = self.get(call.name)
        step = {"id": call.id, "turn": turn}
        safe_again = declared is not None and (declared.level == 0 or declared.idempotent)
        if self.replay.was_started(turn, call) and not safe_again:
            outcome = ToolOutcome(call, error_result(UNKNOWN_OUTCOME), ok=False, error="outcome_unknown")
        else:
            await self.journal.append(self.task_id, "tool_started", {**step, "name": call.name})
            outcome = await super().execute(call, timeout=timeout, max_chars=max_chars, context=context)
        if outcome.error in PAUSES:  # nothing ran: when the task is run again, so is this call
            await self.journal.append(self.task_id, "tool_paused", {**step, "reason": outcome.error})
            return outcome
        await self.journal.append(self.task_id, "tool_result", {**outcome_record(outcome), "turn": turn})
        return outcome


async def resume(
    journal: TaskJournal, task_id: str, model: ModelClient, registry: ToolRegistry
) -> tuple[ModelClient, ToolRegistry]:
    """The model and tools for running `task_id`, journaled, and replaying what the journal holds.

    A finished task replays to the end without calling the model or any tool, which rebuilds its
    messages and reply exactly as they were.
    """
    replay = replay_of(await journal.entries(task_id))
    journaled = JournaledModel(model, journal, task_id, replay.responses)
    return journaled, JournaledTools(registry, journal, task_id, replay, journaled)
