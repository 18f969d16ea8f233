"""Fixtures shared by the test files, so that each stands up the fakes and processes the same way.

- `fake`: the fake OpenAI-compatible server (hermes_core.testing), on a free local port.
- `feishu`: the fake Feishu platform, default credentials.
- `http`: an aiohttp client session without a connection limit.
- for every test, TZ=UTC: the machine's time zone, the default of `schedule.timezone`.
- `clean_env`: this test's os.environ without the machine's HERMES_*/FEISHU_* variables; and
  for every test, HERMES_*/FEISHU_* are put back as they were afterwards.
- `serve`: starts `python -m hermes_core … serve` processes (tests/serve_process.py) and stops
  each with SIGTERM after the test.
- `postgres`: one private PostgreSQL server for the whole run (tests/pg_server.py: initdb + pg_ctl
  in a temporary folder, 127.0.0.1, a free port), started by the first test that asks for it;
  `pg_url`: a fresh empty database on it for this test. Without PostgreSQL installed they skip.

A test file that needs another set-up (other credentials, a thread-run server) defines its own
fixture of the same name, which takes precedence over these. The helpers behind them stay
importable modules: tests/serve_process.py (processes, clean environments) and
tests/gateway_harness.py (an in-process gateway on 127.0.0.1, `idle`).

Waiting: `wait_for(condition)` and `await eventually(condition)` poll a condition and fail with what
was awaited and the last value seen; no test sleeps for a fixed time in place of a condition. They
live in tests/waiting.py, re-exported here: conftest.py imports the helper modules that use them,
and tests/contracts has a conftest.py of its own, so the files import them from `waiting`.

Tests marked `slow` (real `hermes-kernel` processes, kill loops, a browser, the MCP reference
servers) are left out of the daily loop `python -m pytest -m "not slow"`; CI runs them all.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from re import Match

import aiohttp
import pytest

from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer
from pg_server import PostgresServer
from pg_server import missing as postgres_missing
from serve_process import Serve, start_serve, stop_serve
from waiting import eventually, wait_for

__all__ = ["eventually", "wait_for"]  # the one way tests wait (tests/waiting.py)


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def feishu() -> AsyncIterator[FakeFeishu]:
    async with FakeFeishu() as platform:
        yield platform


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


@pytest.fixture(autouse=True)
def _hermes_environment_restored() -> Iterator[None]:
    """Put HERMES_*/FEISHU_* back as they were after each test: code under test may set them
    (a `.env` read by load_settings sets os.environ directly, out of monkeypatch's reach), and
    one test's leftover HERMES_BASE_URL would change what every later test in the run builds."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(("HERMES_", "FEISHU_"))}
    yield
    for name in [k for k in os.environ if k.startswith(("HERMES_", "FEISHU_"))]:
        if name not in saved:
            del os.environ[name]
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _machine_zone_utc(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine's time zone is UTC in every test (the default of `schedule.timezone` is the
    machine's own): a test reads the same times on any developer's machine; a test about another
    zone sets TZ itself (tests/serve_process.py does the same for processes)."""
    monkeypatch.setenv("TZ", "UTC")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Remove HERMES_*/FEISHU_* from os.environ for this test; the environment that is left."""
    for name in list(os.environ):
        if name.startswith(("HERMES_", "FEISHU_")):
            monkeypatch.delenv(name)
    return dict(os.environ)


@pytest.fixture
def serve() -> Iterator[Serve]:
    """`serve(*args, cwd=…, env=…, stderr=…)` → (process, `serving on` match); stopped after the test."""
    started: list[subprocess.Popen[str]] = []

    def start(
        *args: str, cwd: Path, env: Mapping[str, str] | None = None, stderr: int | None = subprocess.STDOUT
    ) -> tuple[subprocess.Popen[str], Match[str]]:
        process, found = start_serve(*args, cwd=cwd, env=env, stderr=stderr)
        started.append(process)
        return process, found

    yield start
    for process in started:
        stop_serve(process)


def _postgres_server() -> Iterator[PostgresServer]:
    """A started PostgreSQL server, stopped afterwards; the test skipped, saying why, without one."""
    reason = postgres_missing()
    if reason is not None:
        pytest.skip(reason)
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    yield from _postgres_server()


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of one test alone, which it may stop and start in the middle."""
    yield from _postgres_server()


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    """The URL (password included) of a new empty database, for this test alone."""
    return postgres.fresh_database()


@pytest.fixture(scope="session")
def temporal_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Temporal dev server (tests/temporal_dev.py) for the session: its host:port. Skips the test,
    saying why, when the pinned `temporal` binary or the `temporalio` SDK is not installed."""
    pytest.importorskip("temporalio", reason="the temporal extra is not installed (temporalio)")
    from temporal_dev import DevServer, temporal_binary

    binary, why = temporal_binary()
    if binary is None:
        pytest.skip(why)
    server = DevServer(binary, tmp_path_factory.mktemp("temporal"))
    try:
        server.wait_ready()
        yield server.address
    finally:
        server.stop()
