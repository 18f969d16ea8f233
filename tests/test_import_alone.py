"""Every module of the package imports on its own, in an interpreter that has imported nothing of it.

A module-level import cycle fails only when one of its modules is imported first (`import
hermes_core.memory.conversation` raised ImportError while `import hermes_core` worked), so the
other tests, which import the package the usual way, never see it. A fresh interpreter forks once
per module: each child starts with only the standard library loaded and imports one module.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import hermes_core

pytestmark = pytest.mark.slow  # one fork and import per module: about 40 s

ROOT = Path(hermes_core.__file__).parent

CHILD = r"""
import os, sys, traceback
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            __import__(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status:
        failed.append(name)
print("\n".join(failed))
"""


def modules() -> list[str]:
    names = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = ["hermes_core", *path.relative_to(ROOT).with_suffix("").parts]
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return [name for name in names if name != "hermes_core.__main__"]  # the command line, run


def test_every_module_imports_alone() -> None:
    names = modules()
    assert "hermes_core.memory.conversation" in names and len(names) > 150
    done = subprocess.run([sys.executable, "-c", CHILD, *names], capture_output=True, text=True, timeout=300)
    failed = done.stdout.split()
    assert done.returncode == 0 and not failed, f"{failed}\n{done.stderr[-4000:]}"
