"""The kernel's seams are typed: `mypy --strict` passes on the kernel, and `Any` is written there
only where no precise type exists, each place named below with its reason.

JSON data is `messages.JSON`, declared once; a tool's function (any documented signature) is
`tools/declare.ToolFunction`. Everything else that crosses a seam — who approves (`Interactions`),
a sub-agent's tokens (`Usage`), a task's trace (`TaskTrace`), its observers (`TaskHooks`) — has
its own type, so a wrong value is a mypy error at the call, not an AttributeError in production.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]  # the checkout (the package may be installed elsewhere)
ROOT = PROJECT / "src" / "hermes_core"

KERNEL = [
    "agent.py", "stack.py", "kernel/loop.py", "kernel/messages.py", "kernel/approvals.py", "kernel/hooks.py",
    "kernel/records.py", "kernel/guards.py", "kernel/prompts.py", "kernel/model.py",
    "kernel/tools/registry.py", "kernel/tools/declare.py", "kernel/tools/arguments.py",
    "kernel/tools/results.py",
]  # fmt: skip
HOOK_CALLERS = ["plans/executor.py", "cli_display.py"]  # the other callers and observers of kernel/hooks.py

# Where the kernel may write `Any` ("file:name", the name of the alias or function it is in).
ALLOWED_ANY: dict[str, str] = {
    "kernel/messages.py:JSON": "the one declaration of JSON data, read by key where it is used",
    "kernel/tools/declare.py:ToolFunction": "a tool is any documented function: any arguments, any result",
    "kernel/tools/declare.py:Extractor": "it takes whatever the tool's function returned",
    "kernel/tools/declare.py:ToolEntry": "the dict-style entry mixes strings, numbers, a schema, a function",
    "kernel/tools/declare.py:Tool.__call__": "the decorated function stays callable as itself",
    "kernel/tools/declare.py:arguments_model_for": "pydantic's field definitions (create_model's own Any)",
    "agent.py:Agent.__init__": "keywords of the agent's fields and of its settings and limits",
    "agent.py:Agent.__getattr__": "an option of settings or limits: of that option's type",
    "agent.py:_default": "dataclasses.Field of any field",
    "agent.py:_apply": "the keywords of __init__, not yet sorted into their declarations",
    "kernel/tools/registry.py:_Job": "a sync tool's result or exception, handed back from its thread",
    "kernel/tools/registry.py:_Job.settle": "the same",
    "kernel/tools/registry.py:ToolThreads.run": "the same: the tool's result, of the tool's own type",
    "kernel/tools/registry.py:ToolThreads._work": "the same, on the worker thread",
}


def _any_places(relative: str) -> list[str]:
    """Each `Any` written in a module (outside its imports) as "file:name", by enclosing alias,
    class or function."""
    tree = ast.parse((ROOT / relative).read_text(encoding="utf-8"))
    found: list[str] = []

    def visit(node: ast.AST, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                continue
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = [*scope, child.name]
            elif not scope and isinstance(child, ast.Assign | ast.AnnAssign):
                targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                inner = [t.id for t in targets if isinstance(t, ast.Name)][:1] or scope
            if isinstance(child, ast.Name) and child.id == "Any":
                found.append(f"{relative}:{'.'.join(scope[:2]) or '<module>'}")
            visit(child, inner)

    visit(tree, [])
    return found


def test_any_is_written_in_the_kernel_only_where_no_precise_type_exists() -> None:
    """Before, the seams said `Any`: the registry's and a call's `interactions`, a sub-agent's
    `spent` tokens, the trace handle of `Agent.task_tools`/`task_finished`, tool results, JSON
    records; each is typed now, and what is left is listed in ALLOWED_ANY."""
    places = {place for relative in KERNEL for place in _any_places(relative)}
    assert places - set(ALLOWED_ANY) == set()
    assert set(ALLOWED_ANY) - places == set(), "an allowance no longer needed: remove it"


@pytest.mark.slow  # about ten seconds when mypy's cache is cold
def test_mypy_strict_passes_on_the_kernel() -> None:
    """`mypy --strict` (with the project's mypy settings: the pydantic plugin) on the kernel and the
    other callers of its hooks; any error fails, and the output names it. The modules they import
    are read for their types, their own errors not reported (`--follow-imports=silent`): whether
    mypy reports them otherwise depends on how the package is installed (editable or not)."""
    files = [str(ROOT / relative) for relative in (*KERNEL, *HOOK_CALLERS)]
    config = ["--config-file", str(PROJECT / "pyproject.toml"), "--follow-imports=silent"]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", *config, *files],
        cwd=PROJECT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Success: no issues found in 16 source files"), done.stdout
