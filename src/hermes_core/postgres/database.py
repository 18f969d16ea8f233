"""One PostgreSQL database shared by the stores of a process: a connection pool, opened on first use.

`PostgresDatabase.shared(url)` is the one pool for a URL in this process (the gateway, sessions,
journal, approvals and traces stores share it, as they share one SQLite file embedded). Stores
register their migrations when they are built (`migrate`, synchronous, like SQLite's); the pool
opens and the migrations run on the first `transaction`, inside the running event loop.

`transaction(fn)` runs `await fn(connection)` in one transaction (READ COMMITTED): committed when
it returns, rolled back if it raises — a process killed in the middle leaves nothing of it.
`statement(fn)` runs one statement on its own (the pool's connections are in autocommit mode): a
single statement is atomic by itself, and it takes one round trip to the server where a
transaction around it takes three (BEGIN, the statement, COMMIT) — most of a node's CPU per turn
on PostgreSQL is these round trips (benchmarks/bench_temporal.py). While
the server is down or restarting it raises `StoreUnavailable` (storage/): the pool reconnects by
itself, and the gateway tries the step again. Where
two nodes may touch the same rows at once the stores say how they are kept apart (unique
constraints with `ON CONFLICT DO NOTHING`, `FOR UPDATE SKIP LOCKED`, transaction-scoped advisory
locks keyed by a conversation or task).

PostgreSQL's text cannot hold the NUL character, which SQLite's can: every string sent is stored
with NUL replaced by U+FFFD (the replacement character, as `clean_text` does for lone surrogates),
so a message id or a text carrying one is accepted as on SQLite, instead of failing every retry.

The password of the URL is never logged: `redacted_url` is what any message shows, and a pool's
URL passwords are known secrets of the process's redactor (kernel/redaction.py) from its start. It
may also come from the environment instead of the URL (`PGPASSWORD`, read by libpq itself).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ..kernel.redaction import default_redactor, redact_text
from ..storage import StoreUnavailable

if TYPE_CHECKING:
    from psycopg import AsyncConnection
    from psycopg_pool import AsyncConnectionPool

T = TypeVar("T")
MIGRATION_LOCK = 0x6865726D6573  # the advisory lock every migration takes ("hermes")
MIN_SERVER_VERSION = 14
HIDDEN = "[REDACTED:url-password]"
URL_PASSWORD_PARAMETERS = frozenset({"password", "sslpassword"})  # libpq's, when in the query string
_shared: dict[str, PostgresDatabase] = {}
_shared_lock = threading.Lock()


def url_passwords(url: str) -> list[str]:
    """The passwords a URL carries: `user:password@` and libpq's `?password=` / `?sslpassword=`."""
    try:
        parts = urlsplit(url)
        found = [unquote(parts.password)] if parts.password else []
    except ValueError:
        return []
    query = parse_qsl(parts.query)
    return found + [value for key, value in query if key.lower() in URL_PASSWORD_PARAMETERS]


def redacted_url(url: str) -> str:
    """The URL as it may be shown: its passwords replaced (`user:password@`, and libpq's `?password=`
    and `?sslpassword=`), whatever their length (kernel/redaction.py finds a URL's password only from
    three characters on, and a query's `password=` only from eight with a digit)."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:  # host and port as written: a bad port is not for this to judge
            netloc = f"{parts.username or ''}:{HIDDEN}@{parts.netloc.rpartition('@')[2]}"
    except ValueError:
        return redact_text(url)
    query = [
        (key, HIDDEN if key.lower() in URL_PASSWORD_PARAMETERS else value)
        for key, value in parse_qsl(parts.query, keep_blank_values=True)
    ]
    shown = urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, safe="[]:"), parts.fragment))
    return redact_text(shown)


def driver() -> Any:
    """psycopg, or an ImportError that says which extra to install."""
    try:
        import psycopg
    except ImportError as exc:
        raise ImportError(
            "database.url is set, but psycopg is not installed: pip install 'hermes-kernel[postgres]'"
        ) from exc
    return psycopg


class PostgresDatabase:
    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 20, timeout: float = 10.0) -> None:
        self.url = url
        default_redactor().add(*url_passwords(url))  # whatever quotes the URL hides them
        self.min_size, self.max_size, self.timeout = min_size, max_size, timeout
        self._migrations: dict[str, Mapping[int, str]] = {}
        self._applied: set[str] = set()
        self._pool: AsyncConnectionPool | None = None
        self._opening: asyncio.Lock | None = None
        self._users = 0

    def __repr__(self) -> str:
        return f"PostgresDatabase({redacted_url(self.url)!r})"

    @classmethod
    def shared(cls, url: str) -> PostgresDatabase:
        """The one pool for this URL in this process (opened on first use)."""
        with _shared_lock:
            database = _shared.get(url)
            if database is None:
                database = _shared[url] = cls(url)
            database._users += 1
            return database

    def migrate(self, component: str, migrations: Mapping[int, str]) -> None:
        """Register the component's migrations; they run before its first transaction."""
        self._migrations[component] = migrations
        self._applied.discard(component)

    @property
    def components(self) -> frozenset[str]:
        """The components whose migrations are registered: what the first transaction applies."""
        return frozenset(self._migrations)

    async def _ready(self) -> AsyncConnectionPool:
        if self._pool is not None and self._applied >= self._migrations.keys():
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                self._pool = await self._open()
            for component in sorted(self._migrations.keys() - self._applied):
                async with self._pool.connection() as connection:
                    await apply_migrations(connection, component, self._migrations[component])
                self._applied.add(component)
        return self._pool

    async def _open(self) -> AsyncConnectionPool:
        driver()
        from psycopg_pool import AsyncConnectionPool

        pool = AsyncConnectionPool(
            self.url, min_size=self.min_size, max_size=self.max_size, timeout=self.timeout, open=False,
            name="hermes", kwargs={"connect_timeout": max(1, int(self.timeout)), "autocommit": True},
            configure=_configure,
        )  # fmt: skip
        try:
            await pool.open(wait=True, timeout=self.timeout)
        except Exception as exc:
            await pool.close()
            raise StoreUnavailable(f"PostgreSQL at {redacted_url(self.url)} is unreachable: "
                                  f"{redact_text(str(exc).strip())}") from None  # fmt: skip
        return pool

    async def transaction(
        self, fn: Callable[[AsyncConnection], Awaitable[T]], *, wait: float | None = None
    ) -> T:
        """Run `await fn(connection)` in one transaction; committed when this returns. `wait`: the
        longest wait for a connection (default the pool's `timeout`), then `StoreUnavailable`."""
        psycopg = driver()
        try:
            pool = await self._ready()
            async with pool.connection(timeout=wait) as connection, connection.transaction():
                return await fn(connection)
        except psycopg.OperationalError as exc:  # the server is down or restarting, connections cut
            raise self._unavailable(exc) from exc

    async def statement(
        self, fn: Callable[[AsyncConnection], Awaitable[T]], *, wait: float | None = None
    ) -> T:
        """Run `await fn(connection)`, which executes one statement (or reads that need no
        snapshot in common: READ COMMITTED gives each statement its own in a transaction too),
        outside a transaction (module docstring); errors as `transaction`'s."""
        psycopg = driver()
        try:
            pool = await self._ready()
            async with pool.connection(timeout=wait) as connection:
                return await fn(connection)
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        reason = redact_text(" ".join(str(exc).split()))
        return StoreUnavailable(f"PostgreSQL at {redacted_url(self.url)} is unavailable: {reason}")

    async def close(self) -> None:
        """Release one user; the pool closes when the last user of the shared database leaves."""
        self._users = max(0, self._users - 1)
        if self._users:
            return
        with _shared_lock:
            if _shared.get(self.url) is self:
                del _shared[self.url]
        await self._close_pool()

    async def _close_pool(self) -> None:
        pool, self._pool = self._pool, None
        self._applied.clear()
        if pool is not None:
            await pool.close()


async def then_close_pools(work: Awaitable[T]) -> T:
    """`await work`, then close every shared pool of the process, whoever still holds one: what
    `serve` and the Temporal worker run under `asyncio.run`. A pool left open outlives its stores,
    and while it reconnects (after a database restart) its background tasks absorb cancellation
    (psycopg_pool retries on `CancelledError`), so `asyncio.run` would wait for them at exit and
    the process would not stop on SIGTERM."""
    try:
        return await work
    finally:
        with _shared_lock:
            databases = list(_shared.values())
            _shared.clear()
        for database in databases:
            database._users = 0
            await database._close_pool()


async def _configure(connection: AsyncConnection) -> None:
    connection.adapters.register_dumper(str, _nul_safe_dumper())


_dumper: type | None = None


def _nul_safe_dumper() -> type:
    """psycopg's dumper of str, with NUL replaced by U+FFFD (made once, on first use)."""
    global _dumper
    if _dumper is None:
        from psycopg.types.string import StrDumperUnknown

        class NulSafeStrDumper(StrDumperUnknown):
            def dump(self, obj: str) -> Any:
                return super().dump(obj.replace("\x00", "\ufffd") if "\x00" in obj else obj)

        _dumper = NulSafeStrDumper
    return _dumper


async def apply_migrations(
    connection: AsyncConnection, component: str, migrations: Mapping[int, str]
) -> None:
    """Apply `component`'s migrations above its recorded version, in one transaction, under an
    advisory lock: nodes that start together apply each migration once."""
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS schema_versions "
            "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        cursor = await connection.execute(
            "SELECT version FROM schema_versions WHERE component = %s", (component,)
        )
        row = await cursor.fetchone()
        current = row[0] if row else 0
        known = max(migrations, default=0)
        if current > known:  # a newer release migrated it: this one would misread its tables
            raise RuntimeError(
                f"the {component} schema in PostgreSQL is at version {current}, newer than this release "
                f"knows ({known}): upgrade hermes-kernel on this node"
            )
        for version in sorted(v for v in migrations if v > current):
            for statement in filter(str.strip, migrations[version].split(";")):
                await connection.execute(statement)  # our own SQL
            await connection.execute(
                "INSERT INTO schema_versions (component, version) VALUES (%s, %s) "
                "ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                (component, version),
            )


async def server_check(url: str, timeout: float = 10.0) -> tuple[str, bool, dict[str, int]]:
    """For `hermes-kernel doctor`: the server's version number (e.g. "15.18"), whether it is a
    read-only standby, and the schema version recorded per component (empty before the first
    start). Raises ConnectionError (its message without the password) when it cannot connect."""
    psycopg = driver()
    try:
        connection = await psycopg.AsyncConnection.connect(url, connect_timeout=max(1, int(timeout)),
                                                           autocommit=True)  # fmt: skip
    except psycopg.Error as exc:
        reason = redact_text(" ".join(str(exc).split()))
        raise ConnectionError(f"PostgreSQL at {redacted_url(url)} is unreachable ({reason})") from None
    async with connection:
        version = connection.info.server_version  # e.g. 150018
        standby = await (await connection.execute("SELECT pg_is_in_recovery()")).fetchone()
        table = await (await connection.execute("SELECT to_regclass('schema_versions')")).fetchone()
        versions: dict[str, int] = {}
        if table and table[0] is not None:
            rows = await (
                await connection.execute("SELECT component, version FROM schema_versions")
            ).fetchall()
            versions = {str(component): int(number) for component, number in rows}
    major, minor = divmod(version, 10000)
    shown = f"{major}.{minor}" if major >= 10 else f"{version // 10000}.{version // 100 % 100}"
    return shown, bool(standby and standby[0]), versions
