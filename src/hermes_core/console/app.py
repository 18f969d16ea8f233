"""The console's routes, under /console/ on the `hermes-kernel serve` port.

    GET  /console/                      chat (the `web` channel, replies streamed)
    GET  /console/tasks                 recorded tasks; ?failed=1, ?conversation=…, ?tool=…
    GET  /console/tasks/{task_id}       one task's timeline: model turns, tool calls, approvals
    GET  /console/approvals             approvals waiting for a decision, and recent ones
    GET  /console/deadletters           replies given up on, with why, and a Resend button
    GET  /console/schedule              scheduled jobs, with a Cancel button (docs/scheduling.md)
    GET  /console/status                the model configured, queues, turns in flight, rates, model errors
    GET  /console/login, POST           the token form (only when a token is required)
    POST /console/api/chat              {"message", "conversation", "image"?} → JSON lines (channel.py)
    GET  /console/api/events?conversation=…   server-sent events: replies sent on their own (channel.py)
    GET  /console/api/history?conversation=…  the conversation's earlier messages (history.py)
    POST /console/api/approvals/{id}    {"decision": "approve"|"reject", "stream": bool}
    GET  /console/api/deadletters       the dead letters, as JSON
    POST /console/api/deadletters/{id}/resend   {} → the reply goes back to its conversation's outbox
    GET  /console/api/schedule          the scheduled jobs, as JSON
    POST /console/api/schedule/{id}/cancel      {} → the job is cancelled
    GET  /console/api/status            the status page's numbers, as JSON
    GET  /console/api/tasks/{task_id}   one task's trace, as JSON (redacted)

The console is an admin's view: a decision taken here is an admin's (`decided_by: console`),
whoever started the task. Chat messages are sent as the user `console`, with the role the
permissions give that id (a member unless listed). A chat message may carry one picture, as a
`data:` URL checked like a webhook's `images` (channels/media.py `inline_image`, `media.max_image_mb`);
it reaches the model as an image part, as a Feishu picture does (gateway/media.py).

Pages speak English or Chinese (words.py): `?lang=`, a cookie, or the browser's Accept-Language.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiohttp import web

from ..channels.media import MediaLimits, inline_image, megabytes
from ..channels.seam import resume_message, task_id_of
from ..config import Settings
from ..gateway.store import dead_letter_summary
from ..kernel.approvals import DecisionRefused
from ..kernel.redaction import Redactor, default_redactor
from ..kernel.tools.permissions import ADMIN, Caller
from .access import Access, add_headers, console_token
from .channel import ConversationFeeds, WebChannel
from .history import chat_items
from .pages import Pages, trace_url
from .words import language, remember_language

if TYPE_CHECKING:
    from ..gateway.view import GatewayView
    from ..kernel.model import ModelClient
    from ..observe.traces import TraceStore
    from ..schedule.jobs import ScheduleStore

log = logging.getLogger("hermes_core.console")

STATIC = Path(__file__).parent / "static"
CONVERSATION = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
BAD_CONVERSATION = "'conversation' must be 1 to 64 letters, digits, '.', '_' or '-'"
MAX_MESSAGE_CHARS = 20_000
MODEL_FAILURES = ("model_unavailable", "model_rejected")
RATE_WINDOW = 60.0  # seconds the turn and send rates are measured over
SAMPLE_EVERY = 5.0
KEEPALIVE = 15.0  # seconds between the comments that keep an idle event stream open through proxies


class Console:
    """The handlers; they read the gateway and the stores it keeps (gateway/view.py `GatewayView`),
    never write them except through the gateway's own paths (accept, a decision, a resend)."""

    def __init__(
        self,
        gateway: GatewayView,
        channel: WebChannel,
        access: Access,
        redactor: Redactor,
        *,
        configured: dict[str, str] | None = None,
        media: MediaLimits | None = None,
    ) -> None:
        """`configured`: the model (provider, model, host; None: the offline demo)."""
        self.gateway = gateway
        self.channel = channel
        self.access = access
        self.redactor = redactor
        self.configured = configured
        self.media = media or MediaLimits()
        self._samples: deque[tuple[float, int, int]] = deque(maxlen=int(RATE_WINDOW / SAMPLE_EVERY) + 1)

    def pages(self, request: web.Request) -> Pages:
        """The pages in the language of this request (words.py)."""
        return Pages(self.redactor, language(request))

    @property
    def traces(self) -> TraceStore | None:
        """The trace store (observe/traces.py), or None when the gateway keeps no traces."""
        return self.gateway.traces

    def routes(self) -> list[web.AbstractRouteDef]:
        return [
            web.get("/", self.chat),
            web.get("/tasks", self.tasks),
            web.get("/tasks/{task_id:.+}", self.task),
            web.get("/approvals", self.approvals),
            web.get("/deadletters", self.dead_letters),
            web.get("/schedule", self.schedule),
            web.get("/status", self.status),
            web.get("/login", self.login_form),
            web.post("/login", self.login),
            web.post("/api/chat", self.post_chat),
            web.get("/api/events", self.events),
            web.get("/api/history", self.history),
            web.post("/api/approvals/{id}", self.decide),
            web.get("/api/deadletters", self.dead_letters_json),
            web.post("/api/deadletters/{id}/resend", self.resend),
            web.get("/api/schedule", self.schedule_json),
            web.post("/api/schedule/{id}/cancel", self.cancel_job),
            web.get("/api/status", self.status_json),
            web.get("/api/tasks/{task_id:.+}", self.task_json),
            web.static("/static", STATIC),
        ]

    # -- pages -----------------------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.Response:
        return _html(self.pages(request).chat(self.media.limit("image")))

    async def tasks(self, request: web.Request) -> web.Response:
        query = request.query
        filters = {key: query.get(key, "").strip()[:200] for key in ("failed", "conversation", "tool")}
        if self.traces is None:
            return _html(self.pages(request).tasks(None, filters))
        rows = await self.traces.list(
            failed=True if filters["failed"] else None,
            conversation=filters["conversation"] or None,
            tool=filters["tool"] or None,
            limit=100,
        )
        return _html(self.pages(request).tasks(rows, filters))

    async def task(self, request: web.Request) -> web.Response:
        task_id = request.match_info["task_id"]
        record = await self.traces.get(task_id) if self.traces is not None else None
        if record is None:
            return _html(self.pages(request).missing_trace(task_id, self.traces is not None), 404)
        return _html(self.pages(request).trace(record))

    async def task_json(self, request: web.Request) -> web.Response:
        record = await self.traces.get(request.match_info["task_id"]) if self.traces is not None else None
        if record is None:
            return _json({"error": "no such task"}, 404)
        return _json(self.redactor.redact_data(record))

    async def approvals(self, request: web.Request) -> web.Response:
        interactions = self.gateway.approvals
        if interactions is None:
            return _html(self.pages(request).approvals([], [], has_store=False))
        waiting = [p.summary() for p in await interactions.list("pending") if p.kind == "approval"]
        recent = [
            p.summary()
            for p in await interactions.list(None, limit=50)
            if p.kind == "approval" and not p.open
        ][:20]
        return _html(self.pages(request).approvals(waiting, recent, has_store=True))

    async def status(self, request: web.Request) -> web.Response:
        return _html(self.pages(request).status(await self.numbers()))

    async def dead_letters(self, request: web.Request) -> web.Response:
        return _html(self.pages(request).dead_letters(await self._dead_letter_rows()))

    async def dead_letters_json(self, request: web.Request) -> web.Response:
        rows = await self._dead_letter_rows()
        return _json(self.redactor.redact_data({"dead_letters": rows}))

    async def _dead_letter_rows(self) -> list[dict[str, Any]]:
        return [dead_letter_summary(row) for row in await self.gateway.store.dead_letters(limit=200)]

    @property
    def schedules(self) -> ScheduleStore | None:
        """The scheduled jobs' store (schedule/jobs.py), or None when scheduling is off."""
        return self.gateway.schedules

    async def _jobs(self) -> list[dict[str, Any]] | None:
        store = self.schedules
        return None if store is None else [job.describe() for job in await store.jobs(active_only=False)]

    async def schedule(self, request: web.Request) -> web.Response:
        return _html(self.pages(request).schedule(await self._jobs()))

    async def schedule_json(self, request: web.Request) -> web.Response:
        jobs = await self._jobs()
        if jobs is None:
            return _json({"error": "scheduling is off in this gateway"}, 404)
        return _json(self.redactor.redact_data({"jobs": jobs}))

    async def cancel_job(self, request: web.Request) -> web.Response:
        """An admin cancels a scheduled job (any job: the console is an admin's view)."""
        job_id, store = request.match_info["id"], self.schedules
        if store is None:
            return _json({"error": "scheduling is off in this gateway"}, 404)
        if len(job_id) > 80:
            return _json({"error": "no such job"}, 404)
        cancelled = await store.cancel(job_id)
        if cancelled is None:
            return _json({"error": "no active job with this id"}, 404)
        log.info("scheduled job %s cancelled from the console", job_id)
        return _json({"cancelled": job_id})

    async def status_json(self, request: web.Request) -> web.Response:
        return _json(await self.numbers())

    # -- chat and decisions ----------------------------------------------------------------------

    async def post_chat(self, request: web.Request) -> web.StreamResponse:
        limit = self.media.limit("image")
        data = await _json_body(request, limit=limit * 4 // 3 + MAX_MESSAGE_CHARS * 4 + 4096)
        if data is None:
            return _json({"error": f"the picture is larger than the limit of {megabytes(limit)}"}, 413)
        text, image = data.get("message", ""), data.get("image")
        conversation = data.get("conversation") or "console"
        if not isinstance(text, str) or not (text.strip() or image) or len(text) > MAX_MESSAGE_CHARS:
            return _json({"error": f"'message' must be 1 to {MAX_MESSAGE_CHARS} characters"}, 400)
        if not isinstance(conversation, str) or not CONVERSATION.match(conversation):
            return _json({"error": BAD_CONVERSATION}, 400)
        try:
            images = [] if image is None else [inline_image(image, self.media)]
        except ValueError as bad:
            return _json({"error": str(bad).replace("'images'", "'image'")}, 400)
        if not self.gateway.accepting:
            return _json({"error": "shutting down, try again"}, 503)
        message = self.channel.message(text, conversation, images)
        task_id = task_id_of(message)  # named before it is accepted: its text is streamed from the start
        head = {"task_id": task_id, "trace": trace_url(task_id)}
        return await self.channel.converse(request, task_id, lambda: self.gateway.accept(message), head)

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events for one conversation: each reply sent on its own (a job's, a post),
        `data: {"type": "message", "text", "approval"}`, until the page or the server goes."""
        conversation = request.query.get("conversation", "")
        if not CONVERSATION.match(conversation):
            return _json({"error": BAD_CONVERSATION}, 400)
        feeds: ConversationFeeds = self.channel.feeds
        queue = feeds.listen(f"web:{conversation}")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "X-Accel-Buffering": "no"}
        )
        try:
            await response.prepare(request)
            await response.write(b": open\n\n")
            while self.gateway.accepting:
                try:
                    event = await asyncio.wait_for(queue.get(), KEEPALIVE)
                except asyncio.TimeoutError:
                    await response.write(b": still here\n\n")
                    continue
                if event is None:  # the server is stopping
                    break
                await response.write(f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode())
        except ConnectionResetError:
            pass  # the page was closed
        finally:
            feeds.leave(f"web:{conversation}", queue)
        return response

    async def history(self, request: web.Request) -> web.Response:
        """The conversation's earlier messages, from the session store (history.py), redacted."""
        conversation = request.query.get("conversation", "")
        if not CONVERSATION.match(conversation):
            return _json({"error": BAD_CONVERSATION}, 400)
        sessions = self.gateway.sessions
        if sessions is None:
            return _json({"messages": []})
        stored = await sessions.load(f"web:{conversation}")
        return _json(self.redactor.redact_data({"messages": chat_items(stored.messages)}))

    async def decide(self, request: web.Request) -> web.StreamResponse:
        """An admin's decision; with `stream` and a task of the web channel, its reply is streamed."""
        data = await _json_body(request) or {}
        if data.get("decision") not in ("approve", "reject"):
            return _json({"error": "'decision' must be 'approve' or 'reject'"}, 400)
        interactions = self.gateway.approvals
        if not self.gateway.accepting:
            return _json({"error": "approvals are not available"}, 503)
        if interactions is None:  # asked in place (a terminal): nothing waits
            return _json({"error": "approval_unknown"}, 404)
        admin = Caller("console", ADMIN, self.channel.name)
        try:
            pending = await interactions.decide(
                request.match_info["id"], admin, data["decision"] == "approve"
            )
        except DecisionRefused as refused:
            return _json({"error": refused.reason}, 404 if refused.reason == "approval_unknown" else 409)
        log.info("approval %s %s in the console", pending.id, pending.status)
        message = resume_message(pending)
        answer = {
            "approval": pending.id,
            "status": pending.status,
            "task_id": pending.task_id,
            "trace": trace_url(pending.task_id),
        }
        if message is None:
            return _json(answer)
        if data.get("stream") and message.channel == self.channel.name:
            return await self.channel.converse(
                request, pending.task_id, lambda: self.gateway.accept(message), answer
            )
        await self.gateway.accept(message)  # the reply goes to the task's own channel
        return _json(answer)

    async def resend(self, request: web.Request) -> web.Response:
        """An admin sends a dead letter again: back in its conversation's outbox, same uuid."""
        raw = request.match_info["id"]
        if not raw.isdigit() or len(raw) > 18:
            return _json({"error": "a dead letter id is a number"}, 400)
        if not self.gateway.accepting:
            return _json({"error": "shutting down, try again"}, 503)
        reply = await self.gateway.resend(int(raw))
        if reply is None:
            return _json({"error": "no such dead letter"}, 404)
        log.info("dead letter %s resent from the console", reply.id)
        return _json({"resent": reply.id, "conversation": reply.conversation})

    # -- access ----------------------------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.Response:
        if not self.access.required:
            raise web.HTTPSeeOther("/console/")
        return _html(self.pages(request).login())

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        typed = form.get("token")
        if not isinstance(typed, str) or not self.access.token_matches(typed):
            await self.access.refuse_guess()
            pages = self.pages(request)
            return _html(pages.login(pages.w("wrong_token")), 401)
        response = web.Response(status=303, headers={"Location": "/console/"})
        self.access.login(response, request)
        return response

    def denied(self, request: web.Request, status: int) -> web.StreamResponse:
        if request.path.startswith("/console/api/"):
            error = "token required" if status == 401 else "the console answers only on this machine"
            return _json({"error": error}, status)
        page = self.pages(request).login() if status == 401 else self.pages(request).refused()
        return _html(page, status)

    # -- numbers ---------------------------------------------------------------------------------

    async def numbers(self) -> dict[str, Any]:
        """Queues, lanes, rates, approvals and model errors: the status page, as data."""
        gateway = self.gateway
        counts = await gateway.store.counts()
        interactions = gateway.approvals
        waiting = await interactions.list("pending") if interactions is not None else []
        return {
            "gateway": {"ok": gateway.accepting, **gateway.status(), **counts},
            "lanes": gateway.lanes(),
            "rates": self.rates(),
            "approvals_waiting": sum(1 for p in waiting if p.kind == "approval"),
            "model": await self.model_errors(),
            "configured": self.configured,
            "degraded": gateway.degraded(),
        }

    def sample(self) -> None:
        self._samples.append((time.monotonic(), self.gateway.turns_done, self.gateway.replies_sent))

    def rates(self) -> dict[str, float]:
        """Turns done and replies sent in the last minute (since start, for a younger process)."""
        now, turns, sent = time.monotonic(), self.gateway.turns_done, self.gateway.replies_sent
        then, turns0, sent0 = self._samples[0] if self._samples else (now, turns, sent)
        return {
            "turns_per_minute": (turns - turns0) * 60.0 / max(now - then, RATE_WINDOW),
            "sends_per_minute": (sent - sent0) * 60.0 / max(now - then, RATE_WINDOW),
            "window": now - then,
        }

    async def model_errors(self) -> dict[str, Any] | None:
        """Over the last hour of traces: model calls, how many failed, and how tasks ended."""
        if self.traces is None:
            return None
        rows = await self.traces.list(since=time.time() - 3600, limit=1000)
        reasons: dict[str, int] = {}
        for row in rows:
            reason = str(row.get("stop_reason") or "unknown")
            reasons[reason] = reasons.get(reason, 0) + 1
        errors = sum(reasons.get(reason, 0) for reason in MODEL_FAILURES)
        calls = sum(int(row.get("model_calls") or 0) for row in rows)
        calls = max(calls, errors)
        tokens = sum(_total_tokens(row.get("tokens")) for row in rows)
        return {
            "tasks": len(rows),
            "failed": sum(1 for row in rows if not row.get("ok")),
            "model_calls": calls,
            "model_errors": errors,
            "error_rate": errors / calls if calls else 0.0,
            "stop_reasons": reasons,
            "tokens": tokens,
        }

    async def sampling(self, app: web.Application) -> AsyncIterator[None]:
        """`cleanup_ctx`: sample the counters every few seconds, for the rates."""

        async def every() -> None:
            while True:
                self.sample()
                await asyncio.sleep(SAMPLE_EVERY)

        task = asyncio.create_task(every())
        yield
        task.cancel()


def mount_console(
    app: web.Application,
    gateway: GatewayView,
    settings: Settings,
    *,
    host: str,
    model: str | ModelClient | None = None,
    environ: Mapping[str, str] | None = None,
) -> Console | None:
    """Add the web channel to `gateway` and the console to `app` under /console/, if the console is
    on for `host` (access.py); None when it is off. Call before the app and the gateway start.
    `model`: the agent's, when it is not the one the settings name (the status page says which)."""
    enabled, token = console_token(settings.console, host, os.environ if environ is None else environ)
    if not enabled:
        return None
    redactor = default_redactor()
    if token is not None:
        redactor.add(token)
    channel = WebChannel(redactor)
    gateway.add_channel(channel)
    gateway.stream_text(channel.streams.on_text)
    access = Access(token, host)  # local-only by the address served on, never by a request's address
    configured = configured_model(settings, model)
    console = Console(gateway, channel, access, redactor, configured=configured, media=settings.media)
    sub = web.Application(middlewares=[access.middleware(console.denied), remember_language])
    sub.add_routes(console.routes())
    sub.on_response_prepare.append(add_headers)
    sub.on_shutdown.append(channel.feeds.closing)
    sub.cleanup_ctx.append(console.sampling)
    app.router.add_get("/console", _to_console)  # before the sub-application, which would answer 404
    app.add_subapp("/console/", sub)
    log.info("console on /console/ (%s)", "token required" if token else "this machine only")
    return console


def configured_model(settings: Settings, model: str | ModelClient | None = None) -> dict[str, str] | None:
    """The model the settings name: provider, model name, the base URL's host (never the key);
    None for the offline demo model. A client handed to serve (`model`: embedding code, tests) by its name."""
    from ..config import ConfigError, model_endpoint
    from ..kernel.model import ModelClient

    if isinstance(model, ModelClient):  # as gateway/server.py `log_model` tells them apart
        return {"provider": "", "model": model.name, "host": ""}
    try:
        endpoint = model_endpoint(settings)
    except ConfigError:  # serve has refused to start already
        return None
    if endpoint is None:
        return None
    return {
        "provider": endpoint.provider or "",
        "model": endpoint.model,
        "host": urlsplit(endpoint.base_url).hostname or "",
    }


async def _to_console(request: web.Request) -> web.Response:
    raise web.HTTPFound("/console/")


async def _json_body(request: web.Request, limit: int | None = None) -> dict[str, Any] | None:
    """The JSON object posted ({} for anything else); with `limit`, the body is read up to that
    many bytes instead of the server's own limit, and None when it is longer."""
    if limit is None:
        body = await request.read()
    else:
        chunks, size = [], 0
        async for chunk in request.content.iter_any():
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return None
        body = b"".join(chunks)
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _total_tokens(tokens: Any) -> int:
    if isinstance(tokens, dict):
        return int(tokens.get("total_tokens") or 0)
    return int(tokens) if isinstance(tokens, (int, float)) else 0


def _html(page: str, status: int = 200) -> web.Response:
    return web.Response(text=page, status=status, content_type="text/html", charset="utf-8")


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda value: json.dumps(value, ensure_ascii=False))
