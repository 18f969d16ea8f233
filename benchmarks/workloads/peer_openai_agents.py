"""openai-agents with its own session mechanism (`SQLiteSession`), for bench_conversation_cost.py.

    python peer_openai_agents.py URL TURNS      # run in the peers' virtual environment

One agent with a calculator function tool, the chat-completions model pointed at URL, one session
kept across TURNS runs, as the SDK's sessions guide shows (openai.github.io/openai-agents-python/sessions/).
"""

from __future__ import annotations

import asyncio
import sys

from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    SQLiteSession,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - the bench sends digits and operators


async def main(url: str, turns: int) -> None:
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="m", openai_client=AsyncOpenAI(base_url=url, api_key="bench"))
    agent = Agent(
        name="assistant", instructions="You are a helpful assistant.", model=model, tools=[calculator]
    )
    session = SQLiteSession("bench")
    for turn in range(turns):
        await Runner.run(agent, f"what is {turn + 12}*{turn % 7 + 3}?", session=session)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
