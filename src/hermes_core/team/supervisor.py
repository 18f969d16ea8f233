"""A supervisor agent that routes work to named expert agents over priority queues (P4).

    team = Supervisor(Agent(model=..., system_prompt="You coordinate a small team."), [
        Expert("research", Agent(model=..., tools=[search]), "finds facts", concurrency=2,
               requests_per_second=5),
        Expert("writer", Agent(model=...), "writes the final text", can_delegate=True),
    ])
    async with team:
        result = await team.run("Compare brand A with brand B", caller=caller)

Every agent of the team, the supervisor included, is a *member* with its own queue, concurrency
and rate limit, and work travels between members only as `Delegation` messages:
- the supervisor's model hands out work with the `delegate` tool (experts get it too with
  `can_delegate`); delegations made in one turn run in parallel, their answers come back as tool
  results, and the supervisor's final answer is its summary of them;
- each message carries `max_depth`, the hops it may still take. A delegation from a message that
  has none left is refused with an error naming the chain, so members that keep handing work to
  each other (or back to the supervisor) stop;
- a member's queue serves interactive work (`INTERACTIVE`, 0) before batch work (`BATCH`, 1), FIFO
  within a priority. A message's priority comes from its caller (`Caller.interactive`) and is
  inherited by the delegations it causes;
- at most `concurrency` runs of a member work at once. A run waiting for a delegated answer gives
  its place back meanwhile and queues to take it again, so delegating back and forth cannot
  deadlock a member whose places are all taken by runs waiting on each other;
- `requests_per_second` spaces the member's model calls. An agent configured with a model name gets
  it as its OpenAI-compatible client's own limit (which also spaces retries); an agent given a
  `ModelClient` object (a `ScriptedModel`, a custom client) has it wrapped in `SpacedModel`.

The team runs copies of the agents it is given (with the limit and the `delegate` tool added);
the originals are left as they were.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import Field

from ..kernel.messages import JSON, Message, ModelResponse, Usage
from ..kernel.model import ModelClient, ModelWrapper, TextCallback
from ..kernel.tools import Tool, ToolContext, tool
from ..kernel.tools.permissions import Caller
from .subagents import run_summary

if TYPE_CHECKING:
    from ..agent import Agent, Session
    from ..kernel.loop import RunResult

T = TypeVar("T")

INTERACTIVE = 0  # someone is waiting for the answer
BATCH = 1  # background work: served when no interactive work is queued

DELEGATE_DESCRIPTION = (
    "Hand a task to a member of your team and wait for its answer. The member sees only `task`, not "
    "this conversation, so include everything it needs. Several delegate calls in one turn run in "
    "parallel. When you have the answers you need, reply with one summary of them."
)


@dataclass(kw_only=True)
class MemberLimits:
    """What one member of a team may do, declared once: an `Expert`'s keywords, and each entry of the
    YAML `team.experts` (team/settings.py `ExpertSettings` extends it, so a file is held to the bounds)."""

    concurrency: Annotated[int, Field(ge=1, le=1000)] = 1  # runs working at once
    # model calls started per second; None: no limit
    requests_per_second: Annotated[float | None, Field(gt=0)] = None
    can_delegate: bool = False  # give it the `delegate` tool too


@dataclass
class Expert(MemberLimits):
    """A named agent of the team, what it is good at, and its limits (`MemberLimits`, by keyword)."""

    name: str
    agent: Agent
    description: str = ""


@dataclass
class TeamLimits:
    """How a team works, declared once: `Supervisor(limits=…)` and its keywords, and the YAML `team:`
    section (team/settings.py `TeamSettings` extends it, so a file is held to the bounds)."""

    max_depth: Annotated[int, Field(ge=1, le=10)] = 3  # hops one piece of work may take between members
    concurrency: Annotated[int, Field(ge=1, le=10_000)] = 4  # the supervisor's runs at once
    # the supervisor's model calls started per second; None: no limit
    requests_per_second: Annotated[float | None, Field(gt=0)] = None
    delegate_timeout: Annotated[float, Field(gt=0)] = 300.0  # seconds one delegation may take


@dataclass
class Delegation:
    """One message on a member's queue: the task, whom it is for, and how many hops it may still take."""

    to: str
    task: str
    max_depth: int
    priority: int = INTERACTIVE
    caller: Caller | None = None
    task_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    path: tuple[str, ...] = ()  # the members the work went through before reaching `to`
    session: Session | None = None  # the conversation, for work from a person; None: a fresh context


class SpacedModel(ModelWrapper):
    """Any model client, its calls started at least `1 / requests_per_second` apart.

    Each call reserves the next start time before it sleeps: no lock, callers go in arrival order.
    """

    def __init__(self, inner: ModelClient, requests_per_second: float) -> None:
        if requests_per_second <= 0:
            raise ValueError("requests_per_second must be positive")
        super().__init__(inner)
        self._spacing = 1.0 / requests_per_second
        self._next_start = 0.0

    async def complete(
        self,
        messages: list[Message],
        tools: list[dict[str, JSON]] | None = None,
        *,
        on_text: TextCallback | None = None,
    ) -> ModelResponse:
        now = time.monotonic()
        start = max(now, self._next_start)
        self._next_start = start + self._spacing
        if start > now:
            await asyncio.sleep(start - now)
        return await self.inner.complete(messages, tools, on_text=on_text)


class Supervisor:
    """Runs tasks through a supervisor agent that delegates to `experts`; see the module docstring."""

    def __init__(
        self,
        agent: Agent,
        experts: Sequence[Expert],
        *,
        name: str = "supervisor",
        limits: TeamLimits | None = None,
        **options: Any,
    ) -> None:
        """`limits` (`TeamLimits`, or the YAML `team:` section itself); each of its options is also a
        keyword, set in a copy: `Supervisor(agent, experts, max_depth=2)`."""
        limits = replace(limits or TeamLimits(), **options)
        names = [name, *(expert.name for expert in experts)]
        if len(set(names)) != len(names):
            raise ValueError(f"team member names must be unique, got {names}")
        if limits.max_depth < 1:
            raise ValueError("max_depth must be at least 1")
        self.name = name
        self.limits = limits
        self.usage: dict[str, Usage] = {}  # token usage per member, over every run so far
        lead = Expert(
            name,
            agent,
            "coordinates the team",
            concurrency=limits.concurrency,
            requests_per_second=limits.requests_per_second,
            can_delegate=True,
        )
        self.delegate_tool = self._build_delegate_tool([lead, *experts], limits.delegate_timeout)
        self._members = {member.name: _Member(member, self.delegate_tool) for member in (lead, *experts)}
        self._order = itertools.count()  # FIFO within a priority
        self._running: set[asyncio.Task[None]] = set()

    async def run(
        self,
        message: str,
        *,
        caller: Caller | None = None,
        session: Session | None = None,
        task_id: str | None = None,
        priority: int | None = None,
    ) -> RunResult:
        """One task: the supervisor delegates, gathers the experts' answers and summarises them."""
        work = Delegation(
            self.name,
            message,
            self.limits.max_depth,
            priority_of(caller) if priority is None else priority,
            caller,
            task_id or uuid.uuid4().hex,
            session=session,
        )
        return await self.submit(work)

    async def submit(self, work: Delegation) -> RunResult:
        """Queue `work` for its member and wait for the result of its run."""
        member = self._members.get(work.to)
        if member is None:
            raise KeyError(f"no team member named {work.to!r}")
        self._start()
        answer: asyncio.Future[RunResult] = asyncio.get_running_loop().create_future()
        member.queue.put_nowait((work.priority, next(self._order), work, answer))
        return await answer

    def pending(self, name: str) -> int:
        """How many messages wait in a member's queue."""
        return self._members[name].queue.qsize()

    async def aclose(self) -> None:
        """Stop the workers, cancel waiting work, close the members' model clients."""
        tasks = [m.dispatcher for m in self._members.values() if m.dispatcher is not None]
        tasks += self._running
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for member in self._members.values():
            member.dispatcher = None
            while not member.queue.empty():
                member.queue.get_nowait()[3].cancel()
        await asyncio.gather(*(member.agent.aclose() for member in self._members.values()))

    async def __aenter__(self) -> Supervisor:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- serving the queues ------------------------------------------------------------------

    def _start(self) -> None:
        for member in self._members.values():
            if member.dispatcher is None:
                member.dispatcher = asyncio.create_task(self._dispatch(member))

    async def _dispatch(self, member: _Member) -> None:
        """Start the member's most urgent queued work whenever one of its places is free."""
        while True:
            # Wait for work without holding a place (runs waiting to take theirs again need it), and
            # choose the item only once a place is free: more urgent work may arrive meanwhile.
            member.queue.put_nowait(await member.queue.get())
            await member.places.acquire()
            _, _, work, answer = member.queue.get_nowait()
            if answer.done():  # its waiter gave up (a timeout) before its turn came
                member.places.release()
                continue
            task = asyncio.create_task(self._serve(member, work, answer))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _serve(self, member: _Member, work: Delegation, answer: asyncio.Future[RunResult]) -> None:
        place = _Place(member.places)
        entered = _serving.set(_Serving(work, place))
        try:
            result = await member.agent.run(
                work.task, session=work.session, task_id=work.task_id, caller=work.caller
            )
            self.usage[member.name] = self.usage.get(member.name, Usage()) + result.usage
            if not answer.done():
                answer.set_result(result)
        except Exception as exc:
            if not answer.done():
                answer.set_exception(exc)
        finally:
            _serving.reset(entered)
            place.give_back()
            if not answer.done():  # cancelled by aclose
                answer.cancel()

    # -- the delegate tool -------------------------------------------------------------------

    def _build_delegate_tool(self, members: Sequence[Expert], timeout: float) -> Tool:
        async def delegate(
            expert: Annotated[str, Field(description="the team member to hand the task to")],
            task: Annotated[str, Field(description="the task, its goal and every fact the member needs")],
            *,
            context: ToolContext,
        ) -> dict[str, JSON]:
            """Hand a task to a team member."""
            return await self._delegate(expert, task, context)

        roster = "; ".join(f"{m.name}: {m.description}" if m.description else m.name for m in members)
        description = f"{DELEGATE_DESCRIPTION} Team: {roster}"
        declared = tool(name="delegate", timeout=timeout, description=description)(delegate)
        declared.parameters["properties"]["expert"]["enum"] = [m.name for m in members]
        return declared

    async def _delegate(self, to: str, task: str, context: ToolContext) -> dict[str, JSON]:
        if to not in self._members:
            return {"error": f"unknown team member {to!r}; choose one of: {', '.join(self._members)}"}
        serving = _serving.get()
        path: tuple[str, ...] = ()
        if serving is None:  # called outside a team run: this is new work
            hops_left, priority = self.limits.max_depth, priority_of(context.caller)
        else:
            current = serving.work
            path, hops_left, priority = (*current.path, current.to), current.max_depth, current.priority
        if hops_left <= 0:
            chain = " → ".join((*path, to))
            return {
                "error": f"cannot delegate to {to}: max_depth reached ({chain}). "
                "Do this part yourself or answer with what you have."
            }
        task_id = f"{context.task_id}/{context.call_id}"
        work = Delegation(to, task, hops_left - 1, priority, context.caller, task_id, path)
        submitted = self.submit(work)
        result = await (serving.place.wait(submitted) if serving is not None else submitted)
        return run_summary(to, result)


def priority_of(caller: Caller | None) -> int:
    """Work for a person who is waiting is interactive; a non-interactive caller's is batch."""
    return BATCH if caller is not None and not caller.interactive else INTERACTIVE


class _Member:
    """One agent of the team as it runs: its copy of the agent, its queue, its places."""

    def __init__(self, expert: Expert, delegate_tool: Tool) -> None:
        if expert.concurrency < 1:
            raise ValueError(f"{expert.name}: concurrency must be at least 1")
        self.name = expert.name
        extra = [delegate_tool] if expert.can_delegate else []
        self.agent = team_copy(expert.agent, expert.requests_per_second, extra)
        self.queue: asyncio.PriorityQueue[tuple[int, int, Delegation, asyncio.Future[RunResult]]]
        self.queue = asyncio.PriorityQueue()
        self.places = asyncio.Semaphore(expert.concurrency)
        self.dispatcher: asyncio.Task[None] | None = None


def team_copy(agent: Agent, requests_per_second: float | None, extra_tools: Sequence[Tool] = ()) -> Agent:
    """The copy of `agent` a team runs: every tool it has, plus `extra_tools`; its model calls spaced."""
    if requests_per_second is None:
        copy = replace(agent)
    elif isinstance(agent.model, ModelClient):
        copy = replace(agent, model=SpacedModel(agent.model, requests_per_second))
    else:
        own = min(agent.settings.requests_per_second or requests_per_second, requests_per_second)
        copy = replace(agent, settings=replace(agent.settings, requests_per_second=own))
    for item in (*agent.registry, *extra_tools):  # those registered after the agent was built, too
        if copy.registry.get(item.name) is None:
            copy.register_tool(item)
    return copy


@dataclass
class _Serving:
    """The message a run is serving, and its place among its member's concurrency."""

    work: Delegation
    place: _Place


_serving: ContextVar[_Serving | None] = ContextVar("hermes_core_team_serving", default=None)


class _Place:
    """A run's place among its member's `concurrency` places.

    Given back while the run waits for delegated work, and taken again (queuing with other work)
    before the run goes on. Parallel delegations of one run share the one place.
    """

    def __init__(self, places: asyncio.Semaphore) -> None:
        self._places = places
        self._held = True
        self._waiting = 0  # delegations of this run still unanswered
        self._retaking = asyncio.Lock()

    async def wait(self, delegated: Awaitable[T]) -> T:
        self._waiting += 1
        self.give_back()
        cancelled = False
        try:
            return await delegated
        except asyncio.CancelledError:
            # The run is stopping, or the delegate tool timed out: waiting for a place here could
            # outlive the cancellation, so the run goes on without one.
            cancelled = True
            raise
        finally:
            self._waiting -= 1
            if self._waiting == 0 and not cancelled:
                await self._retake()

    async def _retake(self) -> None:
        async with self._retaking:
            if self._held or self._waiting:
                return
            await self._places.acquire()
            if self._waiting:  # another delegation began meanwhile: it waits without the place
                self._places.release()
            else:
                self._held = True

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self._places.release()


__all__ = [
    "BATCH",
    "DELEGATE_DESCRIPTION",
    "INTERACTIVE",
    "Delegation",
    "Expert",
    "MemberLimits",
    "SpacedModel",
    "Supervisor",
    "TeamLimits",
    "priority_of",
    "team_copy",
]
