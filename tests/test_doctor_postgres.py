"""`hermes-kernel doctor` with `database.url`: PostgreSQL's reachability, version and migration level,
against a private server (tests/pg_server.py); the password never printed."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import psycopg
import pytest

from hermes_core.cli import main
from hermes_core.postgres.gateway import PostgresGatewayStore
from hermes_core.postgres.migrations import GATEWAY, SCHEDULES
from hermes_core.stores import interactions, schedule_store, session_store, task_journal, trace_store
from pg_server import PASSWORD, PostgresServer, without_database_environment


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    without_database_environment(monkeypatch, tmp_path)


def doctor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], url: str | None = None
) -> tuple[int, str, str]:
    """Exit code, the `database` line, everything printed."""
    lines = [f"gateway:\n  data_dir: {tmp_path / 'data'}"]
    if url is not None:
        lines.append(f"database:\n  url: {url}")
    config = tmp_path / "hermes.yaml"
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code = main(["--config", str(config), "doctor"])
    out = capsys.readouterr()
    found = [line for line in out.out.splitlines() if line.partition("  ")[2].strip().startswith("database:")]
    return code, (found[0] if found else ""), out.out + out.err


def migrate_everything(url: str) -> None:
    async def run() -> None:
        settings = type("S", (), {})()  # the parts of Settings the store factories read
        settings.database = type("D", (), {"url": url})()
        settings.permissions = type("P", (), {"approval_ttl": 600.0})()
        made = [
            session_store(settings),
            task_journal(settings),
            interactions(settings),
            trace_store(settings),
            schedule_store(settings),
        ]
        store = PostgresGatewayStore(url)
        await store.counts()  # the first transaction applies every registered migration
        from hermes_core.stores import long_term_memory

        await long_term_memory(made[0]).count()
        for each in [store, *made]:
            await each.close()

    asyncio.run(run())


def test_a_reachable_server_its_version_and_its_migration_level(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HERMES_DATABASE_URL", pg_url)  # the password in the environment's URL
    code, line, output = doctor(tmp_path, capsys)
    assert line.startswith("OK ") and "PostgreSQL 1" in line, output
    assert f"migrations to apply at the next start: gateway 0 → {max(GATEWAY)}" in line
    migrate_everything(pg_url)
    code, line, output = doctor(tmp_path, capsys)
    assert (
        line.startswith("OK ")
        and f"schema at the latest migration (gateway {max(GATEWAY)}, journal 1" in line
        and f"schedules {max(SCHEDULES)}" in line
    ), output
    assert PASSWORD not in output and ":[REDACTED:url-password]@" in line


def test_the_password_from_pgpassword_and_a_url_without_one(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    code, line, output = doctor(tmp_path, capsys, url=pg_url.replace(f":{PASSWORD}@", "@"))
    assert line.startswith("OK "), output
    assert PASSWORD not in output


def test_a_password_in_the_configuration_file_is_refused(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, output = doctor(tmp_path, capsys, url=pg_url)
    assert code == 1 and "database.url: the password is read only from the environment" in output
    assert PASSWORD not in output


def test_an_unreachable_server_and_a_wrong_password_are_fail_lines(
    postgres: PostgresServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    monkeypatch.setenv("HERMES_DATABASE_URL", postgres.url().replace(f":{postgres.port}/", f":{closed}/"))
    code, line, output = doctor(tmp_path, capsys)
    assert code == 1 and line.startswith("FAIL") and "is unreachable" in line, output
    assert "start the server, or correct database.url" in line and PASSWORD not in output
    wrong = postgres.url().replace(PASSWORD, "not-the-password-123")
    monkeypatch.setenv("HERMES_DATABASE_URL", wrong)
    code, line, output = doctor(tmp_path, capsys)
    assert code == 1 and "password authentication failed" in line, output
    assert "not-the-password-123" not in output and PASSWORD not in output


def test_a_schema_newer_than_this_release_is_a_fail(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate_everything(pg_url)
    with psycopg.connect(pg_url) as connection:
        connection.execute("UPDATE schema_versions SET version = 7 WHERE component = 'gateway'")
    monkeypatch.setenv("HERMES_DATABASE_URL", pg_url)
    code, line, output = doctor(tmp_path, capsys)
    assert code == 1 and f"newer than this release (gateway 7 > {max(GATEWAY)})" in line, output
