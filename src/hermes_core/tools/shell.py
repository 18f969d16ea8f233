"""run_command: run one allow-listed program in the workspace. Off unless configured.

This is a level-2 tool (its effects cannot be known, so they count as irreversible) and it only
exists when the configuration names the programs it may start. What it guarantees:

- **No shell.** The command is a list `[program, arg, …]` given to `create_subprocess_exec`, so
  `;`, `|`, `$(…)`, `*` and `>` in an argument are plain characters, never interpreted.
- **Exact program names.** `command[0]` must be one of the configured names ("git", not
  "/usr/bin/git" or "./git"); it is looked up on the PATH below.
- **A minimal environment.** The child sees `PATH` and nothing else, so API keys and tokens in
  the agent's environment never reach a program the model chose to run.
- **Bounded time and output.** The program runs in its own process group; on timeout (or if the
  call is cancelled) the whole group is killed, and so is anything it left running after it
  exits. Output (stdout and stderr together, as a terminal shows them) is capped while it is
  read, so `yes` cannot fill memory.

What it does not do: sandbox the program. The working directory is the workspace, but an
allowed program can still read any path its arguments name, and allowing an interpreter
(`python3`, `bash`, `git` with aliases) allows anything it can do. Allow-list accordingly.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from .declare import Tool, ToolError, tool

DEFAULT_OUTPUT_CHARS = 10_000
DEFAULT_MAX_TIMEOUT = 60.0


def run_command_tool(
    root: Path,
    allowed: Sequence[str],
    *,
    max_output_chars: int = DEFAULT_OUTPUT_CHARS,
    max_timeout: float = DEFAULT_MAX_TIMEOUT,
    search_path: str | None = None,
) -> Tool:
    """Build the run_command tool for `root`, limited to the program names in `allowed`.

    `search_path` is the PATH the programs are found on and run with; it defaults to the
    agent's own PATH (a list of directories, not a secret). The model may ask for any timeout
    up to `max_timeout` seconds.
    """
    programs = tuple(dict.fromkeys(allowed))
    if not programs:
        raise ValueError("run_command needs at least one allowed program")
    for name in programs:
        if not name or os.sep in name or (os.altsep and os.altsep in name) or "\x00" in name:
            raise ValueError(f"allowed programs are bare names such as 'git', not paths: {name!r}")
    workdir = Path(root).resolve(strict=True)
    env = {"PATH": search_path if search_path is not None else os.environ.get("PATH", os.defpath)}

    @tool(name="run_command", level=2, idempotent=False, timeout=max_timeout + 5)
    async def run_command(
        command: Annotated[
            list[str],
            Field(min_length=1, description='Program and arguments as a list, e.g. ["git", "status"]'),
        ],
        timeout: Annotated[float, Field(gt=0, description="Seconds before the program is killed")] = 10,
    ) -> dict[str, Any]:
        """Run an allowed program in the workspace and return its exit code and output. There is no shell: pipes, redirects, `;` and $VARS are passed as plain text. 在工作区运行允许的命令（不经过 shell），返回退出码和输出。"""  # noqa: E501
        executable = _check_command(command, programs, env["PATH"])
        return await _run(executable, command, workdir, env, min(timeout, max_timeout), max_output_chars)

    # The schema is built from annotations, which cannot see this function's variables: add them here.
    limits = f"Allowed programs / 允许的程序: {', '.join(programs)}; timeout ≤ {max_timeout:g} s."
    run_command.description += f" {limits}"
    return run_command


def _check_command(command: Sequence[str], programs: Sequence[str], search_path: str) -> str:
    """The executable's full path, or a ToolError the model can act on."""
    if not command:
        raise ToolError("command is empty; give the program and its arguments as a list")
    if any("\x00" in part for part in command):
        raise ToolError("arguments must not contain NUL bytes")
    program = command[0]
    if program not in programs:
        raise ToolError(f"program {program!r} is not allowed; allowed programs: {', '.join(programs)}")
    executable = shutil.which(program, path=search_path)
    if executable is None:
        raise ToolError(f"program {program!r} is allowed but not installed on this machine")
    return executable


async def _run(
    executable: str, command: Sequence[str], cwd: Path, env: dict[str, str], timeout: float, max_chars: int
) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        executable,
        *command[1:],
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group, so a timeout can kill its children too
    )
    if process.stdout is None:  # cannot happen with stdout=PIPE; narrows the type
        raise RuntimeError("subprocess has no stdout pipe")
    reader = asyncio.ensure_future(_read_capped(process.stdout, max_chars * 4))  # ≤ 4 UTF-8 bytes a char
    finished = asyncio.ensure_future(_output_and_exit(process, reader))
    try:
        done, _ = await asyncio.wait({finished}, timeout=timeout)
    finally:
        _kill_group(process.pid)  # on timeout, on cancellation, and any leftover background child
    kept, total = await reader  # the group is dead, so every pipe writer is gone: EOF comes at once
    exit_code = await process.wait()
    result: dict[str, Any] = {"exit_code": exit_code, "output": _cap(kept, total, max_chars)}
    if not done:
        result["error"] = f"command timed out after {timeout:g} s and was killed"
    return result


async def _output_and_exit(process: asyncio.subprocess.Process, reader: asyncio.Future[Any]) -> None:
    """Done when the output is at EOF *and* the program has exited (closing stdout comes first)."""
    await reader
    await process.wait()


async def _read_capped(stream: asyncio.StreamReader, keep: int) -> tuple[bytes, int]:
    """Read to EOF, keeping the first `keep` bytes and counting the rest."""
    kept = bytearray()
    total = 0
    while chunk := await stream.read(65536):
        total += len(chunk)
        if len(kept) < keep:
            kept += chunk[: keep - len(kept)]
    return bytes(kept), total


def _cap(kept: bytes, total: int, max_chars: int) -> str:
    text = kept.decode("utf-8", errors="replace")
    if len(text) <= max_chars and len(kept) == total:
        return text
    return f"{text[:max_chars]}\n[output truncated: {total:,} bytes in all, first {max_chars:,} chars shown]"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # already gone
        pass


__all__ = ["run_command_tool"]
