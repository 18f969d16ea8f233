"""The typed messages that cross the seam between channels and the agent.

A channel turns a platform event into an `InboundMessage` and delivers `OutboundMessage`s; it never
sees the agent loop. Routing facts live in named fields, not in a free-form metadata dict.

Text sanitation: JSON may carry a lone UTF-16 surrogate (`"\\ud800"` is valid JSON) that no UTF-8
store can hold, so a message carrying one would fail on every retry. An inbound message's text has
lone surrogates replaced with U+FFFD (`clean_text`), so it is stored and answered once; channels
refuse identifiers that carry one (`has_surrogate`), since an id must round-trip exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..sessions.store import TurnAppend

_SURROGATE = re.compile("[\ud800-\udfff]")


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
    callback_url: str | None = None  # webhook async variant: where to POST the reply
    received_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # platform details; for "resume": the task id
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


@dataclass
class Turn:
    """What a runner returns when its turn leaves session history to store: the replies, and the
    history, which `GatewayStore.complete` stores with the message's done mark, atomically."""

    replies: list[str | Reply]
    history: TurnAppend | None = None


@dataclass
class OutboundMessage:
    channel: str
    conversation: str
    text: str
    uuid: str  # idempotency key derived from (message_id, reply index): a resend cannot duplicate
    chat_id: str | None = None
    reply_to: str | None = None
    callback_url: str | None = None
    inbound_id: int | None = None
    index: int = 0
    approval: dict[str, Any] | None = None  # an approval request to render with the text
    message_id: str | None = None  # of the inbound message this answers
    error: str | None = None  # the task failed: `text` is the apology (Reply.error)
    id: int | None = None  # the outbox row
    attempts: int = 0
