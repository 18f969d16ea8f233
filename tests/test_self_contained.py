"""The repository stands alone: nothing in it reads a path outside its own tree.

A fresh clone has nothing beside it, so data the tests use lives under tests/data/ (with its
source and licence in tests/data/README.md), and no code climbs above the repository root.
`.ci/run` also runs the suite from a copy with no sibling folders, which catches what this
static check cannot (a path built at run time).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIMBS = re.compile(r"\.\./(shared|conformance)|parents\[[2-9]\]|\"shared\"\s*/\s*\"conformance\"")


def test_no_file_reads_a_path_outside_the_repository() -> None:
    offenders = []
    for folder in ("src", "tests", "benchmarks", ".ci", "deploy"):
        for path in (ROOT / folder).rglob("*"):
            if ".venv" in path.relative_to(ROOT).parts:  # an environment left in the checkout (.ci/run's)
                continue
            if path.is_file() and path.suffix in {".py", ".sh", ".toml", ".yaml", ".yml", ""}:
                text = path.read_text(encoding="utf-8", errors="replace")
                if path != Path(__file__) and CLIMBS.search(text):
                    offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_every_data_file_has_its_source_recorded() -> None:
    readme = (ROOT / "tests" / "data" / "README.md").read_text(encoding="utf-8")
    for path in (ROOT / "tests" / "data").iterdir():
        if path.name != "README.md":
            assert f"`{path.name}" in readme, f"{path.name} has no source line in tests/data/README.md"
