"""Task ids on the command line: what `traces` prints can be pasted into `trace show`, `replay` and
`eval add`, and so can any beginning of an id that no other id shares.

Task ids are `<channel>:<message id>~<12 hex>` (channels/seam.py: `task_id_of`); a Feishu
message id alone is 35 characters, so a listing that cut ids to fit a column printed ids ending in
"…" that no command accepted. Every test here runs `hermes-kernel` as a subprocess over a real trace
database written by a real traced agent.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from hermes_core import Agent
from hermes_core.observe.traces import SQLiteTraceStore, Tracer
from hermes_core.testing import ScriptedModel, reply
from serve_process import CLEAN_ENV

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")

MESSAGE = "feishu:om_dc13264520392913993dd051dba21dcf"  # a real-looking Feishu message id
IDS = (f"{MESSAGE}~3f9a0c2b71de", f"{MESSAGE}~3f9a77aa0b12", "webhook:m1~0c2b71de3f9a")


def record_tasks(data_dir: Path) -> None:
    """Three finished tasks in the gateway database, as `serve` records them."""

    async def run() -> None:
        store = SQLiteTraceStore(data_dir / "gateway.db")
        for task_id in IDS:
            agent = Agent(model=ScriptedModel([reply(f"answer of {task_id}")]), tracer=Tracer(store))
            await agent.run(f"question of {task_id}", task_id=task_id)
        await store.close()

    asyncio.run(run())


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    record_tasks(tmp_path / ".hermes")
    return tmp_path


def cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hermes_core", *argv],
        cwd=cwd,
        env=CLEAN_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )


def listed_ids(cwd: Path) -> list[str]:
    """The task column of `hermes-kernel traces`, as a person would copy it."""
    out = cli(cwd, "traces").stdout.splitlines()
    return [line.split("  ")[1].strip() for line in out[1:]]


def test_traces_prints_ids_that_trace_show_accepts(workdir: Path) -> None:
    """Attack: copy an id from `traces` and paste it into `trace show` (the old table cut Feishu
    task ids at 28 characters with "…", an id nothing accepts)."""
    shown = listed_ids(workdir)
    assert sorted(shown) == sorted(IDS)
    for task_id in shown:
        assert "…" not in task_id
        result = cli(workdir, "trace", "show", task_id)
        assert result.returncode == 0, result.stderr
        assert f"task {task_id}" in result.stdout


def test_a_unique_prefix_names_its_task_in_show_replay_and_eval_add(workdir: Path) -> None:
    """Attack: paste only the beginning of an id (the way git takes short hashes) into each of
    the three commands that take one."""
    shown = cli(workdir, "trace", "show", "webhook:m1")
    assert shown.returncode == 0, shown.stderr
    assert f"task {IDS[2]}" in shown.stdout
    assert cli(workdir, "trace", "show", f"{MESSAGE}~3f9a0").returncode == 0
    replayed = cli(workdir, "replay", f"{MESSAGE}~3f9a7")
    assert replayed.returncode == 0, replayed.stderr
    assert f"replay of task {IDS[1]}" in replayed.stdout and "reproduced" in replayed.stdout
    added = cli(workdir, "eval", "add", "webhook:m", "--cases", "cases")
    assert added.returncode == 0, added.stderr
    written = list((workdir / "cases").iterdir())
    assert [p.name for p in written] == ["trace-0c2b71de3f9a.yaml"]  # named by the id's own part
    assert cli(workdir, "eval", "--cases", "cases").returncode == 0


def test_an_ambiguous_prefix_lists_the_candidates_and_exits_2(workdir: Path) -> None:
    """Attack: a prefix two tasks share (two tasks of one Feishu message: a resent message gets a
    task of its own) must not pick one of them silently."""
    for argv in (("trace", "show"), ("replay",), ("eval", "add")):
        result = cli(workdir, *argv, f"{MESSAGE}~3f9a")
        assert result.returncode == 2, (argv, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and IDS[0] in lines[0] and IDS[1] in lines[0], lines
        assert "Traceback" not in result.stderr
    unknown = cli(workdir, "trace", "show", "feishu:om_nothing")
    assert unknown.returncode == 2 and "no such task" in unknown.stderr


def test_two_feishu_tasks_become_two_cases(workdir: Path) -> None:
    """Attack: `eval add` of two tasks of one Feishu chat; a name from the id's first 12 characters
    (`trace-feishu-om_dc`) made the second refuse to overwrite the first."""
    for task_id in IDS[:2]:
        result = cli(workdir, "eval", "add", task_id, "--cases", "cases")
        assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (workdir / "cases").iterdir()) == [
        "trace-3f9a0c2b71de.yaml",
        "trace-3f9a77aa0b12.yaml",
    ]
