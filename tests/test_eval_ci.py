"""The regression cases run in CI (MISSION O4: "run before each release"), and a failing case fails
the build.

`.ci/run` runs the whole suite, so these tests are the release gate: the command the README shows,
`hermes-kernel eval --cases examples/evals/`, is run as a subprocess from the repository's root on the
built-in offline model (no endpoint, no key, no network) and must exit 0; a copy of the same cases
with one deliberately broken case must exit 1 — the exit code a CI step turns into a red build.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from serve_process import clean_environ

pytestmark = pytest.mark.slow  # real processes: not in the daily loop (-m "not slow")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "evals"
OFFLINE_ENV = clean_environ()


def hermes_core(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed `hermes-kernel` script (as CI calls it), else the module."""
    script = Path(sys.executable).with_name("hermes-kernel")
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "hermes_core"]
    return subprocess.run(
        [*command, *argv], cwd=cwd, env=OFFLINE_ENV, capture_output=True, text=True, timeout=120
    )


def case_names() -> list[str]:
    return sorted(path.stem for path in EXAMPLES.glob("*.yaml"))


def test_the_example_regression_cases_pass_as_the_readme_runs_them() -> None:
    """Attack: a change that breaks a shipped regression case must not reach a release; here the
    cases as released, through the README's own command line, on the offline model."""
    result = hermes_core("eval", "--cases", "examples/evals/", cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    names = case_names()
    assert len(names) >= 4
    for name in names:
        assert re.search(rf"^{re.escape(name)}\s+PASS\b", result.stdout, re.MULTILINE), result.stdout
    assert f"{len(names)} case(s): {len(names)} passed, 0 failed" in result.stdout


def test_a_broken_case_makes_eval_exit_1_so_the_build_fails(tmp_path: Path) -> None:
    """Attack: one regressed case among passing ones (a reply that no longer holds the right number)
    must turn the exit code non-zero, or CI would stay green over a regression."""
    cases = tmp_path / "evals"
    shutil.copytree(EXAMPLES, cases)
    calculation = (cases / "calculation.yaml").read_text(encoding="utf-8")
    broken = calculation.replace('reply_contains: ["92"]', 'reply_contains: ["93"]')
    assert broken != calculation
    (cases / "calculation-broken.yaml").write_text(broken, encoding="utf-8")
    result = hermes_core("eval", "--cases", str(cases), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"^calculation-broken\s+FAIL\b", result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^calculation\s+PASS\b", result.stdout, re.MULTILINE), result.stdout
    assert "1 failed" in result.stdout and "Traceback" not in result.stderr
