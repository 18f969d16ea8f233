"""Built-in tools (T7): the workspace sandbox of the file tools, the off-by-default shell, date_diff."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_core.kernel.messages import ToolCall
from hermes_core.tools import Tool, ToolError, ToolRegistry
from hermes_core.tools.builtin import builtin_tools
from hermes_core.tools.files import Workspace, file_tools
from hermes_core.tools.shell import run_command_tool
from waiting import eventually

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="the sandbox needs POSIX openat")
pytestmark = posix_only


@pytest.fixture
def root(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return workspace


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory next to the workspace holding a secret the tools must never reach."""
    secret_dir = tmp_path / "outside"
    secret_dir.mkdir()
    (secret_dir / "secret.txt").write_text("TOP SECRET\n")
    return secret_dir


@pytest.fixture
def ws(root: Path) -> Workspace:
    return Workspace(root)


def by_name(tools: list[Tool]) -> dict[str, Tool]:
    return {t.name: t for t in tools}


# -- normal use ----------------------------------------------------------------------------


def test_write_then_read_and_list(ws: Workspace, root: Path) -> None:
    written = ws.write_file("notes/day1/todo.md", "buy milk\n")
    assert written == {"path": "notes/day1/todo.md", "bytes_written": 9, "appended": False}
    assert (root / "notes/day1/todo.md").read_text() == "buy milk\n"  # parent dirs were created
    ws.write_file("notes/day1/todo.md", "call mum\n", append=True)
    assert ws.read_file("notes/day1/todo.md") == {
        "path": "notes/day1/todo.md",
        "content": "buy milk\ncall mum\n",
    }
    ws.write_file("notes/day1/todo.md", "replaced")
    assert ws.read_file("./notes/day1/todo.md")["content"] == "replaced"

    (root / "b.bin").write_bytes(b"12345")
    listing = ws.list_directory()
    assert listing == {
        "path": ".",
        "total": 2,
        "entries": [{"name": "b.bin", "type": "file", "size": 5}, {"name": "notes", "type": "directory"}],
    }
    assert ws.list_directory("notes")["entries"] == [{"name": "day1", "type": "directory"}]


def test_absolute_path_inside_the_workspace_is_fine(ws: Workspace, root: Path) -> None:
    (root / "a.txt").write_text("hi")
    assert ws.read_file(str(root / "a.txt"))["content"] == "hi"


def test_read_truncates_at_max_chars_and_reports_total_lines(ws: Workspace, root: Path) -> None:
    (root / "log.txt").write_text("".join(f"line {n:03d}\n" for n in range(1, 101)))  # 9 chars a line
    first = ws.read_file("log.txt", max_chars=50)
    assert first["content"] == "".join(f"line {n:03d}\n" for n in range(1, 6))  # whole lines only
    assert first["total_lines"] == 100
    assert first["shown_lines"] == "1-5"
    assert first["truncated"] is True
    assert "start_line=6" in first["hint"]
    assert list(first)[-1] == "content"  # numbers first, so a cap on the whole result cuts the content

    following = ws.read_file("log.txt", max_chars=50, start_line=6)
    assert following["content"].startswith("line 006\n")
    assert following["shown_lines"] == "6-10"


def test_read_line_range(ws: Workspace, root: Path) -> None:
    (root / "poem.txt").write_text("one\ntwo\nthree\nfour\nfive")
    ranged = ws.read_file("poem.txt", start_line=2, end_line=4)
    assert ranged == {
        "path": "poem.txt",
        "total_lines": 5,
        "shown_lines": "2-4",
        "truncated": False,
        "content": "two\nthree\nfour\n",
    }
    assert ws.read_file("poem.txt", start_line=5, end_line=99)["content"] == "five"
    with pytest.raises(ToolError, match="only 5 lines"):
        ws.read_file("poem.txt", start_line=6)
    with pytest.raises(ToolError, match="before start_line"):
        ws.read_file("poem.txt", start_line=3, end_line=2)


def test_a_line_longer_than_max_chars_is_cut_and_says_so(ws: Workspace, root: Path) -> None:
    (root / "one-line.json").write_text("x" * 500)
    result = ws.read_file("one-line.json", max_chars=100)
    assert result["content"] == "x" * 100
    assert result["truncated"] is True and result["total_lines"] == 1
    assert "max_chars" in result["hint"]


def test_undecodable_bytes_are_replaced(ws: Workspace, root: Path) -> None:
    (root / "mixed.txt").write_bytes("你好 ".encode() + b"\xff\xfe end")
    assert ws.read_file("mixed.txt")["content"] == "你好 \ufffd\ufffd end"


def test_list_is_capped_with_a_marker(root: Path) -> None:
    for n in range(12):
        (root / f"f{n:02d}.txt").write_text("x")
    listing = Workspace(root, max_entries=5).list_directory(".")
    assert [entry["name"] for entry in listing["entries"]] == [f"f{n:02d}.txt" for n in range(5)]
    assert listing["total"] == 12
    assert listing["more"] == "… 7 more entries not shown"


def test_symlinks_inside_are_followed_and_listed_without_target(ws: Workspace, root: Path) -> None:
    (root / "real.txt").write_text("real")
    (root / "alias.txt").symlink_to("real.txt")
    assert ws.read_file("alias.txt") == {"path": "real.txt", "content": "real"}
    assert {"name": "alias.txt", "type": "symlink"} in ws.list_directory()["entries"]


# -- size caps -----------------------------------------------------------------------------


def test_read_size_cap(root: Path) -> None:
    (root / "big.txt").write_text("a" * 2000)
    with pytest.raises(ToolError, match="read limit of 1,000 bytes"):
        Workspace(root, max_read_bytes=1000).read_file("big.txt")


def test_write_size_cap(root: Path) -> None:
    with pytest.raises(ToolError, match="the limit is 10 bytes"):
        Workspace(root, max_write_bytes=10).write_file("out.txt", "ü" * 6)  # 12 bytes in UTF-8
    assert not (root / "out.txt").exists()


# -- escapes -------------------------------------------------------------------------------


def make_escapes(root: Path, outside: Path) -> None:
    """Plant every kind of way out: symlinks of files and directories, a dangling one, a FIFO."""
    (root / "passwd-link").symlink_to("/etc/passwd")
    (root / "etc-link").symlink_to("/etc")
    (root / "secret-link").symlink_to(outside / "secret.txt")
    (root / "out-dir").symlink_to(outside)  # a symlinked parent directory
    (root / "dangling").symlink_to(outside / "created-by-tool.txt")
    os.mkfifo(root / "pipe")


READ_ESCAPES = [
    "../../etc/passwd",
    "/etc/passwd",
    "foo/../../x",
    "../outside/secret.txt",
    "../ws/a.txt",  # a path through the root's parent, even one that lands back inside
    "passwd-link",
    "secret-link",
    "etc-link/passwd",
    "out-dir/secret.txt",
    "a.txt\x00.png",
    "pipe",
]
LIST_ESCAPES = ["..", "/", "/etc", "etc-link", "out-dir", "../outside", "x\x00"]
WRITE_ESCAPES = [
    "../evil.txt",
    "{outside}/evil.txt",
    "out-dir/new.txt",
    "out-dir/sub/new.txt",
    "dangling",
    "pipe",
]


def read_in_thread(ws: Workspace, path: str) -> BaseException | dict[str, Any] | None:
    """Run a read in a daemon thread so that a blocking open (of a FIFO) fails the test, not hangs it."""
    box: list[BaseException | dict[str, Any]] = []

    def target() -> None:
        try:
            box.append(ws.read_file(path))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=5)
    return box[0] if box else None


@pytest.mark.parametrize("path", READ_ESCAPES)
def test_read_escapes_are_refused(ws: Workspace, root: Path, outside: Path, path: str) -> None:
    make_escapes(root, outside)
    (root / "a.txt").write_text("inside")
    outcome = read_in_thread(ws, path)
    assert isinstance(outcome, ToolError), f"{path!r} was not refused: {outcome!r}"
    assert str(root) not in str(outcome) and str(outside) not in str(outcome)


@pytest.mark.parametrize("path", LIST_ESCAPES)
def test_list_escapes_are_refused(ws: Workspace, root: Path, outside: Path, path: str) -> None:
    make_escapes(root, outside)
    with pytest.raises(ToolError) as refused:
        ws.list_directory(path)
    assert str(root) not in str(refused.value)


@pytest.mark.parametrize("path", WRITE_ESCAPES)
def test_write_escapes_are_refused(ws: Workspace, root: Path, outside: Path, path: str) -> None:
    make_escapes(root, outside)
    with pytest.raises(ToolError) as refused:
        ws.write_file(path.format(outside=outside), "pwned")
    assert str(root) not in str(refused.value)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


@pytest.mark.parametrize("swapped", ["sub", "sub/secret.txt"])
def test_a_path_swapped_for_a_symlink_after_the_check_is_not_followed(
    ws: Workspace, root: Path, outside: Path, monkeypatch: pytest.MonkeyPatch, swapped: str
) -> None:
    """The TOCTOU race: the path is checked, then a directory or the file becomes a symlink to outside."""
    (root / "sub").mkdir()
    (root / "sub" / "secret.txt").write_text("inside")
    checked = Workspace.resolve

    def check_then_swap(self: Workspace, path: str) -> Any:
        relative = checked(self, path)
        (root / "sub" / "secret.txt").unlink()
        if swapped == "sub":
            (root / "sub").rmdir()
        (root / swapped).symlink_to(outside if swapped == "sub" else outside / "secret.txt")
        return relative

    monkeypatch.setattr(Workspace, "resolve", check_then_swap)
    with pytest.raises(ToolError, match="symlink.*access refused"):
        ws.read_file("sub/secret.txt")


def test_fifos_are_refused_without_blocking(ws: Workspace, root: Path) -> None:
    os.mkfifo(root / "pipe")
    outcome = read_in_thread(ws, "pipe")
    assert isinstance(outcome, ToolError) and "not a regular file" in str(outcome)
    with pytest.raises(ToolError, match="not a regular file"):
        ws.write_file("pipe", "x")  # no reader: opening it for writing fails at once
    with open(os.open(root / "pipe", os.O_RDONLY | os.O_NONBLOCK), "rb"):  # now with a reader
        with pytest.raises(ToolError, match="not a regular file"):
            ws.write_file("pipe", "x", append=True)


def test_device_files_are_refused() -> None:
    """A workspace rooted where devices live still reads only regular files."""
    with pytest.raises(ToolError, match="regular file"):
        Workspace(Path("/dev")).read_file("null")


async def test_the_model_facing_path_returns_refusals_as_errors(root: Path, outside: Path) -> None:
    make_escapes(root, outside)
    registry = ToolRegistry(file_tools(Workspace(root)))
    calls = [("read_file", {"path": p}) for p in READ_ESCAPES]
    calls += [("list_directory", {"path": p}) for p in LIST_ESCAPES]
    calls += [("write_file", {"path": p.format(outside=outside), "content": "pwned"}) for p in WRITE_ESCAPES]
    for number, (name, arguments) in enumerate(calls):
        outcome = await registry.execute(ToolCall(f"call-{number}", name, json.dumps(arguments)), timeout=5)
        assert not outcome.ok, (name, arguments, outcome.content)
        assert "error" in json.loads(outcome.content)
        assert str(root) not in outcome.content and "TOP SECRET" not in outcome.content
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]

    (root / "fine.txt").write_text("fine")
    outcome = await registry.execute(ToolCall("ok", "read_file", '{"path": "fine.txt"}'))
    assert outcome.ok and json.loads(outcome.content)["content"] == "fine"


# -- builtin_tools -------------------------------------------------------------------------


def test_builtin_tools_without_workspace_are_pure_and_read_only() -> None:
    tools = by_name(builtin_tools(None))
    assert list(tools) == ["calculator", "current_time", "date_diff", "clarify"]
    assert all(t.level == 0 for t in tools.values())
    with pytest.raises(ValueError, match="workspace"):
        builtin_tools(None, shell_allow=["ls"])


def test_builtin_tools_shell_only_with_a_non_empty_allow_list(root: Path) -> None:
    assert list(by_name(builtin_tools(root))) == [
        "calculator", "current_time", "date_diff", "clarify", "read_file", "write_file", "list_directory",
    ]  # fmt: skip
    assert "run_command" not in by_name(builtin_tools(root, shell_allow=[]))
    tools = by_name(builtin_tools(root, shell_allow=["ls"]))
    assert tools["run_command"].level == 2
    assert "ls" in tools["run_command"].description
    assert (tools["read_file"].level, tools["list_directory"].level, tools["write_file"].level) == (0, 0, 1)
    assert all(any("\u4e00" <= ch <= "\u9fff" for ch in t.description) for t in tools.values())  # bilingual


def test_date_diff_tool() -> None:
    date_diff = by_name(builtin_tools(None))["date_diff"]
    assert date_diff(start="2024-01-01", end="2024-03-01")["days"] == 60
    with pytest.raises(ToolError, match="ISO"):
        date_diff(start="next tuesday", end="2024-03-01")


# -- run_command ---------------------------------------------------------------------------


def shell(root: Path, *allowed: str, **options: Any) -> Tool:
    return run_command_tool(root, list(allowed), **options)


async def test_only_allowed_programs_run(root: Path) -> None:
    run = shell(root, "echo")
    for command in (["rm", "-rf", "x"], ["/bin/echo", "hi"], ["./echo"], ["ECHO"]):
        with pytest.raises(ToolError, match="not allowed"):
            await run.handler(command=command)
    with pytest.raises(ToolError, match="NUL"):
        await run.handler(command=["echo", "a\x00b"])
    with pytest.raises(ToolError, match="not installed"):
        await shell(root, "no-such-program-hermes")(command=["no-such-program-hermes"])
    with pytest.raises(ValueError, match="bare names"):
        shell(root, "/bin/ls")


async def test_runs_in_the_workspace(root: Path) -> None:
    (root / "sentinel.txt").write_text("x")
    result = await shell(root, "ls").handler(command=["ls"])
    assert result == {"exit_code": 0, "output": "sentinel.txt\n"}


async def test_shell_metacharacters_are_passed_literally(root: Path) -> None:
    (root / "sentinel.txt").write_text("still here")
    arguments = [
        "; rm -rf /",
        "$(whoami)",
        "`touch pwned1`",
        "&& touch pwned2",
        "| tee pwned3",
        "*",
        "> pwned4",
    ]
    result = await shell(root, "echo").handler(command=["echo", *arguments])
    assert result == {"exit_code": 0, "output": " ".join(arguments) + "\n"}
    assert sorted(p.name for p in root.iterdir()) == ["sentinel.txt"]


async def test_timeout_kills_the_process_group(root: Path) -> None:
    started = time.monotonic()
    result = await shell(root, "sleep").handler(command=["sleep", "5"], timeout=0.3)
    assert time.monotonic() - started < 3
    assert "timed out after 0.3 s" in result["error"]
    assert result["exit_code"] < 0  # killed by a signal


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="checks process state in /proc")
@pytest.mark.parametrize("sandbox", ["none", "auto"])
async def test_timeout_kills_children_too(root: Path, tmp_path: Path, sandbox: str) -> None:
    """A program that leaves a child in the background: the child dies with the timeout. `sh` itself
    may not be allowed (it runs anything), so the program is a script of a name of its own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    spawner = bin_dir / "spawner"
    spawner.write_text("#!/bin/sh\nsleep 30 &\necho $!\nwait\n")
    spawner.chmod(0o755)
    run = shell(root, "spawner", search_path=str(bin_dir), sandbox="none")
    if sandbox == "auto":  # inside bubblewrap the script must live where the sandbox can see it
        run = shell(root, "sleep", sandbox="auto")
        if not run.sandbox.isolated:  # type: ignore[attr-defined]
            pytest.skip("bubblewrap is not available here")
        result = await run.handler(command=["sleep", "30"], timeout=0.5)
        assert "timed out" in result["error"]
        return
    result = await run.handler(command=["spawner"], timeout=0.5)
    if "Text file busy" in result["output"]:  # ETXTBSY: a fork elsewhere in this process held the
        result = await run.handler(command=["spawner"], timeout=0.5)  # script's write fd a moment
    assert result["output"].split()[0].isdigit(), result
    child = int(result["output"].split()[0])

    def dead() -> bool:
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True  # gone and reaped
        return state == "Z"  # dead, waiting for its new parent to reap it

    await eventually(dead, timeout=3, what="the background child to die with the call's timeout")


async def test_output_is_capped(root: Path) -> None:
    result = await shell(root, "seq", max_output_chars=1000).handler(command=["seq", "1", "100000"])
    assert result["exit_code"] == 0
    text, marker = result["output"].rsplit("\n[output truncated: ", 1)
    assert len(text) == 1000 and text.startswith("1\n2\n3\n")
    assert marker.startswith("588,895 bytes in all")


async def test_environment_is_minimal(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERMES_API_KEY", "sk-do-not-leak")
    result = await shell(root, "printenv").handler(command=["printenv"])
    assert "sk-do-not-leak" not in result["output"] and "HERMES_API_KEY" not in result["output"]
    names = {line.split("=", 1)[0] for line in result["output"].splitlines()}
    assert {"PATH", "HOME", "LANG"} <= names <= {"PATH", "HOME", "LANG", "PWD"}  # bubblewrap sets PWD
    assert f"HOME={root}" not in result["output"]  # never the workspace: git would read a planted config


def test_workspace_tools_from_configuration(tmp_path: Path) -> None:
    from hermes_core.config import ConfigError, build_agent, load_settings

    (tmp_path / "ws").mkdir()
    config = tmp_path / "hermes.yaml"
    config.write_text(f"agent:\n  workspace: {tmp_path / 'ws'}\n  shell_allow: [echo]\n", encoding="utf-8")
    names = build_agent(load_settings(config, env={}, dotenv=None)).registry.names
    assert {"read_file", "write_file", "list_directory", "run_command"} <= set(names)
    config.write_text("agent:\n  shell_allow: [echo]\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="needs agent.workspace"):
        build_agent(load_settings(config, env={}, dotenv=None))
