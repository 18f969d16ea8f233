"""The built-in tools, safe by default (T7): what an agent gets without writing a tool itself.

Always: calculator, current_time, date_diff (pure functions, level 0), and clarify (offered when
the agent has someone to ask: tasks/pending.py). With a workspace:
read_file and list_directory (level 0) and write_file (level 1), confined to that directory.
With a workspace *and* a non-empty list of allowed programs: run_command (level 2). The shell is
off unless configuration names the programs, because a command's effects cannot be known; it runs
them in the bubblewrap sandbox when the machine has one (`shell_sandbox`, tools/sandbox.py).
"""

from __future__ import annotations

from pathlib import Path

from ..kernel.tools.declare import Tool
from .clarify import clarify
from .examples import calculator_tool, current_time, date_diff
from .files import Workspace, file_tools
from .sandbox import DEFAULT_SANDBOX, SandboxMode
from .shell import run_command_tool


def builtin_tools(
    workspace: Path | Workspace | None,
    *,
    shell_allow: list[str] | None = None,
    shell_sandbox: SandboxMode = DEFAULT_SANDBOX,
) -> list[Tool]:
    """The built-in tools for an agent: see the module docstring for what each argument turns on.

    Pass a `Workspace` instead of a path to change its size limits, quota or protected paths; a
    folder holding the service's secrets, configuration or database raises `WorkspaceError`.
    `shell_allow` names the programs run_command may start (e.g. ["ls", "git"]); it needs a
    workspace, which becomes the programs' working directory. `shell_sandbox`: `auto`, `bwrap`
    or `none` (tools/sandbox.py).
    """
    tools: list[Tool] = [calculator_tool, current_time, date_diff, clarify]
    if workspace is None:
        if shell_allow:
            raise ValueError("run_command needs a workspace to run in; pass workspace=… with shell_allow")
        return tools
    space = workspace if isinstance(workspace, Workspace) else Workspace(workspace)
    tools.extend(file_tools(space))
    if shell_allow:
        tools.append(run_command_tool(space.root, shell_allow, sandbox=shell_sandbox, private=space.private))
    return tools


__all__ = ["builtin_tools", "date_diff"]
