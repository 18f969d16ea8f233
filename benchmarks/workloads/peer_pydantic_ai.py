"""pydantic-ai with its own history mechanism (`message_history`), for bench_conversation_cost.py.

    python peer_pydantic_ai.py URL TURNS        # run in the peers' virtual environment

One agent with a calculator tool, an OpenAI-compatible model pointed at URL, each run given the
previous run's `all_messages()`, as the message-history guide shows (ai.pydantic.dev/message-history/).
"""

from __future__ import annotations

import asyncio
import sys

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider


async def main(url: str, turns: int) -> None:
    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=url, api_key="bench"))
    agent = Agent(model, system_prompt="You are a helpful assistant.")

    @agent.tool_plain
    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - the bench sends digits and operators

    history = None
    for turn in range(turns):
        result = await agent.run(f"what is {turn + 12}*{turn % 7 + 3}?", message_history=history)
        history = result.all_messages()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
