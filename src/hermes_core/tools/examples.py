"""The example tools the CLI loads by default (calculator, current_time, date_diff), so the demo
does something real.

Their descriptions are bilingual so that a model (and the offline demo model, which matches
words) knows when a Chinese or an English message asks for them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ..kernel.tools.declare import ToolError, tool
from . import calculator, clock


@tool(name="calculator", level=0)
def calculator_tool(
    expression: Annotated[str, Field(description="Arithmetic expression, e.g. (12+34)*2 or sqrt(2)^2")],
) -> dict[str, object]:
    """Evaluate an arithmetic expression exactly (use for all math). 计算数学表达式，例如 (12+34)*2。"""
    value = calculator.evaluate(expression)
    if isinstance(value, int) and value.bit_length() > 14_000:  # > 4,300 digits: json.dumps refuses it
        return {"expression": expression, "result": calculator.format_result(value)}
    return {"expression": expression, "result": value}


@tool(name="current_time", level=0, varies=True)  # a replay uses the recorded time
def current_time(
    timezone: Annotated[
        str | None, Field(description="IANA timezone such as Asia/Shanghai; omit for local")
    ] = None,
) -> dict[str, str]:
    """Get the current date and time, optionally in a timezone. 查询现在的时间、日期、几点、星期几。"""
    return clock.now(timezone)


@tool(name="date_diff", level=0, idempotent=True)
def date_diff(
    start: Annotated[str, Field(description="Start date or datetime, ISO format, e.g. 2024-05-01")],
    end: Annotated[str, Field(description="End date or datetime, e.g. 2024-12-25T08:00:00+08:00")],
) -> dict[str, int | float | str]:
    """How many days (and seconds) lie between two dates, and the weekday of each; negative when end is earlier. Use it for any date arithmetic or weekday. 计算两个日期之间相差多少天、还有多久、过了多久，以及某天是星期几。"""  # noqa: E501
    try:
        span = clock.date_diff(start, end)
        return {**span, "start_weekday": clock.weekday(start), "end_weekday": clock.weekday(end)}
    except ValueError as exc:  # a wrong date is the model's to fix, not a crash
        raise ToolError(str(exc)) from None


TOOLS = [calculator_tool, current_time, date_diff]
