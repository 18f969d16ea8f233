"""The backup and restore lines of docs/scale-out.md, run as written against a private PostgreSQL
server (tests/pg_server.py) holding a gateway's state: what was there at the dump comes back, what
came after is gone, and the stores go on (new ids do not collide with restored ones)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from hermes_core.channels.seam import InboundMessage, OutboundMessage
from hermes_core.postgres.database import PostgresDatabase
from hermes_core.postgres.gateway import PostgresGatewayStore
from hermes_core.postgres.sessions import PostgresSessionStore
from hermes_core.sessions.store import TurnAppend
from pg_server import binaries

PAGE = Path(__file__).resolve().parents[1] / "docs" / "scale-out.md"


def documented(program: str) -> str:
    """The line of the page's fenced blocks that runs `program`."""
    blocks = re.findall(r"^```bash\n(.*?)^```", PAGE.read_text(encoding="utf-8"), flags=re.M | re.S)
    [line] = [line for block in blocks for line in block.splitlines() if line.startswith(program + " ")]
    return line


def run(line: str, url: str, cwd: Path) -> None:
    env = {**os.environ, "HERMES_DATABASE_URL": url, "PATH": f"{binaries()}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", line], cwd=cwd, env=env, check=True, timeout=120, capture_output=True)


def inbound(n: int) -> InboundMessage:
    return InboundMessage("webhook", "webhook:u1", "u1", f"message {n}", f"m{n}")


async def open_stores(url: str) -> tuple[PostgresGatewayStore, PostgresSessionStore]:
    database = PostgresDatabase(url)
    return PostgresGatewayStore(url, database=database), PostgresSessionStore(url, database=database)


@pytest.mark.slow
async def test_the_documented_dump_and_restore_bring_the_state_back(pg_url: str, tmp_path: Path) -> None:
    store, sessions = await open_stores(pg_url)
    first = await store.accept(inbound(1))
    reply = OutboundMessage(channel="webhook", conversation="webhook:u1", text="answer 1", uuid="u1")
    history = TurnAppend(sessions, "webhook:u1", "t1", [{"role": "user", "content": "message 1"}])
    await store.complete(first, [reply], history)  # type: ignore[arg-type]
    run(documented("pg_dump"), pg_url, tmp_path)
    assert (tmp_path / "hermes.dump").stat().st_size > 0
    await store.accept(inbound(2))  # after the dump
    await store.close()

    run(documented("pg_restore"), pg_url, tmp_path)  # the nodes are stopped, as the page says

    store, sessions = await open_stores(pg_url)
    earlier = await store.replies_of("webhook", "m1")
    assert earlier is not None and earlier.done and [r.text for r in earlier.replies] == ["answer 1"]
    assert await store.replies_of("webhook", "m2") is None
    assert [m["content"] for m in (await sessions.load("webhook:u1")).messages] == ["message 1"]
    later = await store.accept(inbound(3))
    assert later is not None and later > first  # type: ignore[operator]  # the sequences came back too
    await store.close()
