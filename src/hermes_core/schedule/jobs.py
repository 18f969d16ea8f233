"""Scheduled jobs: what one is, when it fires, and the store it lives in (the `ScheduleStore` seam).

A job is a prompt that runs as a task in the conversation it was created in, at a time:
- `cron`: a cron expression (5 fields, croniter), read in the job's time zone, so "0 9 * * 1-5" in
  America/New_York is 09:00 local on both sides of a daylight-saving change;
- `at`: one moment (a UTC timestamp; an ISO datetime without an offset is read in the time zone);
- a delay is turned into `at` when the job is created.

`next_fire` is always a UTC timestamp; the time zone matters only for reading cron fields and naive
datetimes. croniter and zoneinfo are imported by the functions that need them, not at import.

When clocks fall back, a wall-clock time comes twice (01:30 in New York on 2026-11-01 is 05:30 and
06:30 UTC). As Vixie cron does, a job at a fixed time (neither its minute nor its hour field starts
with `*`) fires at the first of the two only; a job with a wildcard minute or hour keeps its rhythm
through the repeated hour (hourly fires 25 times that day).

Bounds: a time more than `MAX_AHEAD` ahead is refused (`check_ahead`): no reminder needs it, and a
time near year 9999 cannot be shown in every zone. What cannot be shown anyway (a row stored before
the bound) is shown as such by `shown_time`, so one bad row never breaks a listing. How many jobs
one creator and one conversation may hold is `JobLimits`, counted by the store in the transaction
that inserts the job.

Firing (gateway/schedules.py has the SQLite implementation, postgres/schedules.py the one several
nodes share): `claim_due(now)` takes each job whose
`next_fire` has come and, in ONE transaction, records the fire (job id, fire time: the primary key of
`schedule_fires`), inserts the task's message into the gateway's inbox (keyed by the same pair) and
moves `next_fire` on. A crash before the commit leaves nothing (the fire is claimed again at the next
start); after it the message is in the inbox and runs once like any accepted message.

Missed fires (the service was down): the latest fire time that has passed runs once if it is at most
`misfire_grace` seconds old; otherwise it is recorded as skipped. Earlier missed fire times of the
same job are recorded as one skipped row that counts them. Either way the job goes on from the next
fire time after now.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Protocol

from ..channels.seam import InboundMessage

JobStatus = Literal["active", "done", "cancelled"]
FireStatus = Literal["queued", "skipped", "refused"]
# Missed fire times counted one by one; beyond, the count says "more than": each step costs a
# croniter call (~0.1 ms), and a minutely job down for a week missed 10,000.
MAX_COUNTED = 100
MAX_AHEAD_YEARS = 10  # the furthest a job may be set; far below year 9999, where times stop showing
MAX_AHEAD = MAX_AHEAD_YEARS * 366 * 86400.0
# how a fire's prompt reaches the model (gateway/runner.py, engine/temporal/workflow.py): said to be a
# job's, never read as a command
SCHEDULED_PROMPT = "[scheduled task {job}, set up earlier in this conversation{by}, is due now] {prompt}"


def scheduled_prompt(message: InboundMessage, speaker: str = "") -> str:
    """A fire as the model reads it: said to be a scheduled task, and in a group by whom it was set
    up (`speaker`: the label of Job.speaker, with their name when the channel gives it), so that
    "remind me" can be answered to that person."""
    by = f" by {speaker}" if speaker else ""
    return SCHEDULED_PROMPT.format(job=message.extra.get("job", "?"), by=by, prompt=message.text)


class ScheduleError(ValueError):
    """A schedule the caller wrote wrongly (a bad cron, an unknown zone, a time in the past)."""


class QuotaExceeded(ScheduleError):
    """The creator or the conversation holds as many active jobs as `JobLimits` allows."""


@dataclass(frozen=True)
class JobLimits:
    """How many active jobs one creator (channel and user id) and one conversation may hold
    (`schedule.max_jobs_per_user`, `schedule.max_jobs_per_chat`). Jobs the operator declares or adds
    from the command line are not counted against anyone."""

    per_user: int
    per_chat: int

    def refusal(self, by_user: int, in_chat: int) -> QuotaExceeded | None:
        """Why one more job is refused, given the active jobs counted now, or None."""
        if by_user >= self.per_user:
            held, setting = f"you have {by_user} active scheduled tasks", "max_jobs_per_user"
        elif in_chat >= self.per_chat:
            held, setting = f"this conversation has {in_chat} active scheduled tasks", "max_jobs_per_chat"
        else:
            return None
        return QuotaExceeded(f"{held}, the most allowed (schedule.{setting}); cancel one "
                             "(list_scheduled, then cancel_scheduled) before scheduling another")  # fmt: skip


@dataclass
class Job:
    id: str
    prompt: str
    channel: str
    conversation: str
    sender: str  # the creator's user id on `channel`: the task runs for them
    timezone: str
    cron: str | None = None
    at: float | None = None  # one-shot: UTC timestamp
    next_fire: float | None = None  # None once a one-shot fired or a job was cancelled
    status: JobStatus = "active"
    creator_role: str = "member"  # at creation; the fire is refused if the creator no longer has it
    broadcast: bool = False  # into a chat other than the one it was asked in: admin only
    chat_id: str | None = None
    chat_type: str = "p2p"
    callback_url: str | None = None
    speaker: str = ""  # in a group: who set it up, as the model read them (the request's speaker)
    thread_id: str | None = None  # the platform topic it was asked in (Feishu): the fire posts there
    reply_to: str | None = None  # with thread_id: the message in the topic the fire replies under
    source: str = "chat"  # chat | config | cli
    created_at: float = field(default_factory=time.time)
    last_fire: float | None = None
    last_outcome: str | None = None

    @property
    def when(self) -> str:
        """How the job was scheduled, for lists: the cron expression or the one moment (local)."""
        if self.cron:
            return f"cron {self.cron} ({self.timezone})"
        return f"at {shown_time(self.at or 0.0, self.timezone)}"

    def message(self, fire_at: float) -> InboundMessage:
        """The task's message for the fire at `fire_at`: its own message id (job, fire time), so a
        fire inserted twice is one inbox row. The reply is sent proactively: into the chat, or for a
        job asked inside a topic into that topic (a topic is reached by replying in it)."""
        return InboundMessage(
            channel=self.channel,
            conversation=self.conversation,
            sender=self.sender,
            text=self.prompt,
            message_id=fire_message_id(self.id, fire_at),
            kind="scheduled",
            chat_id=self.chat_id,
            chat_type=self.chat_type,
            callback_url=self.callback_url,
            reply_to=self.reply_to if self.thread_id else None,
            thread_id=self.thread_id,
            speaker=self.speaker,
            received_at=fire_at,
            extra={"job": self.id, "fire_at": fire_at, "creator_role": self.creator_role},
        )

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["when"] = self.when
        data["next_fire_local"] = shown_time(self.next_fire, self.timezone) if self.next_fire else None
        return data


@dataclass
class Fire:
    """One fire time of a job, as claimed: queued (its message is in the inbox), skipped or refused."""

    job_id: str
    fire_at: float
    status: FireStatus
    reason: str = ""
    message: InboundMessage | None = None  # when queued: the message now in the inbox


def fire_message_id(job_id: str, fire_at: float) -> str:
    return f"job:{job_id}@{int(round(fire_at * 1000))}"


def job_id_for(*parts: str) -> str:
    """A job id derived from where it was asked (task id and call id): a call run again after a
    crash creates the same job, not a second one."""
    return "j" + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:11]


MACHINE_ZONE = "local"  # `schedule.timezone: local` (the default): the machine's own zone


def machine_zone() -> str:
    """The machine's own time zone as an IANA name, found as the C library finds it: `TZ` (a name,
    `:name` or a path into a zoneinfo folder), else the zone file /etc/localtime links to, else the
    name in /etc/timezone (Debian copies the file instead of linking it); UTC when none names a zone.
    Written here rather than taken from tzlocal: these few lines are all of it on a POSIX machine."""
    candidates = [os.environ.get("TZ", "").removeprefix(":")]
    if os.path.islink("/etc/localtime"):
        candidates.append(os.path.realpath("/etc/localtime"))
    try:
        candidates.append(Path("/etc/timezone").read_text(encoding="utf-8").strip())
    except OSError:
        pass
    for candidate in candidates:
        name = candidate.rpartition("zoneinfo/")[2].removeprefix("posix/")
        if name and _is_zone(name):
            return name
    return "UTC"


def _is_zone(name: str) -> bool:
    try:
        zone(name)
    except ScheduleError:
        return False
    return True


def zone(name: str) -> Any:
    """The `ZoneInfo` of `name`; ScheduleError naming it when there is no such zone."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:  # OSError: a folder (`Asia`)
        raise ScheduleError(f"unknown time zone {name!r} (use an IANA name such as Asia/Shanghai)") from exc


def local_iso(timestamp: float, zone_name: str) -> str:
    return datetime.fromtimestamp(timestamp, zone(zone_name)).isoformat(timespec="seconds")


def shown_time(timestamp: float, zone_name: str) -> str:
    """`local_iso` for listings: a time that cannot be shown (beyond year 9999, an unknown zone) is
    said to be so, with its raw value, instead of failing the whole list."""
    try:
        return local_iso(timestamp, zone_name)
    except (ValueError, TypeError, OverflowError, OSError):  # ScheduleError is a ValueError
        return f"(cannot be shown: {timestamp!r} in {zone_name!r})"


def check_ahead(stamp: float, now: float) -> float:
    """`stamp`, unless it is more than MAX_AHEAD after `now` (a ScheduleError saying the bound)."""
    if stamp - now > MAX_AHEAD:
        raise ScheduleError(f"that is more than {MAX_AHEAD_YEARS} years ahead; schedule something nearer")
    return stamp


def check_cron(expression: str) -> str:
    from croniter import croniter

    expression = " ".join(expression.split())
    if len(expression.split()) != 5 or not croniter.is_valid(expression):
        raise ScheduleError(
            f"not a cron expression: {expression!r} (five fields: minute hour day month weekday, "
            "e.g. '0 9 * * 1-5' for weekdays at 9:00)"
        )
    return expression


def next_cron(expression: str, zone_name: str, after: float) -> float:
    """The first fire time of `expression` (local to `zone_name`) strictly after `after` (UTC); for
    a job at a fixed time, never the second occurrence of a wall-clock time (module docstring)."""
    from croniter import croniter

    tz = zone(zone_name)
    times = croniter(expression, datetime.fromtimestamp(after, tz))
    fixed = not any(field.startswith("*") for field in expression.split()[:2])
    while True:
        candidate = float(times.get_next(float))
        if not (fixed and _repeated_wall_clock(candidate, tz)):
            return candidate


def _repeated_wall_clock(stamp: float, tz: Any) -> bool:
    """Whether `stamp` is the second time its wall-clock time comes in `tz` (clocks fell back)."""
    local = datetime.fromtimestamp(stamp, tz)
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


def parse_at(text: str, zone_name: str, now: float, *, past_ok: bool = False) -> float:
    """An ISO datetime (`2026-12-01T15:00`, `2026-12-01 15:00+08:00`) as a UTC timestamp; without an
    offset it is read in `zone_name`. A time already past (unless `past_ok`) or more than MAX_AHEAD
    after `now` is a ScheduleError."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=zone(zone_name))
        stamp = check_ahead(moment.timestamp(), now)
    except ScheduleError:
        raise
    except (ValueError, OverflowError):
        raise ScheduleError(f"not an ISO date and time: {text!r} (e.g. 2026-12-01T15:00)") from None
    if stamp <= now and not past_ok:
        shown = shown_time(stamp, zone_name)
        raise ScheduleError(f"{shown} is in the past (now: {local_iso(now, zone_name)})")
    return stamp


def first_fire(cron: str | None, at: float | None, zone_name: str, now: float) -> float:
    if cron:
        return check_ahead(next_cron(cron, zone_name, now), now)
    if at is None:
        raise ScheduleError("give a cron expression, a time or a delay")
    return check_ahead(at, now)


def catch_up(job: Job, now: float) -> tuple[float, int, float | None]:
    """For a job due at `now`: the latest passed fire time, how many earlier ones were missed, and
    the next fire time after now (None: a one-shot, finished)."""
    assert job.next_fire is not None
    if not job.cron:
        return job.next_fire, 0, None
    latest, missed = job.next_fire, 0
    while missed <= MAX_COUNTED:
        following = next_cron(job.cron, job.timezone, latest)
        if following > now:
            return latest, missed, following
        latest, missed = following, missed + 1
    latest = _previous_cron(job.cron, job.timezone, now)  # far behind: straight to the last one
    return latest, missed, next_cron(job.cron, job.timezone, now)


def plan_claim(job: Job, now: float, grace: float, refusal: RefusalCheck | None) -> list[Fire]:
    """What claiming a due `job` at `now` records (every store's claim writes these, in its one
    transaction): the missed fire times as one skipped row, the latest queued (with its message),
    skipped (beyond `grace`) or refused (`refusal`); `job` itself is moved on to its next fire time,
    or done."""
    latest, missed, following = catch_up(job, now)
    fires: list[Fire] = []
    if missed:
        assert job.next_fire is not None
        count = f"more than {MAX_COUNTED}" if missed > MAX_COUNTED else str(missed)
        reason = f"{count} fire time(s) from {utc_iso(job.next_fire)} missed while the service was down"
        fires.append(Fire(job.id, job.next_fire, "skipped", reason))
    if now - latest > grace:
        late = f"{now - latest:.0f}s late (the service was down), beyond misfire_grace {grace:.0f}s"
        fire = Fire(job.id, latest, "skipped", late)
    elif (why := refusal(job) if refusal is not None else None) is not None:
        fire = Fire(job.id, latest, "refused", why)
    else:
        fire = Fire(job.id, latest, "queued", message=job.message(latest))
    fires.append(fire)
    job.last_fire, job.last_outcome = latest, fire.status
    job.next_fire = following
    if following is None:
        job.status = "done"
    return fires


def _previous_cron(expression: str, zone_name: str, now: float) -> float:
    """The last fire time at or before `now`, by the rule of `next_cron` (a repeated wall-clock
    time of a fixed-time job is not one)."""
    from croniter import croniter

    times = croniter(expression, datetime.fromtimestamp(now + 1e-3, zone(zone_name)))
    while True:
        candidate = float(times.get_prev(float))
        if next_cron(expression, zone_name, candidate - 1e-3) == candidate:
            return candidate


def plan_claims(jobs: list[Job], now: float, grace: float, refusal: RefusalCheck | None) -> list[list[Fire]]:
    """`plan_claim` for each of `jobs` (moving each on). Stores run it before their write, off the
    event loop: a job far behind costs a hundred croniter calls, and a write or the loop held that
    long is an acknowledgement a platform stops waiting for (Feishu: 3 s)."""
    return [plan_claim(job, now, grace, refusal) for job in jobs]


def utc_iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="seconds")


class ScheduleStore(Protocol):
    """Where jobs live and how fires are claimed: SQLite (gateway/schedules.py) embedded, PostgreSQL
    (postgres/schedules.py) shared by several nodes. Each method is one atomic step;
    tests/contracts/test_schedule_store_contract.py is what every implementation must pass."""

    async def add(self, job: Job, limits: JobLimits | None = None) -> Job:
        """Store a new job (a job with this id already stored is returned as it is: idempotent).
        With `limits`, the creator's and the conversation's active jobs are counted in the same
        transaction as the insert, and QuotaExceeded is raised instead of storing one too many."""
        ...

    async def replace(self, job: Job) -> Job:
        """Store `job` whether or not its id exists (the operator's declared jobs)."""
        ...

    async def get(self, job_id: str) -> Job | None: ...

    async def jobs(self, conversation: str | None = None, *, active_only: bool = True) -> list[Job]:
        """Jobs by next fire time, of one conversation or all."""
        ...

    async def cancel(self, job_id: str) -> Job | None:
        """Cancel an active job; None when there is no such active job."""
        ...

    async def claim_due(
        self, now: float, grace: float, limit: int, refusal: RefusalCheck | None = None
    ) -> list[Fire]:
        """Claim up to `limit` due fires (see the module docstring), atomically."""
        ...

    async def fires(self, job_id: str, limit: int = 20) -> list[Fire]:
        """A job's recorded fires, newest first."""
        ...

    async def next_due(self) -> float | None:
        """The earliest next fire time of an active job (None: nothing scheduled)."""
        ...

    async def prune(self, older_than: float) -> int:
        """Forget the fires of fire times before `older_than` (seconds since the epoch), and say
        how many. They are past any claim (a claim looks back at most the misfire grace); a fire
        not yet handed to its workflow (engine temporal) is kept."""
        ...

    async def close(self) -> None: ...


class RefusalCheck(Protocol):
    def __call__(self, job: Job) -> str | None:
        """Why this job may not fire now (its creator lost the role it was created with), or None."""
        ...
