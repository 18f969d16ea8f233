"""docs/architecture.md maps behaviours to files: every file it names exists, so a move or a
rename that forgets the map fails here rather than misleading the next reader."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "hermes_core"
NAMED = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:py|md|yaml|yml|json|jsonl|txt|js|css|html|sh))\b")


def named_files(text: str) -> set[str]:
    code = re.findall(r"`([^`]+)`", text) + re.findall(r"```.*?```", text, flags=re.S)
    return {name for chunk in code for name in NAMED.findall(chunk)}


def exists(name: str) -> bool:
    bases = [PACKAGE, ROOT, ROOT / "docs", PACKAGE / "channels", PACKAGE / "kernel"]
    if any((base / name).exists() for base in bases):
        return True
    return "/" not in name and any(PACKAGE.rglob(name))  # a bare name: a module somewhere in the package


def test_every_file_the_map_names_exists() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = sorted(name for name in named_files(text) if not exists(name))
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def test_the_check_sees_a_missing_file() -> None:
    assert named_files("a row | `kernel/loop.py` (`run_loop`), `tools/nothere.py` |") == {
        "kernel/loop.py",
        "tools/nothere.py",
    }
    assert exists("kernel/loop.py") and not exists("tools/nothere.py")
