"""The built-in scheduling tools: `schedule_task`, `list_scheduled`, `cancel_scheduled`.

They act on the conversation the request came from (`CURRENT_MESSAGE`, set by the gateway's runner
for the turn): a job created here runs its prompt as a task in this conversation and its reply is
sent here, proactively. Who may do what (checked here, when the job is created, and again by the
scheduler when it fires):
- anyone may schedule into the conversation they are writing in (their one-to-one chat, or the
  group the request came from: being in the group is what sending from it proves);
- a job into another chat (`chat_id`, a broadcast) is for admins only;
- a job remembers its creator's role; at each fire the creator must still hold it.
The tools are level 1 (a job can be cancelled), `list_scheduled` level 0. A job's id comes from the
task and the call that created it, so the call run again after a crash creates nothing new.

Limits, so that one member cannot flood the operator's model account: each creator and each
conversation holds at most `JobLimits` active jobs (counted by the store as it inserts); a one-time
job is at least `min_delay` seconds ahead; and a fired task cannot schedule. A job that creates
jobs is how one message became hundreds of jobs a second, and counting its jobs against its
creator would only slow that to the quota; no reminder needs it, so its turn is not offered
`schedule_task` (gateway/runner.py withholds it) and the tool refuses such a turn anyway.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Annotated, Any

from pydantic import Field

from ..channels.seam import InboundMessage
from ..kernel.tools.permissions import ADMIN
from ..tools import Tool, ToolContext, ToolError, tool
from .jobs import (
    Job,
    JobLimits,
    ScheduleError,
    ScheduleStore,
    check_cron,
    first_fire,
    job_id_for,
    parse_at,
    shown_time,
    zone,
)

# the message whose turn is running: where a job created now runs and replies (gateway/runner.py)
CURRENT_MESSAGE: ContextVar[InboundMessage | None] = ContextVar("hermes_current_message", default=None)
MAX_DELAY_MINUTES = 366 * 24 * 60
MIN_DELAY = 60.0  # seconds a one-time job is ahead at least (`schedule.min_delay_minutes`)
NO_CONVERSATION = "scheduling works only in a conversation served by the gateway (hermes-kernel serve)"
JOB_WITHHELD = ("schedule_task",)  # not offered to a fired job's turn (gateway/runner.py)
FROM_A_JOB = "a scheduled task cannot schedule further tasks; say in your reply what should be scheduled"


def schedule_tools(
    store: ScheduleStore,
    *,
    timezone: str = "UTC",
    clock: Callable[[], float] = time.time,
    on_change: Callable[[], None] | None = None,
    limits: JobLimits | None = None,
    min_delay: float = MIN_DELAY,
) -> list[Tool]:
    """The three tools over `store`; `timezone` reads times without an offset and cron fields;
    `limits` and `min_delay` as the module docstring says."""
    zone(timezone)  # an unknown default zone is a start-up error
    default_zone = timezone

    @tool(name="schedule_task", level=1, groups=("schedule",),
          keywords=("remind", "every", "later", "提醒", "定时", "每天", "分钟后"))  # fmt: skip
    async def schedule_task(
        prompt: Annotated[
            str,
            Field(
                description="What to do when it fires, as an instruction to yourself, "
                "e.g. 'Remind the user to send the report'"
            ),
        ],  # fmt: skip
        context: ToolContext,
        cron: Annotated[
            str | None,
            Field(
                description="Repeat: a 5-field cron expression in the time zone, "
                "e.g. '0 9 * * 1-5' = weekdays 09:00"
            ),
        ] = None,  # fmt: skip
        at: Annotated[
            str | None,
            Field(
                description="Once, at this ISO date and time, e.g. "
                "2026-12-01T15:00 (the time zone unless an offset is given)"
            ),
        ] = None,
        delay_minutes: Annotated[float | None, Field(description="Once, this many minutes from now")] = None,
        timezone: Annotated[
            str | None, Field(description="IANA time zone, e.g. Asia/Shanghai; default: the service's")
        ] = None,  # fmt: skip
        chat_id: Annotated[
            str | None,
            Field(description="Another chat to post into (admins only); omit for this conversation"),
        ] = None,  # fmt: skip
    ) -> dict[str, Any]:
        """Schedule a task: at a time, after a delay, or repeating (cron). The prompt runs then as a task in this conversation and the reply is sent here. 定时任务/提醒：在指定时间、延迟后或按 cron 重复执行。"""  # noqa: E501
        message = _current()
        if message.kind == "scheduled":
            raise ToolError(FROM_A_JOB)
        given = [name for name, value in (("cron", cron), ("at", at), ("delay_minutes", delay_minutes))
                 if value is not None]  # fmt: skip
        if len(given) != 1:
            raise ToolError("give exactly one of cron, at or delay_minutes")
        if not prompt.strip():
            raise ToolError("the prompt is empty: say what to do when it fires")
        zone_name = timezone or default_zone
        now = clock()
        try:
            zone(zone_name)
            expression = check_cron(cron) if cron is not None else None
            moment = parse_at(at, zone_name, now) if at is not None else None
            if delay_minutes is not None:
                if not 0 < delay_minutes <= MAX_DELAY_MINUTES:
                    raise ScheduleError("delay_minutes must be more than 0 and at most a year")
                moment = now + delay_minutes * 60
            if moment is not None and moment - now < min_delay:
                raise ScheduleError(f"a one-time task must be at least {min_delay / 60:g} minute(s) ahead "
                                    "(schedule.min_delay_minutes)")  # fmt: skip
            next_fire = first_fire(expression, moment, zone_name, now)
        except ScheduleError as exc:
            raise ToolError(str(exc)) from None
        caller = context.caller
        role = caller.role if caller is not None else "member"
        target = _target(message, chat_id, role)
        job = Job(
            id=job_id_for(context.task_id, context.call_id), prompt=prompt.strip(), channel=message.channel,
            sender=message.sender, timezone=zone_name, cron=expression, at=moment, next_fire=next_fire,
            creator_role=role, **target,
        )  # fmt: skip
        try:
            stored = await store.add(job, limits)
        except ScheduleError as exc:  # over a quota
            raise ToolError(str(exc)) from None
        if on_change is not None:
            on_change()
        shown = shown_time(next_fire, zone_name)
        return {"job_id": stored.id, "when": stored.when, "next_fire": shown,
                "conversation": stored.conversation}  # fmt: skip

    @tool(name="list_scheduled", level=0, groups=("schedule",), keywords=("scheduled", "定时任务"))
    async def list_scheduled(context: ToolContext) -> list[dict[str, Any]]:
        """List the scheduled tasks of this conversation (id, when, next fire time, prompt). 列出本对话的定时任务。"""  # noqa: E501
        message = _current()
        return [_summary(job) for job in await store.jobs(message.conversation)]

    @tool(name="cancel_scheduled", level=1, groups=("schedule",), keywords=("cancel", "取消"))
    async def cancel_scheduled(
        job_id: Annotated[str, Field(description="The job's id, as list_scheduled shows it")],
        context: ToolContext,
    ) -> dict[str, Any]:
        """Cancel a scheduled task of this conversation by its id. 取消本对话的一个定时任务。"""
        message = _current()
        job = await store.get(job_id)
        if job is None or job.conversation != message.conversation or job.status != "active":
            raise ToolError(f"no active scheduled task {job_id!r} in this conversation (see list_scheduled)")
        caller = context.caller
        mine = caller is not None and caller.user_id == job.sender and caller.channel == job.channel
        if not mine and (caller is None or caller.role != ADMIN):
            raise ToolError("only the person who scheduled it, or an admin, can cancel it")
        cancelled = await store.cancel(job_id)
        if on_change is not None:
            on_change()
        return {"job_id": job_id, "cancelled": cancelled is not None}

    return [schedule_task, list_scheduled, cancel_scheduled]


def register_schedule_tools(
    agent: Any,
    store: ScheduleStore,
    *,
    timezone: str = "UTC",
    clock: Callable[[], float] = time.time,
    on_change: Callable[[], None] | None = None,
    limits: JobLimits | None = None,
    min_delay: float = MIN_DELAY,
) -> None:
    """The three tools on `agent` (unless it has tools of those names already): serve's agent, and
    with engine temporal a worker's, whose tool steps set `CURRENT_MESSAGE` (engine/temporal/)."""
    made = schedule_tools(store, timezone=timezone, clock=clock, on_change=on_change, limits=limits,
                          min_delay=min_delay)  # fmt: skip
    for declared in made:
        if agent.registry.get(declared.name) is None:
            agent.register_tool(declared)


def _current() -> InboundMessage:
    message = CURRENT_MESSAGE.get()
    if message is None:
        raise ToolError(NO_CONVERSATION)
    return message


def _target(message: InboundMessage, chat_id: str | None, role: str) -> dict[str, Any]:
    """Where the job posts: this conversation (inside a topic: that topic), or (admins, Feishu)
    another chat."""
    if chat_id is None or chat_id == message.chat_id:
        if message.channel == "webhook" and not message.callback_url:
            raise ToolError("this webhook conversation has no callback_url: a scheduled reply could not be "
                            "delivered; send the request with a callback_url to schedule")  # fmt: skip
        topic = message.thread_id  # asked inside a topic: the fire replies in it
        return {"conversation": message.conversation, "chat_id": message.chat_id, "broadcast": False,
                "chat_type": message.chat_type, "callback_url": message.callback_url,
                "thread_id": topic, "reply_to": message.reply_to if topic else None,
                "speaker": message.speaker}  # fmt: skip
    if role != ADMIN:
        raise ToolError("scheduling into another chat is for admins only; schedule into this conversation")
    if message.channel != "feishu":
        raise ToolError("posting into another chat is possible on Feishu only")
    return {"conversation": f"feishu:{chat_id}", "chat_id": chat_id, "chat_type": "group",
            "callback_url": None, "broadcast": True}  # fmt: skip


def _summary(job: Job) -> dict[str, Any]:
    nxt = shown_time(job.next_fire, job.timezone) if job.next_fire else None
    return {"job_id": job.id, "when": job.when, "next_fire": nxt, "prompt": job.prompt,
            "created_by": f"{job.channel}:{job.sender}"}  # fmt: skip


def job_lines(jobs: list[Job]) -> list[str]:
    """One line per job, for /jobs and the CLI: id, when, next fire, prompt."""
    lines = []
    for number, job in enumerate(jobs, start=1):
        nxt = shown_time(job.next_fire, job.timezone) if job.next_fire else "-"
        lines.append(f"{number}. [{job.id}] {job.when} → {nxt}: {job.prompt}")
    return lines
