"""The default runner: the agent, with one in-memory session per conversation.

The gateway depends only on the `Runner` protocol, so a durable session store can replace the
in-memory `sessions` without touching the gateway or any channel.
"""

from __future__ import annotations

from collections import OrderedDict

from ..agent import Agent, Session
from ..replies import REPLIES, detect_language, fixed_reply
from .messages import InboundMessage

MAX_CONVERSATIONS = 10_000
MAX_HISTORY_MESSAGES = 40


class AgentRunner:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.sessions: OrderedDict[str, Session] = OrderedDict()

    async def __call__(self, message: InboundMessage) -> list[str]:
        if message.kind != "text":  # images, files…: we cannot read them, and we do not know the language
            return [f"{REPLIES['non_text']['zh']}\n{REPLIES['non_text']['en']}"]
        if not message.text.strip():  # a bare @mention
            return [fixed_reply("how_can_i_help", detect_language(message.text))]
        session = self._session(message.conversation)
        result = await self.agent.run(message.text, session=session)
        trim_history(session)
        return [result.reply]

    def _session(self, conversation: str) -> Session:
        session = self.sessions.pop(conversation, None) or Session(id=conversation)
        self.sessions[conversation] = session  # most recently used last
        while len(self.sessions) > MAX_CONVERSATIONS:
            self.sessions.popitem(last=False)
        return session


def trim_history(session: Session, limit: int = MAX_HISTORY_MESSAGES) -> None:
    """Keep the newest messages, cutting only before a user message, so a tool call is never
    separated from its results."""
    messages = session.messages
    if len(messages) <= limit:
        return
    for start in range(len(messages) - limit, len(messages)):
        if messages[start].get("role") == "user":
            del messages[:start]
            return
