"""The default time zone of scheduled jobs is the machine's own, as the C library finds it.

Cases: the first-hour report of issue 29 ("下午 3 点提醒我" fired at 23:00 Beijing time, because the
default was UTC for everyone), and the forms `TZ` takes in the POSIX/glibc documentation of the
variable (`Asia/Shanghai`, `:Asia/Shanghai`, a path into the zoneinfo folder) and a value that names
no zone (`CST-8`, a POSIX rule); `schedule.timezone` in the configuration still wins. Each case is
`hermes-kernel schedule add` + `schedule list --json` run as a process with `TZ` in its environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from serve_process import clean_environ

YEAR = datetime.now(timezone.utc).year + 1  # always ahead, and within the ten years a job may be set


def add_at_three_pm(tmp_path: Path, tz: str, config: str | None = None) -> dict:
    """`schedule add --at <next year>-12-01T15:00` with TZ=`tz`: the job as `schedule list --json`
    shows it."""
    flags = []
    if config is not None:
        (tmp_path / "hermes.yaml").write_text(config, encoding="utf-8")
        flags = ["--config", "hermes.yaml"]
    env = clean_environ(TZ=tz)
    for command in (
        ["schedule", "add", "--at", f"{YEAR}-12-01T15:00", "--prompt", "提醒我开会"],
        ["schedule", "list", "--json"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "hermes_core", *flags, *command],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    [job] = json.loads(done.stdout)
    return job


def utc_of(job: dict) -> str:
    return datetime.fromtimestamp(job["next_fire"], timezone.utc).strftime("%H:%M")


@pytest.mark.parametrize(
    ("tz", "name"),
    [("Asia/Shanghai", "Asia/Shanghai"), (":Asia/Shanghai", "Asia/Shanghai"),
     ("/usr/share/zoneinfo/Asia/Shanghai", "Asia/Shanghai")],
)  # fmt: skip
def test_three_pm_is_three_pm_on_the_machine_s_clock(tmp_path: Path, tz: str, name: str) -> None:
    job = add_at_three_pm(tmp_path, tz)
    assert job["timezone"] == name
    assert utc_of(job) == "07:00"  # 15:00 in Beijing, not 23:00
    assert job["next_fire_local"] == f"{YEAR}-12-01T15:00:00+08:00"


def test_the_configured_zone_wins_over_the_machine_s(tmp_path: Path) -> None:
    job = add_at_three_pm(tmp_path, "Asia/Shanghai", config="schedule:\n  timezone: America/New_York\n")
    assert job["timezone"] == "America/New_York" and utc_of(job) == "20:00"


def test_a_tz_that_names_no_zone_falls_back_to_the_system_file_then_utc(tmp_path: Path) -> None:
    job = add_at_three_pm(tmp_path, "CST-8")  # a POSIX rule: no IANA name to store with the job
    assert job["timezone"] != "CST-8"
    assert datetime.fromisoformat(job["next_fire_local"]).hour == 15
