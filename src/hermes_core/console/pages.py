"""The console's pages: plain HTML built from strings, every value redacted and escaped.

One method does both, `Pages.show`, and every value reaches the HTML through it (or through
`attr`/`url`, which use it); the finished page is redacted once more as a whole. The pages carry no
inline script or style (the Content-Security-Policy forbids both): `static/console.js` finds its
elements by id and `data-` attributes, and timeline bars are SVG rectangles.
"""

from __future__ import annotations

import html
import json
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import quote, urlencode

from ..kernel.redaction import Redactor, cut_text

if TYPE_CHECKING:
    from ..observe.traces import TraceSummary

from ..kernel.messages import JSON

NAV = (
    ("chat", "/console/", "Chat"),
    ("tasks", "/console/tasks", "Tasks"),
    ("approvals", "/console/approvals", "Approvals"),
    ("deadletters", "/console/deadletters", "Dead letters"),
    ("schedule", "/console/schedule", "Schedule"),
    ("status", "/console/status", "Status"),
)
BAR_WIDTH = 1000  # the SVG's own units; it is stretched to the column's width


def trace_url(task_id: str) -> str:
    return "/console/tasks/" + quote(task_id, safe="")


class Pages:
    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor

    def show(self, value: object) -> str:
        """Any value as HTML text: redacted, then escaped (quotes too: safe inside attributes)."""
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        return html.escape(self.redactor.redact(text), quote=True)

    def layout(self, page: str, title: str, body: str, *, refresh: int | None = None) -> str:
        nav = "".join(
            f'<a href="{href}"{" class=current" if key == page else ""}>{label}</a>'
            for key, href, label in NAV
        )
        meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
        document = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{meta}<title>{self.show(title)} · hermes-core console</title>
<link rel="stylesheet" href="/console/static/console.css">
<script src="/console/static/console.js" defer></script>
</head><body data-page="{page}"><header><strong>hermes-core</strong><nav>{nav}</nav></header>
<main><h1>{self.show(title)}</h1>
{_scrollable(body)}</main></body></html>"""
        return self.redactor.redact(document)

    # -- chat ------------------------------------------------------------------------------------

    def chat(self) -> str:
        body = """<div id="log" class="log" aria-live="polite"></div>
<form id="chat" class="chat" autocomplete="off">
<textarea id="message" name="message" rows="2" required
 placeholder="Message the agent (Enter to send)"></textarea>
<button id="send" type="submit">Send</button>
<button id="new-conversation" type="button" class="quiet">New conversation</button>
</form>
<p class="hint">Conversation <code id="conversation"></code>: the same gateway path as every channel;
each reply links to its trace.</p>"""
        return self.layout("chat", "Chat", body)

    # -- tasks -----------------------------------------------------------------------------------

    def tasks(self, rows: list[TraceSummary] | None, filters: dict[str, str]) -> str:
        if rows is None:
            return self.layout("tasks", "Tasks", NO_TRACES)
        failed = " checked" if filters.get("failed") else ""
        form = f"""<form class="filters" method="get" action="/console/tasks">
<label><input type="checkbox" name="failed" value="1"{failed}> failed only</label>
<label>conversation <input name="conversation" value="{self.show(filters.get("conversation", ""))}"></label>
<label>tool <input name="tool" value="{self.show(filters.get("tool", ""))}"></label>
<button type="submit">Filter</button> <a href="/console/tasks">clear</a></form>"""
        head = "<tr><th>started</th><th>task</th><th>conversation</th><th>input</th><th>reply</th>"
        head += "<th>outcome</th><th>model calls</th><th>tools</th><th>tokens</th><th>time</th></tr>"
        body = "".join(self._task_row(row) for row in rows) or '<tr><td colspan="10">No tasks.</td></tr>'
        table = f'<table id="tasks" class="tasks"><thead>{head}</thead><tbody>{body}</tbody></table>'
        return self.layout("tasks", "Tasks", form + table)

    def _task_row(self, row: TraceSummary) -> str:
        task_id = str(row.get("task_id", ""))
        tools = ", ".join(str(name) for name in row.get("tool_names") or [])
        return (  # data-label: the column's name, shown before each value on a phone (console.css)
            f'<tr class="{"ok" if row.get("ok") else "failed"}">'
            f'<td data-label="started">{_when(row.get("started_at"))}</td>'
            f'<td data-label="task"><a href="{self.show(trace_url(task_id))}">{self.show(task_id)}</a></td>'
            f"<td data-label=conversation>{self.show(row.get('conversation') or '')}</td>"
            f"<td data-label=input>{self.show(_clip(row.get('input')))}</td>"
            f"<td data-label=reply>{self.show(_clip(row.get('reply')))}</td>"
            f"<td data-label=outcome>{self._outcome(row)}</td>"
            f"<td data-label='model calls'>{self.show(row.get('model_calls', ''))}</td>"
            f"<td data-label=tools>{self.show(tools)}</td>"
            f"<td data-label=tokens>{self.show(_tokens(row.get('tokens')))}</td>"
            f"<td data-label=time>{_seconds(row.get('started_at'), row.get('finished_at'))}</td></tr>"
        )

    def _outcome(self, record: Mapping[str, Any]) -> str:
        reason = record.get("stop_reason") or ("completed" if record.get("ok") else "failed")
        css = "ok" if record.get("ok") else "paused" if str(reason).startswith("awaiting") else "failed"
        return f'<span class="badge {css}">{self.show(reason)}</span>'

    def trace(self, record: dict[str, JSON]) -> str:
        """One task: what came in, every model turn and tool call on a time axis, what went out."""
        task_id = str(record.get("task_id", ""))
        usage = record.get("usage") or {}
        facts = [
            ("outcome", self._outcome(record)),
            ("conversation", self.show(record.get("conversation"))),
            ("channel", self.show(record.get("channel"))),
            ("caller", self.show(_caller(record.get("caller")))),
            ("started", _when(record.get("started_at"))),
            ("time", _seconds(record.get("started_at"), record.get("finished_at"))),
            ("tokens", self.show(_tokens(usage))),
            ("raw", f'<a href="/console/api/tasks/{self.show(quote(task_id, safe=""))}">JSON</a>'),
        ]
        summary = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
        parts = [
            f'<dl class="facts">{summary}</dl>',
            f'<h2>Input</h2><pre class="input">{self.show(record.get("input") or "")}</pre>',
            f"<h2>Timeline</h2>{self._timeline(record)}",
        ]
        if record.get("error"):
            parts.append(f'<h2>Error</h2><pre class="error">{self.show(record["error"])}</pre>')
        if record.get("approvals"):
            parts.append(f"<h2>Approvals</h2>{self._approvals_of(record['approvals'])}")
        parts.append(
            f'<h2>Reply</h2><pre id="reply" class="reply">{self.show(record.get("reply") or "")}</pre>'
        )
        parts.append(self._messages(record.get("messages") or []))
        return self.layout("tasks", f"Task {task_id}", "\n".join(parts))

    def _timeline(self, record: dict[str, JSON]) -> str:
        model_calls = list(record.get("model_calls") or [])
        tool_calls = list(record.get("tool_calls") or [])
        start, total = _span(record, model_calls + tool_calls)
        rows = []
        for call in model_calls:
            rows.append(self._model_row(call, start, total))
            rows.extend(
                self._tool_row(t, start, total) for t in tool_calls if t.get("turn") == call.get("turn")
            )
        turns = {call.get("turn") for call in model_calls}
        rows.extend(self._tool_row(t, start, total) for t in tool_calls if t.get("turn") not in turns)
        head = "<tr><th>step</th><th>what</th><th>time</th><th>detail</th></tr>"
        body = "".join(rows)
        return f'<table id="timeline" class="timeline"><thead>{head}</thead><tbody>{body}</tbody></table>'

    def _model_row(self, call: dict[str, JSON], start: float, total: float) -> str:
        response = call.get("response") or {}
        asked = [f"{c.get('name')}({_compact(c.get('arguments'))})" for c in response.get("tool_calls") or []]
        detail = [
            f"<div>{self.show(_tokens(response.get('usage')))} · {self.show(response.get('model') or '')}"
            f" · {self.show(response.get('finish_reason') or '')}</div>"
        ]
        if response.get("content"):
            detail.append(f'<pre class="content">{self.show(response["content"])}</pre>')
        if asked:
            detail.append(f'<div class="asked">calls: {self.show("; ".join(asked))}</div>')
        if call.get("error"):
            detail.append(f'<pre class="error">{self.show(call["error"])}</pre>')
        css = "model failed" if call.get("error") else "model"
        label = f"model · {self.show(call.get('request_messages_count', '?'))} messages in"
        return self._row(css, f"turn {self.show(call.get('turn', '?'))}", label, call, start, total, detail)

    def _tool_row(self, call: dict[str, JSON], start: float, total: float) -> str:
        detail = [
            '<div class="label">arguments</div>',
            f'<pre class="arguments">{self.show(_pretty(call.get("arguments")))}</pre>',
            '<div class="label">result</div>',
            f'<pre class="result">{self.show(_pretty(call.get("result")))}</pre>',
        ]
        if call.get("error"):
            detail.append(f'<div class="error">error: {self.show(call["error"])}</div>')
        css = "tool" if call.get("ok", True) else "tool failed"
        name = f'<span class="tool-name">{self.show(call.get("name", "?"))}</span>'
        return self._row(css, "tool", name, call, start, total, detail)

    def _row(
        self,
        css: str,
        step: str,
        what: str,
        call: dict[str, JSON],
        start: float,
        total: float,
        detail: list[str],
    ) -> str:
        began = float(call.get("started_at") or start)
        elapsed = float(call.get("elapsed") or 0.0)
        x = min(BAR_WIDTH, (began - start) / total * BAR_WIDTH)
        width = max(2.0, min(BAR_WIDTH - x, elapsed / total * BAR_WIDTH))
        bar = (
            f'<svg class="bar" viewBox="0 0 {BAR_WIDTH} 10" preserveAspectRatio="none" role="img">'
            f'<title>{elapsed * 1000:.0f} ms</title><rect x="{x:.1f}" y="0" width="{width:.1f}" height="10"/>'
            f"</svg><span>{elapsed * 1000:.0f} ms</span>"
        )
        cells = f'<td>{step}</td><td>{what}</td><td class="when">{bar}</td><td>{"".join(detail)}</td>'
        return f'<tr class="{css}">{cells}</tr>'

    def _approvals_of(self, approvals: list[JSON]) -> str:
        items = []
        for item in approvals:
            if isinstance(item, dict):
                text = (
                    f"{item.get('tool', '')} {_compact(item.get('arguments'))}: {item.get('status', '')}"
                    f"{' by ' + str(item['decided_by']) if item.get('decided_by') else ''}"
                )
                items.append(f"<li>{self.show(text)} <code>{self.show(item.get('id', ''))}</code></li>")
            else:
                items.append(f"<li>{self.show(item)}</li>")
        return f'<ul class="approvals">{"".join(items)}</ul>'

    def _messages(self, messages: list[JSON]) -> str:
        items = "".join(
            f"<li><b>{self.show(m.get('role', '?') if isinstance(m, dict) else '?')}</b>"
            f"<pre>{self.show(_message_text(m))}</pre></li>"
            for m in messages
        )
        summary = f"<summary>All {len(messages)} messages</summary>"
        return f'<details class="messages">{summary}<ol>{items}</ol></details>'

    def missing_trace(self, task_id: str, has_store: bool) -> str:
        text = (
            NO_TRACES
            if not has_store
            else (
                f"<p>No trace of <code>{self.show(task_id)}</code> yet: a task's trace is written when it "
                'finishes or pauses. <a href="">Reload</a></p>'
            )
        )
        return self.layout("tasks", "Task not found", text)

    # -- approvals ------------------------------------------------------------------------------

    def approvals(
        self, waiting: list[dict[str, JSON]], recent: list[dict[str, JSON]], has_store: bool
    ) -> str:
        if not has_store:
            return self.layout("approvals", "Approvals", "<p>Approvals are not configured.</p>")
        head = "<tr><th>id</th><th>tool</th><th>arguments</th><th>asked by</th><th>task</th>"
        rows = "".join(self._approval_row(p, decidable=True) for p in waiting)
        rows = rows or '<tr><td colspan="7">Nothing waits for a decision.</td></tr>'
        done = "".join(self._approval_row(p, decidable=False) for p in recent)
        body = (
            f'<table id="approvals" class="approvals"><thead>{head}<th>expires</th><th></th></tr></thead>'
            f"<tbody>{rows}</tbody></table><h2>Recently decided</h2>"
            f'<table id="decided" class="approvals"><thead>{head}<th>decided</th><th>status</th></tr></thead>'
            f"<tbody>{done}</tbody></table>"
        )
        return self.layout("approvals", "Approvals", body)

    def _approval_row(self, pending: dict[str, JSON], *, decidable: bool) -> str:
        pid = self.show(pending.get("id", ""))
        task_id = str(pending.get("task_id", ""))
        if decidable:
            last = (
                f'<button class="decide" data-approval="{pid}" data-decision="approve">Approve</button> '
                f'<button class="decide quiet" data-approval="{pid}" data-decision="reject">Reject</button>'
            )
            expires = _until(pending.get("expires_at"))
        else:
            by = f" by {pending['decided_by']}" if pending.get("decided_by") else ""
            last, expires = self.show(f"{pending.get('status', '')}{by}"), _when(pending.get("decided_at"))
        who = f"{pending.get('requested_by', '')} ({pending.get('channel', '')})"
        return (
            f'<tr id="approval-{pid}"><td><code>{pid}</code></td>'
            f"<td>{self.show(pending.get('tool', ''))}</td>"
            f'<td><pre class="arguments">{self.show(_pretty(pending.get("arguments")))}</pre></td>'
            f"<td>{self.show(who)}</td>"
            f'<td><a href="{self.show(trace_url(task_id))}">{self.show(task_id)}</a></td>'
            f"<td>{expires}</td><td>{last}</td></tr>"
        )

    # -- dead letters ----------------------------------------------------------------------------

    def dead_letters(self, rows: list[dict[str, JSON]] | None) -> str:
        """Replies given up on, each with why, and a Resend button (console.js posts the JSON)."""
        if rows is None:
            return self.layout("deadletters", "Dead letters", "<p>This gateway keeps no dead letters.</p>")
        columns = ("id", "died", "conversation", "attempts", "error", "text", "")
        head = "<tr>" + "".join(f"<th>{name}</th>" for name in columns) + "</tr>"
        body_rows = "".join(self._dead_letter_row(row) for row in rows)
        body_rows = body_rows or '<tr><td colspan="7">No reply was given up on.</td></tr>'
        hint = (
            '<p class="hint">A reply is dead-lettered when the platform refuses it for good (the bot was '
            "removed from the chat, the chat was dissolved…) or after repeated real failures — never "
            "for being rate limited. Fix the cause, then resend it: it goes out with the same "
            "idempotency key, so it is never delivered twice.</p>"
        )
        table = (
            f'<table id="deadletters" class="approvals"><thead>{head}</thead>'
            f"<tbody>{body_rows}</tbody></table>"
        )
        return self.layout("deadletters", "Dead letters", hint + table)

    def schedule(self, jobs: list[dict[str, Any]] | None) -> str:
        """Scheduled jobs (schedule/jobs.py `Job.describe()`), each active one with a Cancel button."""
        if jobs is None:
            return self.layout("schedule", "Schedule", "<p>Scheduling is off in this gateway.</p>")
        columns = ("id", "when", "next fire", "conversation", "created by", "last fire", "prompt", "")
        head = "<tr>" + "".join(f"<th>{name}</th>" for name in columns) + "</tr>"
        rows = "".join(self._job_row(job) for job in jobs)
        rows = rows or f'<tr><td colspan="{len(columns)}">No job is scheduled.</td></tr>'
        hint = (
            '<p class="hint">Jobs come from chat (<code>schedule_task</code>), from '
            "<code>schedule.jobs</code> in the configuration and from <code>hermes-core schedule "
            "add</code>. Each fire runs once as a task in its conversation; the last fire says "
            "whether it ran, was skipped or refused.</p>"
        )
        table = f'<table id="schedule" class="approvals"><thead>{head}</thead><tbody>{rows}</tbody></table>'
        return self.layout("schedule", "Schedule", hint + table)

    def _job_row(self, job: dict[str, Any]) -> str:
        jid = self.show(job.get("id", ""))
        active = job.get("status") == "active"
        action = f'<button class="cancel-job" data-job="{jid}">Cancel</button>' if active else self.show(
            job.get("status", ""))  # fmt: skip
        last = f"{_when(job.get('last_fire'))} {self.show(job.get('last_outcome') or '')}".strip()
        upcoming = self.show(job.get("next_fire_local") or "-")
        cells = [f"<code>{jid}</code>", self.show(job.get("when", "")), upcoming,
                 self.show(f"{job.get('conversation', '')} ({job.get('channel', '')})"),
                 self.show(f"{job.get('channel', '')}:{job.get('sender', '')}"), last or "-",
                 self.show(job.get("prompt", "")), action]  # fmt: skip
        return f'<tr id="job-{jid}">' + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"

    def _dead_letter_row(self, row: dict[str, Any]) -> str:
        did = self.show(row.get("id", ""))
        conversation = f"{row.get('conversation', '')} ({row.get('channel', '')})"
        button = (
            "resend requested"
            if row.get("resend_requested_at")
            else f'<button class="resend" data-deadletter="{did}">Resend</button>'
        )
        return (
            f'<tr id="deadletter-{did}"><td><code>{did}</code></td><td>{_when(row.get("dead_at"))}</td>'
            f"<td>{self.show(conversation)}</td><td>{self.show(row.get('attempts', ''))}</td>"
            f'<td><pre class="arguments">{self.show(row.get("error", ""))}</pre></td>'
            f"<td>{self.show(row.get('text', ''))}</td><td>{button}</td></tr>"
        )

    # -- status ----------------------------------------------------------------------------------

    def status(self, data: dict[str, JSON]) -> str:
        gateway = data["gateway"]
        cards = [
            ("accepting messages", "yes" if gateway.get("ok") else "no"),
            ("turns in flight", gateway.get("conversations_busy", 0)),
            ("messages waiting", gateway.get("messages_waiting", 0)),
            ("replies waiting", gateway.get("replies_waiting", 0)),
            ("inbox pending", gateway.get("inbox_pending", "?")),
            ("outbox pending", gateway.get("outbox_pending", "?")),
            ("dead letters", gateway.get("dead_letters", "?")),
            ("set aside", gateway.get("set_aside", "?")),
            ("approvals waiting", data.get("approvals_waiting", 0)),
            ("turns done", gateway.get("turns_done", 0)),
            ("replies sent", gateway.get("replies_sent", 0)),
        ]
        rates = data["rates"]
        cards += [
            ("turns / min", f"{rates['turns_per_minute']:.1f}"),
            ("sends / min", f"{rates['sends_per_minute']:.1f}"),
        ]
        grid = "".join(f'<div class="card"><b>{self.show(v)}</b><span>{k}</span></div>' for k, v in cards)
        parts = [
            f'<div id="status" class="cards">{grid}</div>',
            '<p class="hint">Rates: in the last minute. This page refreshes every 5 s.</p>',
            "<h2>Conversations</h2>" + self._lanes(data["lanes"]),
            "<h2>Model</h2>" + self._model(data["model"]),
        ]
        return self.layout("status", "Status", "\n".join(parts), refresh=5)

    def _lanes(self, lanes: dict[str, dict[str, int]]) -> str:
        names = sorted(set(lanes["turns"]) | set(lanes["replies"]))
        if not names:
            return "<p>No conversation is busy.</p>"
        rows = "".join(
            f"<tr><td>{self.show(name)}</td><td>{1 if lanes['turns'].get(name) else 0}</td>"
            f"<td>{max(0, lanes['turns'].get(name, 0) - 1)}</td><td>{lanes['replies'].get(name, 0)}</td></tr>"
            for name in names
        )
        head = "<tr><th>conversation</th><th>turn in flight</th><th>messages waiting</th>"
        head += "<th>replies to send</th></tr>"
        return f'<table id="lanes"><thead>{head}</thead><tbody>{rows}</tbody></table>'

    def _model(self, model: dict[str, JSON] | None) -> str:
        if model is None:
            return NO_TRACES
        rate = f"{model['error_rate'] * 100:.1f}%" if model["model_calls"] else "–"
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(model["stop_reasons"].items())) or "–"
        rows = [
            ("tasks (last hour)", model["tasks"]),
            ("failed tasks", model["failed"]),
            ("model calls", model["model_calls"]),
            ("failed model calls", model["model_errors"]),
            ("model error rate", rate),
            ("tokens", model["tokens"]),
            ("outcomes", reasons),
        ]
        body = "".join(f"<tr><th>{k}</th><td>{self.show(v)}</td></tr>" for k, v in rows)
        link = '<p><a href="/console/tasks?failed=1">Failed tasks</a></p>'
        return f'<table id="model" class="facts">{body}</table>{link}'

    # -- access ----------------------------------------------------------------------------------

    def login(self, error: str = "") -> str:
        message = f'<p class="error">{self.show(error)}</p>' if error else ""
        body = f"""{message}<form class="login" method="post" action="/console/login">
<label>Console token
<input id="token" type="password" name="token" autocomplete="current-password" autofocus></label>
<button type="submit">Open</button></form>
<p class="hint">The token is the value of the server's console token variable (HERMES_CONSOLE_TOKEN).</p>"""
        return self.layout("login", "Console login", body)

    def refused(self) -> str:
        text = (
            "<p>The console answers only on this machine (a loopback address, not through a proxy). "
            "To open it to others, set HERMES_CONSOLE_TOKEN on the server.</p>"
        )
        return self.layout("refused", "Console not available here", text)


NO_TRACES = "<p>No trace store is configured: tasks are not recorded.</p>"


def filters_query(filters: dict[str, str]) -> str:
    return urlencode({key: value for key, value in filters.items() if value})


def _when(timestamp: JSON) -> str:
    if not isinstance(timestamp, (int, float)):
        return ""
    return html.escape(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp)))


def _until(timestamp: JSON) -> str:
    if not isinstance(timestamp, (int, float)):
        return "never"
    left = timestamp - time.time()
    return "expired" if left <= 0 else f"in {left / 60:.0f} min" if left >= 60 else f"in {left:.0f} s"


def _seconds(started: JSON, finished: JSON) -> str:
    if not isinstance(started, (int, float)) or not isinstance(finished, (int, float)):
        return ""
    return f"{finished - started:.2f} s"


def _tokens(usage: JSON) -> str:
    if isinstance(usage, (int, float)):
        return f"{usage:g} tokens"
    if not isinstance(usage, dict) or not usage:
        return ""
    total, prompt, completion = (
        usage.get(k, 0) for k in ("total_tokens", "prompt_tokens", "completion_tokens")
    )
    cached = f", {usage['cached_tokens']} of them cached" if usage.get("cached_tokens") else ""
    return f"{total} tokens ({prompt} in{cached}, {completion} out)"


def _span(record: dict[str, JSON], calls: list[dict[str, JSON]]) -> tuple[float, float]:
    """The task's start and length, for the bars: its own times, widened to cover all its steps."""
    steps = [
        (float(c["started_at"]), float(c.get("elapsed") or 0)) for c in calls if _is_time(c.get("started_at"))
    ]
    started: JSON = record.get("started_at")
    finished: JSON = record.get("finished_at")
    start = float(started) if _is_time(started) else min((s for s, _ in steps), default=0.0)
    end = max(
        [began + elapsed for began, elapsed in steps] + [float(finished) if _is_time(finished) else start]
    )
    return start, max(end - start, 1e-3)


def _caller(caller: JSON) -> str:
    """`alice (admin, feishu)` from a recorded Caller."""
    if not isinstance(caller, dict):
        return "" if caller is None else str(caller)
    return f"{caller.get('user_id') or '?'} ({caller.get('role', '')}, {caller.get('channel') or '?'})"


def _is_time(value: JSON) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pretty(value: JSON) -> str:
    """JSON (or JSON text) indented for reading; anything else as it is."""
    if isinstance(value, str):
        text = value
        try:
            value = json.loads(text)
        except ValueError:
            return text
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)


def _compact(value: JSON) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def _clip(value: JSON, limit: int = 80) -> str:
    """A table cell's snippet: redacted before it is cut, so no secret leaves its start at the cut."""
    shown, total = cut_text("" if value is None else str(value), limit)
    return shown if total <= limit else cut_text(shown, limit - 1)[0] + "…"


def _message_text(message: JSON) -> str:
    if not isinstance(message, dict):
        return str(message)
    text = message.get("content") or ""
    if message.get("tool_calls"):
        text = f"{text}\n{_pretty(message['tool_calls'])}".strip()
    return str(text) if not isinstance(text, str) else text


def _scrollable(body: str) -> str:
    """Every table in its own horizontal scroll container, so no table widens the page."""
    return re.sub(r"(<table\b.*?</table>)", r'<div class="scroll">\1</div>', body, flags=re.DOTALL)


class DeadLetter(TypedDict):
    """A reply given up on, as the gateway's store keeps it (gateway/store.py `dead_letters`)."""

    outbox_id: int
    channel: str
    conversation: str
    payload: str  # the reply, JSON (an OutboundMessage's fields)
    error: str  # why its last send failed
    attempts: int
    dead_at: float
    resend_requested_at: float | None  # a resend asked for from another process, not yet taken up


def dead_letter_summary(row: DeadLetter) -> dict[str, Any]:
    """A dead letter as listed (CLI, console): its id, where it was going, why it died, its text cut."""
    try:
        payload = json.loads(row["payload"])
        text = str(payload.get("text", "")) if isinstance(payload, dict) else ""
    except ValueError:
        text = ""
    return {
        "id": row["outbox_id"],
        "channel": row["channel"],
        "conversation": row["conversation"],
        "attempts": row["attempts"],
        "error": row["error"],
        "dead_at": row["dead_at"],
        "resend_requested_at": row["resend_requested_at"],
        "text": " ".join(text.split())[:200],
    }
