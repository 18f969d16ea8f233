"""The sandbox run_command starts programs in: bubblewrap when the machine has a working one.

Checking a program's name and arguments (command_rules.py) cannot stop everything an allowed
program might do, such as reading the service's secrets from `/proc/<parent>/environ` or writing
outside the workspace. Bubblewrap (`bwrap`, Debian/Ubuntu package `bubblewrap`) confines it:

- its own pid namespace with a fresh `/proc`: the service and its environment are not visible;
  when the program ends, or bwrap is killed, every process it started dies with the namespace
  (`--unshare-pid`, `--die-with-parent`), including ones that started their own session;
- no network (`--unshare-net`), its own IPC, UTS and (where possible) user namespace, and no
  capabilities (`--cap-drop ALL`, which matters when the service runs as root);
- a clean environment (`--clearenv`: PATH, HOME, LANG only, plus what a rule adds for git);
- a filesystem of read-only system folders (/usr, /bin, /lib*, /sbin and a few files of /etc that
  programs need to start), an empty /dev, a private /tmp, and the workspace as the only writable
  place. The home folders, the data folder and the configuration are simply not there.

`agent.shell_sandbox` chooses: `auto` (bubblewrap if it is installed and a trial run works, else
none, with a WARNING), `bwrap` (bubblewrap or refuse to start) or `none`. The trial run happens
once per process: some containers forbid the namespaces bubblewrap needs.

Without the sandbox run_command still gives a clean environment, a new session and process group
killed on timeout, and the argument checks, but **no filesystem or /proc isolation**: a program
can read and write wherever the service's user can, and one that starts its own session can
outlive the call.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

log = logging.getLogger("hermes_core.tools.shell")

SandboxMode = Literal["auto", "bwrap", "none"]
DEFAULT_SANDBOX: SandboxMode = "auto"  # bubblewrap if it works here (agent.shell_sandbox)
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
SANDBOX_HOME = "/tmp"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What dynamically linked programs, user and group names, time zones and `awk`-style alternatives
# need from /etc; nothing else of it (no credentials, no host configuration) is visible.
_ETC_FILES = (
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/passwd",
    "/etc/group", "/etc/nsswitch.conf", "/etc/localtime", "/etc/timezone", "/etc/mime.types",
    "/etc/magic",
)  # fmt: skip
TRIAL_TIMEOUT = 10.0


class SandboxUnavailable(RuntimeError):
    """`agent.shell_sandbox: bwrap` was asked for, but bubblewrap is missing or cannot run here."""


@dataclass(frozen=True)
class Sandbox:
    """How to start a program: through bubblewrap (`bwrap` is its path) or directly (None)."""

    bwrap: str | None = None
    reason: str = ""  # why there is no sandbox, for the warning and the doctor

    @property
    def isolated(self) -> bool:
        return self.bwrap is not None

    def command(
        self,
        executable: str,
        arguments: list[str],
        workdir: Path,
        env: dict[str, str],
        hidden: tuple[Path, Path | None] | None = None,
    ) -> list[str]:
        """The argv that runs `executable arguments…` in `workdir`, inside the sandbox if there is one;
        `hidden`: a folder of the workspace the program sees empty, and one inside it shown again."""
        if self.bwrap is None:
            return [executable, *arguments]
        return [self.bwrap, *bwrap_options(workdir, env, hidden), "--", executable, *arguments]

    def describe(self) -> str:
        if self.isolated:
            return f"bubblewrap ({self.bwrap}): own pid/net namespaces, only the workspace writable"
        return f"none ({self.reason}): no filesystem or /proc isolation for run_command"


def bwrap_options(
    workdir: Path, env: dict[str, str], hidden: tuple[Path, Path | None] | None = None
) -> list[str]:
    """bubblewrap's options: namespaces, a read-only system, the workspace writable, a clean env."""
    # --cap-drop ALL: bwrap started by root would otherwise keep root's capabilities inside
    options = ["--unshare-all", "--cap-drop", "ALL", "--die-with-parent", "--new-session", "--clearenv"]
    for name, value in env.items():
        options += ["--setenv", name, value]
    for folder in _SYSTEM_DIRS:
        if os.path.islink(folder):  # merged /usr: /bin is a symlink to usr/bin
            options += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            options += ["--ro-bind", folder, folder]
    for file in dict.fromkeys(_ETC_FILES):
        options += ["--ro-bind-try", file, file]
    options += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    options += ["--bind", str(workdir), str(workdir)]
    if hidden is not None:  # other conversations' uploads: an empty tmpfs, the caller's own bound back
        private, shown = hidden
        options += ["--tmpfs", str(private)] + (["--bind", str(shown), str(shown)] if shown else [])
    return [*options, "--chdir", str(workdir)]


def choose_sandbox(mode: SandboxMode, workdir: Path) -> Sandbox:
    """The sandbox for `mode`: bubblewrap after a successful trial run, or none (with a WARNING)."""
    if mode == "none":
        problem = "agent.shell_sandbox is none"
    else:
        found, problem = bwrap_status(str(workdir))
        if found is not None:
            return Sandbox(found)
        if mode == "bwrap":
            raise SandboxUnavailable(f"agent.shell_sandbox is bwrap, but {problem}")
    log.warning(
        "run_command runs WITHOUT a sandbox (%s): there is no filesystem or /proc isolation, so allowed "
        "programs can read and write anything the service's user can, including /proc/<pid>/environ; "
        "install bubblewrap (package bubblewrap) and set agent.shell_sandbox to auto to confine them",
        problem,
    )
    return Sandbox(None, problem)


@lru_cache(maxsize=8)
def bwrap_status(workdir: str) -> tuple[str | None, str]:
    """(path of a working bwrap, "") or (None, why not): one trial run per process and folder."""
    found = shutil.which("bwrap")
    if found is None:
        return None, "bubblewrap (bwrap) is not installed"
    true = shutil.which("true", path=SANDBOX_PATH)
    if true is None:
        return None, "no `true` program to try bubblewrap with"
    argv = [found, *bwrap_options(Path(workdir), {"PATH": SANDBOX_PATH}), "--", true]
    try:
        trial = subprocess.run(argv, capture_output=True, text=True, timeout=TRIAL_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bubblewrap could not be started ({exc})"
    if trial.returncode != 0:
        reason = (trial.stderr or "").strip().splitlines()[-1:] or [f"exit {trial.returncode}"]
        return None, f"bubblewrap does not work here (user namespaces may be disabled): {reason[0]}"
    return found, ""


__all__ = [
    "DEFAULT_SANDBOX", "SANDBOX_PATH", "Sandbox", "SandboxMode", "SandboxUnavailable", "bwrap_options",
    "choose_sandbox",
]  # fmt: skip
