"""The default runner: the agent, with a memory per conversation.

For each message: `/memory` and `/forget` are answered here, before any model call, so every
channel (webhook, Feishu, the terminal REPL) has them; anything else becomes one agent turn over
the window and notes that `ConversationMemory.prepare` builds, and the turn's messages are
committed to the session store afterwards. The gateway depends only on the `Runner` protocol.
"""

from __future__ import annotations

from ..agent import Agent
from ..models.base import TextCallback
from ..replies import REPLIES, detect_language, fixed_reply
from ..sessions import ConversationMemory, InMemorySessionStore
from ..tools.permissions import Caller
from .messages import InboundMessage


class AgentRunner:
    def __init__(self, agent: Agent, memory: ConversationMemory | None = None) -> None:
        """`memory` defaults to in-process conversations (lost on restart); `serve` passes a SQLite one."""
        self.agent = agent
        self.memory = memory or ConversationMemory(InMemorySessionStore())
        self.memory.attach(agent)

    async def __call__(self, message: InboundMessage) -> list[str]:
        if message.kind != "text":  # images, files…: we cannot read them, and we do not know the language
            return [f"{REPLIES['non_text']['zh']}\n{REPLIES['non_text']['en']}"]
        if not message.text.strip():  # a bare @mention
            return [fixed_reply("how_can_i_help", detect_language(message.text))]
        # the same id when the message is run again after a crash: the task resumes from its journal
        task_id = f"{message.channel}:{message.message_id}"
        caller = self.agent.permissions.caller(message.sender, message.channel)
        return [await self.reply(message.conversation, message.text, task_id=task_id, caller=caller)]

    async def reply(
        self,
        conversation: str,
        text: str,
        *,
        on_text: TextCallback | None = None,
        task_id: str | None = None,
        caller: Caller | None = None,
    ) -> str:
        """One user message in, the reply text out: a memory command, or one agent turn."""
        answer = await self.memory.command(conversation, text, self.agent.language)
        if answer is not None:
            return answer
        prompt = await self.memory.prepare(conversation, text, self.agent.client)
        session = prompt.session()
        result = await self.agent.run(text, session=session, on_text=on_text, task_id=task_id, caller=caller)
        await self.memory.commit(conversation, session.messages[len(prompt.window) :], result)
        return result.reply

    async def aclose(self) -> None:
        await self.memory.close()
