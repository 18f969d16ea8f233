"""`clarify` (T6): the model asks the user a question, and the task waits for the answer.

In the gateway the task pauses (`awaiting_answer`): the question goes out as the reply, and the
asker's next message in that conversation is the answer; the task then continues from its
journal, with the answer as this call's result. In a terminal the question is asked in place.
Offered only when the agent has somewhere to ask (`Agent.interactions`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ..kernel.tools.declare import TaskPaused, ToolContext, ToolError, tool


@tool(name="clarify", level=0, groups=("always",))  # offered whatever tools routing picks
async def clarify(
    question: Annotated[str, Field(description="The question, in the user's language; one thing at a time")],
    context: ToolContext,
) -> dict[str, str]:
    """Ask the user a question when the request is ambiguous or a needed detail is missing, instead of guessing. 需要用户补充信息或澄清时向用户提问。"""  # noqa: E501
    if context.interactions is None:
        raise ToolError("there is no one to ask in this run: make a reasonable assumption and state it")
    if not question.strip():
        raise ToolError("the question is empty: write the question for the user")
    asked = await context.interactions.question(
        context.task_id, context.call_id, question, context.caller, context.session_id
    )
    if asked.status == "answered":
        return {"question": question, "answer": asked.answer or ""}
    raise TaskPaused("awaiting_answer", question)


clarify.asks_user = True

__all__ = ["clarify"]
