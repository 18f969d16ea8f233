"""The default runner: the agent, with a memory per conversation.

For each message: the conversation commands (`/new`, `/help`, `/stop`, `/jobs`, `/memory`,
`/forget`: gateway/commands.py) are answered here, before any model call, so every channel (webhook,
Feishu, the console, the terminal REPL) has them with the same replies; anything else becomes one
agent turn over the window and notes that `ConversationMemory.prepare` builds. A scheduled job's
fire (`kind` "scheduled", gateway/schedules.py) is a turn like a message, its prompt marked as a
job's; the message being handled is `schedule.tools.CURRENT_MESSAGE` for the scheduling tools.
A message's pictures and files are made ready first (`MediaDesk.prepare`, gateway/media.py); one
that cannot be used is answered with the reason, and no turn runs. The gateway depends only on the
`Runner` protocol.

In a conversation several people share (a group chat) the model reads who said each message
(`InboundMessage.speaker` before the text; commands are left as written), and the history keeps it.
A channel's greeting (kind "greeting") is sent as it is; a text over the channels' cap (kind
"too_long", channels/seam.py `MAX_MESSAGE_CHARS`) is answered with a note, unread.

The turn's messages are not stored here: the runner returns them with the replies (`Turn.history`,
keyed by the task id) and the gateway stores them in the transaction that marks the message done
(`GatewayStore.complete`). A crash before that commit leaves no history, so the message run again
adds its turn once; a crash after it leaves the message done, so it is not run again. A task that
failed (the model unavailable, a limit hit) answers with the apology and says why (`Reply.error`).

Streamed replies: `watch_for` (set by serve: gateway/server.py) asks the message's channel whether
it wants to see the turn as it runs (`Channel.watch`); if so, its watcher gets the model's text as
it is written (the same `on_text` callback the terminal display uses) and each tool call as it
starts and ends (`WatchedSteps`, hooks the loop calls beside the trace's). The console's
`on_text_for` is the same seam, keyed by task id.

Paused tasks (tasks/pending.py): a turn that stops for an approval or a question is not committed;
its original message is kept with the pending record. It is run again under its task id when the
gateway delivers a `resume` message (a decision, an expiry), or when the asker's next message in
the conversation answers the question — the journal replays it up to the paused call.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from ..agent import Agent
from ..channels.media import MediaRefused
from ..channels.seam import (
    MAX_MESSAGE_CHARS,
    TOO_LONG,
    SpeakerNames,
    TurnWatcher,
    inbound_of,
    resume_message,
    task_id_of,
)
from ..kernel.approvals import DecisionRefused, Pending, PendingStore
from ..kernel.hooks import TaskHooks
from ..kernel.loop import PAUSES
from ..kernel.messages import ToolCall
from ..kernel.model import TextCallback
from ..kernel.replies import REPLIES, detect_language, fixed_reply
from ..kernel.tools.permissions import ADMIN, Caller
from ..kernel.tools.registry import ToolOutcome
from ..modes import run_task
from ..schedule.jobs import ScheduleStore, scheduled_prompt
from ..schedule.tools import CURRENT_MESSAGE, JOB_WITHHELD
from ..sessions import ConversationMemory, InMemorySessionStore, TurnAppend
from . import commands
from .media import MediaDesk
from .messages import InboundMessage, Reply, Turn
from .model_health import ModelHealth
from .outgoing import PREAPPROVED_IN_ADMIN_JOBS, posts_of

__all__ = ["AgentRunner", "WatchedSteps", "resume_message"]  # resume_message: channels/seam.py

log = logging.getLogger("hermes_core.gateway")


class AgentRunner:
    def __init__(self, agent: Agent, memory: ConversationMemory | None = None) -> None:
        """`memory` defaults to in-process conversations (lost on restart); `serve` passes a SQLite one."""
        self.agent = agent
        self.memory = memory or ConversationMemory(InMemorySessionStore())
        self.memory.attach(agent)
        # pictures and files; `serve` gives it the channels that fetch them and the workspace
        self.media = MediaDesk(vision=agent.settings.vision)
        # streamed text, by task id: who wants a turn's text as it is written (the web console)
        self.on_text_for: Callable[[str], TextCallback | None] | None = None
        self.schedules: ScheduleStore | None = None  # the jobs `/jobs` lists (serve sets it)
        # who wants to see a message's turn as it runs (a channel streaming its reply): Channel.watch
        self.watch_for: Callable[[InboundMessage], TurnWatcher | None] | None = None
        self.speakers: dict[str, SpeakerNames] = {}  # channels that name who speaks in a group
        self.model_health: ModelHealth | None = None  # serve's watch of the key (gateway/model_health.py)

    async def __call__(self, message: InboundMessage) -> Turn:
        token = CURRENT_MESSAGE.set(message)  # where the scheduling tools create jobs (schedule/tools.py)
        try:
            return await self._message_turn(message)
        finally:
            CURRENT_MESSAGE.reset(token)

    async def _message_turn(self, message: InboundMessage) -> Turn:
        if message.kind == "greeting":  # a channel's fixed greeting (a bot added to a group)
            return Turn([message.text])
        if message.kind == "too_long":  # over the channels' cap (channels/seam.py): not read
            fields = {"length": f"{message.extra.get('length', 0):,}", "limit": f"{MAX_MESSAGE_CHARS:,}"}
            lang = self.agent.language or detect_language(message.text)
            return Turn([TOO_LONG[lang].format(**fields)])
        if message.kind not in ("text", "resume", "scheduled"):  # audio, stickers…: we cannot read them
            return Turn([f"{REPLIES['non_text']['zh']}\n{REPLIES['non_text']['en']}"])
        if not message.text.strip() and not message.attachments:  # a bare @mention
            return Turn([fixed_reply("how_can_i_help", detect_language(message.text))])
        # the same id when the message is run again after a crash: the task resumes from its journal
        task_id = task_id_of(message)
        original = message
        interactions = self._store()
        if message.kind == "text" and interactions is not None:  # only the asker's own answer counts
            answered = await interactions.answer(
                message.conversation, message.sender, message.text, channel=message.channel
            )
            if answered is not None and answered.resume:  # this message answers a question: resume it
                original = inbound_of(answered.resume)
                task_id = answered.task_id
        caller = self.agent.permissions.caller(original.sender, original.channel)
        if original.kind == "scheduled" and original.extra.get("creator_role") == ADMIN:  # an admin's job
            caller = dataclasses.replace(caller, preapproved=PREAPPROVED_IN_ADMIN_JOBS)
        if original.kind == "scheduled":  # a job's turn schedules nothing (schedule/tools.py)
            caller = dataclasses.replace(caller, withheld=JOB_WITHHELD)
        on_text = self.on_text_for(task_id) if self.on_text_for is not None else None
        text = original.text
        if original.kind == "scheduled":  # a job's prompt: never read as a command, said to be one
            text = scheduled_prompt(original, await self._speaker(original))
        try:  # pictures and files: fetched, checked, saved now (gateway/media.py)
            prepared = await self.media.prepare(original) if original.attachments else None
        except MediaRefused as refused:
            return Turn([self._refusal(refused, original.text)])
        # a turn the model writes is streamed; a command's or a refusal's fixed reply is one message
        streamed = original.kind == "scheduled" or commands.parse(text) is None
        watcher = self._watcher(message) if streamed else None
        hooks = WatchedSteps(watcher) if watcher is not None else None
        speaker = await self._speaker(original) if streamed else ""  # a command is not labelled
        spoken = _spoken(original, prepared.text if prepared else text, speaker)
        reply, history, error, posts = await self._turn(
            original.conversation, spoken, task_id=task_id,
            caller=caller, message=original, on_text=_both(on_text, watcher), hooks=hooks,
            images=prepared.images if prepared else (),
        )  # fmt: skip
        if error == "model_rejected" and self.model_health is not None:  # the key, not the user's words
            reply = self.model_health.apology(self.agent.language or detect_language(original.text)) or reply
        if error is not None:
            reply = dataclasses.replace(reply if isinstance(reply, Reply) else Reply(reply), error=error)
        return Turn([reply, *posts], history)

    async def reply(
        self,
        conversation: str,
        text: str,
        *,
        on_text: TextCallback | None = None,
        task_id: str | None = None,
        caller: Caller | None = None,
        message: InboundMessage | None = None,
    ) -> str | Reply:
        """One user message in, the reply out: a memory command, or one agent turn, stored here
        (outside the gateway: the terminal, tests)."""
        reply, history, _, _ = await self._turn(
            conversation, text, on_text=on_text, task_id=task_id, caller=caller, message=message,
            hooks=None,
        )  # fmt: skip
        if history is not None:
            await history.apply()
        return reply

    async def _turn(
        self,
        conversation: str,
        text: str,
        *,
        on_text: TextCallback | None,
        task_id: str | None,
        caller: Caller | None,
        message: InboundMessage | None,
        images: Sequence[str] = (),
        hooks: TaskHooks | None,
    ) -> tuple[str | Reply, TurnAppend | None, str | None, list[Reply]]:
        """The reply, the turn's history to store (None: nothing to store), why the task failed and
        the posts it asked for (`send_message`: gateway/outgoing.py)."""
        answer = await commands.answer(
            text, conversation=conversation, memory=self.memory, registry=self.agent.registry, caller=caller,
            models=self.agent.client.models, language=self.agent.language, schedules=self.schedules,
            message=message,
        )  # fmt: skip
        if answer is not None:  # /new, /help, /stop, /jobs, /memory, /forget: no model call
            return answer, None, None, []
        prompt = await self.memory.prepare(conversation, text, self.agent.client)
        session = prompt.session()
        # the agent's mode (loop, plan or team) decides how the turn runs: modes.run_task
        result = await run_task(self.agent, text, session=session, on_text=on_text, task_id=task_id,
                                caller=caller, images=images, hooks=hooks)  # fmt: skip
        if result.stop_reason in PAUSES:  # not stored: the whole turn is stored once it finishes
            return await self._paused(result.reply, task_id, message), None, None, []
        await self.memory.learn(conversation, result)
        await self.memory.keep_context(prompt, session)  # an unchanged context stays put next turn
        history = self.memory.turn(conversation, session.messages[len(prompt.window) :], task_id)
        posts = posts_of(result, self.agent.registry.get("send_message"))
        return result.reply, history, None if result.ok else result.stop_reason, posts

    def _refusal(self, refused: MediaRefused, text: str) -> str:
        """The fixed reply for an attachment that cannot be used, in the user's language (both
        languages when a bare picture or file gives no hint and none is configured)."""
        log.info("attachment refused: %s", refused)
        fields = defaultdict(str, refused.fields)
        key = f"attachment_{refused.reason}"
        if self.agent.language is None and not text.strip():
            return "\n".join(REPLIES[key][lang].format_map(fields) for lang in ("zh", "en"))
        return fixed_reply(key, self.agent.language or detect_language(text)).format_map(fields)

    async def _speaker(self, message: InboundMessage) -> str:
        """Who speaks, as the model reads it: the channel's label (a name), else the message's."""
        names = self.speakers.get(message.channel)
        if names is None or not message.speaker:
            return message.speaker
        try:
            return await names.speaker_label(message)
        except Exception:
            log.exception("naming the speaker of %s message %s failed", message.channel, message.message_id)
            return message.speaker

    def _watcher(self, message: InboundMessage) -> TurnWatcher | None:
        """The channel's watcher of this turn, if it streams it; a failing channel streams nothing."""
        if self.watch_for is None:
            return None
        try:
            return self.watch_for(message)
        except Exception:
            log.exception("streaming the reply to %s message %s failed", message.channel, message.message_id)
            return None

    def _store(self) -> PendingStore | None:
        """Where the agent's pauses wait, if they wait anywhere (a terminal asks in place)."""
        interactions = self.agent.interactions
        return interactions if isinstance(interactions, PendingStore) else None

    async def _paused(self, text: str, task_id: str | None, message: InboundMessage | None) -> str | Reply:
        interactions = self._store()
        if interactions is None or task_id is None:
            return text
        if message is not None:
            original = dataclasses.replace(message, kind="text", id=None, extra={})
            await interactions.set_resume(task_id, json.loads(json.dumps(dataclasses.asdict(original))))
        approvals = [p for p in await interactions.open_for_task(task_id) if p.kind == "approval"]
        return Reply(text, approvals[0].summary()) if approvals else text

    async def decide(self, pending_id: str, user_id: str, channel: str, approve: bool) -> Pending:
        """A person's decision on an approval; raises DecisionRefused (who, expiry, already decided)."""
        interactions = self._store()
        if interactions is None:
            raise DecisionRefused("approval_unknown")
        decider = self.agent.permissions.caller(user_id, channel)
        return await interactions.decide(pending_id, decider, approve)

    async def expire_due(self) -> list[Pending]:
        interactions = self._store()
        return await interactions.expire_due() if interactions is not None else []

    async def aclose(self) -> None:
        if self.agent.mode is not None:  # a team's queues and its members' clients
            await self.agent.mode.aclose()
        await self.memory.close()


class WatchedSteps(TaskHooks):
    """The loop's tool hooks, told to a channel's watcher: each call's start and end. Observers
    only: a watcher that fails is logged, never raised into the turn."""

    def __init__(self, watcher: TurnWatcher) -> None:
        self.watcher = watcher

    async def on_tool_start(self, call: ToolCall) -> None:
        _safely(self.watcher.tool_started, call.name, call.id)

    async def on_tool_end(
        self, call: ToolCall, outcome: ToolOutcome | None, error: BaseException | None
    ) -> None:
        ok = error is None and outcome is not None and (outcome.ok or outcome.error in PAUSES)
        _safely(self.watcher.tool_finished, call.name, call.id, ok)


def _spoken(message: InboundMessage, text: str, speaker: str) -> str:
    """The text as the model reads it: in a conversation several people share (a group chat), who
    said it first (`speaker`), so the history tells them apart. A command is left as written, so
    it is still recognised."""
    if not speaker or message.kind == "scheduled" or commands.parse(text) is not None:
        return text
    return f"{speaker}: {text}"


def _both(on_text: TextCallback | None, watcher: TurnWatcher | None) -> TextCallback | None:
    """One `on_text` callback for the console's stream and a channel's watcher (either may be None)."""
    if watcher is None:
        return on_text

    def both(piece: str) -> None:
        if on_text is not None:
            on_text(piece)
        _safely(watcher.text, piece)

    return both


def _safely(call: Callable[..., Any], *args: Any) -> None:
    try:
        call(*args)
    except Exception:
        log.exception("a streamed reply's watcher failed")
