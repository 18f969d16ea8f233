"""run_command: run one allow-listed program in the workspace. Off unless configured.

This is a level-2 tool (its effects cannot be known, so they count as irreversible) and it only
exists when the configuration names the programs it may start. What it guarantees:

- **No shell.** The command is a list `[program, arg, …]` given to `create_subprocess_exec`, so
  `;`, `|`, `$(…)`, `*` and `>` in an argument are plain characters, never interpreted.
- **Exact program names.** `command[0]` must be one of the configured names ("git", not
  "/usr/bin/git" or "./git"); it is looked up on the PATH below.
- **No program that runs other programs.** Launchers (`sh`, `env`, `xargs`, …) cannot be allowed,
  interpreters (`python3`, `awk`, …) only inside the sandbox, and the arguments that make `find`,
  `git`, `tar`, `sed`, `zip` or `rsync` run a command are refused on every call (command_rules.py).
- **A sandbox when the machine has one** (sandbox.py, `agent.shell_sandbox`): with bubblewrap the
  program sees a fresh /proc, no network, read-only system folders and the workspace as the only
  writable place, and everything it starts dies with it. Without bubblewrap a WARNING says so at
  start-up: there is then no filesystem or /proc isolation.
- **Other conversations' uploads out of sight, in the sandbox.** The private folder (`private`,
  `media.folder`: files users sent, one folder per conversation, tools/files.py) is an empty
  tmpfs inside the sandbox, with the calling conversation's own folder bound back in. Without the
  sandbox a program reads what the service's user can, uploads included.
- **A minimal environment.** The child sees `PATH`, `HOME` (an empty private folder), `LANG`, and
  for git the settings that switch off its hooks, pager and editor; API keys and tokens in the
  agent's environment never reach a program the model chose to run.
- **Bounded time and output.** The program runs in its own session and process group; on timeout
  (or if the call is cancelled) the whole group is killed, and so is anything it left running
  after it exits. Output (stdout and stderr together, as a terminal shows them) is capped while it
  is read, so `yes` cannot fill memory.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from ..kernel.redaction import cut_text
from ..kernel.tools.declare import Tool, ToolContext, ToolError, tool
from .command_rules import (
    checked_arguments,
    git_config_listing,
    program_environment,
    refusal_for_allow_list,
    repository_refusal,
)
from .files import conversation_folder
from .sandbox import DEFAULT_SANDBOX, SANDBOX_HOME, SANDBOX_PATH, Sandbox, SandboxMode, choose_sandbox

DEFAULT_OUTPUT_CHARS = 10_000
DEFAULT_MAX_TIMEOUT = 60.0
OUTSIDE_CONVERSATION = ToolContext("", "run_command")  # a direct call: it sees no upload


def run_command_tool(
    root: Path,
    allowed: Sequence[str],
    *,
    max_output_chars: int = DEFAULT_OUTPUT_CHARS,
    max_timeout: float = DEFAULT_MAX_TIMEOUT,
    search_path: str | None = None,
    sandbox: SandboxMode | Sandbox = DEFAULT_SANDBOX,
    private: str | None = None,
) -> Tool:
    """Build the run_command tool for `root`, limited to the program names in `allowed`.
    `private` names the folder of conversations' uploads, hidden in the sandbox but for the
    calling conversation's own.

    `sandbox` is `auto` (bubblewrap if it works here), `bwrap` (or raise `SandboxUnavailable`),
    `none`, or a `Sandbox` already chosen. `search_path` is the PATH the programs are found on
    without a sandbox; it defaults to the agent's own PATH (a list of directories, not a secret).
    Inside the sandbox they are found on its own PATH of system folders. The model may ask for
    any timeout up to `max_timeout` seconds. A name no program may have raises ValueError.
    """
    programs = tuple(dict.fromkeys(allowed))
    if not programs:
        raise ValueError("run_command needs at least one allowed program")
    for name in programs:
        if not name or os.sep in name or (os.altsep and os.altsep in name) or "\x00" in name:
            raise ValueError(f"allowed programs are bare names such as 'git', not paths: {name!r}")
    workdir = Path(root).resolve(strict=True)
    chosen = sandbox if isinstance(sandbox, Sandbox) else choose_sandbox(sandbox, workdir)
    for name in programs:
        if (why := refusal_for_allow_list(name, chosen.isolated)) is not None:
            raise ValueError(f"agent.shell_allow: {why}")
    path = SANDBOX_PATH if chosen.isolated else search_path or os.environ.get("PATH", os.defpath)

    @tool(name="run_command", level=2, idempotent=False, timeout=max_timeout + 5)
    async def run_command(
        command: Annotated[
            list[str],
            Field(min_length=1, description='Program and arguments as a list, e.g. ["git", "status"]'),
        ],
        context: ToolContext = OUTSIDE_CONVERSATION,
        timeout: Annotated[float, Field(gt=0, description="Seconds before the program is killed")] = 10,
    ) -> dict[str, Any]:
        """Run an allowed program in the workspace and return its exit code and output. There is no shell: pipes, redirects, `;` and $VARS are passed as plain text. 在工作区运行允许的命令（不经过 shell），返回退出码和输出。"""  # noqa: E501
        executable, arguments = _check_command(command, programs, path, chosen.isolated)
        with _home(chosen) as home:
            env = {"PATH": path, "HOME": home, "LANG": "C.UTF-8", **program_environment(command[0])}
            if command[0] == "git" and not chosen.isolated:  # no sandbox: git obeys the repository's config
                await _check_repository(executable, arguments, workdir, env)
            hidden = _hidden(workdir, private, context.session_id) if chosen.isolated else None
            argv = chosen.command(executable, arguments, workdir, env, hidden)
            return await _run(argv, workdir, env, min(timeout, max_timeout), max_output_chars)

    # The schema is built from annotations, which cannot see this function's variables: add them here.
    limits = f"Allowed programs / 允许的程序: {', '.join(programs)}; timeout ≤ {max_timeout:g} s."
    run_command.description += f" {limits}"
    run_command.sandbox = chosen  # type: ignore[attr-defined]  # which one was chosen, for callers and tests
    return run_command


def _hidden(workdir: Path, private: str | None, conversation: str | None) -> tuple[Path, Path | None] | None:
    """The private folder to hide in the sandbox and the conversation's own folder to show in it
    (None when it is not a real folder: a symlink planted there is never bound)."""
    if private is None:
        return None
    folder = workdir / private
    own = folder / conversation_folder(conversation) if conversation else None
    return folder, own if own is not None and own.is_dir() and not own.is_symlink() else None


def _check_command(
    command: Sequence[str], programs: Sequence[str], search_path: str, sandboxed: bool
) -> tuple[str, list[str]]:
    """The executable's full path and the arguments to give it, or a ToolError the model can act on."""
    if not command:
        raise ToolError("command is empty; give the program and its arguments as a list")
    if any("\x00" in part for part in command):
        raise ToolError("arguments must not contain NUL bytes")
    program = command[0]
    if program not in programs:
        raise ToolError(f"program {program!r} is not allowed; allowed programs: {', '.join(programs)}")
    arguments = checked_arguments(command)[1:]
    executable = shutil.which(program, path=search_path)
    if executable is None:
        where = "in the sandbox's system folders (/usr, /bin)" if sandboxed else "on this machine"
        raise ToolError(f"program {program!r} is allowed but not installed {where}")
    return executable, arguments


async def _check_repository(executable: str, arguments: list[str], cwd: Path, env: dict[str, str]) -> None:
    """Refuse a git call (ToolError) in a repository whose own configuration names a command or a
    file; a listing git cannot give is a refusal too."""
    listing = await asyncio.create_subprocess_exec(
        executable, *git_config_listing(arguments), cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(listing.communicate(), timeout=10)
    finally:
        if listing.returncode is None:  # still running (timed out, cancelled); once reaped, its id is free
            _kill_group(listing.pid)
    if listing.returncode != 0:
        first = err.decode("utf-8", errors="replace").strip().splitlines()[:1]
        raise ToolError(f"git cannot read this repository's configuration, so it does not run: {first}")
    if (refusal := repository_refusal(out)) is not None:
        raise refusal


@contextmanager
def _home(sandbox: Sandbox) -> Iterator[str]:
    """HOME for one call: the sandbox's private /tmp, or else a fresh empty folder removed afterwards
    (never the workspace, whose files the model writes: git would read a planted ~/.gitconfig)."""
    if sandbox.isolated:
        yield SANDBOX_HOME
        return
    with tempfile.TemporaryDirectory(prefix="hermes-home-", ignore_cleanup_errors=True) as folder:
        yield folder


async def _run(
    argv: Sequence[str], cwd: Path, env: dict[str, str], timeout: float, max_chars: int
) -> dict[str, Any]:
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group, so a timeout can kill its children too
    )
    if process.stdout is None:  # cannot happen with stdout=PIPE; narrows the type
        raise RuntimeError("subprocess has no stdout pipe")
    capture = _Capture(max_chars * 4)  # ≤ 4 UTF-8 bytes a char
    reader = asyncio.ensure_future(capture.read(process.stdout))
    finished = asyncio.ensure_future(_output_and_exit(process, reader))
    try:
        done, _ = await asyncio.wait({finished}, timeout=timeout)
    finally:
        _kill_group(process.pid)  # on timeout, on cancellation, and any leftover background child
    # The group is dead, so its pipe writers are gone and EOF comes at once; only a process that
    # left the group (possible without the sandbox) could hold the pipe open: stop waiting for it.
    _, still_open = await asyncio.wait({reader}, timeout=2)
    for task in (*still_open, finished):
        task.cancel()
    exit_code = await process.wait()
    result: dict[str, Any] = {"exit_code": exit_code, "output": _cap(capture.kept, capture.total, max_chars)}
    if not done:
        result["error"] = f"command timed out after {timeout:g} s and was killed"
    elif still_open:
        result["error"] = "the program left a process running that kept its output open; output was cut off"
    return result


async def _output_and_exit(process: asyncio.subprocess.Process, reader: asyncio.Future[Any]) -> None:
    """Done when the output is at EOF *and* the program has exited (closing stdout comes first)."""
    await reader
    await process.wait()


class _Capture:
    """The output read so far: the first `keep` bytes, and how many there were in all."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.kept = bytearray()
        self.total = 0

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self.total += len(chunk)
            if len(self.kept) < self.keep:
                self.kept += chunk[: self.keep - len(self.kept)]


def _cap(kept: bytes | bytearray, total: int, max_chars: int) -> str:
    text = bytes(kept).decode("utf-8", errors="replace")
    if len(text) <= max_chars and len(kept) == total:
        return text
    shown = cut_text(text, max_chars)[0]  # redacted before the cut: no start of a secret at its edge
    return f"{shown}\n[output truncated: {total:,} bytes in all, first {max_chars:,} chars shown]"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # already gone
        pass


__all__ = ["run_command_tool"]
