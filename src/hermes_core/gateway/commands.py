"""Conversation commands, answered before any model call, identically on every channel.

    /new, /reset (/新对话, /重置)   start a fresh conversation: the history and the notes are no longer
                                  carried over (the log is kept for traces); /forget keeps the history
    /help (/帮助)                  the commands, and the tools this caller may use (after permissions)
    /stop (/停止)                  cancel the turn running in this conversation (started by the same
                                  person); the gateway cancels it when the /stop arrives (dispatcher.py)
    /jobs (/任务)                  this conversation's scheduled tasks
    /memory, /forget [N]          the notes (memory/conversation.py)

In a group whose history is shared (the whole chat, or a topic: not `group_session: user`), only
an admin (`permissions.admins`) may /new, /reset or /forget: they erase what every member relies on.
Others get a polite fixed reply; one-to-one chats are unchanged.

The runner (gateway/runner.py) asks `answer` first; the terminal REPL, the webhook, Feishu and the
console all go through it, so the replies are the same text everywhere. A reply's language is the
agent's configured one, else Chinese for the Chinese command words, else the message's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..kernel.replies import Language, detect_language, fixed_reply
from ..kernel.tools.permissions import ADMIN

if TYPE_CHECKING:
    from ..channels.seam import InboundMessage
    from ..kernel.tools.permissions import Caller
    from ..schedule.jobs import ScheduleStore
    from ..sessions import ConversationMemory
    from ..tools import ToolRegistry

WORDS: dict[str, str] = {
    "new": "new", "reset": "new", "新对话": "new", "重置": "new",
    "help": "help", "帮助": "help",
    "stop": "stop", "停止": "stop",
    "jobs": "jobs", "任务": "jobs",
    "memory": "memory", "记忆": "memory", "forget": "memory", "忘记": "memory",
}  # fmt: skip
_COMMAND = re.compile(r"\s*[/／](\S+?)(?:\s+(.*?))?\s*", re.DOTALL)


@dataclass
class Command:
    name: str  # new | help | stop | jobs | memory
    word: str  # as written, lower-cased
    argument: str


def parse(text: str) -> Command | None:
    """The command `text` is, or None for anything else (an unknown /word goes to the model)."""
    found = _COMMAND.fullmatch(text or "")
    if found is None:
        return None
    word = found.group(1).lower()
    name = WORDS.get(word)
    return None if name is None else Command(name, word, (found.group(2) or "").strip())


def is_stop(text: str) -> bool:
    command = parse(text)
    return command is not None and command.name == "stop" and not command.argument


def language_of(command: Command, text: str, configured: Language | None) -> Language:
    if configured is not None:
        return configured
    if re.search(r"[\u4e00-\u9fff]", command.word):
        return "zh"
    return detect_language(command.argument) if command.argument else detect_language(text)


async def answer(
    text: str,
    *,
    conversation: str,
    memory: ConversationMemory,
    registry: ToolRegistry,
    caller: Caller | None,
    models: tuple[str, ...] = (),
    language: Language | None = None,
    schedules: ScheduleStore | None = None,
    message: InboundMessage | None = None,
) -> str | None:
    """The fixed reply to a command, or None when `text` is no command (the model answers it)."""
    command = parse(text)
    if command is None:
        return None
    if _erases(command) and _shared(conversation, message) and (caller is None or caller.role != ADMIN):
        return fixed_reply("command_admins_only", language_of(command, text, language))
    if command.name == "memory":
        return await memory.command(conversation, text, language)
    lang = language_of(command, text, language)
    if command.name == "new":
        await memory.reset(conversation)
        return fixed_reply("conversation_new", lang)
    if command.name == "help":
        return help_text(registry, caller, models, lang)
    if command.name == "stop":
        stopping = message is not None and bool(message.extra.get("stopping"))
        return fixed_reply("stop_done" if stopping else "stop_nothing", lang)
    return await jobs_text(schedules, conversation, lang)


def _erases(command: Command) -> bool:
    """/new, /reset, /forget [N]: they take away history or notes (/memory only reads them)."""
    return command.name == "new" or command.word in ("forget", "忘记")


def _shared(conversation: str, message: InboundMessage | None) -> bool:
    """A group conversation of more than its sender: the chat's or a topic's, not one member's."""
    if message is None or message.chat_type in ("", "p2p"):
        return False
    return not (message.sender and conversation.endswith(f":{message.sender}"))


def help_text(registry: ToolRegistry, caller: Caller | None, models: tuple[str, ...], lang: Language) -> str:
    permitted = [t.name for t in registry if registry.permitted(t, caller, models or "")]
    tools = (fixed_reply("help_tools", lang).format(tools=", ".join(permitted)) if permitted
             else fixed_reply("help_no_tools", lang))  # fmt: skip
    return "\n".join([fixed_reply("help_header", lang), fixed_reply("help_commands", lang), tools])


async def jobs_text(schedules: ScheduleStore | None, conversation: str, lang: Language) -> str:
    from ..schedule.tools import job_lines

    if schedules is None:
        return fixed_reply("jobs_unavailable", lang)
    jobs = await schedules.jobs(conversation)
    if not jobs:
        return fixed_reply("jobs_none", lang)
    return "\n".join([fixed_reply("jobs_header", lang), *job_lines(jobs)])


__all__: list[Any] = ["Command", "answer", "is_stop", "parse"]
