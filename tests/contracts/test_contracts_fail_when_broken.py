"""Every contract test can fail: run against implementations with one bug each, each test fails
against at least one of them, while passing on every registered implementation.

The six suites run in a child pytest with the backends of tests/contracts/broken_backends.py
registered (`HERMES_CONTRACT_BACKENDS=broken_backends:BROKEN`), each broken backend on its own
seam's suite only (`broken_backends.SUITES`), next to the registered backends; its JUnit report
says which test failed where.
A contract test that no bug can fail, or a bug that no test notices, fails this test by name.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import pytest
from broken_backends import BROKEN, SUITES
from contract_backends import ENV

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def outcomes(report: Path) -> dict[str, dict[str, str]]:
    """test (file::function) → backend → "passed" | "failed" | "skipped"."""
    found: dict[str, dict[str, str]] = defaultdict(dict)
    for case in ET.parse(report).iter("testcase"):
        named = re.fullmatch(r"(\w+)\[(.+)\]", case.get("name", ""))
        assert named is not None, case.get("name")
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{named.group(1)}"
        failed = case.find("failure") is not None or case.find("error") is not None
        found[test][named.group(2)] = (
            "failed" if failed else "skipped" if case.find("skipped") is not None else "passed"
        )
    return found


@pytest.mark.slow
def test_every_contract_test_fails_against_some_broken_implementation(tmp_path: Path) -> None:
    own_suite = " or ".join(f"({kind} and {suite})" for kind, suite in SUITES.items())
    report = tmp_path / "report.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *sorted(str(p) for p in HERE.glob("test_*_contract.py")), "-q",
         "-p", "no:cacheprovider", "-k", f"not broken or (broken and ({own_suite}))", f"--junitxml={report}"],
        cwd=ROOT, env={**os.environ, ENV: "broken_backends:BROKEN"}, capture_output=True, text=True,
        timeout=1200,
    )  # fmt: skip
    assert report.is_file(), run.stdout[-3000:] + run.stderr[-3000:]
    found = outcomes(report)
    assert len(found) >= 60, sorted(found)  # the suites were all collected
    broke_something: set[str] = set()
    for test, by_backend in sorted(found.items()):
        good = {b: outcome for b, outcome in by_backend.items() if not b.startswith("broken-")}
        failing = {b for b, outcome in by_backend.items() if b.startswith("broken-") and outcome == "failed"}
        assert "failed" not in good.values(), f"{test} fails on a registered implementation: {good}"
        assert "passed" in good.values(), f"{test} ran on no registered implementation: {good}"
        assert failing, f"{test} fails against no broken implementation: it cannot fail"
        broke_something |= failing
    assert sorted(set(BROKEN) - broke_something) == [], "bugs that no contract test notices"
