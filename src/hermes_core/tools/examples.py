"""The two example tools the CLI loads by default, so the demo does something real.

Their descriptions are bilingual so that a model (and the offline demo model, which matches
words) knows when a Chinese or an English message asks for them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from . import calculator, clock
from .declare import tool


@tool(name="calculator", level=0)
def calculator_tool(
    expression: Annotated[str, Field(description="Arithmetic expression, e.g. (12+34)*2 or sqrt(2)^2")],
) -> dict[str, object]:
    """Evaluate an arithmetic expression exactly (use for all math). 计算数学表达式，例如 (12+34)*2。"""
    value = calculator.evaluate(expression)
    if isinstance(value, int) and value.bit_length() > 14_000:  # > 4,300 digits: json.dumps refuses it
        return {"expression": expression, "result": calculator.format_result(value)}
    return {"expression": expression, "result": value}


@tool(name="current_time", level=0)
def current_time(
    timezone: Annotated[
        str | None, Field(description="IANA timezone such as Asia/Shanghai; omit for local")
    ] = None,
) -> dict[str, str]:
    """Get the current date and time, optionally in a timezone. 查询现在的时间、日期、几点、星期几。"""
    return clock.now(timezone)


TOOLS = [calculator_tool, current_time]
