"""`send_message`: the agent posts into another chat, or to a user, on the channel it was asked on.

Where a post can go, by the channel of the message being answered:
- Feishu: a chat (`oc_…`, its chat_id) or a user (`ou_…`, an open_id: their one-to-one chat);
- webhook: a callback URL (delivered as a webhook reply is, so only to the hosts the webhook
  channel's `callback_hosts` allows, checked again when it is sent);
- the web console: the console itself (it has no other chats), marked with the target.

A post is not sent by the tool. The tool checks the target and answers "queued"; when the turn ends,
the gateway's runner reads the turn's successful `send_message` calls (`posts_of`) and returns each
as a `Reply` addressed elsewhere (`Reply.to`), so it is stored in the outbox in the transaction that
completes the turn, with a uuid of its own (gateway/dispatcher.py `reply_for`): sent once, retried
with the same uuid, never twice — and a turn run again after a crash posts what it posts once, as
its reply. A replayed call (the task's journal) counts like a run one.

Who may post: admins only (`required_role`), and the tool is level 2: off unless
`permissions.allow_irreversible` names it, and then a person approves each call. A scheduled job
made by an admin (an admin's `schedule_task`, or a `schedule.jobs` entry whose `sender` is an admin)
carries that approval: its fires may post without asking (`PREAPPROVED_IN_ADMIN_JOBS`; the
scheduler refuses a fire whose creator is no longer an admin, gateway/schedules.py).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import Field

from ..channels.seam import Reply
from ..kernel.loop import RunResult
from ..kernel.tools import Tool, ToolContext, ToolError, tool
from ..kernel.tools.permissions import ADMIN
from ..schedule.tools import CURRENT_MESSAGE

MAX_POST_CHARS = 8000
PREAPPROVED_IN_ADMIN_JOBS = ("send_message",)  # what a job an admin made may run without a person
_FEISHU_TARGET = re.compile(r"^o[cu]_[A-Za-z0-9_-]{1,120}$")
_URL = re.compile(r"^https?://[^\s/?#]+", re.IGNORECASE)


@tool(name="send_message", level=2, required_role=ADMIN, groups=("messages",),
      keywords=("post", "notify", "announce", "发消息", "通知", "群发"))  # fmt: skip
async def send_message(
    target: Annotated[
        str,
        Field(description="Feishu: a chat_id (oc_…) or a user's open_id (ou_…); webhook: a callback URL"),
    ],
    text: Annotated[str, Field(description="The message to post")],
    context: ToolContext,
) -> dict[str, Any]:
    """Post a message into another chat, or to one user, on this conversation's channel (admins only). The post is sent when this turn ends. 发送消息到另一个群聊或用户（仅管理员）。"""  # noqa: E501
    message = CURRENT_MESSAGE.get()
    if message is None:
        raise ToolError(
            "send_message works only in a conversation served by the gateway (hermes-kernel serve)"
        )
    target, text = target.strip(), text.strip()
    if not text:
        raise ToolError("the text is empty: say what to post")
    if len(text) > MAX_POST_CHARS:
        raise ToolError(f"the text has {len(text)} characters; post at most {MAX_POST_CHARS}")
    _check_target(message.channel, target)
    return {"queued": True, "to": target, "channel": message.channel, "sent": "when this turn ends"}


def _check_target(channel: str, target: str) -> None:
    if channel == "feishu" and not _FEISHU_TARGET.match(target):
        raise ToolError(f"{target!r} is not a Feishu chat_id (oc_…) or open_id (ou_…)")
    if channel == "webhook" and not _URL.match(target):
        raise ToolError("on the webhook channel the target is a callback URL (http:// or https://)")
    if channel not in ("feishu", "webhook", "web"):
        raise ToolError(f"send_message cannot post on the {channel} channel")


def posts_of(result: RunResult, declared: Tool | None) -> list[Reply]:
    """The posts a finished turn asked for: its successful calls of `declared` (this module's tool,
    as registered: another tool that took the name posts nothing), as replies addressed elsewhere."""
    if declared is None or declared.handler is not send_message.handler:
        return []
    posts = []
    for outcome in result.tool_calls:
        if outcome.call.name != declared.name or not outcome.ok:
            continue
        try:
            arguments = json.loads(outcome.content)
            to = str(arguments["to"])
        except (ValueError, KeyError, TypeError):
            continue
        text = _argument(outcome.arguments, outcome.call.arguments, "text")
        if text:
            posts.append(Reply(text, to=to))
    return posts


def _argument(validated: dict[str, Any] | None, raw: str, name: str) -> str:
    """One argument of a call: as validated when it ran, else (a replayed call) as the model wrote it."""
    if validated is None:
        try:
            validated = json.loads(raw)
        except ValueError:
            return ""
    value = validated.get(name) if isinstance(validated, dict) else None
    return value.strip() if isinstance(value, str) else ""


def register_outgoing_tools(agent: Any) -> None:
    """`send_message` on serve's agent, unless it has a tool of that name already."""
    if agent.registry.get(send_message.name) is None:
        agent.register_tool(send_message)


__all__ = ["PREAPPROVED_IN_ADMIN_JOBS", "posts_of", "register_outgoing_tools", "send_message"]
