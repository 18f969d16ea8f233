"""The embedded gateway as `hermes-kernel serve` builds it (`build_gateway`), and the pieces of its
HTTP server; server.py runs them as one process, with the web console, on one port.

With no configuration it starts on embedded defaults: SQLite under ./.hermes/, the webhook
channel, and the offline demo model. The Feishu channel joins when FEISHU_APP_ID and
FEISHU_APP_SECRET are set. SIGTERM or SIGINT stops it gracefully: no new messages are accepted
(callers get 503 and retry), in-flight turns get `shutdown_grace` seconds to finish, and whatever
is still unfinished stays in the inbox for the next start. Once listening it probes the model in the
background (gateway/model_health.py): a refused key or an unknown model is `degraded` in /healthz
and /metrics, never a failed start.

Two refusals keep the edge safe (docs/security.md): serve does not start when it would put an
unsigned webhook (no HERMES_WEBHOOK_SECRET) on a non-loopback address, unless the configuration says
`webhook.allow_unsigned: true`; and every connection has `gateway.header_timeout` seconds to send a
request's headers and `gateway.body_timeout` more for its body (gateway/deadlines.py).

GET /metrics (`gateway.metrics`, on by default) is the Prometheus exposition of observe/metrics.py
plus the queue depths read at scrape time. It is guarded like the console (console/access.py):
with HERMES_METRICS_TOKEN (or the console's token) set, every scrape must carry one of them as
`Authorization: Bearer …`; without a token it answers only local requests on a loopback bind, and
on any other address it refuses every scrape. A dedicated token exists so that a scraper's
configuration never holds the console's token, which can approve tool calls.

No request gets a 500 (`error_middleware`, the outermost layer): a handler's exception becomes
- 400 with `{"error": …}` and one WARNING line, no traceback, when the request itself caused it
  (`ValueError` — undecodable text and JSON included —, `RecursionError`, `TypeError`, `KeyError`,
  `IndexError`, `AttributeError`, SQLite refusing a value) or the client hung up mid-request:
  sending it again cannot help;
- 503 with `Retry-After` and one ERROR line with the traceback for anything else — a genuine
  internal failure, e.g. the database unwritable or locked: Feishu and webhook clients retry a 503,
  and the retry may succeed once the fault is fixed, so no event is lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web

from ..agent import Agent
from ..channels.inert import visible
from ..channels.media import AttachmentSource
from ..channels.seam import SpeakerNames, TurnWatcher
from ..channels.webhook import SECRET_ENV, WebhookChannel, exposure_problem
from ..config import ConfigError, Settings, build_agent, workspace_of
from ..kernel.approvals import Pending, PendingStore
from ..kernel.redaction import Redactor, default_redactor
from ..retention import pruners, uploads_pruner
from ..sessions import ConversationMemory
from .dispatcher import Gateway
from .flood import FloodGate
from .media import MediaDesk
from .messages import InboundMessage, Reply, Turn
from .outgoing import register_outgoing_tools
from .runner import AgentRunner

if TYPE_CHECKING:
    from ..agent import Agent
    from ..observe.metrics import Sample
    from ..schedule.jobs import ScheduleStore
    from .model_health import ModelHealth

log = logging.getLogger("hermes_core.server")
METRICS_TOKEN_ENV = "HERMES_METRICS_TOKEN"
KEEPALIVE_TIMEOUT = 75.0  # seconds an idle kept-alive connection stays open (aiohttp's run_app default)
RETRY_AFTER = "5"  # seconds, on a 503 for an internal failure
# Exceptions a request's content causes (RecursionError is a RuntimeError, so it is named first).
BAD_REQUEST_ERRORS = (
    ValueError, RecursionError, TypeError, KeyError, IndexError, AttributeError,
    sqlite3.InterfaceError, sqlite3.DataError,
)  # fmt: skip


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """The safety net (see the module docstring): 400 for what the request caused, else 503."""
    try:
        return await handler(request)
    except (web.HTTPException, asyncio.CancelledError):
        raise
    except ConnectionResetError as exc:  # the client hung up mid-request: nobody reads the answer
        log.warning("%s %s: the client went away (%s)", request.method, request.path, _one_line(exc))
        return web.json_response({"error": "incomplete request"}, status=400)
    except BAD_REQUEST_ERRORS as exc:
        log.warning("%s %s refused (400): %s: %s", request.method, request.path, type(exc).__name__,
                    _one_line(exc))  # fmt: skip
        return web.json_response({"error": f"bad request: {type(exc).__name__}"}, status=400)
    except Exception as exc:
        log.error("%s %s failed (503, the client retries): %s: %s", request.method, request.path,
                  type(exc).__name__, _one_line(exc), exc_info=True)  # fmt: skip
        return web.json_response({"error": "temporarily unavailable, try again"}, status=503,
                                 headers={"Retry-After": RETRY_AFTER})  # fmt: skip


def _one_line(exc: BaseException) -> str:
    return default_redactor().redact(" ".join(str(exc).split()))[:200]


class RedactingRunner:
    """The agent's runner, with every reply redacted (kernel/redaction.py) before the gateway stores or
    sends it: a prompt-injected model may try to echo a secret to the user. An approval request's
    text has its bidi and zero-width controls written out (channels/inert.py)."""

    def __init__(self, inner: AgentRunner, redactor: Redactor) -> None:
        self.inner = inner
        self.redactor = redactor

    async def __call__(self, message: InboundMessage) -> Turn:
        turn = await self.inner(message)
        return Turn([self._redact(reply) for reply in turn.replies], turn.history)

    def _redact(self, reply: str | Reply) -> str | Reply:
        if isinstance(reply, str):
            return self.redactor.redact(reply)
        if reply.approval is None:
            return dataclasses.replace(reply, text=self.redactor.redact(reply.text))
        approval = self.redactor.redact_data(reply.approval)  # the text an approver reads: inert
        return dataclasses.replace(reply, text=visible(self.redactor.redact(reply.text)), approval=approval)

    async def decide(self, pending_id: str, user_id: str, channel: str, approve: bool) -> Pending:
        return await self.inner.decide(pending_id, user_id, channel, approve)

    async def expire_due(self) -> list[Pending]:
        return await self.inner.expire_due()

    async def aclose(self) -> None:
        await self.inner.aclose()


def build_gateway(
    settings: Settings, agent: Agent | None = None, *, clock: Callable[[], float] | None = None
) -> tuple[Gateway, list[web.RouteDef]]:
    """The gateway `serve` runs, and its channels' routes; `clock` is the scheduler's (tests)."""
    from .. import stores  # the embedded SQLite file, or PostgreSQL with `database.url`

    agent = agent or build_agent(settings)
    store = stores.gateway_store(settings)
    if agent.journal is None:  # turns resume from their journal after a crash (tasks/journal.py)
        agent.journal = stores.task_journal(settings)
    if agent.interactions is None:  # approvals and questions wait here (tasks/pending.py)
        agent.use_interactions(stores.interactions(settings))
    if agent.tracer is None:  # every task's record and log events; failed ones as X-rays (observe/traces.py)
        from ..observe.traces import tracer_for

        agent.tracer = tracer_for(settings)
    register_outgoing_tools(agent)  # send_message: admins, level 2 (gateway/outgoing.py)
    memory = build_memory(settings)
    runner = RedactingRunner(AgentRunner(agent, memory), default_redactor())
    options = settings.gateway
    gateway = Gateway(
        store, runner, desk=runner, max_turns_in_flight=options.max_turns_in_flight,
        min_turns_in_flight=options.min_turns_in_flight, loop_lag_target=options.loop_lag_target,
        flood=FloodGate(options.user_messages_per_minute, options.conversation_queue),
    )  # fmt: skip
    tracer = agent.tracer.store if agent.tracer is not None else None
    # the stores the console reads through the gateway (gateway/view.py)
    gateway.traces, gateway.sessions = tracer, memory.store
    gateway.approvals = agent.interactions if isinstance(agent.interactions, PendingStore) else None
    gateway.pruners += pruners(settings, {  # hourly: what is older than its retention (retention.py)
        "journal": agent.journal.prune, "traces": tracer.prune if tracer else None, "history": memory.prune,
        "uploads": uploads_pruner(settings),
    })  # fmt: skip
    if settings.schedule.enabled:  # with database.url every node fires; the claims keep it once
        add_scheduler(gateway, runner.inner, settings, stores.schedule_store(settings), clock=clock)
    channels, routes = channels_for(settings, gateway)
    for channel in channels:
        gateway.add_channel(channel)
    # pictures and files are fetched through the channel they came in on (Feishu's resource API)
    sources = {
        channel.name: cast(AttachmentSource, channel) for channel in channels if channel.name == "feishu"
    }
    runner.inner.media = media_desk(settings, agent, sources)
    runner.inner.watch_for = lambda message: watcher_of(gateway, message)  # streamed replies
    runner.inner.on_text_for = gateway.text_for  # and the console's chat (gateway/view.py `stream_text`)
    # who speaks in a group, named through the channel it came in on (Feishu's contact API)
    runner.inner.speakers = {name: cast(SpeakerNames, channel) for name, channel in sources.items()}
    return gateway, routes


def channels_for(settings: Settings, inbox: Any) -> tuple[list[Any], list[web.RouteDef]]:
    """The configured channels (webhook; Feishu when its credentials are set), each given `inbox`
    (the embedded `Gateway`, or engine/temporal's `TemporalInbox`), and their routes."""
    channels: list[Any] = []
    routes: list[web.RouteDef] = []
    if settings.webhook.enabled:
        webhook = WebhookChannel(
            inbox, secret=os.environ.get(SECRET_ENV), allow_unsigned=settings.webhook.allow_unsigned,
            callback_hosts=settings.webhook.callback_hosts, media=settings.media,
        )  # fmt: skip
        channels.append(webhook)
        routes += webhook.routes()
    app_id, app_secret = settings.feishu.app_id, os.environ.get("FEISHU_APP_SECRET")
    if app_id and app_secret:
        from .. import stores  # with database.url the limits are counted for every node together
        from ..channels.feishu.api import FeishuAPI
        from ..channels.feishu.channel import FeishuChannel
        from ..channels.feishu.ratelimit import SendLimiter

        pace = settings.feishu
        limiter = SendLimiter(
            rate_per_s=pace.send_rate, chat_per_s=pace.chat_send_rate, app_per_s=pace.app_send_rate,
            app_per_min=pace.app_send_per_minute, shared=stores.send_quota(settings, app_id),
        )  # fmt: skip
        api = FeishuAPI(app_id, app_secret, base_url=settings.feishu.base_url, limiter=limiter)
        feishu = FeishuChannel(
            inbox,
            app_id=app_id,
            app_secret=app_secret,
            verification_token=os.environ.get("FEISHU_VERIFICATION_TOKEN"),
            encrypt_key=os.environ.get("FEISHU_ENCRYPT_KEY"),
            base_url=settings.feishu.base_url,
            mode=settings.feishu.mode,
            api=api,
            hold_file=Path(settings.gateway.data_dir) / "feishu-held.jsonl",  # events awaiting the bot's id
            stream=settings.feishu.stream,
            card_streaming=settings.feishu.card_streaming,
            group_session=settings.feishu.group_session,
            greeting=settings.feishu.greeting,
        )
        channels.append(feishu)
        routes += feishu.routes()
    return channels, routes


def media_desk(settings: Settings, agent: Any, sources: dict[str, AttachmentSource]) -> MediaDesk:
    """Pictures and files for the turns (gateway/media.py): the channels that fetch them (and read
    the messages a message quotes), the workspace files are saved in (the file tools'), whether the
    model takes pictures, the endpoint that transcribes voice and video."""
    workspace = workspace_of(settings) if settings.agent.workspace else None
    transcriber = None
    if settings.media.transcription is not None:  # voice and video as text (gateway/transcription.py)
        from .transcription import Transcriber

        config = settings.media.transcription
        transcriber = Transcriber(config, os.environ.get(config.api_key_env))
    return MediaDesk(settings.media, sources=sources, workspace=workspace, vision=agent.settings.vision,
                     transcriber=transcriber)  # fmt: skip


def add_scheduler(
    gateway: Gateway, runner: AgentRunner, settings: Settings, store: ScheduleStore, *, clock: Any = None
) -> Any:
    """Scheduled jobs (gateway/schedules.py): the store (the gateway's database: SQLite, or the
    PostgreSQL every node shares), the chat tools on the agent, `/jobs` on the runner, the operator's
    `schedule.jobs`, the firing loop on the gateway."""
    import time as clocks

    from .schedules import Scheduler, declare_jobs, role_refusal

    options, agent = settings.schedule, runner.agent
    now = clock or clocks.time
    scheduler = Scheduler(store, gateway, misfire_grace=options.misfire_grace, tick=options.tick,
                          refusal=role_refusal(agent.permissions), clock=now,
                          retention=settings.gateway.retention_days * 86400)  # fmt: skip
    from ..schedule.jobs import JobLimits
    from ..schedule.tools import register_schedule_tools

    register_schedule_tools(agent, store, timezone=options.timezone, clock=now, on_change=scheduler.wake,
                            limits=JobLimits(options.max_jobs_per_user, options.max_jobs_per_chat),
                            min_delay=options.min_delay_minutes * 60)  # fmt: skip
    runner.schedules = gateway.schedules = store
    scheduler.declared = lambda: declare_jobs(store, options, agent.permissions, now())
    scheduler.owns_store = True  # closed when the gateway stops
    gateway.scheduler = scheduler
    return scheduler


def watcher_of(gateway: Gateway, message: InboundMessage) -> TurnWatcher | None:
    """The watcher of `message`'s turn: its channel's, when the channel streams replies."""
    channel = gateway.channels.get(message.channel)
    return channel.watch(message) if channel is not None else None


def refuse_open_webhook(settings: Settings, host: str) -> None:
    """Raise ConfigError when the webhook would be unsigned on a non-loopback address; warn when the
    configuration allows that explicitly."""
    if not settings.webhook.enabled:
        return
    secret, allowed = os.environ.get(SECRET_ENV), settings.webhook.allow_unsigned
    problem = exposure_problem(host, secret, allowed)
    if problem is not None:
        raise ConfigError(problem)
    if not secret and allowed and exposure_problem(host, None, False) is not None:
        log.warning("webhook: unsigned requests from anyone on %s (webhook.allow_unsigned: true): "
                    "whoever reaches the port may act as any user", host)  # fmt: skip


def build_memory(settings: Settings) -> ConversationMemory:
    """Conversations in the gateway's database; long-term outcomes there too, if enabled."""
    from .. import stores

    options = settings.memory
    store = stores.session_store(settings)
    long_term = stores.long_term_memory(store) if options.long_term else None
    return ConversationMemory(
        store, window_turns=options.window_turns, budget_tokens=options.budget_tokens, fold=options.fold,
        long_term=long_term, examples=options.examples,
    )  # fmt: skip


def log_model(settings: Settings, agent: Agent) -> None:
    """Which model answers, never its key: a WARNING when it is the offline demo model."""
    from ..config import model_endpoint
    from ..kernel.model import ModelClient

    if isinstance(agent.model, ModelClient):  # a client handed over by the caller (tests, embedding code)
        log.info("model: %s (a %s client)", agent.model.name, type(agent.model).__name__)
        return
    endpoint = model_endpoint(settings)
    if endpoint is None:
        log.warning("no model configured: the offline demo model answers (arithmetic, dates and times only); "
                    "set HERMES_PROVIDER and its API key, or HERMES_BASE_URL and HERMES_MODEL")  # fmt: skip
    else:
        log.info("model: %s; tool_mode %s", endpoint.describe(), settings.model.tool_mode)


def watch_model(gateway: Gateway, settings: Settings, agent: Agent) -> ModelHealth | None:
    """The model's health (gateway/model_health.py), told of every model call, reported as degraded
    while it refuses the key or the model, and answering the users politely meanwhile. None when
    there is nothing to probe: the offline demo model, or a client handed over by the caller."""
    from ..config import model_endpoint
    from ..kernel.model import ModelClient
    from .model_health import ModelHealth

    endpoint = None if isinstance(agent.model, ModelClient) else model_endpoint(settings)
    if endpoint is None:
        return None
    health = ModelHealth(endpoint)
    agent.hooks = [*agent.hooks, health]
    gateway.health_reports.append(health.degraded)
    if isinstance(gateway.runner, RedactingRunner):
        gateway.runner.inner.model_health = health
    return health


def route_summary(app: web.Application) -> str:
    """`POST /webhook, …; GET /, /healthz, /console/`: the routes of `app`, by method."""
    by_method: dict[str, list[str]] = {}
    for resource in app.router.resources():
        path = resource.canonical
        if isinstance(resource, web.PrefixedSubAppResource):
            by_method.setdefault("GET", []).append(path.rstrip("/") + "/")
            continue
        for route in resource:
            if route.method != "HEAD" and path not in by_method.setdefault(route.method, []):
                by_method[route.method].append(path)
    order = sorted(by_method, key=lambda method: (method != "POST", method))
    return "; ".join(f"{method} {', '.join(by_method[method])}" for method in order if by_method[method])


async def to_console(request: web.Request) -> web.Response:
    raise web.HTTPFound("/console/")


async def what_is_served(request: web.Request) -> web.Response:
    """GET / without the console: a short plain-text page saying what is served where."""
    lines = ["hermes-kernel gateway", "", *route_summary(request.app).split("; "), "",
             "GET /healthz: JSON status (ok, degraded parts, queues)."]  # fmt: skip
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


def metrics_route(
    gateway: Any,
    settings: Settings,
    bind: str,
    environ: Mapping[str, str],
    *,
    samples: Callable[[], Awaitable[list[Sample]]] | None = None,
) -> web.RouteDef:
    """GET /metrics, guarded as the module docstring says; `samples`: the gauges read at scrape
    time (default: the embedded gateway's, `gateway_samples`)."""
    from ..channels.base import FAILED_LOGIN_DELAY, is_local, is_loopback
    from ..observe.metrics import CONTENT_TYPE, REGISTRY

    tokens = [t for t in (environ.get(METRICS_TOKEN_ENV), environ.get(settings.console.token_env)) if t]
    if not tokens and not is_loopback(bind):
        log.info("/metrics refuses every scrape on %s: %s is not set", bind, METRICS_TOKEN_ENV)

    def allowed(request: web.Request) -> bool:
        if not tokens:
            return is_loopback(bind) and is_local(request)
        header = request.headers.get("Authorization", "")
        bearer = header[7:].strip().encode() if header[:7].lower() == "bearer " else b""
        return any(hmac.compare_digest(bearer, t.encode()) for t in tokens) and bool(bearer)

    async def metrics(request: web.Request) -> web.Response:
        if not allowed(request):
            if "Authorization" in request.headers:
                await asyncio.sleep(FAILED_LOGIN_DELAY)  # guessing tokens stays slow
            status = 401 if tokens else 403
            hint = "local requests only" if status == 403 and is_loopback(bind) else (
                f"send Authorization: Bearer ${METRICS_TOKEN_ENV}")  # fmt: skip
            return web.json_response({"error": f"metrics: not allowed ({hint})"}, status=status)
        text = REGISTRY.render(await (samples() if samples is not None else gateway_samples(gateway)))
        return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})

    return web.get("/metrics", metrics)


async def gateway_samples(gateway: Gateway) -> list[Sample]:
    """The gauges read when scraped: queue depths (the database's), turns, the loop's lag."""
    from ..observe.metrics import Sample

    counts = await gateway.store.counts()
    status, slots = gateway.status(), gateway.turn_slots
    gauges = [
        ("hermes_inbox_depth", "Accepted messages not yet completed (inbox rows pending).",
         counts.get("inbox_pending")),
        ("hermes_outbox_depth", "Replies not yet sent (outbox rows pending).", counts.get("outbox_pending")),
        ("hermes_dead_letters", "Replies given up on (the dead-letter table).", counts.get("dead_letters")),
        ("hermes_set_aside_messages", "Messages set aside after taking the process down twice.",
         counts.get("set_aside")),
        ("hermes_turns_in_flight", "Turns running now.", status["turns_in_flight"]),
        ("hermes_turns_waiting", "Turns waiting for a slot (acks first).", status["turns_waiting_for_slot"]),
        ("hermes_turn_limit", "Turns allowed at once now (adapts to the event loop's lag).", slots.limit),
        ("hermes_event_loop_lag_seconds", "The event loop's last measured lag.", slots.lag),
        ("hermes_conversations_busy", "Conversations with a turn running or waiting.",
         status["conversations_busy"]),
    ]  # fmt: skip
    samples = [Sample(name, text, value) for name, text, value in gauges]
    degraded: dict[tuple[str, ...], float] = {(str(part["component"]),): 1.0 for part in status["degraded"]}
    degraded.setdefault(("model",), 0.0)
    text = "1 while a component is degraded (GET /healthz says why): the model refusing the key, a link down."
    samples.append(Sample("hermes_degraded", text, labels=("component",), values=degraded))
    from .store import SQLiteGatewayStore

    if isinstance(gateway.store, SQLiteGatewayStore):  # the embedded store's single writer thread
        waiting = gateway.store.db.queued
        queued: dict[tuple[str, ...], float] = {(name,): float(n) for name, n in waiting.items()}
        text = "Jobs waiting for the database writer, by queue."
        samples.append(Sample("hermes_db_writer_queue", text, labels=("queue",), values=queued))
    return samples


def site_address(site: web.BaseSite) -> str:
    """The URL a started site listens on (its port chosen by the system when 0 was asked for)."""
    server = site._server  # aiohttp exposes the bound port only through the server's sockets
    sockets = getattr(server, "sockets", None) or []
    host, port = sockets[0].getsockname()[:2] if sockets else ("?", "?")
    return f"http://{host}:{port}"
