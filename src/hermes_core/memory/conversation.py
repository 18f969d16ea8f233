"""`ConversationMemory`: what the agent sees of a conversation on each call, and what is kept after.

    prompt = await memory.prepare(conversation, text, agent.client)
    session = prompt.session()                      # the window, plus notes for the turn's context
    result = await agent.run(text, session=session)
    await memory.commit(conversation, session.messages[len(prompt.window):], result)
    await memory.keep_context(prompt, session)      # optional: where an unchanged context goes next turn

The gateway does not call `commit`: it takes `memory.turn(...)` (the turn's messages keyed by its
task id) and stores it in the transaction that marks the message done (gateway/store.py), so a
crash can neither lose a finished turn nor store it twice.

`Agent.run` never learns about storage: it gets a `Session` whose `messages` are the window (the
newest whole turns, at most `window_turns`, within `budget_tokens` together with the notes) and
whose `notes` and `hints` go into context messages after the history (agent.py `turn_messages`,
so the system prompt and the history stay a prefix a provider's cache reuses). The notes are the
state snapshot (facts, constraints, done and pending steps, recorded by the model through the
`remember` tool), the summary of folded turns and the pinned original goal once its turn has left
the window; the hints are long-term examples when a hook is given, less those whose reply the
window still shows. The context messages a turn gave are kept in the state (`keep_context`) with
where they stand: later turns give them again there and add one only for what they lack (the
notes when they changed, the examples not given yet: agent.py `context_update`). `/forget` and
`/new` take them back.

Folding: when the unfolded history no longer fits (more turns than the window, or more tokens than
the budget leaves), the oldest turns are replaced by a summary the model writes (≤ 200 characters,
covering the previous summary too) and the window restarts at a quarter of its size. A fold
rewrites the prompt after the system prompt and tools, so nothing after them is cached for that
one request; folding in large steps keeps the new prefix for three quarters of a window of turns
(with the defaults, 24 turns and 8,000 tokens, and short turns: the first fold at turn 25, then
one every 19 turns), and pays a summary call as rarely. If the summary call fails or comes back empty, those
turns are simply dropped (plain truncation): a turn never fails because of memory.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from ..agent import Agent, Session
from ..kernel.loop import RunResult
from ..kernel.messages import JSON, Message
from ..kernel.model import ModelClient
from ..kernel.replies import Language, detect_language, fixed_reply
from ..kernel.tools import Tool, ToolContext, ToolError, tool
from ..sessions.context import Turn, estimate_tokens, flatten, history_tokens, newest_turns, split_turns
from ..sessions.store import ConversationState, Fold, SessionStore, TurnAppend

if TYPE_CHECKING:
    from .longterm import Outcome

log = logging.getLogger("hermes_core.sessions")

SUMMARY_CHARS = 200  # one fold's summary: short enough to inject on every call
GOAL_CHARS = 500  # a pinned goal longer than this is shortened, so a pasted document cannot eat the budget
NOTE_CHARS = 200  # one remembered fact or step
MAX_DONE = 10  # completed steps kept; older ones leave first when the snapshot needs room
EXAMPLE_SHARE = 4  # long-term examples may use at most 1/4 of the budget
TRANSCRIPT_CHARS = 8000  # how much of the folded turns the summary call reads (the newest part)
REMEMBER = "remember"
SUMMARY_INSTRUCTIONS = (
    "You compress a conversation for an assistant's memory. Write ONE summary of at most 200 characters, "
    "in the conversation's language, covering the summary so far and the new messages: what the user "
    "wants, decisions, names, numbers, results and open questions. Reply with the summary only."
)
NoteKind = Literal["fact", "pending", "done"]
_SECTIONS: tuple[Literal["facts", "pending", "done"], ...] = ("facts", "pending", "done")
_COMMAND = re.compile(r"\s*[/／](memory|记忆|forget|忘记)(?:\s+(.*?))?\s*", re.IGNORECASE | re.DOTALL)


class LongTermHook(Protocol):
    """What memory needs of a long-term store (`hermes_core.memory.LongTermMemory` is one)."""

    async def relevant(self, owner: str, query: str, k: int) -> list[Outcome]: ...
    def format_examples(self, outcomes: list[Outcome], language: str = "en") -> str: ...
    async def record(self, owner: str, task_type: str, params: JSON, result: str) -> object: ...
    async def prune(self, older_than: float) -> int: ...


@dataclass
class Prompt:
    """What one turn of a conversation is given, and the fold it caused (for the trace)."""

    conversation: str
    window: list[Message]
    notes: str
    fold: Fold | None = None
    start: int = 0  # the log index of the window's first message
    hints: str = ""  # long-term examples
    contexts: list[tuple[int, str, str]] = field(default_factory=list)  # given, within the window

    def session(self) -> Session:
        return Session(
            id=self.conversation, messages=list(self.window), notes=self.notes, hints=self.hints,
            contexts=list(self.contexts),
        )  # fmt: skip


class ConversationMemory:
    def __init__(
        self,
        store: SessionStore,
        *,
        window_turns: int = 24,
        budget_tokens: int = 8000,
        fold: bool = True,
        long_term: LongTermHook | None = None,
        examples: int = 3,
    ) -> None:
        self.store = store
        self.window_turns = window_turns
        self.budget_tokens = budget_tokens
        self.fold = fold
        self.long_term = long_term
        self.examples = examples
        self.remember_tool = self._remember_tool()

    def attach(self, agent: Agent) -> None:
        """Offer the `remember` tool to the agent (once)."""
        existing = agent.registry.get(REMEMBER)
        if existing is None:
            agent.register_tool(self.remember_tool)
        elif existing is not self.remember_tool:
            raise ValueError(f"the agent already has a {REMEMBER!r} tool: use one Agent per memory")

    # -- one turn ------------------------------------------------------------------------------
    async def prepare(self, conversation: str, text: str, model: ModelClient | None = None) -> Prompt:
        """Load the conversation, fold what no longer fits, and build the window and the notes."""
        loaded = await self.store.load(conversation)
        state, turns = loaded.state, split_turns(loaded.messages)
        goal = _shorten(state.goal or _first_user_text(loaded.messages), GOAL_CHARS)
        outcomes = await self._outcomes(conversation, text)
        examples = self._format(outcomes, text)
        # what the history may use: the budget minus the notes, with the goal pinned and room for a new
        # summary (≤ SUMMARY_CHARS characters, so at most as many tokens)
        room = self.budget_tokens - estimate_tokens(render_notes(state, goal, examples)) - SUMMARY_CHARS
        fold = None
        if len(turns) > self.window_turns or history_tokens(flatten(turns)) > room:
            kept = self._kept_on_fold(turns, room)
            state, fold = await self._fold(conversation, state, turns[: len(turns) - len(kept)], model)
            turns = kept
        notes = render_notes(state, goal if state.folded else "", "")
        window = flatten(newest_turns(turns, self.window_turns, self.budget_tokens - estimate_tokens(notes)))
        # an outcome whose reply the window still holds is in front of the model already
        replies = [str(m.get("content") or "") for m in window if m.get("role") == "assistant"]
        hints = self._format([o for o in outcomes if not _shown(o, replies)], text)
        start = loaded.state.folded + len(loaded.messages) - len(window)
        given = [(at - start, n, h) for at, n, h in state.contexts if 0 <= at - start <= len(window)]
        return Prompt(conversation, window, notes, fold, start, hints, given)

    async def keep_context(self, prompt: Prompt, session: Session) -> None:
        """Note the context messages the turn gave and where they stand, when that changed, so that
        the next turn gives them again there (agent.py `context_update`); one write only then."""
        if session.contexts == prompt.contexts:
            return
        given = [(prompt.start + at, notes, hints) for at, notes, hints in session.contexts]

        def place(state: ConversationState) -> None:
            state.contexts = given

        await self.store.update_state(prompt.conversation, place)

    async def commit(
        self,
        conversation: str,
        messages: list[Message],
        result: RunResult | None = None,
        *,
        turn_id: str | None = None,
    ) -> None:
        """Store the turn's messages (once per `turn_id`); tell the long-term hook about it (`learn`)."""
        await self.store.append(conversation, messages, turn_id=turn_id)
        await self.learn(conversation, result)

    def turn(self, conversation: str, messages: list[Message], turn_id: str | None) -> TurnAppend:
        """The turn's messages, for the gateway to store with the message's done mark (store.py)."""
        return TurnAppend(self.store, conversation, turn_id, messages)

    async def learn(self, conversation: str, result: RunResult | None) -> None:
        """Tell the long-term hook about a finished task that used tools (a hint: never fails)."""
        if result is not None and result.ok and self.long_term is not None:
            used = [o for o in result.tool_calls if o.arguments is not None and o.call.name != REMEMBER]
            if used:
                task_type = "+".join(sorted({o.call.name for o in used}))
                try:
                    await self.long_term.record(
                        conversation, task_type, [o.arguments for o in used], result.reply[:500]
                    )
                except Exception:  # long-term memory is a hint; losing one must not fail the turn
                    log.exception("recording the outcome of %s failed", conversation)

    def _kept_on_fold(self, turns: list[Turn], room: int) -> list[Turn]:
        """The turns that stay unfolded: a quarter of the window when folding, so the folded prefix
        then stays the same for three quarters of a window of turns (a prompt cache serves it) and
        the next summary call is as far away; the whole window when only truncating."""
        if self.fold:
            return newest_turns(turns, max(1, self.window_turns // 4), max(0, room) // 4)
        return newest_turns(turns, self.window_turns, room)

    async def _fold(
        self, conversation: str, state: ConversationState, dropped: list[Turn], model: ModelClient | None
    ) -> tuple[ConversationState, Fold | None]:
        messages = flatten(dropped)
        record = None
        if self.fold:
            try:
                summary = await summarize(model, state.summary, dropped)
                record = Fold(summary, len(dropped), len(messages), time.time())
                log.info("folded %d turn(s) of %s into: %s", len(dropped), conversation, summary)
            except Exception as exc:  # the summary is an optimisation: truncate instead, never fail
                log.warning("folding %s failed, truncating instead: %r", conversation, exc)
                reason = f"{type(exc).__name__}: {exc}"[:200]
                record = Fold("", len(dropped), len(messages), time.time(), fallback=reason)
        first_goal = _first_user_text(messages)

        def apply(current: ConversationState) -> None:
            current.goal = current.goal or first_goal
            current.folded += len(messages)
            if record is not None:
                current.folds.append(record)
                current.summary = record.summary or current.summary

        return await self.store.update_state(conversation, apply), record

    async def _outcomes(self, conversation: str, text: str) -> list[Outcome]:
        if self.long_term is None or self.examples <= 0:
            return []
        try:
            return await self.long_term.relevant(conversation, text, self.examples)
        except Exception:
            log.exception("long-term examples for %s failed", conversation)
            return []

    def _format(self, outcomes: list[Outcome], text: str) -> str:
        if not outcomes or self.long_term is None:
            return ""
        try:
            block = self.long_term.format_examples(outcomes, language=detect_language(text))
        except Exception:
            log.exception("formatting long-term examples failed")
            return ""
        lines = block.splitlines()
        while len(lines) > 1 and estimate_tokens("\n".join(lines)) > self.budget_tokens // EXAMPLE_SHARE:
            lines.pop()
        return "\n".join(lines) if len(lines) > 1 else ""

    # -- the remember tool ---------------------------------------------------------------------
    def _remember_tool(self) -> Tool:
        memory = self

        async def remember(note: str, context: ToolContext, kind: NoteKind = "fact") -> str:
            """Keep a fact or constraint the user stated ("only East China data", "budget ≤ 5000") or a task
            step; kept notes are shown to you on every later call. One short note per call.

            Args:
                note: one short sentence, in the user's language
                kind: fact (facts, constraints), pending (a step to do) or done (a finished step)
            """
            return await memory.remember(context.session_id, note, kind)

        return tool(name=REMEMBER, level=1, idempotent=True)(remember)

    async def remember(self, conversation: str | None, note: str, kind: NoteKind = "fact") -> str:
        """The `remember` tool's body. Every refusal is a `ToolError`, so the model reads what to fix.

        The snapshot may use at most half the token budget: beyond that the oldest completed steps
        go, then new notes are refused (the user decides what to drop, with /forget), because a
        constraint silently evicted is worse than one the model was told it could not keep."""
        note = " ".join(note.split())
        if not conversation:
            raise ToolError("remember works only inside a conversation")
        if not note or len(note) > NOTE_CHARS:
            raise ToolError(f"a note must be 1 to {NOTE_CHARS} characters: one short fact per call")
        full = False

        def record(state: ConversationState) -> None:
            nonlocal full
            if kind == "done":
                state.pending = [step for step in state.pending if step.casefold() != note.casefold()]
            notes: list[str] = getattr(state, "facts" if kind == "fact" else kind)
            if note.casefold() in (existing.casefold() for existing in notes):
                return
            notes.append(note)
            del state.done[:-MAX_DONE]
            while len(state.done) > 1 and _snapshot_tokens(state) > self.budget_tokens // 2:
                state.done.pop(0)  # the oldest completed steps make room first
            if _snapshot_tokens(state) > self.budget_tokens // 2:
                notes.pop()
                full = True

        await self.store.update_state(conversation, record)
        if full:
            raise ToolError("memory is full: tell the user to remove notes with /forget N (see /memory)")
        return f"noted ({kind}): {note}"

    # -- /memory and /forget -------------------------------------------------------------------
    async def command(self, conversation: str, text: str, language: Language | None = None) -> str | None:
        """The reply to `/memory` or `/forget [N]` (also `/记忆`, `/忘记`); None for any other text.

        The reply is in `language`, else Chinese for the Chinese command words, else in the language
        of the conversation's first request (the command word itself says nothing about the user).
        """
        found = _COMMAND.fullmatch(text)
        if found is None:
            return None
        word, argument = found.group(1).lower(), (found.group(2) or "").strip()
        loaded = await self.store.load(conversation)
        if language is None:
            first_request = loaded.state.goal or _first_user_text(loaded.messages)
            language = "zh" if word in ("记忆", "忘记") else detect_language(first_request)
        if word in ("memory", "记忆"):
            return describe_memory(loaded.state, language)
        if argument and not argument.isdigit():
            return fixed_reply("memory_usage", language)
        number = int(argument) if argument else None
        removed: list[str] = []

        def forget(state: ConversationState) -> None:
            items = _numbered(state)
            state.contexts = []  # what earlier context messages said of it leaves the prompt too
            if number is None:
                removed.extend(getattr(state, section)[index] for section, index in items)
                removed.extend([state.summary] if state.summary else [])
                state.facts, state.pending, state.done, state.summary = [], [], [], ""
            elif 1 <= number <= len(items):
                section, index = items[number - 1]
                removed.append(getattr(state, section).pop(index))

        await self.store.update_state(conversation, forget)
        if number is not None:
            key = "memory_forgot_one" if removed else "memory_no_item"
            return fixed_reply(key, language).format(n=number, text=removed[0] if removed else "")
        if not removed:
            return fixed_reply("memory_empty", language)
        return fixed_reply("memory_forgot_all", language).format(count=len(removed))

    async def reset(self, conversation: str) -> None:
        """`/new`: start the conversation afresh. The goal, notes and summary are cleared (as `/forget`
        does) and the messages so far are marked folded, so the next turn's window starts empty; the
        log itself is kept for traces and audits."""
        loaded = await self.store.load(conversation)
        logged = loaded.state.folded + len(loaded.messages)

        def fresh(state: ConversationState) -> None:
            state.goal, state.facts, state.pending, state.done, state.summary = "", [], [], [], ""
            state.contexts = []
            state.folded = max(state.folded, logged)

        await self.store.update_state(conversation, fresh)

    async def prune(self, older_than: float) -> int:
        """Forget the history (and long-term outcomes) stored before `older_than`, a UNIX time
        (`memory.retention_days`); returns how many messages and outcomes went."""
        outcomes = await self.long_term.prune(older_than) if self.long_term is not None else 0
        return await self.store.prune(older_than) + outcomes

    async def close(self) -> None:
        await self.store.close()


async def summarize(model: ModelClient | None, previous: str, turns: Sequence[Turn]) -> str:
    """One model call: the previous summary and the folded turns in, ≤ 200 characters out."""
    if model is None:
        raise ValueError("no model to write the summary")
    lines = []
    for message in flatten(turns):
        for call in message.get("tool_calls") or ():
            function = call.get("function", {})
            arguments = _shorten(str(function.get("arguments")), 200)
            lines.append(f"assistant called {function.get('name')}({arguments})")
        if message.get("content"):
            lines.append(f"{message.get('role')}: {_shorten(str(message['content']), 300)}")
    transcript = "\n".join(lines)[-TRANSCRIPT_CHARS:]
    request = (f"Summary so far: {previous}\n\n" if previous else "") + f"New messages:\n{transcript}"
    messages: list[Message] = [
        {"role": "system", "content": SUMMARY_INSTRUCTIONS},
        {"role": "user", "content": request},
    ]
    response = await model.complete(messages, None)
    summary = " ".join(response.text.split())
    if not summary:
        raise ValueError("the model returned an empty summary")
    return _shorten(summary, SUMMARY_CHARS)


def _shown(outcome: Outcome, replies: list[str]) -> bool:
    """Whether one of `replies` is the outcome's (an outcome keeps the reply's start)."""
    result = getattr(outcome, "result", None)  # a hook may hand back its own kind of outcome
    return isinstance(result, str) and bool(result) and any(reply.startswith(result) for reply in replies)


def render_notes(state: ConversationState, goal: str, examples: str) -> str:
    """The block of the turn's context message on every call; "" when there is nothing to say."""
    sections = [f"The user's original request (pinned): {goal}"] if goal else []
    headings = {
        "facts": "Facts and constraints to respect",
        "pending": "Pending steps",
        "done": "Completed steps",
    }
    for section, heading in headings.items():
        items = getattr(state, section)
        if items:
            sections.append(f"{heading}:\n" + "\n".join(f"- {item}" for item in items))
    if state.summary:
        sections.append(f"Summary of earlier turns: {state.summary}")
    if examples:
        sections.append(examples)
    if not sections:
        return ""
    heading = "Conversation state (kept outside the chat history; the newest such note is current):"
    return "\n".join([heading, *sections])


def describe_memory(state: ConversationState, language: Language) -> str:
    """The `/memory` reply: every note, numbered for `/forget N`, and the summary."""
    items = _numbered(state)
    if not items and not state.summary:
        return fixed_reply("memory_empty", language)
    lines = [fixed_reply("memory_header", language)]
    shown: set[str] = set()
    for number, (section, index) in enumerate(items, start=1):
        if section not in shown:
            shown.add(section)
            lines.append(fixed_reply(f"memory_{section}", language))
        lines.append(f"{number}. {getattr(state, section)[index]}")
    if state.summary:
        lines.append(fixed_reply("memory_summary", language) + state.summary)
    lines.append(fixed_reply("memory_usage", language))
    return "\n".join(lines)


def _numbered(state: ConversationState) -> list[tuple[str, int]]:
    """(section, index) of every note, in the order `/memory` shows and `/forget N` counts them."""
    return [(section, index) for section in _SECTIONS for index in range(len(getattr(state, section)))]


def _snapshot_tokens(state: ConversationState) -> int:
    """Tokens of the facts and steps alone: the part of the notes that `remember` grows."""
    snapshot = ConversationState(facts=state.facts, pending=state.pending, done=state.done)
    return estimate_tokens(render_notes(snapshot, "", ""))


def _first_user_text(messages: Sequence[Message]) -> str:
    for message in messages:
        if message.get("role") == "user":
            return str(message.get("content") or "")
    return ""


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = [
    "REMEMBER",
    "SUMMARY_INSTRUCTIONS",
    "ConversationMemory",
    "LongTermHook",
    "Prompt",
    "describe_memory",
    "render_notes",
    "summarize",
]
