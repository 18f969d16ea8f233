"""LangGraph with a checkpointer (its own session mechanism), for bench_conversation_cost.py.

    python peer_langgraph.py URL TURNS        # run in the peers' virtual environment

One agent (`langchain.agents.create_agent`, a LangGraph graph) with a calculator tool and an
OpenAI-compatible chat model pointed at URL; its state is kept by a SQLite checkpointer under one
thread id, and each turn sends only the new message, as the persistence guide shows
(docs.langchain.com/oss/python/langgraph/persistence).
"""

from __future__ import annotations

import sqlite3
import sys

from langchain.agents import create_agent
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - the bench sends digits and operators


def main(url: str, turns: int) -> None:
    model = ChatOpenAI(model="m", base_url=url, api_key="bench")
    checkpointer = SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
    agent = create_agent(
        model, [calculator], system_prompt="You are a helpful assistant.", checkpointer=checkpointer
    )
    thread = {"configurable": {"thread_id": "bench"}}
    for turn in range(turns):
        agent.invoke({"messages": [("user", f"what is {turn + 12}*{turn % 7 + 3}?")]}, thread)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
