"""Which allowed programs may run with which arguments: the checks run_command makes before it starts one.

An allow-list of program names is only as strong as its weakest entry: many ordinary programs
run another program named in their arguments, so allowing them allows everything. The checks:

1. **Launchers are never allowed** (`LAUNCHERS`): shells (`sh`, `bash`, …), `env`, `xargs`,
   `nohup`, `setsid`, `timeout`, `sudo`, … exist to start the program in their arguments, so an
   allow-list holding one is no allow-list. Configuring one is an error at start-up.
2. **Interpreters only in the sandbox** (`INTERPRETERS`, and `python3`, `perl`, `node`, `lua`…
   under any version suffix): they, `awk` (its `system()` and pipes), `make` (its recipes),
   `sqlite3` (`.shell`), `dc` and `m4`, editors, pagers and mail readers with command escapes,
   `ssh` (ProxyCommand), version control other than git (hooks)… run whatever code they are given.
   Inside the bubblewrap sandbox (sandbox.py) that code is confined (no secrets, no network, only
   the workspace writable), so they may be allowed there; without it, configuring one is an error
   at start-up.
3. **Argument rules** (`ARGUMENT_RULES`), checked on every call, sandbox or not:
   - `find` without `-exec`, `-execdir`, `-ok`, `-okdir`, `-delete`, `-fprint*` and `-fls`;
   - `git` without `-c`, `--config-env` and `--exec-path`; only built-in subcommands that run no
     configured command (an unknown name may be an alias, and an alias starting with `!` is a
     shell command), never `git config`; no `grep -O` (a pager command), `--output`,
     `--ext-diff`, `--upload-pack`, `--receive-pack`, `--exec`. Git also runs with its system and
     global configuration off and with settings that switch off hooks, pager, editor, fsmonitor,
     ssh and gpg commands, which win over the repository's own (`GIT_ENVIRONMENT`). No repository
     outside a `.git` folder (whose config the model could write with write_file): no `--git-dir`,
     `init --bare` / `--separate-git-dir`, and a bare repository only when named. Without the
     sandbox, shell.py also lists the repository's configuration first and refuses a repository
     whose own settings are not all in `_GIT_INERT` (filters and drivers name commands);
   - `tar` without `--checkpoint-action`, `--to-command`, `--use-compress-program`/`-I`,
     `--info-script`/`--new-volume-script`/`-F`, `--rsh-command`, `--rmt-command`;
   - `sed` without `-i`/`--in-place`, and always with GNU `--sandbox` (no `e`, `w`, `r` commands);
   - `zip` without `-TT`/`--unzip-command`; `rsync` without `-e`/`--rsh`/`--rsync-path`.
   Long options count in any unambiguous abbreviation, as getopt accepts them (`--to-com=` is
   `--to-command=`).

These are lists of what is known to be dangerous, not a proof that the rest is harmless: only the
sandbox confines what a program does. Without it, choose the allow-list accordingly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..kernel.tools.declare import ToolError

LAUNCHERS = frozenset(
    {
        "sh", "bash", "dash", "zsh", "ksh", "mksh", "pdksh", "fish", "csh", "tcsh", "ash", "rc", "es",
        "busybox", "toybox", "env", "xargs", "parallel", "nohup", "setsid", "nice", "ionice", "chrt",
        "taskset", "numactl", "prlimit", "setarch", "linux32", "linux64", "timeout", "stdbuf", "time",
        "watch", "flock", "script", "expect", "unbuffer", "rlwrap", "chroot", "unshare", "nsenter",
        "sudo", "su", "sg", "newgrp", "doas", "pkexec", "runuser", "setpriv", "capsh", "fakeroot",
        "faketime", "proot", "strace", "ltrace", "gdb", "valgrind", "catchsegv", "exec", "eval",
        "command", "builtin", "bwrap", "firejail", "nsjail", "systemd-run", "start-stop-daemon",
        "daemonize", "chpst", "dbus-run-session", "xvfb-run", "ssh-agent", "torsocks", "proxychains",
        "proxychains4", "at", "batch", "crontab", "screen", "tmux", "dtach",
    }
)  # fmt: skip
INTERPRETERS = frozenset(
    {
        "irb", "nodejs", "deno", "bun", "R", "Rscript", "julia", "racket", "ghci", "runghc", "osascript",
        "pwsh", "powershell", "octave", "gnuplot", "m4", "dc", "sqlite3", "psql", "mysql", "awk", "gawk",
        "mawk", "nawk", "make", "gmake", "cmake", "ninja", "npm", "npx", "yarn", "pnpm", "pip", "pip3",
        "uv", "cargo", "go", "java", "jshell", "exiftool", "vi", "vim", "rvim", "nvim", "ex", "view",
        "rview", "ed", "emacs", "nano", "editor", "sensible-editor", "less", "more", "most", "pager",
        "sensible-pager", "man", "mail", "mailx", "ssh", "scp", "sftp", "ftp", "telnet", "nc", "ncat",
        "socat", "openssl", "gpg", "hg", "svn", "cvs", "docker", "podman", "kubectl",
    }
)  # fmt: skip
# Interpreters also go by versioned names: python3.11, perl5.36, ruby3.1, lua5.4, php8.2, tclsh8.6…
_VERSIONED = re.compile(r"^(python|pypy|ipython|perl|ruby|node|lua|luajit|php|tclsh|wish|guile)[0-9.]*$")


def refusal_for_allow_list(program: str, sandboxed: bool) -> str | None:
    """Why `program` may not be on run_command's allow-list (here, with or without the sandbox)."""
    if program in LAUNCHERS:
        return (
            f"{program!r} starts the program named in its arguments, so allowing it would allow any program"
        )
    if not sandboxed and (program in INTERPRETERS or _VERSIONED.match(program)):
        return (
            f"{program!r} runs code given in its arguments or files; it can be allowed only inside the "
            "bubblewrap sandbox (install bubblewrap and set agent.shell_sandbox to auto or bwrap)"
        )
    return None


def program_environment(program: str) -> dict[str, str]:
    """Variables added to the minimal environment for this program (git: its overrides)."""
    return dict(GIT_ENVIRONMENT) if program == "git" else {}


def repository_refusal(listing: bytes) -> ToolError | None:
    """Why git must not run in a repository whose configuration is `listing` (the output of
    `git config --list --show-scope -z`), or None: its own settings that name a program or a file."""
    entries = listing.decode("utf-8", errors="replace").split("\0")
    for scope, setting in zip(entries[::2], entries[1::2], strict=False):
        key = setting.split("\n", 1)[0].lower()
        if scope in ("local", "worktree") and not _GIT_INERT.fullmatch(key):
            return _refuse(
                "git", f"in a repository that sets {key}",
                "a repository's own configuration can name a command git runs (a filter, a driver, an "
                "include); without the sandbox only plain settings are allowed",
            )  # fmt: skip
    return None


def git_config_listing(arguments: Sequence[str]) -> list[str]:
    """The arguments that list the configuration the git call `arguments` would read (its global
    options, such as `-C dir`, then `config --list --show-scope -z`)."""
    position = 0
    while position < len(arguments) and arguments[position].startswith("-"):
        position += 2 if arguments[position] in _GIT_GLOBAL_WITH_VALUE else 1
    return [*arguments[:position], "config", "--list", "--show-scope", "-z"]


def checked_arguments(command: Sequence[str]) -> list[str]:
    """The argument list to run (`command` itself, or with a safety option added), or a ToolError."""
    rule = ARGUMENT_RULES.get(command[0])
    return rule(list(command)) if rule is not None else list(command)


# -- the rules ------------------------------------------------------------------------------


def _refuse(program: str, what: str, why: str) -> ToolError:
    return ToolError(f"{program} {what} is refused: {why}; run_command does not run it")


def _long_option(argument: str, dangerous: Sequence[str], exact_ok: Sequence[str] = ()) -> str | None:
    """The dangerous long option `argument` names (also abbreviated, as getopt allows), or None."""
    if not argument.startswith("--") or len(argument) < 3:
        return None
    name = argument[2:].split("=", 1)[0]
    if name in exact_ok:
        return None
    return next((option for option in dangerous if option.startswith(name)), None)


def _short_letters(argument: str) -> str:
    """The letters of a bundle of short options (`-xvf` → `xvf`); empty for anything else."""
    return argument[1:] if argument.startswith("-") and not argument.startswith("--") else ""


_FIND_ACTIONS = frozenset(
    {"-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fprint0", "-fprintf", "-fls"}
)


def _find(command: list[str]) -> list[str]:
    for argument in command[1:]:
        if argument in _FIND_ACTIONS:
            raise _refuse("find", argument, "it runs a command, deletes or writes files")
    return command


_GIT_SAFE = frozenset(
    {
        "status", "log", "diff", "show", "add", "commit", "branch", "checkout", "switch", "restore",
        "reset", "rm", "mv", "init", "tag", "stash", "merge", "rev-parse", "rev-list", "ls-files",
        "ls-tree", "blame", "grep", "shortlog", "describe", "cherry-pick", "revert", "clean",
        "format-patch", "apply", "notes", "reflog", "show-ref", "diff-tree", "diff-files", "diff-index",
        "cat-file", "count-objects", "name-rev", "whatchanged", "version", "annotate", "range-diff",
    }
)  # fmt: skip
# Settings that win over the repository's own configuration (which another allowed program may have
# written): no hooks, pager, editor, fsmonitor, ssh or gpg command.
_GIT_OVERRIDES = {
    "core.fsmonitor": "false", "core.hooksPath": "/dev/null", "core.pager": "cat", "core.editor": "false",
    "sequence.editor": "false", "core.sshCommand": "false", "core.askPass": "false",
    "protocol.allow": "never", "gpg.program": "false", "commit.gpgSign": "false", "tag.gpgSign": "false",
    "log.showSignature": "false", "safe.bareRepository": "explicit",
}  # fmt: skip
GIT_ENVIRONMENT = {
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_PAGER": "cat", "GIT_EDITOR": "false",
    "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_COUNT": str(len(_GIT_OVERRIDES)),
    **{f"GIT_CONFIG_KEY_{n}": key for n, key in enumerate(_GIT_OVERRIDES)},
    **{f"GIT_CONFIG_VALUE_{n}": value for n, value in enumerate(_GIT_OVERRIDES.values())},
}  # fmt: skip
_GIT_GLOBAL_WITH_VALUE = frozenset({"-C", "--git-dir", "--work-tree", "--namespace"})
# A repository whose configuration lies outside a `.git` folder (which write_file refuses): a bare
# one, or one named by --git-dir or a `.git` file. Its config is a file the model can write.
_GIT_ELSEWHERE = ("git-dir", "bare", "separate-git-dir")
_ELSEWHERE = "a repository outside .git has a configuration anyone can write"
# What a repository's own configuration may hold when git runs without the sandbox: settings that
# name no program and no other file. Everything else — a filter, diff or merge driver, an include,
# a credential helper, a work tree elsewhere — is refused before git starts (repository_refusal).
_GIT_INERT = re.compile(
    r"core\.(?:repositoryformatversion|filemode|bare|logallrefupdates|ignorecase|precomposeunicode|symlinks"
    r"|autocrlf|eol|safecrlf|quotepath|abbrev|whitespace|checkstat|trustctime|compression|sharedrepository)"
    r"|user\.(?:name|email)|init\.defaultbranch|extensions\.(?:objectformat|worktreeconfig)"
    r"|branch\.[^\n]+\.(?:remote|merge|rebase|description)|remote\.[^\n]+\.(?:url|pushurl|fetch|push|tagopt)"
    r"|pull\.(?:rebase|ff)|push\.default|fetch\.prune|merge\.(?:ff|conflictstyle)|gc\.auto|i18n\.[a-z]+"
    r"|diff\.(?:renames|algorithm|mnemonicprefix|noprefix)|color\.[a-z.]+|log\.(?:date|decorate)|status\.[a-z]+"
)
_GIT_DANGEROUS_LONG = (
    "exec-path", "config-env", "upload-pack", "receive-pack", "exec", "open-files-in-pager", "ext-diff",
    "extcmd", "tool", "output",
)  # fmt: skip


def _git(command: list[str]) -> list[str]:
    position = 1
    while position < len(command) and command[position].startswith("-"):
        option = command[position]
        if option == "-c" or option.startswith("-c") and not option.startswith("--"):
            raise _refuse("git", "-c", "a -c setting can name a command git runs (an alias, a pager, a hook)")
        if _long_option(option, ("exec-path", "config-env")):
            raise _refuse(
                "git", option.split("=", 1)[0], "it makes git run programs of the caller's choosing"
            )
        if _long_option(option, ("git-dir",)):
            raise _refuse("git", "--git-dir", _ELSEWHERE)
        position += 2 if option in _GIT_GLOBAL_WITH_VALUE else 1
    if position == len(command):  # no subcommand: git prints its usage
        return command
    subcommand = command[position]
    if subcommand not in _GIT_SAFE:
        raise _refuse(
            "git", repr(subcommand),
            "only built-in subcommands that run no configured command are allowed (an unknown name may be "
            f"an alias, and `git config` can define one); allowed: {', '.join(sorted(_GIT_SAFE))}",
        )  # fmt: skip
    for argument in command[position + 1 :]:
        if argument.startswith("!"):
            raise _refuse("git", repr(argument), "a leading '!' is a shell command to git")
        if subcommand == "init" and (found := _long_option(argument, _GIT_ELSEWHERE)):
            raise _refuse("git", f"init --{found}", _ELSEWHERE)
        pager = argument.startswith("-O") or subcommand == "grep" and "O" in _short_letters(argument)
        if (found := _long_option(argument, _GIT_DANGEROUS_LONG)) or pager:  # grep -O<pager>, also -iO
            raise _refuse(
                "git", f"--{found}" if found else "-O", "it makes git run another program or write a file"
            )
    return command


_TAR_DANGEROUS_LONG = ("checkpoint-action", "to-command", "use-compress-program", "info-script",
                       "new-volume-script", "rsh-command", "rmt-command")  # fmt: skip


def _tar(command: list[str]) -> list[str]:
    for index, argument in enumerate(command[1:], start=1):
        found = _long_option(argument, _TAR_DANGEROUS_LONG, exact_ok=("checkpoint",))
        if found:
            raise _refuse("tar", f"--{found}", "it runs a command")
        old_style = index == 1 and not argument.startswith("-")  # `tar xIf …`: letters without a dash
        letters = argument if old_style else _short_letters(argument)
        if "I" in letters or "F" in letters:
            raise _refuse("tar", "-I/-F", "it runs a compression program or a volume script")
    return command


def _sed(command: list[str]) -> list[str]:
    takes_value = False
    for argument in command[1:]:
        if takes_value:  # the script, file or length after -e, -f or -l
            takes_value = False
            continue
        if _long_option(argument, ("in-place",)):
            raise _refuse("sed", "--in-place", "it rewrites files, wherever their names point")
        for position, letter in enumerate(_short_letters(argument)):
            if letter == "i":
                raise _refuse("sed", "-i", "it rewrites files, wherever their names point")
            if letter in "efl":  # the rest of the bundle, or else the next argument, is its value
                takes_value = position == len(argument) - 2
                break
    return [command[0], "--sandbox", *command[1:]]  # GNU sed: refuses its e, w and r commands


def _zip(command: list[str]) -> list[str]:
    for argument in command[1:]:
        if argument == "-TT" or _long_option(argument, ("unzip-command",)):
            raise _refuse("zip", "-TT/--unzip-command", "it runs a command to test the archive")
    return command


def _rsync(command: list[str]) -> list[str]:
    for argument in command[1:]:
        if _long_option(argument, ("rsh", "rsync-path")) or "e" in _short_letters(argument):
            raise _refuse("rsync", "-e/--rsh/--rsync-path", "it names the program rsync runs")
    return command


ARGUMENT_RULES: dict[str, Callable[[list[str]], list[str]]] = {
    "find": _find,
    "git": _git,
    "tar": _tar,
    "sed": _sed,
    "gsed": _sed,
    "zip": _zip,
    "rsync": _rsync,
}

__all__ = [
    "ARGUMENT_RULES", "INTERPRETERS", "LAUNCHERS", "checked_arguments", "program_environment",
    "refusal_for_allow_list",
]  # fmt: skip
