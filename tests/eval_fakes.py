"""Scripted models for the eval and bench tests, served by the real-HTTP fake OpenAI server.

One handler, `solve`, knows a plan for every task the tests use (the built-in bench tasks and the
example cases): the tool calls to make, one batch per turn, then the answer. The models differ
only in the fake's per-model knobs:

- "good" follows the plan;
- "flaky" gets its tool-call arguments broken on the fake's fixed 30% schedule;
- "broken" gets every tool call broken;
- "slow" follows the plan, each answer delayed.

A model whose tool call fails gives up with `GIVE_UP`, so a broken call is a failed run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest

USAGE = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}  # every answer
GIVE_UP = "Sorry, the tool call failed, so I cannot answer that."
SLOW_LATENCY = 0.05
FLAKY_SHARE = 0.3
REPORT = "# Growth from q1 to q2\n- North: 25%\n- South: 18.75%\n- East: -9.09%\n"

Batch = list[tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class Plan:
    key: str  # a piece of the task message
    turns: list[Batch]  # the tool calls of each turn
    answer: str


PLANS = [
    Plan(
        "(1234 + 5678) * 3 - 17",
        [[("calculator", {"expression": "(1234 + 5678) * 3 - 17"})]],
        "(1234 + 5678) * 3 - 17 = 20719.",
    ),
    Plan("小明买了", [[("calculator", {"expression": "3*45.5 + 2*12"})]], "一共花了 160.5 元。"),
    Plan(
        "Read sales.csv",
        [
            [("read_file", {"path": "sales.csv"})],
            [
                ("calculator", {"expression": "(1500-1200)/1200*100"}),
                ("calculator", {"expression": "(950-800)/800*100"}),
                ("calculator", {"expression": "(1000-1100)/1100*100"}),
            ],
            [("write_file", {"path": "report.md", "content": REPORT})],
        ],
        "I wrote report.md: North +25%, South +18.75%, East -9.09%.",
    ),
    Plan(
        "order B-7",
        [
            [("list_directory", {})],
            [("read_file", {"path": "orders.json"})],
            [("calculator", {"expression": "4*27.25"})],
        ],
        "Order B-7 (4 desk lamps at 27.25) totals 109 euros.",
    ),
    Plan(
        "2024-05-01 to 2024-12-25",
        [
            [("date_diff", {"start": "2024-05-01", "end": "2024-12-25"})],
            [("calculator", {"expression": "238*24"})],
        ],
        "There are 5,712 hours (238 days).",
    ),
    Plan("what is (12+34)*2", [[("calculator", {"expression": "(12+34)*2"})]], "(12+34)*2 = 92"),
    Plan("what is (1280+745)*2", [[("calculator", {"expression": "(1280+745)*2"})]], "Twice the total: 4050"),
    Plan("list the files", [[("list_directory", {})]], "The workspace holds data/ and notes.txt."),
]


def solve(request: RecordedRequest) -> FakeReply:
    """The next move for the task in `request`: the plan's next batch of calls, or its answer."""
    messages = request.messages
    if not request.tools:  # the greeting fast path offers no tools
        return FakeReply.text("Hello! How can I help?", usage=dict(USAGE))
    last_user = max(i for i, message in enumerate(messages) if message.get("role") == "user")
    task = str(messages[last_user]["content"])
    plan = next((plan for plan in PLANS if plan.key in task), None)
    if plan is None:
        return FakeReply.text("I do not know how to do that.", usage=dict(USAGE))
    since = messages[last_user + 1 :]
    if any(str(m.get("content", "")).startswith('{"error"') for m in since if m.get("role") == "tool"):
        return FakeReply.text(GIVE_UP, usage=dict(USAGE))
    done = sum(1 for m in since if m.get("role") == "assistant" and m.get("tool_calls"))
    if done < len(plan.turns):
        return FakeReply.parallel_tool_calls(list(plan.turns[done]), usage=dict(USAGE))
    return FakeReply.text(plan.answer, usage=dict(USAGE))


@contextmanager
def fake_models() -> Iterator[FakeOpenAIServer]:
    """The fake server in a thread, with the good, flaky, broken and slow models set up."""
    fake = FakeOpenAIServer(handler=solve)
    fake.break_arguments = {"flaky": FLAKY_SHARE, "broken": 1.0}
    fake.model_latency = {"slow": SLOW_LATENCY}
    with fake:
        yield fake


def requests_for(fake: FakeOpenAIServer, model: str) -> int:
    """How many model calls the fake answered for `model`."""
    return sum(1 for request in fake.requests if request.model == model)


def write_config(folder: Path, max_concurrency: int = 2) -> Path:
    """A configuration for the tests: no retries (a broken answer is final), a small concurrency cap."""
    path = folder / "hermes.yaml"
    path.write_text(
        f"model:\n  max_retries: 0\n  timeout: 20\n  max_concurrency: {max_concurrency}\n", encoding="utf-8"
    )
    return path
