"""The top-level packages of hermes_core import each other in one direction only.

Every module's imports are read from its source (ast), relative and absolute `hermes_core.`
ones, at module level, under TYPE_CHECKING and inside functions (a lazy import is still a
dependency). An edge is package A importing package B (A != B); a cycle is a path back to A.
A cycle means neither package can be read, tested or replaced without the other: a channel
author, for one, reads channels/base.py and channels/seam.py, never the gateway's dispatcher.

No cycle is left; an allow-listed one would need its reason below, and the list may only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hermes_core

ROOT = Path(hermes_core.__file__).parent

# (the cycle's packages, why it is still there); each must still exist, so the list only shrinks
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def packages() -> set[str]:
    return {d.name for d in ROOT.iterdir() if d.is_dir() and any(d.glob("*.py"))}


def _module_parts(path: Path) -> list[str]:
    parts = ["hermes_core", *path.relative_to(ROOT).with_suffix("").parts]
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported(path: Path, parts: list[str] | None = None) -> list[tuple[list[str], int]]:
    """Every module `path` (module `parts`) imports, as dotted parts with the line, wherever the
    import is in the file."""
    parts, is_package = parts or _module_parts(path), path.name == "__init__.py"
    found: list[tuple[list[str], int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name.split("."), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = parts if is_package else parts[:-1]
            base = base[: len(base) - (node.level - 1)]
            if node.module:
                found.append(([*base, *node.module.split(".")], node.lineno))
            else:
                found += [([*base, alias.name], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.module.split("."), node.lineno))
    return found


def package_edges() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> where ("file:line")."""
    names = packages()
    edges: dict[str, dict[str, list[str]]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = _module_parts(path)
        if len(parts) < 3 or parts[1] not in names:
            continue
        for target, line in imported(path):
            if (
                target[0] == "hermes_core"
                and len(target) > 1
                and target[1] in names
                and target[1] != parts[1]
            ):
                where = f"{path.relative_to(ROOT)}:{line}"
                edges.setdefault(parts[1], {}).setdefault(target[1], []).append(where)
    return edges


def cycles(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """Every simple cycle, each once (starting at its smallest package)."""
    found: list[list[str]] = []
    for start in sorted(edges):
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges.get(node, {})):
                if nxt == start:
                    found.append(path)
                elif nxt > start and nxt not in path:
                    stack.append((nxt, [*path, nxt]))
    return found


def describe(cycle: list[str], edges: dict[str, dict[str, list[str]]]) -> str:
    steps = zip(cycle, [*cycle[1:], cycle[0]], strict=True)
    return (
        " -> ".join(cycle + cycle[:1]) + ": " + "; ".join(f"{a}->{b} at {edges[a][b][0]}" for a, b in steps)
    )


def test_no_import_cycle_between_packages() -> None:
    """Attack: a module that imports back up the layers (a channel importing the gateway, the
    console imported by the gateway and importing it). Every cycle found that is not allow-listed
    fails, naming the import lines that close it."""
    edges = package_edges()
    new = [c for c in cycles(edges) if frozenset(c) not in KNOWN_CYCLES]
    assert not new, "import cycles between packages:\n" + "\n".join(describe(c, edges) for c in new)


def test_allow_list_only_shrinks() -> None:
    """An allow-listed cycle that is gone must leave the list, so it cannot come back unnoticed."""
    present = {frozenset(c) for c in cycles(package_edges())}
    stale = [sorted(c) for c in KNOWN_CYCLES if c not in present]
    assert not stale, f"these cycles are gone: remove them from KNOWN_CYCLES: {stale}"


def test_channels_import_no_gateway() -> None:
    """Attack: a channel that reaches into the dispatcher. A channel sees only channels/seam.py
    (messages, `Inbox`) and channels/base.py; the `Gateway` implements `Inbox`."""
    edges = package_edges()
    assert "gateway" not in edges.get("channels", {}), edges["channels"]["gateway"]


# what the console may import of the gateway: the seams it reads, never the dispatcher, runner or server
CONSOLE_SEES = {"hermes_core.gateway.view", "hermes_core.gateway.store"}


def test_the_console_sees_the_gateway_only_through_its_view() -> None:
    """Attack: the console reaching into the dispatcher, or the gateway importing the console (the
    gateway store's own types once lived in console/pages.py, and serve mounted the console from
    gateway/). The console reads a gateway through gateway/view.py (`GatewayView`, which the
    `Gateway` and engine/temporal's node implement) and the store's types in gateway/store.py; the
    gateway imports nothing of the console, lazily or not. The process that serves both is above
    them (server.py)."""
    edges = package_edges()
    assert "console" not in edges.get("gateway", {}), edges["gateway"]["console"]
    reached = [
        f"{path.relative_to(ROOT)}:{line} imports {'.'.join(target)}"
        for path in sorted((ROOT / "console").rglob("*.py"))
        for target, line in imported(path)
        if target[:2] == ["hermes_core", "gateway"] and ".".join(target) not in CONSOLE_SEES
    ]
    assert not reached, "\n".join(reached)


def test_the_scan_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The parser itself: relative imports (at module level, under TYPE_CHECKING, in a function) and
    an absolute one are all found."""
    source = (
        "from . import a\nif TYPE_CHECKING:\n    from ..sessions import store\n\n"
        "def f():\n    from ..gateway.dispatcher import Gateway\n    import hermes_core.tools\n"
    )
    (tmp_path / "m.py").write_text(source)
    found = {".".join(t) for t, _ in imported(tmp_path / "m.py", ["hermes_core", "channels", "m"])}
    wanted = {"hermes_core.channels.a", "hermes_core.sessions", "hermes_core.gateway.dispatcher"}
    wanted.add("hermes_core.tools")
    assert wanted <= found


def test_the_kernel_imports_only_itself() -> None:
    """Attack: the loop or the tool seam reaching into a channel, a store or the HTTP client. Every
    hermes_core module kernel/ imports (lazily or not, top-level modules included) is in kernel/;
    the assembly of a task from the outer packages is agent.py and stack.py, outside it."""
    outward = [
        f"{path.relative_to(ROOT)}:{line} imports {'.'.join(target)}"
        for path in sorted((ROOT / "kernel").rglob("*.py"))
        for target, line in imported(path)
        if target[0] == "hermes_core" and target[1:2] != ["kernel"] and target != ["hermes_core"]
    ]
    assert not outward, "\n".join(outward)
