"""What a fresh clone of the project holds: the tracked files of this tree, copied into a folder.

Tests of a new user's path (tests/test_first_hour.py) and of the built package
(tests/test_packaging.py) start from such a copy, never from the tree itself, so nothing beside
the clone (a virtual environment, a .hermes folder, build output) can make them pass.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEFT_OUT = {".git", ".venv", ".hermes", "test-artifacts", ".cache", "build", "dist", "__pycache__"}


def tracked_files() -> list[str]:
    """`git ls-files`, or without git (an unpacked archive) every file outside `LEFT_OUT`."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60, check=False
        )
    except OSError:
        listed = None
    if listed is not None and listed.returncode == 0 and listed.stdout:
        return [name for name in listed.stdout.decode().split("\0") if name]
    return [
        str(path.relative_to(ROOT)) for path in ROOT.rglob("*")
        if path.is_file() and not LEFT_OUT & set(path.relative_to(ROOT).parts)
    ]  # fmt: skip


def fresh_clone(target: Path) -> Path:
    """Copy the tracked files (as the working tree has them) into `target`; return it."""
    for name in tracked_files():
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not in a clone of it
            copy = target / name
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(source.read_bytes())
            copy.chmod(source.stat().st_mode & 0o777)
    return target
