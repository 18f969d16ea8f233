"""Attacks on run_command, each performed end to end: a scripted model calls the built-in tool
through the agent (or a real `serve` process and the fake OpenAI-compatible server), and the
attack must fail. Before these checks the allow-list looked at the program name only, so every
allowed `find`, `git`, `tar`, `sed`, `awk`, `env` or `xargs` could run a shell.

The exec escapes come from the GTFOBins catalogue (gtfobins.github.io: find, git, tar, sed, awk,
env, xargs, nohup, perl "Shell" and "Command" entries). Tests that need bubblewrap are skipped with
a reason when it is missing or does not work here (package `bubblewrap`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hermes_core import Agent
from hermes_core.kernel.tools.permissions import Policy
from hermes_core.tasks.pending import InlineInteractions, Pending
from hermes_core.testing import ScriptedModel, call, reply
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from hermes_core.tools.builtin import builtin_tools
from serve_process import CLEAN_ENV
from waiting import eventually

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox and /proc checks are Linux's")


def bwrap_problem() -> str:
    """Why bubblewrap cannot be used here ("" when it can): missing, or no namespaces allowed."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (package bubblewrap)"
    trial = ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    done = subprocess.run(trial, capture_output=True, text=True, check=False)
    return f"bwrap does not work here: {done.stderr.strip()}" if done.returncode else ""


BWRAP_PROBLEM = bwrap_problem() if sys.platform == "linux" else "not Linux"
needs_bwrap = pytest.mark.skipif(bool(BWRAP_PROBLEM), reason=f"needs bubblewrap: {BWRAP_PROBLEM}")
needs_perl = pytest.mark.skipif(
    shutil.which("perl", path="/usr/bin:/bin") is None, reason="needs perl in /usr/bin"
)
MODES = ["none", pytest.param("bwrap", marks=needs_bwrap)]


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    """A workspace (a git repository holding victim.txt and seed.tar) and a folder outside it."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (ws / "victim.txt").write_text("original\n")
    (ws / "hello.txt").write_text("hello\n")
    with tarfile.open(ws / "seed.tar", "w") as archive:
        archive.add(ws / "hello.txt", arcname="hello.txt")
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(ws)], check=True, env=CLEAN_ENV)
    execdir = outside / "execdir"  # for `git --exec-path`: a git-pwn "subcommand" of the attacker's
    execdir.mkdir()
    (execdir / "git-pwn").write_text(f"#!/bin/sh\ntouch {outside}/pwned\n")
    (execdir / "git-pwn").chmod(0o755)
    return {"ws": ws, "outside": outside, "out": outside / "pwned", "execdir": execdir}


async def approve(pending: Pending) -> bool:
    return True


async def no_answer(question: str) -> str:
    return ""


async def attempt(ws: Path, allowed: list[str], commands: list[list[str]], mode: str) -> list[str]:
    """Give the agent run_command with `allowed`, and let the model call each command in turn.

    Returns what the model was told for each call, or one line saying the tools could not even be
    made (the start-up refusal of an allow-list that holds a launcher)."""
    try:
        tools = builtin_tools(ws, shell_allow=allowed, shell_sandbox=mode)  # type: ignore[arg-type]
    except ValueError as exc:
        return [f"refused at start-up: {exc}"]
    model = ScriptedModel([*(call("run_command", {"command": c}) for c in commands), reply("done")])
    policy = Policy.from_lists(allow_irreversible=["run_command"])
    agent = Agent(model=model, tools=tools, permissions=policy, max_tool_calls=10)
    agent.use_interactions(InlineInteractions(approve, no_answer))  # a person approves every call
    result = await agent.run("tidy up the workspace")
    return [outcome.content for outcome in result.tool_calls]


def fill(part: str, places: dict[str, Path]) -> str:
    return part.replace("{out}", str(places["out"])).replace("{execdir}", str(places["execdir"]))


ESCAPES: dict[str, tuple[list[str], list[list[str]]]] = {
    "find -exec": (["find"], [["find", ".", "-maxdepth", "0", "-exec", "touch", "{out}", ";"]]),
    "find -execdir sh": (
        ["find"],
        [["find", ".", "-maxdepth", "0", "-execdir", "sh", "-c", "touch {out}", ";"]],
    ),
    "find -ok": (["find"], [["find", ".", "-maxdepth", "0", "-ok", "touch", "{out}", ";"]]),
    "find -delete": (["find"], [["find", "victim.txt", "-delete"]]),
    "find -fprint": (["find"], [["find", ".", "-maxdepth", "0", "-fprint", "{out}"]]),
    "git -c alias !": (["git"], [["git", "-c", "alias.x=!touch {out}", "x"]]),
    "git config alias then call it": (["git"], [["git", "config", "alias.x", "!touch {out}"], ["git", "x"]]),
    "git config fsmonitor then status": (
        ["git"],
        [["git", "config", "core.fsmonitor", "touch {out}"], ["git", "status"]],
    ),
    "git --exec-path": (["git"], [["git", "--exec-path={execdir}", "pwn"]]),
    "git grep -O pager": (["git"], [["git", "grep", "--no-index", "-iOtouch {out}", "hello"]]),
    "tar --checkpoint-action": (
        ["tar"],
        [["tar", "-cf", "a.tar", "--checkpoint=1", "--checkpoint-action=exec=touch {out}", "victim.txt"]],
    ),
    "tar --checkpoint-action abbreviated": (
        ["tar"],
        [["tar", "-cf", "a.tar", "--checkpoint=1", "--checkpoint-act=exec=touch {out}", "victim.txt"]],
    ),
    "tar old-style cI": (["tar"], [["tar", "cIf", "touch {out}; cat", "c.tar.x", "victim.txt"]]),
    "tar --to-command": (["tar"], [["tar", "-xf", "seed.tar", "--to-command=touch {out}"]]),
    "tar -I": (["tar"], [["tar", "-I", "touch {out}; cat", "-cf", "a.tar.x", "victim.txt"]]),
    "tar --use-compress-program": (
        ["tar"],
        [["tar", "--use-compress-program=touch {out}", "-cf", "b.tar.x", "victim.txt"]],
    ),
    "sed e command": (["sed"], [["sed", "1e touch {out}", "victim.txt"]]),
    "sed s///e flag": (["sed"], [["sed", "s|.*|touch {out}|e", "victim.txt"]]),
    "sed w command": (["sed"], [["sed", "-n", "w {out}", "victim.txt"]]),
    "sed -i": (["sed"], [["sed", "-i", "s/.*/corrupted/", "victim.txt"]]),
    "sed -ni bundle": (["sed"], [["sed", "-ni", "s/.*/corrupted/p", "victim.txt"]]),
    "awk system()": (["awk"], [["awk", 'BEGIN{system("touch {out}")}']]),
    "awk pipe": (["awk"], [["awk", 'BEGIN{print 1 | "touch {out}"}']]),
    "env": (["env"], [["env", "touch", "{out}"]]),
    "xargs": (["xargs"], [["xargs", "touch", "{out}"]]),
    "sh -c": (["sh"], [["sh", "-c", "touch {out}"]]),
    "bash -c": (["bash"], [["bash", "-c", "touch {out}"]]),
    "nohup": (["nohup"], [["nohup", "touch", "{out}"]]),
    "perl -e": (["perl"], [["perl", "-e", "open(my $f, '>', '{out}')"]]),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(ESCAPES))
async def test_allowed_programs_cannot_run_a_command_of_the_models_choosing(
    places: dict[str, Path], case: str, mode: str
) -> None:
    """The attack: the operator allows an ordinary program; the model hands it arguments that make
    it run `touch <outside>/pwned` (or delete or rewrite a workspace file). Each is refused at
    start-up or at the call, or, inside the sandbox, cannot reach outside the workspace."""
    allowed, commands = ESCAPES[case]
    program = allowed[0]
    if shutil.which(program) is None:
        pytest.skip(f"{program} is not installed")
    filled = [[fill(part, places) for part in c] for c in commands]
    told = await attempt(places["ws"], allowed, filled, mode)
    assert not places["out"].exists(), f"{case}: the command ran: {told}"
    assert (places["ws"] / "victim.txt").read_text() == "original\n", f"{case}: victim changed: {told}"
    assert not (places["ws"] / "pwned").exists()
    assert all("approval" not in t for t in told), told  # the calls really reached run_command
    if mode == "none":  # no sandbox to confine it: the check itself must refuse
        assert (
            told[0].startswith("refused at start-up") or "is refused" in told[0] or "sandbox mode" in told[0]
        ), told


async def test_the_refusals_tell_the_model_why(places: dict[str, Path]) -> None:
    """What the model reads when its escape is refused: the option, and that it runs a command."""
    if shutil.which("find") is None or shutil.which("git") is None:
        pytest.skip("needs find and git")
    told = await attempt(
        places["ws"], ["find", "git"],
        [["find", ".", "-exec", "id", ";"], ["git", "-c", "alias.x=!id", "x"], ["git", "x"]], "none",
    )  # fmt: skip
    errors = [json.loads(t)["error"] for t in told]
    assert "-exec is refused" in errors[0] and "runs a command" in errors[0]
    assert "-c is refused" in errors[1]
    assert "'x' is refused" in errors[2] and "alias" in errors[2]
    ok = await attempt(places["ws"], ["git"], [["git", "status", "--short"]], "none")
    assert json.loads(ok[0])["exit_code"] == 0  # ordinary git still works


# A repository configuration whose filter runs a command on `git add` (git-scm.com/docs/gitattributes,
# "filter"); `core.worktree` points a bare repository's work tree back at the workspace.
FILTER_CONFIG = '[core]\n\tbare = false\n\tworktree = ..\n[filter "x"]\n\tclean = touch {out}\n'
BARE_REPOSITORY = [  # what git looks for to call a folder a bare repository, written with write_file
    ("write_file", {"path": "r/HEAD", "content": "ref: refs/heads/main\n"}),
    ("write_file", {"path": "r/objects/info/x", "content": ""}),
    ("write_file", {"path": "r/refs/heads/x", "content": ""}),
]
REPOSITORY_ATTACKS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "a bare repository found in a folder": [
        ("run_command", {"command": ["git", "init", "--bare", "r"]}),
        *BARE_REPOSITORY,
        ("write_file", {"path": "r/config", "content": FILTER_CONFIG}),
        ("write_file", {"path": ".gitattributes", "content": "* filter=x\n"}),
        ("run_command", {"command": ["git", "-C", "r", "add", "../hello.txt"]}),
    ],
    "a repository named by --git-dir": [
        *BARE_REPOSITORY,
        ("write_file", {"path": "r/config", "content": FILTER_CONFIG.replace("\tworktree = ..\n", "")}),
        ("write_file", {"path": ".gitattributes", "content": "* filter=x\n"}),
        ("run_command", {"command": ["git", "--git-dir=r", "--work-tree=.", "add", "hello.txt"]}),
    ],
    "a .git/config copied in by another allowed program": [
        ("write_file", {"path": "evil", "content": FILTER_CONFIG.replace("\tworktree = ..\n", "")}),
        ("write_file", {"path": ".gitattributes", "content": "* filter=x\n"}),
        ("run_command", {"command": ["cp", "evil", ".git/config"]}),
        ("run_command", {"command": ["git", "add", "hello.txt"]}),
    ],
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(REPOSITORY_ATTACKS))
async def test_git_does_not_obey_a_repository_configuration_the_model_wrote(
    places: dict[str, Path], case: str, mode: str
) -> None:
    """The attack (reported by hand against the last release): with `git` (and `cp`) allowed and
    no sandbox, the model writes a repository configuration with write_file — a bare repository's
    `config`, or one copied over `.git/config` — whose filter is a command, marks every file with it
    in `.gitattributes`, and runs `git add`: git ran the filter. Now a repository outside `.git`
    cannot be made or named, and git does not start in a repository whose own configuration holds
    anything but plain settings."""
    if shutil.which("git") is None or shutil.which("cp") is None:
        pytest.skip("needs git and cp")
    steps = [
        call(
            name,
            {key: fill(value, places) if key == "content" else value for key, value in arguments.items()},
        )
        for name, arguments in REPOSITORY_ATTACKS[case]
    ]
    tools = builtin_tools(places["ws"], shell_allow=["git", "cp"], shell_sandbox=mode)  # type: ignore[arg-type]
    policy = Policy.from_lists(allow_irreversible=["run_command", "write_file"])
    agent = Agent(
        model=ScriptedModel([*steps, reply("done")]), tools=tools, permissions=policy, max_tool_calls=12
    )
    agent.use_interactions(InlineInteractions(approve, no_answer))
    told = [outcome.content for outcome in (await agent.run("tidy up the workspace")).tool_calls]
    assert not places["out"].exists(), f"{case}: the filter ran: {told}"
    if mode == "none":
        assert "is refused" in told[-1] or "not a git repository" in told[-1] or "bare" in told[-1], told


async def test_git_still_runs_in_a_repository_with_plain_settings(places: dict[str, Path]) -> None:
    """Not an attack: a repository with a user name, a remote and a branch is not refused."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    for key, value in [("user.name", "A"), ("remote.origin.url", "https://example.com/r.git"),
                       ("branch.main.remote", "origin"), ("init.defaultBranch", "main")]:  # fmt: skip
        subprocess.run(["git", "-C", str(places["ws"]), "config", key, value], check=True, env=CLEAN_ENV)
    told = json.loads((await attempt(places["ws"], ["git"], [["git", "add", "hello.txt"]], "none"))[0])
    assert told.get("exit_code") == 0, told


# -- inside the sandbox ------------------------------------------------------------------------


def survivors(token: str) -> list[int]:
    """Host pids whose command line holds `token`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
@needs_bwrap
@needs_perl
async def test_a_process_that_starts_its_own_session_dies_with_the_call(places: dict[str, Path]) -> None:
    """The attack: an allowed program forks a child into a new session (`setsid sleep 100 &`),
    which a process-group kill does not reach, and leaves it running after the call returns. In
    the sandbox's pid namespace it dies with the call; checked by scanning the host's pids."""
    token = f"100.{os.getpid()}{int(time.time() * 1000) % 100000}"
    script = (
        f'use POSIX; if (fork() == 0) {{ POSIX::setsid(); exec("sleep", "{token}"); }} print "started\\n";'
    )
    try:
        told = await attempt(places["ws"], ["perl"], [["perl", "-e", script]], "auto")
        assert json.loads(told[0])["output"] == "started\n"
        await eventually(
            lambda: not survivors(token), timeout=3, what="the setsid child to die with the call"
        )
        assert survivors(token) == [], "the setsid child outlived the call"
    finally:
        for pid in survivors(token):
            os.kill(pid, signal.SIGKILL)


@needs_bwrap
@needs_perl
async def test_a_sandboxed_program_cannot_write_outside_read_home_or_use_the_network(
    places: dict[str, Path], tmp_path: Path
) -> None:
    """The attack: an interpreter (allowed because it is sandboxed) writes a file outside the
    workspace, lists the parent's folders and connects to a service on 127.0.0.1. All fail; a
    file in the workspace is written."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    script = (
        "use IO::Socket::INET;"
        f"print(open(my $f, '>', '{places['out']}') ? \"wrote-outside\\n\" : \"no-outside\\n\");"
        f"print(-e '{tmp_path}' && -d '{places['outside']}' ? \"sees-outside\\n\" : \"no-see\\n\");"
        f"my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1:{port}', Timeout => 2);"
        'print($s ? "net\\n" : "no-net\\n");'
        "print(open(my $g, '>', 'inside.txt') ? \"wrote-inside\\n\" : \"no-inside\\n\");"
    )
    try:
        told = await attempt(places["ws"], ["perl"], [["perl", "-e", script]], "auto")
    finally:
        listener.close()
    assert json.loads(told[0])["output"].split() == ["no-outside", "no-see", "no-net", "wrote-inside"]
    assert not places["out"].exists() and (places["ws"] / "inside.txt").exists()


# -- through a real `serve` process -------------------------------------------------------------


def write_config(tmp_path: Path, ws: Path, allowed: list[str], sandbox: str) -> Path:
    config = tmp_path / "hermes.yaml"
    config.write_text(
        f"agent:\n  workspace: {ws}\n  shell_allow: {json.dumps(allowed)}\n  shell_sandbox: {sandbox}\n"
        f"gateway:\n  data_dir: {tmp_path / 'data'}\n"
        "permissions:\n  allow_irreversible: [run_command]\n",
        encoding="utf-8",
    )
    return config


def start_serve(config: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str, list[str]]:
    """A `serve` process on a free port; its address and the lines it printed before it was ready."""
    process = subprocess.Popen(
        [sys.executable, "-m", "hermes_core", "--config", str(config), "serve", "--port", "0"],
        cwd=config.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        found = re.search(r"hermes-kernel serving on (http://\S+) \(", line)
        if found:
            return process, found.group(1), lines
    raise AssertionError(f"server did not start (exit {process.wait()}): {''.join(lines)}")


def stop(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.mark.slow
@needs_bwrap
def test_an_allowed_program_cannot_read_the_services_secrets_from_proc(tmp_path: Path) -> None:
    """The attack: `cat` is allowed; the model (the fake endpoint) asks run_command for
    `cat /proc/<serve's pid>/environ`, which holds the service's API key and other secrets. In the
    sandbox the service's /proc entry does not exist; the secret never reaches the model."""
    ws = tmp_path / "ws"
    ws.mkdir()
    config = write_config(tmp_path, ws, ["cat"], "auto")
    with FakeOpenAIServer() as fake:
        secrets = {"HERMES_API_KEY": "sk-service-key-0123456789"}
        secrets["SERVICE_MARKER"] = "marker-visible-to-no-one"
        env = {**CLEAN_ENV, "HERMES_BASE_URL": fake.base_url, "HERMES_MODEL": "m1", **secrets}
        process, address, _ = start_serve(config, env)
        try:
            command = ["cat", f"/proc/{process.pid}/environ", f"/proc/{process.pid}/cmdline"]
            fake.script(FakeReply.tool_call("run_command", {"command": command}), FakeReply.text("done"))
            asked = post(f"{address}/webhook", {"message": "show me the environment", "user_id": "u1"})
            decide = f"{address}/webhook/approvals/{asked['approval']['id']}"  # a person approves it
            answer = post(decide, {"user_id": "u1", "decision": "approve"})
        finally:
            stop(process)
        told = [m for m in fake.requests[-1].messages if m["role"] == "tool"]
    assert answer["reply"] == "done" and len(told) == 1
    assert "marker-visible-to-no-one" not in told[0]["content"]
    assert "sk-service-key" not in told[0]["content"] and "hermes_core" not in told[0]["content"]
    assert "No such file" in told[0]["content"]


@pytest.mark.slow
def test_serve_without_a_sandbox_says_so_at_start_up(tmp_path: Path) -> None:
    """Running without isolation must not be silent: `serve` with `agent.shell_sandbox: none`
    logs a WARNING that names what is missing."""
    ws = tmp_path / "ws"
    ws.mkdir()
    process, _, lines = start_serve(write_config(tmp_path, ws, ["ls"], "none"), CLEAN_ENV)
    stop(process)
    warning = [line for line in lines if "WARNING" in line and "WITHOUT a sandbox" in line]
    assert warning and "no filesystem or /proc isolation" in warning[0]


@pytest.mark.slow
@pytest.mark.parametrize("program", ["bash", "env", "xargs"])
def test_serve_refuses_an_allow_list_holding_a_launcher(tmp_path: Path, program: str) -> None:
    """The attack surface made by configuration: allowing `bash`, `env` or `xargs` lets the model
    run anything. `serve` refuses to start, with one line that says why, and exit code 2."""
    ws = tmp_path / "ws"
    ws.mkdir()
    config = write_config(tmp_path, ws, ["ls", program], "auto")
    process = subprocess.Popen(
        [sys.executable, "-m", "hermes_core", "--config", str(config), "serve", "--port", "0"],
        cwd=tmp_path, env=CLEAN_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        stop(process)
        pytest.fail(f"serve started with {program} allowed")
    errors = [line for line in output.splitlines() if line.startswith("hermes-kernel:")]
    assert process.returncode == 2, output
    assert len(errors) == 1 and f"'{program}'" in errors[0] and "any program" in errors[0]


ORDINARY = [
    (["find"], ["find", ".", "-name", "*.txt", "-type", "f"], "victim.txt"),
    (["tar"], ["tar", "-tf", "seed.tar"], "hello.txt"),
    (["tar"], ["tar", "--checkpoint=1", "-cf", "out.tar", "hello.txt"], ""),
    (["sed"], ["sed", "-n", "-e", "1p", "victim.txt"], "original"),
    (["sed"], ["sed", "s|original|changed|", "victim.txt"], "changed"),
    (["git"], ["git", "status", "--short"], "?? hello.txt"),
    (["git"], ["git", "add", "hello.txt"], ""),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("allowed", "command", "expected"), ORDINARY)
async def test_ordinary_use_of_the_checked_programs_still_works(
    places: dict[str, Path], allowed: list[str], command: list[str], expected: str, mode: str
) -> None:
    """Not an attack: the checks must not refuse everyday use of find, tar, sed and git."""
    if shutil.which(allowed[0]) is None:
        pytest.skip(f"{allowed[0]} is not installed")
    told = json.loads((await attempt(places["ws"], allowed, [command], mode))[0])
    assert "error" not in told and expected in told["output"] and told["exit_code"] == 0, told


def fake_bwrap(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH finds a `bwrap` that fails, as in a container without user namespaces."""
    folder = tmp_path / "fakebin"
    folder.mkdir()
    (folder / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n"
    )
    (folder / "bwrap").chmod(0o755)
    return {**CLEAN_ENV, "PATH": f"{folder}{os.pathsep}{CLEAN_ENV.get('PATH', os.defpath)}"}


@pytest.mark.slow
def test_a_bubblewrap_that_cannot_run_here_is_detected_at_start_up(tmp_path: Path) -> None:
    """Where bubblewrap is installed but cannot create namespaces, the trial run at start-up finds
    out: `auto` falls back with a WARNING that says why; `bwrap` refuses to start (exit 2)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    env = fake_bwrap(tmp_path)
    process, _, lines = start_serve(write_config(tmp_path, ws, ["ls"], "auto"), env)
    stop(process)
    warning = [line for line in lines if "WARNING" in line and "WITHOUT a sandbox" in line]
    assert warning and "No permissions to create new namespace" in warning[0]
    strict = subprocess.run(
        [sys.executable, "-m", "hermes_core", "--config", str(write_config(tmp_path, ws, ["ls"], "bwrap")),
         "serve", "--port", "0"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert strict.returncode == 2
    assert "shell_sandbox is bwrap, but bubblewrap does not work here" in strict.stderr


@pytest.mark.slow
def test_doctor_has_a_shell_sandbox_line(tmp_path: Path) -> None:
    """The doctor says plainly whether run_command's programs are confined."""
    ws = tmp_path / "ws"
    ws.mkdir()
    config = write_config(tmp_path, ws, ["ls"], "auto")
    (tmp_path / "data").mkdir()
    for env, expected in (
        (fake_bwrap(tmp_path), "FAIL  shell sandbox:"),
        (CLEAN_ENV, "OK    shell sandbox:"),
    ):
        if expected.startswith("OK") and BWRAP_PROBLEM:
            continue
        done = subprocess.run(
            [sys.executable, "-m", "hermes_core", "--config", str(config), "doctor"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        line = next((li for li in done.stdout.splitlines() if "shell sandbox" in li), "")
        assert line.startswith(expected), done.stdout
        if expected.startswith("FAIL"):
            assert "NO filesystem or /proc isolation" in line and "install bubblewrap" in line
