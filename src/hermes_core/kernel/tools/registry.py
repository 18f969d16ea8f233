"""The tools an agent may use, and the one path every tool call is executed through.

`execute` never raises: unknown names, unparseable or invalid arguments, exceptions, business
errors, results that cannot be serialised and timeouts all come back as a `ToolOutcome` whose
`content` is what the model reads. "Exceptions" means every `BaseException` a tool raises:
`SystemExit` (argparse on bad input), `KeyboardInterrupt`, `GeneratorExit`, custom subclasses —
none of them may end the task, let alone the process. The one exception that passes is a real
cancellation of the task running the call (a shutdown, a stop, a timeout): when the task is being
cancelled, the tool's exception, whatever it is, leaves as `CancelledError`. A `CancelledError`
a tool raises of its own accord, while nothing cancels its task, is a tool failure like any other.

Sync tools run on daemon threads of their own (`ToolThreads`), never on the event loop, at most
`MAX_TOOL_THREADS` at once. Python cannot kill a thread, so a sync tool that never returns cannot
be stopped. What happens instead, when its call times out (or its task is cancelled):
- the model reads a timeout error, and the thread is *abandoned*: it keeps running, but its result
  is thrown away when it comes, and a new worker takes its place, so the capacity for new calls
  stays whole and instant tools keep answering;
- it is counted and logged (WARNING when abandoned, INFO if it returns later);
- once `MAX_STUCK_PER_TOOL` threads of one tool are stuck, further calls of that tool are refused
  at once with a clear error (nothing more is started), and once `MAX_STUCK` threads are stuck in
  all, every sync call is; the refusals end as the stuck threads return;
- abandoned threads are daemon threads: they do not hold the process at exit (`hermes-kernel run`
  exits after its reply, `serve` within its shutdown grace).
Code that can hang (network without timeouts, locks, child programs) belongs in an async tool, or
in a subprocess with a timeout, which *can* be stopped.

A sync tool declared `inline` (quick pure functions: arithmetic, parsing, formatting) skips the
thread: it runs on the event loop, in a copy of the caller's context as on a thread, at a tenth of
the cost of the hop (benchmarks/bench_overhead.py). Nothing else runs on the loop meanwhile, so a
call that takes longer than `INLINE_SECONDS` is logged (WARNING) and the tool's later calls go to a
worker thread again: a wrong declaration costs one slow call, not a stalled gateway.
"""

from __future__ import annotations

import _thread
import asyncio
import contextvars
import difflib
import functools
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..messages import JSON, Message, ToolCall
from ..redaction import redact_text
from .arguments import ArgumentError, bind_arguments, parse_arguments
from .declare import TaskPaused, Tool, ToolContext, ToolError, ToolLike, tool_from_entry, tool_from_function
from .permissions import Caller, Policy
from .results import DEFAULT_MAX_CHARS, UnrenderableResult, error_result, is_error_value, render_result

if TYPE_CHECKING:
    from ..approvals import Interactions

log = logging.getLogger("hermes_core.tools")

MAX_TOOL_THREADS = 32  # sync tool calls running at once (abandoned ones not counted); more wait
MAX_STUCK_PER_TOOL = 4  # abandoned threads of one tool before its sync calls are refused
MAX_STUCK = 64  # abandoned threads in all before every sync call is refused
IDLE_WORKER_SECONDS = 60.0  # an idle worker thread ends after this long
INLINE_SECONDS = 0.02  # an inline call that took longer: the tool's later calls go to a thread
DEFAULT_TOOL_TIMEOUT = 30.0  # seconds a tool call may take, unless its tool or the limits say otherwise


@dataclass
class ToolOutcome:
    """The result of one tool call, as recorded for the run and as shown to the model."""

    call: ToolCall
    content: str
    ok: bool
    arguments: dict[str, JSON] | None = None
    elapsed: float = 0.0
    error: str | None = None  # "unknown_tool", "bad_arguments", "exception", "timeout", "tool_error", …

    def to_message(self) -> Message:
        return {"role": "tool", "tool_call_id": self.call.id, "content": self.content}


class ToolRegistry:
    def __init__(
        self,
        tools: Iterable[ToolLike] = (),
        policy: Policy | None = None,
        interactions: Interactions | None = None,
    ) -> None:
        self._tools: dict[str, Tool] = {}
        self._edits = [0]  # tools added and removed (shared with wrappers, as `_tools` is): `version`
        self.policy = policy or Policy()
        self.interactions = interactions  # who approves, who answers (kernel/approvals.py)
        for item in tools:
            self.add(item)

    def add(self, item: ToolLike, name: str | None = None) -> Tool:
        """Register a `@tool`, a plain documented function, or a dict-style entry."""
        if isinstance(item, Tool):
            declared = item
        elif isinstance(item, Mapping):
            entry_name = name or item.get("name")
            if not entry_name:
                raise TypeError("a dict-style tool entry needs a name (pass name=… or a 'name' key)")
            declared = tool_from_entry(str(entry_name), item)
        elif callable(item):
            declared = tool_from_function(item, name=name)
        else:
            raise TypeError(f"cannot register {item!r} as a tool")
        if declared.name in self._tools and self._tools[declared.name] is not declared:
            raise ValueError(f"a tool named {declared.name!r} is already registered")
        self._tools[declared.name] = declared
        self._edits[0] += 1
        return declared

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def remove(self, name: str) -> None:
        """Withdraw a tool (an MCP server that no longer lists it); unknown names are ignored."""
        if self._tools.pop(name, None) is not None:
            self._edits[0] += 1

    @property
    def version(self) -> int:  # changes when a tool is added or removed (the loop's offer is redone)
        return self._edits[0]

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def schemas(
        self, exclude: Iterable[str] = (), caller: Caller | None = None, model: str | Sequence[str] = ""
    ) -> list[dict[str, JSON]]:
        """The tools to offer: not excluded, permitted for this caller and model, and — for tools
        that need a person (approval, a question) — only when there is someone to ask.

        Given several models (a client with fallbacks), the tools any of them may use: the client
        offers each model its own share (kernel/model.py `offered_to`)."""
        skipped = set(exclude)
        return [
            t.schema()
            for t in self._tools.values()
            if t.name not in skipped
            and self.permitted(t, caller, model)
            and (self.interactions is not None or not t.needs_person)
        ]

    def permitted(self, declared: Tool, caller: Caller | None, model: str | Sequence[str]) -> bool:
        """Whether the policy lets `caller` run `declared` with `model` (or with one of several)."""
        refusal = self.policy.refusal
        if isinstance(model, str):
            return refusal(declared, caller, model) is None
        if len(model) == 1:  # a client without fallbacks
            return refusal(declared, caller, model[0]) is None
        return any(refusal(declared, caller, name) is None for name in model or ("",))

    def offer(
        self,
        exclude: Iterable[str] = (),
        caller: Caller | None = None,
        known: dict[str, set[str]] | None = None,
    ) -> Callable[[str], set[str]]:
        """Per model, the names of the tools `schemas` offers it (for kernel/model.py `offering`);
        worked out once per model for the life of the offer (one model call). `known`: the names
        already worked out for some models (the loop's own `schemas` for a one-model client)."""
        exclude, known = tuple(exclude), dict(known or {})

        def offered(model: str) -> set[str]:
            names = known.get(model)
            if names is None:
                names = known[model] = {s["function"]["name"] for s in self.schemas(exclude, caller, model)}
            return names

        return offered

    def closest(self, name: str, limit: int = 3) -> list[str]:
        close = difflib.get_close_matches(name, self.names, n=limit, cutoff=0.4)
        return close or self.names[:limit]

    async def execute(
        self,
        call: ToolCall,
        *,
        timeout: float = DEFAULT_TOOL_TIMEOUT,
        max_chars: int = DEFAULT_MAX_CHARS,
        context: ToolContext | None = None,
    ) -> ToolOutcome:
        started = time.perf_counter()
        outcome = await self._execute(call, timeout, max_chars, context)
        outcome.elapsed = time.perf_counter() - started
        outcome.content = redact_text(outcome.content)  # a tool that read a secret does not hand it on
        return outcome

    async def _execute(
        self, call: ToolCall, timeout: float, max_chars: int, context: ToolContext | None
    ) -> ToolOutcome:
        declared = self._tools.get(call.name)
        if declared is None:
            message = f"unknown tool {call.name!r}; available tools: {', '.join(self.closest(call.name))}"
            return ToolOutcome(call, error_result(message), ok=False, error="unknown_tool")
        context = context or ToolContext(call_id=call.id, tool_name=call.name)
        refusal = self.policy.refusal(declared, context.caller, context.model)
        if refusal is not None:  # the one choke point: refused calls never run, whatever they say
            log.warning(
                "refused %s for %s: %s", call.name, context.caller or "an unidentified caller", refusal
            )
            return ToolOutcome(call, error_result(refusal), ok=False, error="permission_denied")
        try:
            arguments = parse_arguments(call.arguments)
            kwargs = self._bind(declared, arguments)
        except ArgumentError as exc:
            message = f"invalid arguments for {call.name}: {exc}. Fix the arguments and call again."
            return ToolOutcome(call, error_result(message), ok=False, error="bad_arguments")
        preapproved = context.caller is not None and declared.name in context.caller.preapproved
        if (declared.confirm or declared.level >= 2) and not preapproved:
            held = await self._approval(declared, call, arguments, context)
            if held is not None:
                return held
        if declared.context_param:
            context.interactions = self.interactions
            kwargs[declared.context_param] = context
        limit = declared.timeout if declared.timeout is not None else timeout
        try:
            work = _invoke(declared, kwargs)  # inline: on the loop, where no timeout can stop it
            value = await (work if declared.inline else _within(limit, work))
        except TaskPaused as paused:
            return ToolOutcome(call, paused.message, False, arguments, error=paused.reason)
        except asyncio.TimeoutError:
            message = f"tool {call.name} timed out after {limit:g} s"
            return ToolOutcome(call, error_result(message), False, arguments, error="timeout")
        except ToolThreadsRefused as exc:
            return ToolOutcome(call, error_result(str(exc)), False, arguments, error="tool_stuck")
        except ToolError as exc:
            return ToolOutcome(call, error_result(str(exc)), False, arguments, error="tool_error")
        except Exception as exc:  # a tool's crash is data for the model, never the user's problem
            raised = exc.raised if isinstance(exc, ToolCrashed) else exc
            message = f"tool {call.name} failed: {type(raised).__name__}: {raised}"
            return ToolOutcome(call, error_result(message), False, arguments, error="exception")
        own = declared.max_chars  # a tool whose results are meant whole (a skill's body) says so
        return self._rendered(call, value, own if own is not None else max_chars, arguments)

    @staticmethod
    def _rendered(call: ToolCall, value: object, max_chars: int, arguments: dict[str, JSON]) -> ToolOutcome:
        """The outcome for a value the tool returned: its JSON, or an error if it has none."""
        try:
            failed = is_error_value(value)
            content = render_result(value, max_chars)
        except UnrenderableResult as exc:
            log.warning("tool %s returned a result that cannot be serialised: %s", call.name, exc)
            return ToolOutcome(
                call, error_result(f"tool {call.name} {exc}"), False, arguments, error="bad_result"
            )
        if failed:
            return ToolOutcome(call, content, False, arguments, error="tool_error")
        return ToolOutcome(call, content, True, arguments)

    async def _approval(
        self, declared: Tool, call: ToolCall, arguments: dict[str, JSON], context: ToolContext
    ) -> ToolOutcome | None:
        """None when a person approved this call; otherwise the outcome that stands in for it."""
        if self.interactions is None:
            message = f"{declared.name} needs a person's approval, and this run has no one to ask"
            log.warning("refused %s: %s", call.name, message)
            return ToolOutcome(call, error_result(message), False, arguments, error="permission_denied")
        approval = await self.interactions.approval(
            context.task_id, call.id, declared.name, call.arguments, context.caller, context.session_id
        )
        if not approval.covers(call):  # an id that named another call: its approval is not this one's
            message = (
                f"the call to {declared.name} was not run: its id {call.id!r} already belongs to a "
                "different call in this task, and every call needs its own approval"
            )
            log.warning("refused %s: call id %s reused for other arguments", call.name, call.id)
            return ToolOutcome(call, error_result(message), False, arguments, error="approval_mismatch")
        if approval.status == "approved":
            log.info("%s approved by %s (%s)", call.name, approval.decided_by, approval.id)
            return None
        if approval.status == "pending":
            log.info("%s waits for approval %s", call.name, approval.id)
            return ToolOutcome(call, approval.id, False, arguments, error="awaiting_approval")
        word = "rejected" if approval.status == "rejected" else "expired without a decision"
        message = f"the call to {declared.name} was not run: the user's approval {word}"
        return ToolOutcome(call, error_result(message), False, arguments, error=f"approval_{approval.status}")

    @staticmethod
    def _bind(declared: Tool, arguments: dict[str, JSON]) -> dict[str, object]:
        """Validated keyword arguments; a private copy, so concurrent calls cannot share objects."""
        return bind_arguments(declared, arguments)


class RegistryWrapper(ToolRegistry):
    """Another registry's tools, policy and interactions, shared rather than copied: a subclass
    changes only `execute` (the journal, the tracer, replay) and may call `inner`'s."""

    def __init__(self, inner: ToolRegistry) -> None:
        super().__init__(policy=inner.policy, interactions=inner.interactions)
        self._tools, self._edits = inner._tools, inner._edits
        self.inner = inner


class ToolCrashed(Exception):
    """A tool raised a BaseException that is not an Exception (SystemExit, KeyboardInterrupt, …),
    or a CancelledError while nothing cancelled it: carried out of the tool as a plain failure."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(f"{type(raised).__name__}: {raised}")
        self.raised = raised


class ToolThreadsRefused(Exception):
    """A sync call not started because too many threads (of its tool, or in all) are stuck."""


async def _invoke(declared: Tool, kwargs: dict[str, object]) -> object:
    """Run the tool (and its extractor); every BaseException but a real cancellation becomes an
    Exception here, inside the coroutine, before it can reach a task boundary and the event loop."""
    try:
        if declared.is_async:
            value = await declared.handler(**kwargs)
        else:
            # copy_context: the tool sees the caller's context variables but its changes stay its own
            run = functools.partial(contextvars.copy_context().run, declared.handler, **kwargs)
            value = (
                _run_inline(declared, run) if declared.inline else await TOOL_THREADS.run(declared.name, run)
            )
            if asyncio.iscoroutine(value):  # a sync wrapper that returned a coroutine
                value = await value
        return declared.extractor(value) if declared.extractor is not None else value
    except Exception:
        raise
    except BaseException as exc:
        if _being_cancelled(exc):
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise asyncio.CancelledError() from exc  # the cancellation goes on; the tool's exit does not
        raise ToolCrashed(exc) from None


def _run_inline(declared: Tool, run: Callable[[], object]) -> object:
    """A sync tool declared `inline`, on the event loop (the module docstring); too slow once, no more."""
    started = time.perf_counter()
    try:
        return run()
    finally:
        took = time.perf_counter() - started
        if took > INLINE_SECONDS and declared.inline:
            declared.inline = False
            log.warning("tool %s is declared inline but took %.3f s on the event loop: its later calls "
                        "run on a worker thread", declared.name, took)  # fmt: skip


async def _within(seconds: float | None, work: Coroutine[object, object, _T]) -> _T:
    """`await work`, cancelled after `seconds` (then TimeoutError): `asyncio.wait_for` as Python 3.12
    has it, run in the calling task rather than in a task of its own (3.11's `wait_for` makes one
    per call). A limit of 0 or less, and Python 3.10, go through `wait_for` itself."""
    if _timeout is None or seconds is None or seconds <= 0:
        return await asyncio.wait_for(work, timeout=seconds)
    async with _timeout(seconds):
        return await work


_T = TypeVar("_T")
_timeout = getattr(asyncio, "timeout", None)  # Python 3.11+


def _being_cancelled(exc: BaseException) -> bool:
    """Whether the task running the tool is being cancelled (a shutdown, a stop, its timeout)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    if cancelling is None:  # Python 3.10: no way to tell; a CancelledError is taken as a cancellation
        return isinstance(exc, asyncio.CancelledError)
    return bool(cancelling())


@dataclass(eq=False)
class _Job:
    tool: str
    run: Callable[[], object]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[tuple[bool, Any]]
    state: str = "queued"  # queued → running → done; or cancelled (never started), abandoned
    started: float = field(default=0.0)

    def settle(self, outcome: tuple[bool, Any]) -> None:
        """Hand the outcome to the waiting coroutine (from the worker thread)."""

        def deliver() -> None:
            if not self.future.done():
                self.future.set_result(outcome)

        try:
            self.loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the event loop is closed: nobody waits for this result any more
            pass


class ToolThreads:
    """Daemon worker threads for sync tools; a worker whose call timed out is abandoned and
    replaced, and tools with too many stuck threads are refused (the module docstring says why)."""

    def __init__(
        self,
        max_running: int = MAX_TOOL_THREADS,
        max_stuck_per_tool: int = MAX_STUCK_PER_TOOL,
        max_stuck: int = MAX_STUCK,
        idle_seconds: float = IDLE_WORKER_SECONDS,
    ) -> None:
        self.max_running, self.max_stuck_per_tool, self.max_stuck = max_running, max_stuck_per_tool, max_stuck
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._workers = 0  # live workers, not abandoned
        self._idle = 0  # of them, waiting for a job
        self._waiting = 0  # jobs queued, not yet taken
        self._stuck: Counter[str] = Counter()
        self._serial = 0

    def stuck(self, tool: str | None = None) -> int:
        """Abandoned threads still running: of `tool`, or in all."""
        with self._lock:
            return self._stuck[tool] if tool is not None else sum(self._stuck.values())

    async def run(self, tool: str, function: Callable[[], object]) -> Any:
        """`function()` on a worker thread; its exceptions re-raised here (BaseExceptions wrapped)."""
        loop = asyncio.get_running_loop()
        job = _Job(tool, function, loop, loop.create_future())
        self._submit(job)
        try:
            returned, value = await job.future
        except asyncio.CancelledError:  # timed out, or the task was cancelled: the thread is left
            self._abandon(job)
            raise
        if returned:
            return value
        if isinstance(value, Exception):
            raise value
        raise ToolCrashed(value)  # SystemExit, CancelledError… raised in the thread: never a cancellation

    def _refusal(self, tool: str) -> str | None:
        if self._stuck[tool] >= self.max_stuck_per_tool:
            return (
                f"tool {tool} is not run: {self._stuck[tool]} earlier calls of it timed out and are "
                "still running; it is unavailable until they return. Do not call it again now."
            )
        if sum(self._stuck.values()) >= self.max_stuck:
            return f"tool {tool} is not run: too many earlier tool calls are stuck; try again later"
        return None

    def _submit(self, job: _Job) -> None:
        with self._lock:
            refusal = self._refusal(job.tool)
            if refusal is not None:
                log.warning("refused %s: %s stuck thread(s) of it", job.tool, self._stuck[job.tool])
                raise ToolThreadsRefused(refusal)
            self._waiting += 1
            self._jobs.put(job)
            if self._waiting > self._idle and self._workers < self.max_running:
                self._start_worker()

    def _start_worker(self) -> None:  # with the lock held
        self._workers += 1
        self._idle += 1
        self._serial += 1
        worker = threading.Thread(target=self._work, name=f"hermes-tool-{self._serial}", daemon=True)
        # `Thread.start()` waits until the new thread runs, which on a busy machine takes milliseconds;
        # the event loop must not wait for that (a burst of calls starts up to `max_running` workers,
        # an abandoned one is replaced): a short-lived helper thread starts the worker and waits.
        _thread.start_new_thread(self._start, (worker,))

    def _start(self, worker: threading.Thread) -> None:
        try:
            worker.start()
        except BaseException as exc:  # noqa: BLE001 — "can't start new thread": its place is free again
            with self._lock:
                self._workers -= 1
                self._idle -= 1
            log.error("could not start a thread for sync tools (%s: %s)", type(exc).__name__, exc)

    def _work(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            try:
                outcome: tuple[bool, Any] = (True, job.run())
            except BaseException as exc:  # noqa: BLE001 — every exception is the tool's result
                outcome = (False, exc)
            if not self._finished(job):
                return
            job.settle(outcome)

    def _next_job(self) -> _Job | None:
        """The next job to run, or None when this worker has been idle long enough to end."""
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._waiting == 0:
                        self._idle -= 1
                        self._workers -= 1
                        return None
                continue
            with self._lock:
                self._waiting -= 1
                if job.state == "cancelled":  # its caller gave up before it started
                    continue
                self._idle -= 1
                job.state, job.started = "running", time.monotonic()
                return job

    def _finished(self, job: _Job) -> bool:
        """Record that `job` returned; False when it had been abandoned (then this thread ends)."""
        with self._lock:
            if job.state == "abandoned":
                self._stuck[job.tool] -= 1
                log.info("tool %s returned %.1f s after it started, after it was abandoned; result discarded",
                         job.tool, time.monotonic() - job.started)  # fmt: skip
                return False
            job.state = "done"
            self._idle += 1
            return True

    def _abandon(self, job: _Job) -> None:
        with self._lock:
            if job.state == "queued":
                job.state = "cancelled"
            elif job.state == "running":
                job.state = "abandoned"
                self._stuck[job.tool] += 1
                self._workers -= 1  # its place is free: a new worker may start
                took = time.monotonic() - job.started
                log.warning("tool %s abandoned after %.1f s on its thread, which keeps running (%d stuck)",
                            job.tool, took, self._stuck[job.tool])  # fmt: skip


TOOL_THREADS = ToolThreads()  # shared by every registry of the process
