"""Which stores a process keeps its state in: the embedded SQLite file, or PostgreSQL.

`database.url` unset (the default): everything in `<gateway.data_dir>/gateway.db`, as it always
was, with no other dependency. Set: the gateway's inbox and outbox (dead letters, set-aside
messages, the replay window of signatures), sessions, long-term memory, task journals, approvals,
traces and scheduled jobs live in that PostgreSQL database (hermes_core/postgres/), so every node
of a scaled-out gateway — and the console on any of them — sees and serves the same state. The URL
alone decides where state lives; which engine runs the turns is a separate choice
(docs/scale-out.md).
With it, Feishu's send limits are counted there too, for every node and worker together
(`send_quota`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .gateway.store import GatewayStore
    from .kernel.approvals import PendingStore
    from .observe.traces import TraceStore
    from .schedule.jobs import ScheduleStore
    from .sessions.store import SessionStore
    from .tasks.journal import TaskJournal


def database_url(settings: Any) -> str | None:
    return settings.database.url or None


def sqlite_path(settings: Any) -> Path:
    return Path(settings.gateway.data_dir) / "gateway.db"


def describe(settings: Any) -> str:
    """Where the state is, as a log line may say it (a URL's password hidden)."""
    if url := database_url(settings):
        from .postgres.database import redacted_url

        return f"PostgreSQL at {redacted_url(url)}"
    return f"SQLite at {sqlite_path(settings)}"


def gateway_store(settings: Any) -> GatewayStore:
    if url := database_url(settings):
        from .postgres.gateway import PostgresGatewayStore

        return PostgresGatewayStore(url, lease_seconds=settings.database.lease_seconds)
    from .gateway.store import SQLiteGatewayStore

    return SQLiteGatewayStore(sqlite_path(settings))


def session_store(settings: Any) -> SessionStore:
    if url := database_url(settings):
        from .postgres.sessions import PostgresSessionStore

        return PostgresSessionStore(url)
    from .sessions.store import SQLiteSessionStore

    return SQLiteSessionStore(sqlite_path(settings))


def long_term_memory(sessions: SessionStore) -> Any:
    """Long-term memory in the database of `sessions` (a `LongTermHook`, memory/conversation.py)."""
    from .sessions.store import SQLiteSessionStore

    if isinstance(sessions, SQLiteSessionStore):
        from .memory import LongTermMemory

        return LongTermMemory(sessions.db)
    from .postgres.longterm import PostgresLongTermMemory
    from .postgres.sessions import PostgresSessionStore

    if not isinstance(sessions, PostgresSessionStore):
        raise TypeError(f"no long-term memory beside a {type(sessions).__name__}")
    return PostgresLongTermMemory(sessions.db)


def task_journal(settings: Any) -> TaskJournal:
    if url := database_url(settings):
        from .postgres.journal import PostgresTaskJournal

        return PostgresTaskJournal(url)
    from .tasks.journal import SQLiteTaskJournal

    return SQLiteTaskJournal(sqlite_path(settings))


def interactions(settings: Any) -> PendingStore:
    ttl = settings.permissions.approval_ttl
    if url := database_url(settings):
        from .postgres.pending import PostgresInteractions

        return PostgresInteractions(url, approval_ttl=ttl)
    from .tasks.pending import SQLiteInteractions

    return SQLiteInteractions(sqlite_path(settings), approval_ttl=ttl)


def trace_store(settings: Any) -> TraceStore:
    if url := database_url(settings):
        from .postgres.traces import PostgresTraceStore

        return PostgresTraceStore(url)
    from .observe.traces import SQLiteTraceStore

    return SQLiteTraceStore(sqlite_path(settings))


def send_quota(settings: Any, app_id: str, *, per_chat: bool = True, per_second: bool = True) -> Any:
    """With `database.url`: the app's Feishu send limits counted in PostgreSQL for every node and
    worker together (postgres/quota.py `SharedSendQuota`); without it None (each process keeps its
    own). `per_chat`, `per_second`: share those limits too (a Temporal worker's are kept elsewhere)."""
    url = database_url(settings)
    if url is None:
        return None
    from .postgres.database import PostgresDatabase
    from .postgres.quota import SharedSendQuota

    pace = settings.feishu
    return SharedSendQuota(
        PostgresDatabase.shared(url), app_id, chat_per_s=pace.chat_send_rate if per_chat else None,
        app_per_s=pace.app_send_rate if per_second else None, app_per_min=pace.app_send_per_minute,
    )  # fmt: skip


def schedule_store(settings: Any, *, inbox: bool = True) -> ScheduleStore:
    """The scheduled jobs (docs/scheduling.md). `inbox`: a claimed fire's message goes into the
    gateway's inbox in the claiming transaction (engine embedded); False: it is recorded with the
    fire, to be signalled to its workflow (engine temporal, PostgreSQL only)."""
    if url := database_url(settings):
        from .postgres.schedules import PostgresScheduleStore

        return PostgresScheduleStore(url, inbox=inbox)
    if not inbox:
        raise ValueError("scheduled jobs with engine temporal live in PostgreSQL: set database.url")
    from .gateway.schedules import SQLiteScheduleStore

    return SQLiteScheduleStore(sqlite_path(settings))
