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

import asyncio
import subprocess
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import psycopg
import pytest

from hermes_core.cli import main
from hermes_core.kernel import redaction
from hermes_core.testing.fake_openai import FakeOpenAIServer
from pg_server import PASSWORD, without_database_environment
from serve_process import clean_environ, start_serve, stop_serve


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    without_database_environment(monkeypatch, tmp_path)
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


def test_a_password_in_the_environments_query_string_is_not_in_serves_state_line(
    pg_url: str, tmp_path: Path
) -> None:
    """The real `serve` process on PostgreSQL, its whole output read."""
    config = tmp_path / "hermes.yaml"
    config.write_text(f"gateway: {{data_dir: '{tmp_path / 'data'}', shutdown_grace: 1}}\n", encoding="utf-8")
    env = clean_environ(HERMES_DATABASE_URL=in_query(pg_url))
    process, _ = start_serve(
        "--config", str(config), "serve", "--port", "0", cwd=tmp_path, env=env, stderr=subprocess.PIPE
    )
    log = stop_serve(process)  # its log, on stderr
    states = [line for line in log.splitlines() if "state:" in line]
    assert states and "?password=[REDACTED" in states[0], log
    assert WORDS_ONLY not in log


async def test_pgpassword_from_the_environment_is_a_secret(tmp_path: Path) -> None:
    """A user who pastes the database password (no `password=` before it, so no shape rule sees it)
    does not get it to the model, the log or the reply. The real `serve` process."""
    secret = "Pq7sZv2Lk"
    async with FakeOpenAIServer() as fake:
        config = tmp_path / "hermes.yaml"
        config.write_text(f"model: {{name: m, base_url: '{fake.base_url}'}}\n"
                          f"gateway: {{data_dir: '{tmp_path / 'data'}', shutdown_grace: 1}}\n")  # fmt: skip
        env = clean_environ(PGPASSWORD=secret, HERMES_API_KEY="sk-test-key-not-secret-0000")
        process, serving = await asyncio.to_thread(
            start_serve, "--config", str(config), "serve", "--port", "0",
            cwd=tmp_path, env=env, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            async with aiohttp.ClientSession() as session:
                body = {"message": f"记住数据库的 {secret} 好吗", "user_id": "u1"}
                async with session.post(f"{serving.group(1)}/webhook", json=body) as response:
                    reply = await response.text()
        finally:
            output = await asyncio.to_thread(stop_serve, process)
        prompts = [request.raw.decode() for request in fake.requests]
    assert any("记住数据库的" in prompt for prompt in prompts)
    assert all(secret not in prompt for prompt in prompts)
    assert secret not in reply and secret not in output
