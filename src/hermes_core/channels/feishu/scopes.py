"""What the Feishu app must be granted, and why: every Open API call the bot makes and every event it
handles, with the scope the developer console checklist (docs/feishu.md) asks for.

One table, read three ways: by the docs' checklist (English and Chinese), by a test that every
`/open-apis/…` path in this package and every call the bot makes against the fake platform is
listed here (tests/test_feishu_scopes.py), and by a reader wondering why the app needs a scope.

`scopes` is what the checklist asks for (all of them); `also` the other scopes the API's page
accepts instead ("开启其中任意一项权限即可"), for an app that already has one of those. A feature
marked `optional` works without its scope, in a lesser way (said in `feature`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Need:
    """One Open API call (`method path`) or one event type, and the scopes it needs."""

    what: str  # "POST /open-apis/im/v1/messages", or an event type such as "im.message.receive_v1"
    scopes: tuple[str, ...]  # asked for by the checklist
    feature: str
    also: tuple[str, ...] = ()  # accepted instead of `scopes` by the platform
    optional: bool = False


SEND = ("im:message:send_as_bot",)
READ = ("im:message:readonly",)
READ_ALSO = ("im:message", "im:message.history:readonly")
CARDKIT = ("cardkit:card:write",)

# Pages: the send/reply/patch pages (open.feishu.cn/document/server-docs/im-v1/message/…), the
# message resource and get-message pages (FEISHU.md §11), CardKit's card pages (open.feishu.cn/
# document/cardkit-v1/card/create: "创建与更新卡片(cardkit:card:write)"), the contact API's user page.
API_CALLS: tuple[Need, ...] = (
    Need("POST /open-apis/auth/v3/tenant_access_token/internal", (), "the tenant token (credentials only)"),
    Need("GET /open-apis/bot/v3/info", (), "the bot's own open_id (needs the bot ability, no scope)"),
    Need("POST /open-apis/im/v1/messages", SEND, "replies, approval cards", also=("im:message",)),
    Need(
        "POST /open-apis/im/v1/messages/:message_id/reply",
        SEND,
        "replies under the user's message",
        also=("im:message",),
    ),  # fmt: skip
    Need(
        "PATCH /open-apis/im/v1/messages/:message_id",
        SEND,
        "streamed replies, legacy approval cards",
        also=("im:message",),
    ),  # fmt: skip
    Need(
        "GET /open-apis/im/v1/messages/:message_id",
        READ,
        "quoted messages, forwarded messages",
        also=READ_ALSO,
    ),  # fmt: skip
    Need(
        "GET /open-apis/im/v1/messages/:message_id/resources/:file_key",
        READ,
        "pictures and files the user sends (docs/media.md)",
        also=READ_ALSO,
    ),  # fmt: skip
    Need("POST /open-apis/cardkit/v1/cards", CARDKIT, "streamed replies (CardKit card entity)"),
    Need(
        "PUT /open-apis/cardkit/v1/cards/:card_id/elements/:element_id/content",
        CARDKIT,
        "streamed replies (typewriter updates)",
    ),  # fmt: skip
    Need(
        "PATCH /open-apis/cardkit/v1/cards/:card_id/settings", CARDKIT, "streamed replies (the stream closed)"
    ),
    Need("PUT /open-apis/cardkit/v1/cards/:card_id", CARDKIT, "streamed replies (an approval, a long reply)"),
    Need(
        "GET /open-apis/contact/v3/users/:user_id",
        ("contact:user.base:readonly",),
        "the approval card names the decider; else an @-mention shows the name",
        optional=True,
    ),  # fmt: skip
)

# Pages: each event's page ("订阅该事件所需的权限"): im.message.receive_v1 (FEISHU.md §4), the bot
# added/removed pages (im:chat.members:bot_access, or im:chat / im:chat:readonly). The recall
# event's scope is UNCONFIRMED here: taken to be the message-reading scope.
EVENTS: tuple[Need, ...] = (
    Need(
        "im.message.receive_v1",
        ("im:message.p2p_msg:readonly", "im:message.group_at_msg:readonly"),
        "messages: one-to-one chats, and group messages that @mention the bot",
    ),  # fmt: skip
    Need(
        "im.message.recalled_v1", READ, "a message recalled before its answer is not answered", also=READ_ALSO
    ),  # fmt: skip
    Need(
        "im.chat.member.bot.added_v1",
        ("im:chat.members:bot_access",),
        "the bot added to a group",
        also=("im:chat", "im:chat:readonly"),
    ),  # fmt: skip
    Need(
        "im.chat.member.bot.deleted_v1",
        ("im:chat.members:bot_access",),
        "the bot removed from a group",
        also=("im:chat", "im:chat:readonly"),
    ),  # fmt: skip
)
CALLBACKS: tuple[Need, ...] = (Need("card.action.trigger", (), "Approve / Reject on an approval card"),)


def checklist_scopes() -> set[str]:
    """Every scope the developer console checklist asks for."""
    return {scope for need in (*API_CALLS, *EVENTS, *CALLBACKS) for scope in need.scopes}


def api_pattern(call: Need) -> tuple[str, str]:
    """`(method, path)` of an API call, the path's `:params` as they are written."""
    method, _, path = call.what.partition(" ")
    return method, path


__all__ = ["API_CALLS", "CALLBACKS", "EVENTS", "Need", "api_pattern", "checklist_scopes"]
