"""`hermes-kernel worker`: runs the conversation workflows and their steps (engine: temporal).

Two Temporal workers in one process, on the configured cluster:

- on `temporal.task_queue`: `ConversationWorkflow` and the `prepare_task`, `model_call`,
  `tool_call`, `command`, `record_turn`, `record_pending` and `dead_letter` activities, with the
  agent built from the configuration exactly as `serve` builds it for the embedded engine (model,
  tools, skills, MCP servers, permissions, the `remember` tool) and the PostgreSQL stores of
  `database.url` (state.py; required: without it the worker refuses to start), and the scheduling tools
  over the jobs in PostgreSQL that the serve nodes fire;
- `send_reply` runs as a local step of the workflow (workflow.py `_deliver`): the app-wide limits,
  per second (`feishu.app_send_rate`) and per minute (`feishu.app_send_per_minute`), are counted
  in PostgreSQL for every worker together (postgres/quota.py), so they hold however many workers
  send; the per-chat limit (`feishu.chat_send_rate`) is kept by each conversation's workflow,
  which spaces its replies (workflow.py `_send`);
- on `<task_queue>-sends`: `send_reply` for the runs that began before sends were local, with
  `max_task_queue_activities_per_second` set to `feishu.app_send_rate`: the server hands out at
  most that many sends per second to all the workers of the queue together.

After `temporal.task_queue` changed, the queues of `temporal.previous_task_queues` are polled
too, each with its sends' queue: a conversation whose run was started on one is answered there and
then continues as new onto `task_queue` (workflow.py), so none is left unanswered; an idle one
moves at its next message or when its idle period ends (`idle_days`).

A workflow's cached state waits `temporal.sticky_timeout` seconds for its worker before another
worker takes it (the SDK's default is 10 s), and every step heartbeats: a worker killed mid-turn
is replaced well within 15 s (docs/scale-out.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn, cast

from ...config import Settings, build_agent, require_database
from ...postgres.database import then_close_pools
from .activities import TurnActivities
from .client import connect
from .workflow import ConversationWorkflow, sends_queue

log = logging.getLogger("hermes_core.worker")
UNPACED = 1e6  # sends per second: no spacing of this worker's own


def senders(settings: Settings) -> dict[str, Any]:
    """Channel name → what sends its replies from a worker (the same code as the gateway's)."""
    from ...channels.webhook import SECRET_ENV, WebhookChannel

    found: dict[str, Any] = {
        "webhook": WebhookChannel(
            cast(Any, None), secret=os.environ.get(SECRET_ENV), callback_hosts=settings.webhook.callback_hosts
        )
    }
    app_id, app_secret = settings.feishu.app_id, os.environ.get("FEISHU_APP_SECRET")
    if app_id and app_secret:
        from ... import stores
        from ...channels.feishu.api import FeishuAPI
        from ...channels.feishu.ratelimit import SendLimiter

        # Per chat the workflow spaces its own replies; app-wide, the per-second and per-minute
        # limits are counted in PostgreSQL for every worker together (module docstring): this
        # worker's own limiter keeps the per-minute quota and the optional extra cap (`send_rate`),
        # as the embedded gateway's does; a platform "wait" is waited for in send_reply.
        pace = settings.feishu
        limiter = SendLimiter(
            rate_per_s=pace.send_rate,
            chat_per_s=UNPACED,
            app_per_s=UNPACED,
            app_per_min=pace.app_send_per_minute,
            shared=stores.send_quota(settings, app_id, per_chat=False),
        )
        found["feishu"] = FeishuAPI(app_id, app_secret, base_url=pace.base_url, limiter=limiter)
    return found


def workflow_runner() -> Any:
    """How the worker runs workflow code: outside Temporal's sandbox. The sandbox re-imports a
    workflow's file for every run and executes each activation, and every payload conversion, in
    its own namespace; its restrictions do not reach modules passed through, and the kernel's
    modules must be (they are imported once, not per run) — so it checked little here and cost a
    third of the worker's CPU per turn (benchmarks/bench_temporal.py). Determinism is what the
    replay test checks instead: recorded histories replayed through `sandbox_runner`."""
    from temporalio.worker import UnsandboxedWorkflowRunner

    return UnsandboxedWorkflowRunner()


def sandbox_runner() -> Any:
    """The workflow sandbox, with the kernel's modules passed through (they are deterministic
    code, imported once rather than again for every workflow run): the replay test's runner."""
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

    passed = (
        "hermes_core",
        "pydantic",
        "pydantic_core",
        "annotated_types",
        "yaml",
        "json_repair",
        "jsonschema",
    )
    return SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules(*passed))


async def run_worker(
    settings: Settings,
    *,
    agent: Any = None,
    ready: Callable[[], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    from .state import SharedState

    require_database(settings)  # before anything connects: the refusal is one line
    agent = agent or build_agent(settings)
    client = await connect(settings.temporal)
    state = SharedState.of(settings)
    if agent.mcp is not None:
        await agent.mcp.start(agent.registry)
    schedules = schedule_tools_for(agent, settings)
    outlets = senders(settings)
    steps = TurnActivities(
        agent,
        outlets,
        chat_rate=settings.feishu.chat_send_rate,
        approval_ttl=settings.permissions.approval_ttl,
        state=state,
        schedules=schedules,
        task_queue=settings.temporal.task_queue,
    )
    queues = list(dict.fromkeys([settings.temporal.task_queue, *settings.temporal.previous_task_queues]))
    workers = [worker for queue in queues for worker in queue_workers(client, queue, steps, settings)]
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        async with contextlib.AsyncExitStack() as running:
            for worker in workers:
                await running.enter_async_context(worker)
            log.info(
                "hermes-kernel worker on %s (%s), task queues %s",
                settings.temporal.address,
                settings.temporal.namespace,
                ", ".join(f"{queue} and {sends_queue(queue)}" for queue in queues),
            )
            if ready is not None:
                ready()
            await stop.wait()
    finally:
        for outlet in outlets.values():
            closer = getattr(outlet, "aclose", None) or getattr(outlet, "stop", None)
            if closer is not None:
                await closer()
        if schedules is not None:
            await schedules.close()
        await state.close()
        await agent.aclose()


def queue_workers(client: Any, queue: str, steps: TurnActivities, settings: Settings) -> list[Any]:
    """The two Temporal workers of one task queue: its workflows and turn steps, and its sends."""
    from temporalio.worker import Worker

    grace = timedelta(seconds=settings.gateway.shutdown_grace)
    turns = Worker(
        client,
        task_queue=queue,
        workflows=[ConversationWorkflow],
        activities=steps.turn_steps(),
        workflow_runner=workflow_runner(),
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=settings.temporal.sticky_timeout),
        graceful_shutdown_timeout=grace,
    )
    sends = Worker(
        client,
        task_queue=sends_queue(queue),
        activities=steps.send_steps(),
        max_task_queue_activities_per_second=settings.feishu.app_send_rate,
        graceful_shutdown_timeout=grace,
    )
    return [turns, sends]


def schedule_tools_for(agent: Any, settings: Settings) -> Any:
    """`schedule_task`, `list_scheduled`, `cancel_scheduled` on this worker's agent, over the jobs in
    PostgreSQL (database.url) that the serve nodes fire (engine/temporal/schedules.py); their store,
    or None when scheduling is off or there is no database.url (then no tool is offered)."""
    from ... import stores
    from ...schedule.jobs import JobLimits
    from ...schedule.tools import register_schedule_tools

    options = settings.schedule
    if not options.enabled or stores.database_url(settings) is None:
        return None
    store = stores.schedule_store(settings)
    limits = JobLimits(options.max_jobs_per_user, options.max_jobs_per_chat)
    register_schedule_tools(agent, store, timezone=options.timezone, limits=limits,
                            min_delay=options.min_delay_minutes * 60)  # fmt: skip
    return store


def run(settings: Settings, agent: Any) -> NoReturn:
    """`hermes-kernel worker`, then exit (no cluster: one line, 1)."""
    from ...config import ConfigError
    from .client import Unreachable, leave

    def ready() -> None:
        print(f"hermes-kernel worker running (task queue {settings.temporal.task_queue})", flush=True)

    try:
        asyncio.run(then_close_pools(run_worker(settings, agent=agent, ready=ready)))
    except (ConfigError, Unreachable) as exc:
        print(f"hermes-kernel: {exc}", file=sys.stderr)
        leave(2 if isinstance(exc, ConfigError) else 1)
    leave(0)
