"""Plan-and-execute mode: the model writes a JSON plan, code validates and runs it, the model answers."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hermes_core import Agent, ToolError, tool
from hermes_core.kernel.loop import pause_reply
from hermes_core.kernel.replies import fixed_reply
from hermes_core.kernel.tools.permissions import Caller
from hermes_core.models import ModelUnavailable
from hermes_core.plans import run_plan
from hermes_core.tasks import SQLiteTaskJournal
from hermes_core.tasks.pending import SQLiteInteractions
from hermes_core.testing import ScriptedModel, call


class Office:
    """Three tools of a small office task, counting what ran and with which arguments."""

    def __init__(
        self, failures: int = 0, block: asyncio.Event | None = None, confirm_email: bool = False
    ) -> None:
        self.confirm_email = confirm_email  # send_email waits for a person's approval
        self.ran: list[tuple[str, dict[str, Any]]] = []
        self.failures = failures  # convert_to_pdf fails this many times first
        self.block = block  # convert_to_pdf waits for this (a test cancels the task there)
        self.entered = asyncio.Event()

    def counts(self) -> tuple[int, int, int]:
        """How often find_file, convert_to_pdf and send_email ran."""
        ran = Counter(tool for tool, _ in self.ran)
        return ran["find_file"], ran["convert_to_pdf"], ran["send_email"]

    def tools(self) -> list[Any]:
        @tool(level=0)
        def find_file(keyword: str) -> dict:
            """Find a file by keyword; returns its id and name."""
            self.ran.append(("find_file", {"keyword": keyword}))
            return {"file_id": "f-42", "name": f"{keyword}.docx"}

        @tool(level=1, idempotent=True)
        async def convert_to_pdf(file_id: str) -> dict:
            """Convert a file to PDF; returns the PDF's id."""
            self.ran.append(("convert_to_pdf", {"file_id": file_id}))
            if self.block is not None:
                self.entered.set()
                await self.block.wait()
            if self.failures:
                self.failures -= 1
                raise ToolError("the converter is busy, try again")
            return {"pdf_id": f"{file_id}.pdf"}

        @tool(level=1, confirm=self.confirm_email)
        def send_email(recipient: str, attachment: str) -> str:
            """Send an email with an attachment."""
            self.ran.append(("send_email", {"recipient": recipient, "attachment": attachment}))
            return f"sent {attachment} to {recipient}"

        @tool(level=1, required_role="admin")
        def broadcast(text: str) -> str:
            """Send a message to everyone in the company."""
            self.ran.append(("broadcast", {"text": text}))
            return "sent"

        return [find_file, convert_to_pdf, send_email, broadcast]


def plan(*steps: dict[str, Any]) -> str:
    return json.dumps({"steps": list(steps)}, ensure_ascii=False)


FIND = {"id": "find", "tool": "find_file", "params": {"keyword": "报价单"}}
PDF = {"id": "pdf", "tool": "convert_to_pdf", "params": {"file_id": "$output.find.file_id"}}
MAIL = {
    "id": "mail",
    "tool": "send_email",
    "params": {"recipient": "李总", "attachment": "$output.pdf.pdf_id"},
    "requires": ["pdf"],
}
GOOD_PLAN = plan(FIND, PDF, MAIL)


async def test_a_valid_plan_runs_in_order_with_references_and_ends_in_an_answer() -> None:
    office = Office()
    model = ScriptedModel([GOOD_PLAN, "报价单已转成 PDF 发给李总。"])
    agent = Agent(model=model, tools=office.tools())
    from hermes_core import Session

    session = Session()
    result = await run_plan(agent, "把报价单转成PDF发给李总", session=session)

    assert result.ok and result.reply == "报价单已转成 PDF 发给李总。"
    assert office.ran == [
        ("find_file", {"keyword": "报价单"}),
        ("convert_to_pdf", {"file_id": "f-42"}),  # "$output.find.file_id" resolved
        ("send_email", {"recipient": "李总", "attachment": "f-42.pdf"}),
    ]
    assert result.model_calls == 2 and len(result.tool_calls) == 3
    assert [o.content for o in result.tool_calls][2] == "sent f-42.pdf to 李总"
    assert result.usage.total_tokens == 30 and set(result.timings) >= {"model", "tools", "total"}
    planning, answering = model.calls
    assert planning.tools is None  # tools are described in the prompt, never offered as callable
    assert '"name": "send_email"' in planning.messages[0]["content"]
    assert '"name": "broadcast"' not in planning.messages[0]["content"]  # members may not use it
    assert '"result": "sent f-42.pdf to 李总"' in answering.messages[-1]["content"]
    assert "Plan mode" not in answering.messages[0]["content"]  # the answer needs no tool catalogue
    assert result.messages[-1] == {"role": "assistant", "content": result.reply}
    assert session.messages == [
        {"role": "user", "content": "把报价单转成PDF发给李总"},
        {"role": "assistant", "content": result.reply},
    ]


async def test_a_plan_without_steps_may_answer_directly() -> None:
    model = ScriptedModel([json.dumps({"steps": [], "answer": "你好！有什么可以帮你？"}, ensure_ascii=False)])
    result = await run_plan(Agent(model=model, tools=Office().tools()), "你好呀，今天怎么样")
    assert result.ok and result.reply == "你好！有什么可以帮你？" and result.model_calls == 1


BAD_PLANS = {
    "unknown tool": (
        plan({"id": "find", "tool": "find_fiel", "params": {"keyword": "x"}}),
        "step 'find': unknown tool 'find_fiel'; available tools: find_file",
    ),
    "forward reference": (
        plan(PDF, FIND),
        "step 'pdf' uses $output.find, but step 'find' comes later in the plan",
    ),
    "reference to no step": (
        plan(FIND, {"id": "pdf", "tool": "convert_to_pdf", "params": {"file_id": "$output.search.id"}}),
        "step 'pdf' uses $output.search, but the plan has no such step (steps: find, pdf)",
    ),
    "cycle": (
        plan({**FIND, "requires": ["mail"]}, PDF, MAIL),
        "the steps form a cycle (find → mail → pdf → find)",
    ),
    "self reference": (
        plan({"id": "pdf", "tool": "convert_to_pdf", "params": {"file_id": "$output.pdf.pdf_id"}}),
        "the steps form a cycle (pdf → pdf)",
    ),
    "missing param": (
        plan(FIND, {"id": "mail", "tool": "send_email", "params": {"recipient": "李总"}}),
        "step 'mail': send_email requires the parameter(s) 'attachment', missing in params",
    ),
    "not permitted": (
        plan({"id": "all", "tool": "broadcast", "params": {"text": "hi"}}),
        "step 'all': you do not have permission to call broadcast: it requires the admin role",
    ),
    "not JSON": ("Sure! First I will look for the file, then convert it.", "your reply is not a JSON plan"),
    "steps not a list": (json.dumps({"steps": {"find": FIND}}), 'a JSON object with a "steps" list'),
    "step without a tool": (plan({"id": "find", "params": {}}), 'step 1: "tool" must be a tool name'),
    "params not an object": (plan({**FIND, "params": ["报价单"]}), 'step 1: "params" must be an object'),
    "duplicate ids": (plan(FIND, {**FIND, "params": {"keyword": "b"}}), "step id 'find' is used more than"),
    "tool calls instead of a plan": (call("find_file", {"keyword": "x"}), "you called tools (find_file)"),
}


@pytest.mark.parametrize("case", BAD_PLANS)
async def test_an_invalid_plan_runs_nothing_and_goes_back_with_its_problems(case: str) -> None:
    bad, problem = BAD_PLANS[case]
    office = Office()
    model = ScriptedModel([bad, GOOD_PLAN, "done"])
    caller = Caller("u1", role="member")
    result = await run_plan(Agent(model=model, tools=office.tools()), "send the quote", caller=caller)

    feedback = model.calls[1].messages[-1]["content"]
    assert feedback.startswith("Your plan cannot run:") and problem in feedback
    assert result.ok and result.reply == "done" and result.model_calls == 3
    assert [name for name, _ in office.ran] == ["find_file", "convert_to_pdf", "send_email"]  # the fixed plan


async def test_every_problem_of_a_plan_is_listed_at_once() -> None:
    bad = plan(
        {"id": "a", "tool": "nope", "params": {}},
        {"id": "b", "tool": "send_email", "params": {"recipient": "x", "attachment": "$output.c"}},
        {"id": "c", "tool": "find_file", "params": {}},
    )
    model = ScriptedModel([bad, GOOD_PLAN, "done"])
    await run_plan(Agent(model=model, tools=Office().tools()), "send it")
    feedback = model.calls[1].messages[-1]["content"]
    assert "unknown tool 'nope'" in feedback and "step 'c' comes later" in feedback
    assert "find_file requires the parameter(s) 'keyword'" in feedback


async def test_invalid_plans_are_bounded_then_the_user_gets_a_fixed_reply() -> None:
    office = Office()
    model = ScriptedModel(["not a plan"] * 3)
    result = await run_plan(Agent(model=model, tools=office.tools()), "发一下报价单", max_replans=2)
    assert result.stop_reason == "plan_invalid" and result.reply == fixed_reply("plan_invalid", "zh")
    assert result.model_calls == 3 and office.ran == []
    assert result.messages[-1]["role"] == "assistant"  # no request for a fourth plan left dangling


async def test_a_failing_step_sends_plan_results_and_error_back_for_a_revised_plan() -> None:
    office = Office(failures=1)
    revised = plan(FIND, PDF, {**MAIL, "id": "send"})
    model = ScriptedModel([GOOD_PLAN, revised, "sent"])
    result = await run_plan(Agent(model=model, tools=office.tools()), "send the quote to Li")

    replan = model.calls[1].messages
    assert replan[-2] == {"role": "assistant", "content": GOOD_PLAN}  # the plan itself
    feedback = replan[-1]["content"]
    assert feedback.startswith("Step 'pdf' (convert_to_pdf) failed: the converter is busy, try again")
    assert '{"step": "find", "tool": "find_file", "status": "ok", "result": {"file_id": "f-42"' in feedback
    assert '{"step": "mail", "tool": "send_email", "status": "not run"}' in feedback
    assert result.ok and result.reply == "sent" and result.model_calls == 3
    # the revised plan repeats find_file with the same arguments: its result is reused, not rerun
    assert office.counts() == (1, 2, 1)
    assert [(o.call.name, o.ok) for o in result.tool_calls] == [
        ("find_file", True),
        ("convert_to_pdf", False),
        ("convert_to_pdf", True),
        ("send_email", True),
    ]
    assert len({o.call.id for o in result.tool_calls}) == 4  # each attempt's calls have their own ids


async def test_re_plans_are_bounded() -> None:
    office = Office(failures=10)
    model = ScriptedModel([GOOD_PLAN] * 2)
    result = await run_plan(Agent(model=model, tools=office.tools()), "send the quote", max_replans=1)
    assert result.stop_reason == "plan_failed" and result.reply == fixed_reply("plan_failed", "en")
    assert result.model_calls == 2 and office.counts() == (1, 2, 0)


async def test_a_reference_to_a_missing_field_is_a_clear_problem_for_the_model() -> None:
    office = Office()
    typo = plan(FIND, {**PDF, "params": {"file_id": "$output.find.fileid"}})
    model = ScriptedModel([typo, GOOD_PLAN, "done"])
    result = await run_plan(Agent(model=model, tools=office.tools()), "convert the quote")
    feedback = model.calls[1].messages[-1]["content"]
    assert "$output.find has no field 'fileid' (its fields: file_id, name)" in feedback
    assert result.ok and office.counts() == (1, 1, 1)  # convert_to_pdf ran only in the corrected plan


async def test_independent_steps_run_concurrently() -> None:
    @tool(level=0)
    def weather(city: str) -> dict:
        """Today's weather in a city."""
        time.sleep(0.5)  # a sync tool: runs in the tool thread pool
        return {"city": city, "temp_c": 21}

    @tool(level=0)
    async def air_quality(city: str) -> dict:
        """Today's air quality in a city."""
        await asyncio.sleep(0.5)  # an async tool: on the event loop
        return {"city": city, "aqi": 42}

    @tool(level=0)
    def compare(a: dict, b: dict) -> str:
        """Compare two readings."""
        return f"{a['city']} {a['temp_c']}°C, AQI {b['aqi']}"

    parallel = plan(
        {"id": "w", "tool": "weather", "params": {"city": "北京"}},
        {"id": "q", "tool": "air_quality", "params": {"city": "北京"}},
        {"id": "c", "tool": "compare", "params": {"a": "$output.w", "b": "$output.q"}},
    )
    agent = Agent(model=ScriptedModel([parallel, "ok"]), tools=[weather, air_quality, compare])
    started = time.perf_counter()
    result = await run_plan(agent, "北京今天天气和空气怎么样")
    elapsed = time.perf_counter() - started
    assert result.ok and result.tool_calls[2].content == "北京 21°C, AQI 42"
    assert elapsed < 0.9, f"two 0.5 s steps took {elapsed:.2f} s: they did not overlap"


async def test_steps_pass_the_registry_timeouts_and_argument_checks() -> None:
    @tool(level=0)
    async def slow_lookup(n: int) -> int:
        """Look a number up slowly."""
        await asyncio.sleep(5)
        return n

    steps = plan(
        {"id": "slow", "tool": "slow_lookup", "params": {"n": 1}},
        {"id": "bad", "tool": "slow_lookup", "params": {"n": "not a number"}},
    )
    model = ScriptedModel([steps, "gave up"])
    agent = Agent(model=model, tools=[slow_lookup], tool_timeout=0.2)
    result = await run_plan(agent, "look up 1", max_replans=1)
    errors = {o.call.arguments: o.error for o in result.tool_calls}
    assert errors == {'{"n": 1}': "timeout", '{"n": "not a number"}': "bad_arguments"}
    assert "timed out after 0.2 s" in model.calls[1].messages[-1]["content"]


async def test_a_pause_for_approval_stops_the_plan_and_it_continues_once_approved(tmp_path: Path) -> None:
    office = Office(confirm_email=True)
    database = tmp_path / "g.db"
    model = ScriptedModel([GOOD_PLAN, "sent"])
    interactions = SQLiteInteractions(database)
    agent = Agent(
        model=model, tools=office.tools(), journal=SQLiteTaskJournal(database), interactions=interactions
    )
    alice = Caller("ou_alice", channel="feishu")
    first = await run_plan(agent, "send the quote", task_id="t1", caller=alice)
    assert first.stop_reason == "awaiting_approval" and office.counts() == (1, 1, 0)
    [pending] = await interactions.open_for_task("t1")
    assert pending.call_id == "t1:plan0:mail" and json.loads(pending.arguments)["attachment"] == "f-42.pdf"
    assert first.reply == pause_reply(first.tool_calls[-1], "en") and pending.id in first.reply

    await interactions.decide(pending.id, alice, approve=True)
    second = await run_plan(agent, "send the quote", task_id="t1", caller=alice)
    assert second.ok and second.reply == "sent" and office.counts() == (1, 1, 1)
    assert len(model.calls) == 2  # the plan came from the journal; the model only wrote the answer


async def test_a_plan_interrupted_mid_step_resumes_from_its_journal(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    office = Office(block=asyncio.Event())
    first = Agent(model=ScriptedModel([GOOD_PLAN]), tools=office.tools(), journal=SQLiteTaskJournal(path))
    task = asyncio.ensure_future(run_plan(first, "send the quote", task_id="t1"))
    await asyncio.wait_for(office.entered.wait(), 5)
    task.cancel()  # the process "dies" inside convert_to_pdf: it has no result in the journal
    with pytest.raises(asyncio.CancelledError):
        await task

    office.block = None
    later = ScriptedModel(["sent"])  # the plan comes from the journal: only the answer is asked
    second = Agent(model=later, tools=office.tools(), journal=SQLiteTaskJournal(path))
    result = await run_plan(second, "send the quote", task_id="t1")
    assert result.ok and result.reply == "sent" and len(later.calls) == 1
    # find_file ran once; the idempotent conversion that was cut off ran again; then the email
    assert office.counts() == (1, 2, 1)

    untouched = ScriptedModel([])
    third = Agent(model=untouched, tools=office.tools(), journal=SQLiteTaskJournal(path))
    replayed = await run_plan(third, "send the quote", task_id="t1")
    assert replayed.reply == "sent" and untouched.calls == [] and len(office.ran) == 4


async def test_an_unreachable_model_ends_with_the_fixed_reply() -> None:
    model = ScriptedModel([GOOD_PLAN, ModelUnavailable("down")])
    office = Office()
    result = await run_plan(Agent(model=model, tools=office.tools()), "send the quote")
    assert result.stop_reason == "model_unavailable"
    assert result.reply == fixed_reply("model_unavailable", "en")
    assert len(office.ran) == 3


async def test_a_plan_written_by_a_fallback_model_is_checked_for_that_model() -> None:
    """The primary answers 503 and the fallback writes the plan: a tool allowed only for the primary
    is refused to it, as in the loop, and never runs (the fixed plan does)."""
    from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply

    office = Office()
    records: list[str] = []

    @tool(level=0, allowed_models=("big",))
    def customer_records(query: str) -> str:
        """Search the customer records."""
        records.append(query)
        return "alice: card 4111"

    async with FakeOpenAIServer() as fake:
        fake.unavailable = {"big"}
        steal = {"id": "steal", "tool": "customer_records", "params": {"query": "cards"}}
        fake.script_for("small", *(FakeReply.text(text) for text in (plan(steal), plan(FIND), "ok")))
        agent = Agent(model="big", base_url=fake.base_url, fallback_models=["small"], max_retries=0,
                      tools=[*office.tools(), customer_records])  # fmt: skip
        result = await run_plan(agent, "find alice's card")
        await agent.aclose()
    assert records == [] and result.ok and [name for name, _ in office.ran] == ["find_file"]
    assert "customer_records" in fake.requests[3].messages[-1]["content"]  # the problem, told to small
