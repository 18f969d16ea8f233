"""The channel seam: the typed messages between channels and the gateway, and what a channel may
ask of the gateway (`Inbox`). A channel author reads this module and channels/base.py, never the
dispatcher: channels import no module of gateway/, and the `Gateway` implements `Inbox`.

A channel turns a platform event into an `InboundMessage` and delivers `OutboundMessage`s; it never
sees the agent loop. Routing facts live in named fields, not in a free-form metadata dict.

Text sanitation: JSON may carry a lone UTF-16 surrogate (`"\\ud800"` is valid JSON) that no UTF-8
store can hold, so a message carrying one would fail on every retry. An inbound message's text has
lone surrogates replaced with U+FFFD (`clean_text`), so it is stored and answered once; channels
refuse identifiers that carry one (`has_surrogate`), since an id must round-trip exactly.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..kernel.replies import Language

if TYPE_CHECKING:
    from ..kernel.approvals import Pending

_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_MESSAGE_CHARS = 20_000  # the longest text a channel takes from a person (a longer one is refused)
TOO_LONG: dict[Language, str] = {  # what the sender of a longer one is told, when it cannot be refused
    "zh": "抱歉，消息太长（{length} 字，上限 {limit}），我没有读。请缩短，或作为文件发给我。",
    "en": "Sorry, too long to read ({length} chars, limit {limit}). Please shorten it or send a file.",
}


def has_surrogate(text: str) -> bool:
    """True when `text` holds a lone surrogate (it cannot be encoded as UTF-8)."""
    return _SURROGATE.search(text) is not None


def clean_text(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD, the replacement character."""
    return _SURROGATE.sub("\ufffd", text) if has_surrogate(text) else text


@dataclass
class InboundMessage:
    channel: str  # "webhook", "feishu", "cli", …
    conversation: str  # session key: the chat for groups, the sender for one-to-one chats
    sender: str  # platform user id (Feishu open_id, webhook user_id)
    text: str
    message_id: str  # platform message id: the dedup key
    kind: str = "text"  # "text"; "non_text" (images, files…: answered politely); "resume" (see below)
    event_id: str | None = None  # platform delivery id: a second dedup key
    chat_id: str | None = None  # where replies go (Feishu chat_id)
    chat_type: str = "p2p"  # "p2p" | "group"
    reply_to: str | None = None  # platform message to thread the reply under
    thread_id: str | None = None  # the platform topic the message is in (Feishu): replies stay in it
    speaker: str = ""  # who said it, as the model reads it in a shared (group) conversation
    callback_url: str | None = None  # webhook async variant: where to POST the reply
    received_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # platform details; for "resume": the task id
    attachments: list[dict[str, Any]] = field(default_factory=list)  # pictures, files (channels/media.py)
    id: int | None = None  # the inbox row, once persisted

    def __post_init__(self) -> None:
        if isinstance(self.text, str):
            self.text = clean_text(self.text)


@dataclass
class Reply:
    """A reply with more than text: an approval request a channel renders natively (a card, a
    y/n prompt, a JSON field). Runners return plain strings for plain replies."""

    text: str
    approval: dict[str, Any] | None = None  # tasks/pending.Pending.summary()
    error: str | None = None  # the task failed ("model_unavailable", …): `text` is the apology
    to: str | None = None  # posted elsewhere on the channel (send_message: gateway/outgoing.py)


@dataclass
class OutboundMessage:
    channel: str
    conversation: str
    text: str
    uuid: str  # idempotency key derived from (message_id, reply index): a resend cannot duplicate
    chat_id: str | None = None
    reply_to: str | None = None
    thread_id: str | None = None  # of the message answered: the reply goes into the same topic
    callback_url: str | None = None
    inbound_id: int | None = None
    index: int = 0
    approval: dict[str, Any] | None = None  # an approval request to render with the text
    message_id: str | None = None  # of the inbound message this answers
    error: str | None = None  # the task failed: `text` is the apology (Reply.error)
    id: int | None = None  # the outbox row
    attempts: int = 0


@dataclass
class Earlier:
    """A message accepted before, as a retry of it finds it: done or not, and its replies."""

    message: InboundMessage
    done: bool
    replies: list[OutboundMessage]


def task_id_of(message: InboundMessage) -> str:
    """The id of the task `message` starts: its journal, trace and approvals are keyed by it.

    Assigned once, when the message is accepted, and stored with it (`extra["task_id"]`), so the
    same message run again after a crash resumes its own journal. It is never derived from the
    message id alone: a webhook client chooses that id, and once its dedup key is pruned another
    user could send the same one and be handed the first task's recorded replies. A random part
    (or, for a row stored without one, its inbox row id) makes every accepted message's task its own.
    """
    task_id = message.extra.get("task_id")
    if not task_id:
        unique = f"r{message.id}" if message.id is not None else secrets.token_hex(6)
        task_id = message.extra["task_id"] = new_task_id(message.channel, message.message_id, unique)
    return str(task_id)


def new_task_id(channel: str, message_id: str, unique: str) -> str:
    """The form of the ids `task_id_of` assigns, `<channel>:<message id>~<unique>` (the message id
    cut at 64 characters), for the Temporal workflow too: it names a message signalled without
    one from its stored fields, with a random part that replays (engine/temporal/workflow.py)."""
    return f"{channel}:{message_id[:64]}~{unique}"


def unique_of(task_id: str) -> str | None:
    """The part of a task id of that form that tells apart the tasks of one channel (after the
    last `~`: a message id may hold one, the random part never does); None for another id."""
    return task_id.rpartition("~")[2] if "~" in task_id else None


APPROVAL_ENDS = ("approved", "rejected", "expired")  # how an approval is settled; each runs its task on


def resumed_id(message_id: str, pending_id: str, status: str) -> str:
    """The message id of the message that runs a task on once approval `pending_id`, asked for
    while message `message_id` ran, was settled `status`: a retry of `message_id` finds it here."""
    return f"{message_id}#{pending_id}:{status}"


def resume_message(pending: Pending) -> InboundMessage | None:
    """The message that runs a decided task again: the original one, under the same task id."""
    if not pending.resume:
        return None
    original = inbound_of(pending.resume)
    return dataclasses.replace(
        original,
        kind="resume",
        message_id=resumed_id(original.message_id, pending.id, pending.status),
        event_id=None,
        extra={"task_id": pending.task_id, "pending": pending.id},
        id=None,
    )


def inbound_of(data: dict[str, Any]) -> InboundMessage:
    """An inbound message from its stored fields (unknown keys ignored)."""
    known = {f.name for f in dataclasses.fields(InboundMessage)}
    return InboundMessage(**{k: v for k, v in data.items() if k in known})


class TurnWatcher(Protocol):
    """Told what a turn of one message does while it runs, so a channel can stream its reply
    (`Channel.watch`). Each call must return at once: the turn does not wait for the platform."""

    def text(self, piece: str) -> None:
        """A piece of text the model wrote (unredacted: the watcher redacts what it shows)."""
        ...

    def tool_started(self, name: str, call_id: str) -> None: ...

    def tool_finished(self, name: str, call_id: str, ok: bool) -> None: ...


class SpeakerNames(Protocol):
    """A channel that can name who speaks in a shared conversation (Feishu: the contact API), asked
    when the turn runs; the runner keeps `InboundMessage.speaker` when it cannot."""

    async def speaker_label(self, message: InboundMessage) -> str:
        """`message.speaker`, with the person's name when the platform gives it."""
        ...


class Records(Protocol):
    """What an HTTP channel reads back from (and notes in) the gateway's store: retries, replayed
    signatures, the platform message a streamed reply is written into, messages their senders
    took back and chats the bot was removed from."""

    async def replies_of(self, channel: str, message_id: str) -> Earlier | None:
        """The message accepted earlier under this id, and its replies once it is done."""
        ...

    async def claim_nonce(self, channel: str, nonce: str, keep_seconds: float) -> bool:
        """True the first time `nonce` is claimed on `channel` within `keep_seconds`."""
        ...

    async def stream_of(self, inbound_id: int) -> str | None:
        """The platform message the reply to inbox row `inbound_id` is being streamed into, as the
        channel stored it (opaque to the store: Feishu keeps a card's uuid there until its id is known)."""
        ...

    async def keep_stream(self, inbound_id: int, channel: str, platform_id: str) -> None:
        """Record, durably, that the reply to `inbound_id` is streamed into `platform_id`."""
        ...

    async def withdraw(self, channel: str, message_id: str, conversation: str) -> bool:
        """Its sender took the message back (a Feishu recall): durably, its turn is not run if it
        has not started; one not received yet is kept as withdrawn, so it is a duplicate when it
        comes. False when its turn started or ran already (its reply stays)."""
        ...

    async def set_chat_left(self, channel: str, chat_id: str, left: bool, at: float) -> None:
        """Record, durably, that the bot was removed from a chat (`left`) or added to it again, at
        `at` (the platform's time of the change): a change older than the one kept is ignored."""
        ...

    async def chat_left(self, channel: str, chat_id: str) -> bool:
        """Was the bot removed from this chat (and not added again)? Nothing is sent there then."""
        ...


class Inbox(Protocol):
    """What a channel may ask of the gateway. `accept` is a durable write: once it returns, the
    message is answered even across a crash (None: a duplicate, already accepted). Whatever engine
    implements it passes tests/contracts/test_inbox_contract.py (docs/seams.md)."""

    @property
    def accepting(self) -> bool:
        """False while the gateway starts or shuts down: `accept` would raise."""
        ...

    @property
    def store(self) -> Records:
        """Read access to earlier messages and nonces."""
        ...

    async def accept(self, message: InboundMessage) -> int | None:
        """Persist `message` and queue its turn; its inbox row id, or None for a duplicate."""
        ...

    async def delivered(self, conversation: str) -> None:
        """Returns once every reply already queued in `conversation` is sent (or given up on): a
        channel that shows a turn's reply before the turn ends (a streaming card) waits for it, so
        what the user sees keeps the conversation's order through a platform fault."""
        ...

    async def decide(
        self, pending_id: str, user_id: str, channel: str, approve: bool
    ) -> tuple[Pending, int | None]:
        """A person's decision on an approval, and the inbox id of the message that resumes its
        task. Raises `approvals.DecisionRefused` when it is not taken."""
        ...
