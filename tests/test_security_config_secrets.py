"""Attacks on the database password in configuration, end to end against a private PostgreSQL server
(tests/pg_server.py), `hermes-kernel doctor` and the real `serve` in this event loop.

Where the cases come from: libpq's connection URI takes its parameters from the query string too
(PostgreSQL manual, 34.1.1 "Connection Strings": `postgresql://user@host/db?password=…`, and the
`sslpassword` parameter), and reads `PGPASSWORD` from the environment (34.15 "Environment
Variables"); OWASP's Secrets Management Cheat Sheet: secrets stay out of configuration files and
out of logs. Issue 31 found a `?password=` URL accepted from the file and printed in clear by
`doctor` and by serve's `state:` line, and `PGPASSWORD` not treated as a secret.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import psycopg
import pytest

from gateway_harness import serve_here
from hermes_core.cli import main
from hermes_core.config import load_settings
from hermes_core.kernel import redaction
from hermes_core.postgres.database import then_close_pools
from hermes_core.testing.fake_openai import FakeOpenAIServer
from pg_server import PASSWORD


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("HERMES_", "FEISHU_", "PG")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(redaction, "_default", None)  # the process's redactor, rebuilt from this environment


WORDS_ONLY = "correcthorsebatterystaple"  # no digit: no shape rule recognises it, only knowing it does


def in_query(url: str) -> str:
    """A URL of the database of `url` for a new login whose password is in the query string:
    `postgresql://words@host:port/db?password=correcthorse…` (a password without a digit, so that only
    knowing it as a password hides it, not its shape)."""
    parts, role = urlsplit(url), f"words_{uuid.uuid4().hex[:8]}"  # roles belong to the whole server
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{WORDS_ONLY}'")
    return f"{parts.scheme}://{role}@{parts.hostname}:{parts.port}{parts.path}?password={WORDS_ONLY}"


def doctor(tmp_path: Path, capsys: pytest.CaptureFixture[str], database: str = "") -> tuple[int, str]:
    config = tmp_path / "hermes.yaml"
    config.write_text(f"gateway:\n  data_dir: {tmp_path / 'data'}\n{database}", encoding="utf-8")
    code = main(["--config", str(config), "doctor"])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_password_in_the_files_query_string_is_refused_naming_the_variable(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, output = doctor(tmp_path, capsys, f"database:\n  url: '{in_query(pg_url)}'\n")
    assert code != 0 and "PGPASSWORD" in output and "HERMES_DATABASE_URL" in output, output
    assert PASSWORD not in output and WORDS_ONLY not in output


def test_pgpassword_in_the_file_is_refused_naming_the_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for database in ("database:\n  PGPASSWORD: hunter2-in-file\n", "PGPASSWORD: hunter2-in-file\n"):
        code, output = doctor(tmp_path, capsys, database)
        assert code != 0 and "environment variable PGPASSWORD" in output, output
        assert "hunter2-in-file" not in output


def test_a_password_in_the_environments_query_string_is_not_printed_by_doctor(
    pg_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_DATABASE_URL", in_query(pg_url))
    code, output = doctor(tmp_path, capsys)
    line = next(line for line in output.splitlines() if "database:" in line)
    assert line.lstrip().startswith("OK") and "?password=[REDACTED" in line, output
    assert PASSWORD not in output and WORDS_ONLY not in output


async def test_a_password_in_the_environments_query_string_is_not_in_serves_state_line(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("HERMES_DATABASE_URL", in_query(pg_url))
    config = tmp_path / "hermes.yaml"
    config.write_text(f"gateway: {{data_dir: '{tmp_path / 'data'}', shutdown_grace: 1}}\n", encoding="utf-8")
    caplog.set_level(logging.INFO)

    async def start_and_stop() -> None:
        async with serve_here(load_settings(config, dotenv=None)):
            pass

    await then_close_pools(start_and_stop())  # as serve's command does: the pool's tasks end too
    states = [record.getMessage() for record in caplog.records if record.getMessage().startswith("state:")]
    assert states and "?password=[REDACTED" in states[0], states
    assert all(WORDS_ONLY not in record.getMessage() for record in caplog.records)


async def test_pgpassword_from_the_environment_is_a_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A user who pastes the database password (no `password=` before it, so no shape rule sees it)
    does not get it to the model, the log or the reply."""
    secret = "Pq7sZv2Lk"
    monkeypatch.setenv("PGPASSWORD", secret)
    caplog.set_level(logging.DEBUG)
    async with FakeOpenAIServer() as fake:
        config = tmp_path / "hermes.yaml"
        config.write_text(f"model: {{name: m, base_url: '{fake.base_url}'}}\n"
                          f"gateway: {{data_dir: '{tmp_path / 'data'}', shutdown_grace: 1}}\n")  # fmt: skip
        monkeypatch.setenv("HERMES_API_KEY", "sk-test-key-not-secret-0000")
        async with serve_here(load_settings(config, dotenv=None)) as url, aiohttp.ClientSession() as session:
            body = {"message": f"记住数据库的 {secret} 好吗", "user_id": "u1"}
            async with session.post(f"{url}/webhook", json=body) as response:
                reply = await response.text()
        prompts = [request.raw.decode() for request in fake.requests]
    assert any("记住数据库的" in prompt for prompt in prompts)
    assert all(secret not in prompt for prompt in prompts)
    assert secret not in reply
    assert all(secret not in record.getMessage() for record in caplog.records)
