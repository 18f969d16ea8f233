"""Retention: history, long-term memory and uploads are deleted by age, hourly in `serve` and by
`hermes-kernel prune`, as set by `memory.retention_days` and `media.retention_days`.

The attack it answers (item 18 of the second round, reproduced by hand against the last release):
conversation history was never deleted — there was no setting and the session store had no prune —
so what a user said a year ago still reached the model. Here a conversation is held through the
real `serve` and the fake OpenAI-compatible server, its rows are then made 400 days old in the
database (the clock cannot be moved for SQLite's own timestamps), and what the model receives next
is read from the fake's recorded requests.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway_harness import post, serve_here
from hermes_core.config import load_settings
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply, RecordedRequest
from hermes_core.tools.files import conversation_folder
from waiting import eventually

DAY = 86400.0
OLD_UPLOAD, NEW_UPLOAD = "contract-2025.txt", "contract-2026.txt"


def write_config(tmp_path: Path, fake: FakeOpenAIServer, retention: str = "") -> Path:
    (tmp_path / "ws").mkdir(exist_ok=True)
    path = tmp_path / "hermes.yaml"
    path.write_text(
        f"model: {{name: m, base_url: '{fake.base_url}'}}\n"
        f"gateway: {{data_dir: '{tmp_path / 'data'}', shutdown_grace: 1}}\n"
        f"agent: {{workspace: '{tmp_path / 'ws'}'}}\n"
        "observe: {traces: false}\n" + retention,
        encoding="utf-8",
    )
    return path


async def say(url: str, text: str, message_id: str) -> None:
    status, answer = await post(
        f"{url}/webhook", {"message": text, "user_id": "ann", "message_id": message_id}
    )
    assert status == 200, answer


def model_calls(fake: FakeOpenAIServer) -> list[RecordedRequest]:
    return [r for r in fake.requests if r.body.get("max_tokens") != 1]  # not serve's start-up check


def seen_by_model(request: RecordedRequest) -> str:
    return "\n".join(str(m.get("content") or "") for m in request.messages)


def age_everything(database: Path, days: float) -> None:
    """Make every stored message, note and turn key `days` older, as if written then."""
    with sqlite3.connect(database) as db:
        for table, column in [("session_messages", "created_at"), ("session_state", "updated_at"),
                              ("session_turns", "created_at")]:  # fmt: skip
            db.execute(f"UPDATE {table} SET {column} = {column} - ?", (days * DAY,))


def stored_messages(database: Path) -> int:
    with sqlite3.connect(database) as db:
        return int(db.execute("SELECT COUNT(*) FROM session_messages").fetchone()[0])


def uploads(tmp_path: Path) -> Path:
    """Two files user ann sent, one unchanged for 40 days (`media.retention_days` is 30)."""
    folder = tmp_path / "ws" / "uploads" / conversation_folder("webhook:ann")
    folder.mkdir(parents=True)
    for name, age in [(OLD_UPLOAD, 40 * DAY), (NEW_UPLOAD, 0.0)]:
        (folder / name).write_text(name)
        os.utime(folder / name, (time.time() - age, time.time() - age))
    return folder


async def test_serve_deletes_history_and_uploads_older_than_their_retention(
    tmp_path: Path, fake: FakeOpenAIServer
) -> None:
    fake.handler = lambda request: FakeReply.text("noted")
    settings = load_settings(write_config(tmp_path, fake), env={}, dotenv=None)
    database = tmp_path / "data" / "gateway.db"
    async with serve_here(settings) as url:
        await say(url, "my project is code-named Apollo", "m-1")
    age_everything(database, 400)
    folder = uploads(tmp_path)
    async with serve_here(settings) as url:  # serve prunes at start, then hourly
        await eventually(lambda: stored_messages(database) == 0)
        await say(url, "what is my project called?", "m-2")
    assert "Apollo" not in seen_by_model(model_calls(fake)[-1])
    assert "Apollo" in seen_by_model(model_calls(fake)[0])  # the first turn did send it
    assert sorted(p.name for p in folder.iterdir()) == [NEW_UPLOAD]


async def test_a_conversation_newer_than_the_retention_is_kept(
    tmp_path: Path, fake: FakeOpenAIServer
) -> None:
    """Not deleting too much: 300 days is within the default 365, and `null` keeps uploads forever."""
    fake.handler = lambda request: FakeReply.text("noted")
    config = write_config(tmp_path, fake, "media: {retention_days: null}\n")
    settings = load_settings(config, env={}, dotenv=None)
    database = tmp_path / "data" / "gateway.db"
    async with serve_here(settings) as url:
        await say(url, "my project is code-named Apollo", "m-1")
    age_everything(database, 300)
    folder = uploads(tmp_path)
    async with serve_here(settings) as url:
        await say(url, "what is my project called?", "m-2")
    assert "Apollo" in seen_by_model(model_calls(fake)[-1])
    assert sorted(p.name for p in folder.iterdir()) == [OLD_UPLOAD, NEW_UPLOAD]


async def test_the_prune_command_deletes_now_and_says_what_it_deleted(
    tmp_path: Path, fake: FakeOpenAIServer
) -> None:
    """`hermes-kernel prune`, as an operator runs it (from cron, or on the engine temporal)."""
    fake.handler = lambda request: FakeReply.text("noted")
    config = write_config(tmp_path, fake, "memory: {retention_days: 90}\n")
    database = tmp_path / "data" / "gateway.db"
    async with serve_here(load_settings(config, env={}, dotenv=None)) as url:
        await say(url, "my project is code-named Apollo", "m-1")
    age_everything(database, 100)
    folder = uploads(tmp_path)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hermes_core", "--config", str(config), "prune",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    said = out.decode()
    assert "older than 90 days (memory.retention_days): 2 deleted" in said, said
    assert "files users sent older than 30 days (media.retention_days): 1 deleted" in said, said
    assert stored_messages(database) == 0
    assert sorted(p.name for p in folder.iterdir()) == [NEW_UPLOAD]


def test_the_prune_command_before_anything_was_stored(tmp_path: Path) -> None:
    config = tmp_path / "hermes.yaml"
    config.write_text(f"gateway: {{data_dir: '{tmp_path / 'data'}'}}\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "hermes_core", "--config", str(config), "prune"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and "nothing stored yet" in done.stdout, done
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("days", ["0", "-1"])
def test_a_retention_must_be_positive(tmp_path: Path, days: str) -> None:
    from hermes_core.config import ConfigError

    config = tmp_path / "hermes.yaml"
    config.write_text(f"memory: {{retention_days: {days}}}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="retention_days"):
        load_settings(config, env={}, dotenv=None)
