"""The offline demo model is the first thing a user sees: the obvious questions go to the right
example tool, in Chinese and English, and the rest gets a plain fixed reply.

The four reported questions run through `hermes-kernel run` subprocesses; the table runs the same
agent (built from the default configuration, real loop and real tools) in-process, with the clock's
documented test seam fixed so that "today" has one answer."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hermes_core.config import build_agent, load_settings
from hermes_core.tools import clock
from hermes_core.tools.calculator import CalculatorError, evaluate
from serve_process import CLEAN_ENV

DEMO = ("I am the built-in offline demo model", "我是内置的离线演示模型")


def run(message: str, tmp_path: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "hermes_core", "run", "--json", message], capture_output=True, text=True,
        timeout=60, cwd=tmp_path, env={**CLEAN_ENV, "TZ": "UTC"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result: dict = json.loads(done.stdout)
    return result


def today_utc() -> set[str]:
    """Today's date in UTC, and a second later's (a test running across midnight)."""
    now = datetime.now(timezone.utc)
    return {now.date().isoformat(), (now + timedelta(seconds=30)).date().isoformat()}


@pytest.mark.slow
def test_weekday_of_a_date_is_not_an_octal_error(tmp_path: Path) -> None:
    """Reported: "What day of the week is 2025-01-01?" answered with Python's octal-literal error
    (2025-01-01 sent to the calculator). Now the date is read as a date: date_diff, Wednesday."""
    result = run("What day of the week is 2025-01-01?", tmp_path)
    assert [c["name"] for c in result["tool_calls"]] == ["date_diff"]
    assert result["tool_calls"][0]["arguments"] == {"start": "2025-01-01", "end": "2025-01-01"}
    assert "2025-01-01 is a Wednesday" in result["reply"]
    assert "octal" not in result["reply"] and "leading zeros" not in result["reply"]


@pytest.mark.slow
@pytest.mark.parametrize("message", ["What's today's date?", "今天是几号？"])
def test_todays_date_in_english_and_chinese(message: str, tmp_path: Path) -> None:
    """Reported: answered "I am the offline demo". Now current_time, and the reply holds today's date."""
    result = run(message, tmp_path)
    assert [c["name"] for c in result["tool_calls"]] == ["current_time"]
    assert any(day in result["reply"] for day in today_utc()), result["reply"]
    assert not any(text in result["reply"] for text in DEMO)


@pytest.mark.slow
def test_arithmetic_in_words(tmp_path: Path) -> None:
    """Reported: "What is 3 plus 4?" answered "I am the offline demo". Now the calculator: 7."""
    result = run("What is 3 plus 4?", tmp_path)
    assert result["tool_calls"] == [
        {
            "name": "calculator",
            "arguments": {"expression": "3 + 4"},
            "result": '{"expression": "3 + 4", "result": 7}',
        }
    ]
    assert result["reply"] == "[offline demo model] The calculator tool returned: 7"


@pytest.mark.slow
def test_a_leading_zero_number_gets_a_clear_message(tmp_path: Path) -> None:
    """Attack: a number with a leading zero reaches the calculator: a clear message instead of
    Python's "use an 0o prefix for octal integers"."""
    result = run("what is 007 + 1", tmp_path)
    assert "numbers cannot start with 0: write 7 instead of 007" in result["reply"]
    assert "0o" not in result["reply"]
    with pytest.raises(CalculatorError, match="looks like a date.*date_diff"):
        evaluate("2025-01-01")
    assert evaluate("1.05 * 2") == 2.1 and evaluate("0.5 + 0") == 0.5 and evaluate("007.5") == 7.5


FIXED_NOW = datetime(2025, 3, 14, 9, 26, 53, tzinfo=timezone.utc)  # a Friday

# question, the tool it must call (None: none), what the reply must contain
TABLE: list[tuple[str, str | None, str]] = [
    ("What is 3 plus 4?", "calculator", "returned: 7"),
    ("what is 10 minus 2.5", "calculator", "returned: 7.5"),
    ("What is 6 times 7?", "calculator", "returned: 42"),
    ("what is 100 divided by 8", "calculator", "returned: 12.5"),
    ("what is (12+34)*2", "calculator", "returned: 92"),
    ("3加4等于几？", "calculator", "返回：7"),
    ("三加四等于多少", "calculator", "返回：7"),
    ("6 乘以 7 是多少", "calculator", "返回：42"),
    ("12除以4", "calculator", "返回：3"),
    ("计算 2^10", "calculator", "返回：1024"),
    ("What's today's date?", "current_time", "today is Friday, 2025-03-14"),
    ("今天是几号？", "current_time", "今天是 2025-03-14，星期五"),
    ("今天星期几？", "current_time", "星期五"),
    ("what time is it", "current_time", "it is 09:26:53 on Friday, 2025-03-14"),
    ("现在几点了", "current_time", "现在是 09:26:53"),
    ('what time is it in "Asia/Shanghai"', "current_time", "it is 17:26:53"),
    ("What day of the week is 2025-01-01?", "date_diff", "2025-01-01 is a Wednesday"),
    ("2025年1月1日是星期几？", "date_diff", "2025-01-01 是星期三"),
    ("How many days between 2025-01-01 and 2025-03-01?", "date_diff", "is 59 days"),
    ("2024-01-01 到 2024-12-25 相差多少天", "date_diff", "相差 359 天"),
    ("tell me a joke", None, "All I can do: arithmetic"),
    ("讲个笑话", None, "我能做的只有：算术"),
    ("the date of the moon landing", None, "cannot answer general questions"),
]


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setattr(clock, "_clock", lambda: FIXED_NOW)


@pytest.mark.parametrize(("question", "tool", "expected"), TABLE)
async def test_the_demo_answers_the_obvious_questions(
    question: str, tool: str | None, expected: str, fixed_clock: None
) -> None:
    """A table of first questions (zh/en): the tool each must go to, and what the answer says."""
    agent = build_agent(load_settings(env={}, dotenv=None))
    result = await agent.run(question)
    assert [o.call.name for o in result.tool_calls] == ([tool] if tool else []), result.reply
    assert expected in result.reply, result.reply
    if tool is None:  # says plainly what it cannot do and how to get a real model, in the asker's language
        assert "HERMES_PROVIDER" in result.reply
