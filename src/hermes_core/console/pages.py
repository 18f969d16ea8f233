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
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from ..channels.inert import visible
from ..channels.media import megabytes
from ..kernel.redaction import Redactor, cut_text
from .words import SCRIPT_WORDS, Lang, word

if TYPE_CHECKING:
    from ..observe.traces import TraceSummary

from ..kernel.messages import JSON

NAV = (
    ("chat", "/console/"),
    ("tasks", "/console/tasks"),
    ("approvals", "/console/approvals"),
    ("deadletters", "/console/deadletters"),
    ("schedule", "/console/schedule"),
    ("status", "/console/status"),
)
JOB_COLUMNS = ("id", "when", "next_fire", "conversation", "created_by", "last_fire", "prompt", "")
DEAD_LETTER_COLUMNS = ("id", "died", "conversation", "attempts", "error", "text", "")
BAR_WIDTH = 1000  # the SVG's own units; it is stretched to the column's width


def trace_url(task_id: str) -> str:
    return "/console/tasks/" + quote(task_id, safe="")


class Pages:
    """The pages in one language (words.py): the console's own words in it, everything else as is."""

    def __init__(self, redactor: Redactor, lang: Lang = "en") -> None:
        self.redactor = redactor
        self.lang = lang

    def w(self, key: str) -> str:
        """One of the console's own words (words.py), in this page's language."""
        return word(key, self.lang)

    def show(self, value: object) -> str:
        """Any value as HTML text: redacted, then escaped (quotes too: safe inside attributes)."""
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
        return html.escape(self.redactor.redact(text), quote=True)

    def layout(self, page: str, title: str, body: str, *, refresh: int | None = None) -> str:
        nav = "".join(
            f'<a href="{href}"{" class=current" if key == page else ""}>{self.w(key)}</a>'
            for key, href in NAV
        )
        meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
        words = self.show({key: self.w(key) for key in SCRIPT_WORDS})
        document = f"""<!doctype html>
<html lang="{self.lang}"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{meta}<title>{self.show(title)} · hermes-kernel console</title>
<link rel="stylesheet" href="/console/static/console.css">
<script src="/console/static/console.js" defer></script>
</head><body data-page="{page}" data-words="{words}">
<header><strong>hermes-kernel</strong><nav>{nav}</nav></header>
<main><h1>{self.show(title)}</h1>
{_scrollable(body)}</main></body></html>"""
        return self.redactor.redact(document)

    # -- chat ------------------------------------------------------------------------------------

    def chat(self, max_image_bytes: int) -> str:
        """The chat: its log (earlier messages and those sent on their own are loaded by console.js),
        the message box, and a picture to send with the message (at most `max_image_bytes`)."""
        hint = self.w("conversation_hint").format(id='<code id="conversation"></code>')
        body = f"""<div id="log" class="log" aria-live="polite"></div>
<form id="chat" class="chat" autocomplete="off" data-max-image="{max_image_bytes}"
 data-max-image-text="{self.show(megabytes(max_image_bytes))}">
<textarea id="message" name="message" rows="2"
 placeholder="{self.w("message_placeholder")}"></textarea>
<label class="picture quiet">{self.w("picture")} <input id="picture" type="file" accept="image/*"></label>
<button id="send" type="submit">{self.w("send")}</button>
<button id="new-conversation" type="button" class="quiet">{self.w("new_conversation")}</button>
<div id="picture-error" class="error" role="alert"></div>
</form>
<p class="hint">{hint}</p>"""
        return self.layout("chat", self.w("chat"), body)

    # -- tasks -----------------------------------------------------------------------------------

    def tasks(self, rows: list[TraceSummary] | None, filters: dict[str, str]) -> str:
        if rows is None:
            return self.layout("tasks", self.w("tasks"), self._no_traces())
        failed = " checked" if filters.get("failed") else ""
        form = f"""<form class="filters" method="get" action="/console/tasks">
<label><input type="checkbox" name="failed" value="1"{failed}> {self.w("failed_only")}</label>
<label>{self.w("conversation")}
<input name="conversation" value="{self.show(filters.get("conversation", ""))}"></label>
<label>{self.w("tool")} <input name="tool" value="{self.show(filters.get("tool", ""))}"></label>
<button type="submit">{self.w("filter")}</button> <a href="/console/tasks">{self.w("clear")}</a></form>"""
        columns = ("started", "task", "conversation", "input", "reply", "outcome", "model_calls", "tools",
                   "tokens", "time")  # fmt: skip
        head = self._head(columns)
        empty = f'<tr><td colspan="10">{self.w("no_tasks")}</td></tr>'
        body = "".join(self._task_row(row) for row in rows) or empty
        table = f'<table id="tasks" class="tasks"><thead>{head}</thead><tbody>{body}</tbody></table>'
        return self.layout("tasks", self.w("tasks"), form + table)

    def _head(self, columns: tuple[str, ...]) -> str:
        """A table's head row: each column's name in this page's language ("" for none)."""
        return "<tr>" + "".join(f"<th>{self.w(key) if key else ''}</th>" for key in columns) + "</tr>"

    def _no_traces(self) -> str:
        return f"<p>{self.w('no_traces')}</p>"

    def _task_row(self, row: TraceSummary) -> str:
        task_id = str(row.get("task_id", ""))
        names = row.get("tool_names") or []
        tools = ", ".join(f'<span class="tool-name">{self.show(str(name))}</span>' for name in names)
        cells = [
            ("started", _when(row.get("started_at"))),
            ("task", f'<a href="{self.show(trace_url(task_id))}">{self.show(task_id)}</a>'),
            ("conversation", self.show(row.get("conversation") or "")),
            ("input", self.show(_clip(row.get("input")))),
            ("reply", self.show(_clip(row.get("reply")))),
            ("outcome", self._outcome(row)),
            ("model_calls", self.show(row.get("model_calls", ""))),
            ("tools", tools),
            ("tokens", self.show(_tokens(row.get("tokens")))),
            ("time", _seconds(row.get("started_at"), row.get("finished_at"))),
        ]
        return f'<tr class="{"ok" if row.get("ok") else "failed"}">{self._cells(cells)}</tr>'

    def _cells(self, cells: list[tuple[str, str]]) -> str:
        """A row's cells, each with its column's name (data-label: shown before it on a phone)."""
        return "".join(f'<td data-label="{self.w(key) if key else ""}">{value}</td>' for key, value in cells)

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
            f'<h2>{self.w("input")}</h2><pre class="input">{self.show(record.get("input") or "")}</pre>',
            f"<h2>{self.w('timeline')}</h2>{self._timeline(record)}",
        ]
        if record.get("error"):
            parts.append(f'<h2>{self.w("error")}</h2><pre class="error">{self.show(record["error"])}</pre>')
        if record.get("approvals"):
            parts.append(f"<h2>{self.w('approvals')}</h2>{self._approvals_of(record['approvals'])}")
        reply = self.show(record.get("reply") or "")
        parts.append(f'<h2>{self.w("reply")}</h2><pre id="reply" class="reply">{reply}</pre>')
        parts.append(self._messages(record.get("messages") or []))
        return self.layout("tasks", f"{self.w('task_title')} {task_id}", "\n".join(parts))

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
        head = self._head(("step", "what", "time", "detail"))
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
                arguments = visible(_compact(item.get("arguments")))  # bidi controls written out
                text = (
                    f"{item.get('tool', '')} {arguments}: {item.get('status', '')}"
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
            self._no_traces()
            if not has_store
            else (
                f"<p>No trace of <code>{self.show(task_id)}</code> yet: a task's trace is written when it "
                'finishes or pauses. <a href="">Reload</a></p>'
            )
        )
        return self.layout("tasks", self.w("task_missing"), text)

    # -- approvals ------------------------------------------------------------------------------

    def approvals(
        self, waiting: list[dict[str, JSON]], recent: list[dict[str, JSON]], has_store: bool
    ) -> str:
        if not has_store:
            return self.layout("approvals", self.w("approvals"), f"<p>{self.w('no_approvals')}</p>")
        columns = ("id", "tool", "arguments", "asked_by", "task")
        rows = "".join(self._approval_row(p, decidable=True) for p in waiting)
        rows = rows or f'<tr><td colspan="7">{self.w("nothing_waits")}</td></tr>'
        done = "".join(self._approval_row(p, decidable=False) for p in recent)
        body = (
            f'<table id="approvals" class="approvals cards">'
            f"<thead>{self._head((*columns, 'expires', ''))}</thead><tbody>{rows}</tbody></table>"
            f'<h2>{self.w("recently_decided")}</h2><table id="decided" class="approvals cards">'
            f"<thead>{self._head((*columns, 'decided', 'state'))}</thead><tbody>{done}</tbody></table>"
        )
        return self.layout("approvals", self.w("approvals"), body)

    def _approval_row(self, pending: dict[str, JSON], *, decidable: bool) -> str:
        pid = self.show(pending.get("id", ""))
        task_id = str(pending.get("task_id", ""))
        if decidable:
            last = (
                f'<button class="decide" data-approval="{pid}" data-decision="approve">'
                f"{self.w('approve')}</button> "
                f'<button class="decide quiet" data-approval="{pid}" data-decision="reject">'
                f"{self.w('reject')}</button>"
            )
            expires = _until(pending.get("expires_at"))
        else:
            by = f" by {pending['decided_by']}" if pending.get("decided_by") else ""
            last, expires = self.show(f"{pending.get('status', '')}{by}"), _when(pending.get("decided_at"))
        who = f"{pending.get('requested_by', '')} ({pending.get('channel', '')})"
        arguments = visible(_pretty(pending.get("arguments")), lines=True)  # bidi controls written out
        cells = [
            ("id", f'<code class="id">{pid}</code>'),
            ("tool", f'<span class="tool-name">{self.show(pending.get("tool", ""))}</span>'),
            ("arguments", f'<pre class="arguments">{self.show(arguments)}</pre>'),
            ("asked_by", self.show(who)),
            ("task", f'<a class="id" href="{self.show(trace_url(task_id))}">{self.show(task_id)}</a>'),
            ("expires" if decidable else "decided", expires),
            ("" if decidable else "state", last),
        ]
        return f'<tr id="approval-{pid}">{self._cells(cells)}</tr>'

    # -- dead letters ----------------------------------------------------------------------------

    def dead_letters(self, rows: list[dict[str, JSON]]) -> str:
        """Replies given up on, each with why, and a Resend button (console.js posts the JSON)."""
        title = self.w("deadletters")
        head = self._head(DEAD_LETTER_COLUMNS)
        body_rows = "".join(self._dead_letter_row(row) for row in rows)
        body_rows = body_rows or f'<tr><td colspan="7">{self.w("no_dead_letters")}</td></tr>'
        hint = (
            '<p class="hint">A reply is dead-lettered when the platform refuses it for good (the bot was '
            "removed from the chat, the chat was dissolved…) or after repeated real failures — never "
            "for being rate limited. Fix the cause, then resend it: it goes out with the same "
            "idempotency key, so it is never delivered twice.</p>"
        )
        table = (
            f'<table id="deadletters" class="approvals cards"><thead>{head}</thead>'
            f"<tbody>{body_rows}</tbody></table>"
        )
        return self.layout("deadletters", title, hint + table)

    def schedule(self, jobs: list[dict[str, Any]] | None) -> str:
        """Scheduled jobs (schedule/jobs.py `Job.describe()`), each active one with a Cancel button."""
        if jobs is None:
            return self.layout("schedule", self.w("schedule"), f"<p>{self.w('scheduling_off')}</p>")
        head = self._head(JOB_COLUMNS)
        rows = "".join(self._job_row(job) for job in jobs)
        rows = rows or f'<tr><td colspan="{len(JOB_COLUMNS)}">{self.w("no_jobs")}</td></tr>'
        hint = (
            '<p class="hint">Jobs come from chat (<code>schedule_task</code>), from '
            "<code>schedule.jobs</code> in the configuration and from <code>hermes-kernel schedule "
            "add</code>. Each fire runs once as a task in its conversation; the last fire says "
            "whether it ran, was skipped or refused.</p>"
        )
        table = f'<table id="schedule" class="approvals cards"><thead>{head}</thead><tbody>{rows}</tbody>'
        table += "</table>"
        return self.layout("schedule", self.w("schedule"), hint + table)

    def _job_row(self, job: dict[str, Any]) -> str:
        jid = self.show(job.get("id", ""))
        active = job.get("status") == "active"
        cancel = f'<button class="cancel-job" data-job="{jid}">{self.w("cancel")}</button>'
        action = cancel if active else self.show(job.get("status", ""))
        last = f"{_when(job.get('last_fire'))} {self.show(job.get('last_outcome') or '')}".strip()
        upcoming = self.show(job.get("next_fire_local") or "-")
        cells = [f'<code class="id">{jid}</code>', self.show(job.get("when", "")), upcoming,
                 self.show(f"{job.get('conversation', '')} ({job.get('channel', '')})"),
                 self.show(f"{job.get('channel', '')}:{job.get('sender', '')}"), last or "-",
                 self.show(job.get("prompt", "")), action]  # fmt: skip
        return f'<tr id="job-{jid}">{self._cells(list(zip(JOB_COLUMNS, cells, strict=True)))}</tr>'

    def _dead_letter_row(self, row: dict[str, Any]) -> str:
        did = self.show(row.get("id", ""))
        conversation = f"{row.get('conversation', '')} ({row.get('channel', '')})"
        button = (
            "resend requested"
            if row.get("resend_requested_at")
            else f'<button class="resend" data-deadletter="{did}">{self.w("resend")}</button>'
        )
        cells = [f'<code class="id">{did}</code>', _when(row.get("dead_at")), self.show(conversation),
                 self.show(row.get("attempts", "")),
                 f'<pre class="arguments">{self.show(row.get("error", ""))}</pre>',
                 self.show(row.get("text", "")), button]  # fmt: skip
        named = list(zip(DEAD_LETTER_COLUMNS, cells, strict=True))
        return f'<tr id="deadletter-{did}">{self._cells(named)}</tr>'

    # -- status ----------------------------------------------------------------------------------

    def status(self, data: dict[str, JSON]) -> str:
        gateway = data["gateway"]
        cards = [
            ("accepting", self.w("yes") if gateway.get("ok") else self.w("no")),
            ("turns_in_flight", gateway.get("conversations_busy", 0)),
            ("messages_waiting", gateway.get("messages_waiting", 0)),
            ("replies_waiting", gateway.get("replies_waiting", 0)),
            ("inbox_pending", gateway.get("inbox_pending", "?")),
            ("outbox_pending", gateway.get("outbox_pending", "?")),
            ("dead_letters", gateway.get("dead_letters", "?")),
            ("set_aside", gateway.get("set_aside", "?")),
            ("approvals_waiting", data.get("approvals_waiting", 0)),
            ("turns_done", gateway.get("turns_done", 0)),
            ("replies_sent", gateway.get("replies_sent", 0)),
        ]
        rates = data["rates"]
        cards += [
            ("turns_per_minute", f"{rates['turns_per_minute']:.1f}"),
            ("sends_per_minute", f"{rates['sends_per_minute']:.1f}"),
        ]
        grid = "".join(
            f'<div class="card"><b>{self.show(v)}</b><span>{self.w(k)}</span></div>' for k, v in cards
        )
        parts = [
            f'<div id="status" class="cards">{grid}</div>',
            f'<p class="hint">{self.w("status_hint")}</p>',
            f"<h2>{self.w('conversations')}</h2>" + self._lanes(data["lanes"]),
            f"<h2>{self.w('model')}</h2>" + self._configured(data.get("configured"), data.get("degraded")),
            self._model(data["model"]),
        ]
        return self.layout("status", self.w("status"), "\n".join(parts), refresh=5)

    def _lanes(self, lanes: dict[str, dict[str, int]]) -> str:
        names = sorted(set(lanes["turns"]) | set(lanes["replies"]))
        if not names:
            return f"<p>{self.w('no_busy_conversation')}</p>"
        rows = "".join(
            f"<tr><td>{self.show(name)}</td><td>{1 if lanes['turns'].get(name) else 0}</td>"
            f"<td>{max(0, lanes['turns'].get(name, 0) - 1)}</td><td>{lanes['replies'].get(name, 0)}</td></tr>"
            for name in names
        )
        head = self._head(("conversation", "turn_in_flight", "messages_waiting", "replies_to_send"))
        return f'<table id="lanes"><thead>{head}</thead><tbody>{rows}</tbody></table>'

    def _configured(self, configured: dict[str, JSON] | None, degraded: JSON) -> str:
        """Which model is configured (provider, model, the endpoint's host; never a key), and what
        is degraded (status JSON `degraded`: a part not working yet, as /healthz reports it)."""
        rows: list[tuple[str, JSON]] = [(self.w("model_name"), self.w("no_model"))]
        if configured is not None:
            rows = [(self.w(key), configured.get(field) or "–") for key, field in
                    (("provider", "provider"), ("model_name", "model"), ("endpoint", "host"))]  # fmt: skip
        parts = degraded if isinstance(degraded, list) else []
        rows += [(self.w("degraded"), _compact(part)) for part in parts]
        body = "".join(f"<tr><th>{k}</th><td>{self.show(v)}</td></tr>" for k, v in rows)
        return f'<table id="configured" class="facts">{body}</table>'

    def _model(self, model: dict[str, JSON] | None) -> str:
        if model is None:
            return self._no_traces()
        rate = f"{model['error_rate'] * 100:.1f}%" if model["model_calls"] else "–"
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(model["stop_reasons"].items())) or "–"
        rows = [
            (self.w("tasks_last_hour"), model["tasks"]),
            (self.w("failed_tasks"), model["failed"]),
            (self.w("model_calls"), model["model_calls"]),
            (self.w("failed_model_calls"), model["model_errors"]),
            (self.w("model_error_rate"), rate),
            (self.w("tokens"), model["tokens"]),
            (self.w("outcomes"), reasons),
        ]
        body = "".join(f"<tr><th>{k}</th><td>{self.show(v)}</td></tr>" for k, v in rows)
        link = f'<p><a href="/console/tasks?failed=1">{self.w("failed_tasks_link")}</a></p>'
        return f'<table id="model" class="facts">{body}</table>{link}'

    # -- access ----------------------------------------------------------------------------------

    def login(self, error: str = "") -> str:
        message = f'<p class="error">{self.show(error)}</p>' if error else ""
        body = f"""{message}<form class="login" method="post" action="/console/login">
<label>{self.w("token")}
<input id="token" type="password" name="token" autocomplete="current-password" autofocus></label>
<button type="submit">{self.w("open")}</button></form>
<p class="hint">The token is the value of the server's console token variable (HERMES_CONSOLE_TOKEN).</p>"""
        return self.layout("login", self.w("login"), body)

    def refused(self) -> str:
        text = (
            "<p>The console answers only on this machine (a loopback address, not through a proxy). "
            "To open it to others, set HERMES_CONSOLE_TOKEN on the server.</p>"
        )
        return self.layout("refused", self.w("refused"), text)


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
