"""Attacks on the workspace of the file tools, each performed end to end: a scripted model calls
read_file / write_file through the agent built from configuration (or a real gateway on 127.0.0.1,
or a `serve` process), and the attack must fail.

Before these checks a workspace could hold the service's own `.env`, configuration file or data
folder (so the model could read the secrets, make itself admin or corrupt the database), had no
size limit, and followed hard links to files outside it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway_harness import serving
from hermes_core.config import ConfigError, build_agent, load_settings
from hermes_core.gateway.server import build_gateway
from hermes_core.testing import ScriptedModel, call, reply
from serve_process import CLEAN_ENV

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the workspace needs POSIX openat")
SECRET = "sk-live-0123456789abcdef"


def write_config(where: Path, **agent: Any) -> Path:
    """A configuration file at `where` with these agent keys (and gateway.data_dir if given)."""
    data_dir = agent.pop("data_dir", None)
    lines = ["agent:", *(f"  {key}: {json.dumps(value)}" for key, value in agent.items())]
    if data_dir is not None:
        lines += ["gateway:", f"  data_dir: {json.dumps(str(data_dir))}"]
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return where


def agent_from(config: Path, model: ScriptedModel) -> Any:
    return build_agent(load_settings(config, env={}, dotenv=None), model=model)


async def run_tools(config: Path, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Build the agent from `config` as `serve` does and let the model make these calls; what it was
    told for each, or the one start-up refusal."""
    model = ScriptedModel([*(call(name, arguments) for name, arguments in calls), reply("done")])
    try:
        agent = agent_from(config, model)
    except ConfigError as exc:
        return [f"refused at start-up: {exc}"]
    result = await agent.run("look around")
    return [outcome.content for outcome in result.tool_calls]


# -- what the service trusts is never inside the workspace ----------------------------------------


def layouts(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    """(folder serve starts in, configuration) for each way a workspace can overlap what the service
    trusts. Every layout has a .env with the API key in the folder serve starts in."""
    ws, cfg, data = tmp_path / "ws", tmp_path / "cfg", tmp_path / "data"
    for folder in (ws, cfg, data / "files"):
        folder.mkdir(parents=True)
    return {
        "the .env file of the folder serve starts in": (ws, write_config(cfg / "a.yaml", workspace=".",
                                                                         data_dir=tmp_path / "d")),
        "a .env at the top of the workspace": (cfg, write_config(cfg / "b.yaml", workspace=str(ws),
                                                                 data_dir=tmp_path / "d")),
        "the configuration file": (cfg, write_config(ws / "hermes.yaml", workspace=str(ws),
                                                     data_dir=tmp_path / "d")),
        "the data folder (gateway.db)": (cfg, write_config(cfg / "c.yaml", workspace=str(ws),
                                                           data_dir=ws / "data")),
        "the default data folder .hermes": (tmp_path, write_config(cfg / "d.yaml", workspace=".")),
        "a folder inside the data folder": (cfg, write_config(cfg / "e.yaml", workspace=str(data / "files"),
                                                              data_dir=data)),
    }  # fmt: skip


CASES = [
    "the .env file of the folder serve starts in",
    "a .env at the top of the workspace",
    "the configuration file",
    "the data folder (gateway.db)",
    "the default data folder .hermes",
    "a folder inside the data folder",
]


@pytest.mark.slow
@pytest.mark.parametrize("command", ["serve", "run"])
@pytest.mark.parametrize("case", CASES)
def test_start_up_refuses_a_workspace_that_overlaps_what_the_service_trusts(
    tmp_path: Path, case: str, command: str
) -> None:
    """The attack: the operator points agent.workspace at a folder holding the service's secrets
    (.env), configuration or database, so the model could read, rewrite or corrupt them with the
    file tools. `serve` and `run` refuse to start: one clear line, exit code 2."""
    cwd, config = layouts(tmp_path)[case]
    (cwd / ".env").write_text(f"HERMES_API_KEY={SECRET}\n")
    if case == "a .env at the top of the workspace":
        (tmp_path / "ws" / ".env").write_text(f"HERMES_API_KEY={SECRET}\n")
    args = ["serve", "--port", "0"] if command == "serve" else ["run", "hello"]
    process = subprocess.Popen(
        [sys.executable, "-m", "hermes_core", "--config", str(config), *args],
        cwd=cwd, env=CLEAN_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"{command} started with a workspace holding {case}")
    errors = [line for line in output.splitlines() if line.startswith("hermes-kernel:")]
    assert process.returncode == 2, output
    assert len(errors) == 1 and "agent.workspace" in errors[0], output
    assert SECRET not in output


async def test_the_model_cannot_read_the_services_env_file_through_the_workspace(tmp_path: Path) -> None:
    """The attack: the model calls read_file(".env") in a workspace that is the service's own
    folder. The agent cannot even be built; the key never reaches the model."""
    (tmp_path / ".env").write_text(f"HERMES_API_KEY={SECRET}\n")
    config = write_config(tmp_path / "cfg" / "hermes.yaml", workspace=str(tmp_path), data_dir=tmp_path / "d")
    told = await run_tools(config, [("read_file", {"path": ".env"})])
    assert told[0].startswith("refused at start-up") and ".env" in told[0], told
    assert all(SECRET not in t for t in told)


async def test_the_model_cannot_corrupt_the_database_or_make_itself_admin(tmp_path: Path) -> None:
    """The attack: with the data folder and the configuration file inside the workspace, the model
    overwrites gateway.db and adds itself to permissions.admins. Refused at start-up; both intact."""
    ws = tmp_path / "ws"
    (ws / "data").mkdir(parents=True)
    (ws / "data" / "gateway.db").write_bytes(b"SQLite format 3\x00")
    config = write_config(ws / "hermes.yaml", workspace=str(ws), data_dir=ws / "data")
    original = config.read_text()
    admin = "permissions: {admins: [mallory]}\n"
    told = await run_tools(config, [
        ("write_file", {"path": "data/gateway.db", "content": "garbage"}),
        ("write_file", {"path": "hermes.yaml", "content": admin, "append": True}),
    ])  # fmt: skip
    assert told[0].startswith("refused at start-up"), told
    assert (ws / "data" / "gateway.db").read_bytes() == b"SQLite format 3\x00"
    assert config.read_text() == original


# -- quota ------------------------------------------------------------------------------------


async def test_a_write_past_the_workspace_quota_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    """The attack: the model fills the disk with write_file, one allowed-size call after another.
    With `agent.workspace_quota_mb` the call that would pass the quota is refused and says why;
    rewriting a file in place (no growth) still works."""
    ws = tmp_path / "ws"
    ws.mkdir()
    quota = {"workspace_quota_mb": 0.01}  # 10,485 bytes
    config = write_config(tmp_path / "hermes.yaml", workspace=str(ws), data_dir=tmp_path / "d", **quota)
    block = "x" * 6000
    told = await run_tools(config, [
        ("write_file", {"path": "a.txt", "content": block}),
        ("write_file", {"path": "b.txt", "content": block}),
        ("write_file", {"path": "a.txt", "content": block, "append": True}),
        ("write_file", {"path": "a.txt", "content": "y" * 6000}),
    ])  # fmt: skip
    results = [json.loads(t) for t in told]
    assert results[0]["bytes_written"] == 6000
    assert "quota" in results[1]["error"] and "workspace_quota_mb" in results[1]["error"]
    assert "quota" in results[2]["error"]
    assert results[3]["bytes_written"] == 6000  # same size: no growth
    assert not (ws / "b.txt").exists() and (ws / "a.txt").read_text() == "y" * 6000


# -- hard links, through a real gateway ---------------------------------------------------------


async def test_hard_links_out_of_the_workspace_are_neither_written_nor_read(tmp_path: Path) -> None:
    """The attack: a hard link in the workspace names a file outside it (planted by another
    program, or anyone who can write there). Through the webhook of a real gateway the model
    writes to it and reads it. Both are refused; the outside file is unchanged and unread."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (outside / "credentials.txt").write_text(f"token={SECRET}\n")
    os.link(outside / "credentials.txt", ws / "notes.txt")
    config = write_config(tmp_path / "hermes.yaml", workspace=str(ws), data_dir=tmp_path / "data")
    settings = load_settings(config, env={}, dotenv=None)
    model = ScriptedModel([
        call("write_file", {"path": "notes.txt", "content": "overwritten"}),
        call("read_file", {"path": "notes.txt"}),
        reply("done"),
    ])  # fmt: skip
    gateway, routes = build_gateway(settings, build_agent(settings, model=model))
    async with serving(gateway, routes) as url, aiohttp.ClientSession() as session:
        body = {"message": "update my notes", "user_id": "u1"}
        async with session.post(f"{url}/webhook", json=body) as response:
            assert response.status == 200 and (await response.json())["reply"] == "done"
    await gateway.runner.aclose()  # type: ignore[attr-defined]
    told = [m["content"] for m in model.calls[-1].messages if m["role"] == "tool"]
    assert len(told) == 2 and all("hard links" in json.loads(t)["error"] for t in told), told
    assert all(SECRET not in t for t in told)
    assert (outside / "credentials.txt").read_text() == f"token={SECRET}\n"


async def test_the_model_cannot_plant_git_configuration(tmp_path: Path) -> None:
    """The attack: write_file(".git/config") with an alias or fsmonitor command, which an allowed
    `git status` would then run. Files under .git/ are refused."""
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    config = write_config(tmp_path / "hermes.yaml", workspace=str(ws), data_dir=tmp_path / "d")
    told = await run_tools(
        config, [("write_file", {"path": ".git/config", "content": "[core]\n fsmonitor = id\n"})]
    )
    assert ".git" in json.loads(told[0])["error"] and not (ws / ".git" / "config").exists()
