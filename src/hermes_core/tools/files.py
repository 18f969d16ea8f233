"""File tools confined to one workspace directory: read_file, write_file, list_directory.

The model chooses every path, and it may have copied that path from a hostile message, so each
path goes through two independent checks before any byte is read or written:

1. **Resolution.** The path is checked as text (no NUL byte, no `..` that climbs above the root,
   an absolute path only if it lies under the root), then joined to the root and resolved with
   symlinks followed; the result must still lie under the root. This refuses `../../etc/passwd`,
   `/etc/passwd`, `foo/../../x`, `../<root name>/x` (a path through the root's parent) and any
   symlink — of the file or of a parent directory — that points outside.
2. **Opening.** Between that check and the open, someone could swap a directory for a symlink
   (a TOCTOU race). So the resolved path is opened one component at a time from a descriptor of
   the root, each with `O_NOFOLLOW` (`openat` under the hood): a symlink that appeared after
   the check makes the open fail instead of being followed. The opened file is then checked with
   `fstat` to be a regular file; FIFOs and devices are refused (FIFOs are opened non-blocking,
   so a FIFO with no writer cannot hang the call).

3. **Hard links.** A hard link is the file itself, wherever its other names are: one planted in the
   workspace (by an allowed program, or by anyone who can write there) could name a file outside.
   A regular file with more than one link (`st_nlink > 1`) is therefore neither read nor written;
   files the tools create have one.

This needs `dir_fd` support in `os.open` (Linux, macOS, the BSDs); elsewhere `Workspace` refuses
to start rather than offer a weaker sandbox.

The workspace must not hold what the service itself trusts: a root that contains (or lies inside)
a protected path — the `.env` file, the configuration file, the data folder with the database —
is refused when the `Workspace` is made (`WorkspaceError`), since the model could otherwise read
the secrets, rewrite the configuration or corrupt the database. A top-level `.env` in the root is
refused too, and so is a write_file under a `.git` folder (its config and hooks name commands git
runs). The total for the quota is measured by one walk of the tree at most once a second and kept
up to date by the writes in between.

Uploads are private: the files users send are saved under `<private>/<conversation folder>/`
(`uploads/feishu-ou_…-<hash>/`, gateway/media.py). A call names its conversation (the
`ToolContext.session_id` the agent gives it): the checked path, symlinks resolved, may lie in that
conversation's own folder or outside `<private>/`, never in another conversation's folder; listing
`<private>/` shows the caller's folder alone. A call with no conversation sees no upload.

Quotas: `quota_bytes` bounds all the files under the root and `conversation_quota_bytes` those in
one conversation's folder, so one user's uploads cannot fill the space for everyone. The check and
the write that follows it hold one lock, so parallel writes cannot all pass a check made before
any of them wrote (one process: two processes sharing a folder each keep their own count).

Refusals are `ToolError`s, which the registry turns into an `error` the model reads. Messages name
paths relative to the workspace and never the absolute root, which is the host's business.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

from pydantic import Field

from ..kernel.messages import JSON
from ..kernel.redaction import cut_text, redact_text
from ..kernel.tools.declare import Tool, ToolContext, ToolError, tool

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO would otherwise wait for a writer; it changes nothing for regular files.
# O_NOCTTY: opening a terminal device must never make it the process's controlling terminal.
_FILE_FLAGS = getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL
MIB = 1024 * 1024  # the quotas are configured in MB (agent.workspace_quota_mb)
DEFAULT_QUOTA_BYTES = 100 * MIB
DEFAULT_CONVERSATION_QUOTA_BYTES = 40 * MIB
PRIVATE_FOLDER = "uploads"  # where each conversation's files have a folder of their own
USAGE_TTL = 1.0  # seconds a measured total is trusted before the tree is walked again


class WorkspaceError(ValueError):
    """The folder cannot be a workspace: it holds (or lies in) a file or folder the service trusts."""


def default_protected() -> list[Path]:
    """What every workspace must stay clear of: `.env` and the default data folder of the current folder."""
    return [Path(".env").absolute(), Path(".hermes").absolute()]


class Workspace:
    """A directory the file tools may use, and the limits that keep one call cheap.

    `max_read_bytes` bounds the file read_file will load, `max_write_bytes` one write_file call,
    `max_entries` the entries list_directory shows, `quota_bytes` all the files under the root
    (None: no quota), `conversation_quota_bytes` the files in one conversation's folder of
    `private` (the folder the gateway saves uploads in; None: no private folders). `protect` names
    paths the root must neither contain nor lie inside, on top of `default_protected()`; a root
    that breaks this raises `WorkspaceError`. The operations take the caller's `conversation`.
    """

    def __init__(
        self,
        root: Path,
        *,
        max_read_bytes: int = 1_000_000,
        max_write_bytes: int = 1_000_000,
        max_entries: int = 500,
        quota_bytes: int | None = DEFAULT_QUOTA_BYTES,
        conversation_quota_bytes: int | None = DEFAULT_CONVERSATION_QUOTA_BYTES,
        private: str | None = PRIVATE_FOLDER,
        protect: Iterable[str | Path] = (),
    ) -> None:
        if not (os.open in os.supports_dir_fd and os.scandir in os.supports_fd):
            raise RuntimeError("the file tools need openat-style dir_fd support (Linux, macOS or BSD)")
        self.root = Path(root).resolve(strict=True)
        if not self.root.is_dir():
            raise NotADirectoryError(f"workspace root {root} is not a directory")
        self._configured_root = Path(os.path.abspath(root))  # the spelling an absolute path may use
        _refuse_protected(self.root, [*default_protected(), *(Path(p) for p in protect)])
        self.max_read_bytes = max_read_bytes
        self.max_write_bytes = max_write_bytes
        self.max_entries = max_entries
        self.quota_bytes = quota_bytes
        self.conversation_quota_bytes = conversation_quota_bytes
        self.private = private
        self._usage: tuple[float, int] | None = None  # (when measured, bytes)
        self._writing = threading.Lock()  # a quota check and the write it allows, as one step

    # -- the three operations -------------------------------------------------------------

    def read_file(
        self,
        path: str,
        max_chars: int = 4000,
        start_line: int | None = None,
        end_line: int | None = None,
        *,
        conversation: str | None = None,
    ) -> dict[str, JSON]:
        """The text of a file (UTF-8, undecodable bytes replaced, secrets redacted), capped at `max_chars`.

        Whole lines are shown whenever possible. When the text is cut or a range is asked for,
        the result says which lines are shown and how many there are, so the model can ask for
        the next range instead of guessing what it missed (seed 001 §3.2). Metadata comes before
        the content so that a later cap on the whole result cuts the content, not the numbers.
        """
        if max_chars < 1:
            raise ToolError("max_chars must be at least 1")
        if start_line is not None and end_line is not None and end_line < start_line:
            raise ToolError(f"end_line ({end_line}) is before start_line ({start_line})")
        relative = self._visible(self.resolve(path), conversation)
        with self._open_file(relative, os.O_RDONLY) as fd:
            data = _read_at_most(fd, self.max_read_bytes + 1)
        if len(data) > self.max_read_bytes:
            raise ToolError(
                f"{_show(relative)} is larger than the read limit of {self.max_read_bytes:,} bytes"
            )
        # Redacted before any cut: a secret straddling max_chars must not leave its start behind.
        lines = _split_lines(redact_text(data.decode("utf-8", errors="replace")))
        first = start_line or 1
        last = min(end_line or len(lines), len(lines))
        if first > max(len(lines), 1):
            raise ToolError(f"{_show(relative)} has only {len(lines)} lines; start_line {first} is past it")
        shown, partial = _fit_lines(lines[first - 1 : last], max_chars)
        shown_last = first + len(shown) - 1
        truncated = partial or shown_last < last
        result: dict[str, JSON] = {"path": _show(relative)}
        if truncated or start_line is not None or end_line is not None:
            result.update(
                total_lines=len(lines),
                shown_lines=f"{first}-{shown_last}" if shown else "none",
                truncated=truncated,
            )
        if partial:
            result["hint"] = f"line {first} alone is longer than {max_chars} characters; raise max_chars"
        elif truncated:
            result["hint"] = f"cut at {max_chars} characters; call again with start_line={shown_last + 1}"
        result["content"] = "".join(shown)
        return result

    def write_file(
        self, path: str, content: str, append: bool = False, *, conversation: str | None = None
    ) -> dict[str, JSON]:
        """Create, overwrite or append to a file; missing parent directories are created inside the root."""
        data = content.encode("utf-8")
        if len(data) > self.max_write_bytes:
            raise ToolError(f"content is {len(data):,} bytes; the limit is {self.max_write_bytes:,} bytes")
        relative = self._visible(self.resolve(path), conversation)
        if not relative.parts:
            raise ToolError("the path names the workspace itself; give a file name")
        if ".git" in relative.parts:
            raise ToolError(
                f"{_show(relative)} is inside a .git folder: git runs commands named there; refused"
            )
        # No O_TRUNC at open: the target is checked to be a regular file before it is changed.
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else 0)
        with self._writing:
            growth = len(data) if append else len(data) - _size_or_zero(self.root / relative)
            self._check_quota(relative, growth)
            with self._open_file(relative, flags, create_parents=True) as fd:
                before = os.fstat(fd).st_size
                if not append:
                    os.ftruncate(fd, 0)
                _write_all(fd, data)
            self._add_usage(len(data) if append else len(data) - before)
        return {"path": _show(relative), "bytes_written": len(data), "appended": append}

    def save_new(self, path: str, data: bytes) -> str:
        """Store `data` as a new file at `path` (or `<stem>-2<ext>`, `-3`… when that name is taken by
        other bytes; a name already holding these bytes is reused, so a message run again saves
        nothing twice), under the same rules as write_file (inside the root, no `.git`, the quota)
        but without its size limit: the gateway saves the files users send (gateway/media.py).
        The path it took."""
        relative = self.resolve(path)
        if not relative.parts or ".git" in relative.parts:
            raise ToolError(f"{path!r} cannot hold a saved file")
        for n in range(1, 1000):
            name = relative if n == 1 else relative.with_name(f"{relative.stem}-{n}{relative.suffix}")
            if self._holds(name, data):
                return _show(name)
            with self._writing:
                self._check_quota(name, len(data))
                try:
                    with self._open_file(name, _NEW_FILE, create_parents=True) as fd:
                        _write_all(fd, data)
                except ToolError as exc:
                    if os.path.lexists(self.root / name):  # taken: try the next name
                        continue
                    raise exc
                self._add_usage(len(data))
            return _show(name)
        raise ToolError(f"{path!r}: too many files of this name")

    def _holds(self, relative: PurePosixPath, data: bytes) -> bool:
        """Whether the regular file `relative` exists and holds exactly `data`."""
        try:
            with self._open_file(relative, os.O_RDONLY) as fd:
                return os.fstat(fd).st_size == len(data) and _read_at_most(fd, len(data) + 1) == data
        except ToolError:  # missing, not a regular file, linked: not the same file
            return False

    def list_directory(self, path: str = ".", *, conversation: str | None = None) -> dict[str, Any]:
        """Names, kinds and sizes of a directory's entries, sorted by name and capped at `max_entries`.

        Symlinks are listed as such, without their targets: a target may name a place outside the
        workspace, which is not the model's business. The private folder shows the caller's own.
        """
        relative = self._visible(self.resolve(path), conversation, listing=True)
        mine = conversation_folder(conversation) if conversation else None
        private = self._is_private(relative) and len(relative.parts) == 1
        with self._open_directory(relative) as fd, os.scandir(fd) as scan:
            entries = sorted((e for e in scan if not private or e.name == mine), key=lambda entry: entry.name)
            shown = [_describe(entry) for entry in entries[: self.max_entries]]  # stat() needs fd open
        result: dict[str, JSON] = {"path": _show(relative), "total": len(entries), "entries": shown}
        if len(entries) > self.max_entries:
            result["more"] = f"… {len(entries) - self.max_entries} more entries not shown"
        return result

    # -- quota ----------------------------------------------------------------------------

    def usage(self) -> int:
        """Bytes in the regular files under the root: walked at most once per `USAGE_TTL` seconds."""
        now = time.monotonic()
        if self._usage is None or now - self._usage[0] > USAGE_TTL:
            self._usage = (now, _tree_size(self.root))
        return self._usage[1]

    def _check_quota(self, relative: PurePosixPath, growth: int) -> None:
        """Refuse a write of `growth` bytes to `relative` past the total quota or its conversation's
        (called with `_writing` held, so no other write passes the check meanwhile)."""
        if growth <= 0:
            return
        if self.quota_bytes is not None and self.usage() + growth > self.quota_bytes:
            raise _over_quota("workspace", self.quota_bytes, self.usage(), growth, "agent.workspace_quota_mb")
        conversation_file = self._is_private(relative) and len(relative.parts) > 1
        if self.conversation_quota_bytes is not None and conversation_file:
            used = _tree_size(self.root / relative.parts[0] / relative.parts[1])
            if used + growth > self.conversation_quota_bytes:
                setting = "agent.workspace_conversation_quota_mb"
                raise _over_quota("conversation's", self.conversation_quota_bytes, used, growth, setting)

    def prune_private(self, older_than: float) -> int:
        """Delete the files of the private folder (uploads; `media.retention_days`) last changed
        before `older_than` (a UNIX time), and its folders left empty and as old; returns how many
        files went. Walked by file descriptor without following links (`os.fwalk`): a folder
        swapped for a link meanwhile leads nowhere outside."""
        top = self.root / self.private if self.private else None
        if top is None or top.is_symlink() or not top.is_dir():
            return 0
        removed = 0
        with self._writing:
            for _, folders, files, fd in os.fwalk(top, topdown=False, follow_symlinks=False):
                for name in files + folders:
                    try:
                        found = os.lstat(name, dir_fd=fd)
                        if found.st_mtime >= older_than:
                            continue
                        if stat.S_ISDIR(found.st_mode):
                            os.rmdir(name, dir_fd=fd)  # only if empty
                        else:
                            os.unlink(name, dir_fd=fd)
                            removed += 1
                    except OSError:  # not empty, gone meanwhile, not ours: left as it is
                        continue
            self._usage = None
        return removed

    def _add_usage(self, growth: int) -> None:
        if self._usage is not None:
            self._usage = (self._usage[0], self._usage[1] + growth)

    # -- path checks ----------------------------------------------------------------------

    def _is_private(self, relative: PurePosixPath) -> bool:
        """Whether `relative` lies in the private folder (compared without case: a case-insensitive
        file system opens `Uploads/…` as `uploads/…`)."""
        top = relative.parts[0] if relative.parts else None
        return bool(self.private and top and top.casefold() == self.private.casefold())

    def _visible(
        self, relative: PurePosixPath, conversation: str | None, listing: bool = False
    ) -> PurePosixPath:
        """`relative` (resolved), if the caller may use it: outside the private folder, in its own
        conversation's folder, or the private folder itself for a listing; a `ToolError` otherwise."""
        if not self._is_private(relative) or (listing and len(relative.parts) == 1):
            return relative
        mine = conversation_folder(conversation) if conversation else None
        if mine is not None and relative.parts[1:2] == (mine,):
            return relative
        own = f"; this conversation's are in {self.private}/{mine}" if mine else ""
        raise ToolError(
            f"{_show(relative)} belongs to another conversation: each conversation sees only its own "
            f"files in {self.private}/ and the shared area{own}. Access refused"
        )

    def resolve(self, path: str) -> PurePosixPath:
        """The path relative to the root, with symlinks resolved, or a `ToolError` if it leaves the root."""
        if "\x00" in path:
            raise ToolError("the path contains a NUL byte")
        relative = self._lexically_relative(path)
        try:
            resolved = (self.root / relative).resolve(strict=False)
        except (OSError, RuntimeError):  # a symlink loop, a name too long
            raise ToolError(f"cannot resolve {path!r} inside the workspace") from None
        if not resolved.is_relative_to(self.root):
            raise ToolError(f"{path!r} points outside the workspace (through a symlink); access refused")
        return PurePosixPath(resolved.relative_to(self.root).as_posix())

    def _lexically_relative(self, path: str) -> PurePosixPath:
        """Refuse what is wrong in the text itself: outside absolute paths and `..` above the root."""
        candidate = Path(path)
        if candidate.is_absolute():
            for root in (self.root, self._configured_root):
                if candidate.is_relative_to(root):
                    candidate = candidate.relative_to(root)
                    break
            else:
                raise ToolError(f"{path!r} is outside the workspace; use a path relative to the workspace")
        depth = 0
        for part in candidate.parts:
            depth += -1 if part == ".." else 0 if part == "." else 1
            if depth < 0:
                raise ToolError(f"{path!r} climbs out of the workspace with '..'; access refused")
        return PurePosixPath(candidate.as_posix())

    # -- opening without following symlinks ----------------------------------------------

    @contextmanager
    def _open_directory(self, relative: PurePosixPath, create: bool = False) -> Iterator[int]:
        """A descriptor of `relative`, reached from the root one `O_NOFOLLOW` step at a time."""
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for part in relative.parts:
                if create:
                    try:
                        os.mkdir(part, dir_fd=fd)
                    except FileExistsError:
                        pass
                    except OSError as exc:
                        raise _refusal(exc, relative) from None
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise _refusal(exc, relative, expect_directory=True) from None
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _open_file(self, relative: PurePosixPath, flags: int, create_parents: bool = False) -> Iterator[int]:
        """A descriptor of the regular file `relative`; anything else (dir, FIFO, device) is refused."""
        if not relative.parts:
            raise ToolError("'.' is the workspace directory, not a file; use list_directory")
        with self._open_directory(relative.parent, create=create_parents) as parent:
            try:
                fd = os.open(relative.name, flags | _FILE_FLAGS, 0o666, dir_fd=parent)
            except OSError as exc:
                raise _refusal(exc, relative) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                kind = (
                    "a directory"
                    if stat.S_ISDIR(info.st_mode)
                    else "not a regular file (FIFO, socket, device)"
                )
                raise ToolError(f"{_show(relative)} is {kind}; only regular files can be read or written")
            if info.st_nlink > 1:
                raise ToolError(
                    f"{_show(relative)} has other hard links (they may be files outside the workspace); "
                    "it is neither read nor written"
                )
            yield fd
        finally:
            os.close(fd)


def _refusal(exc: OSError, relative: PurePosixPath, expect_directory: bool = False) -> ToolError:
    """An OSError as a message for the model: relative path and reason, never the absolute root."""
    name = _show(relative)
    if isinstance(exc, FileNotFoundError):
        return ToolError(f"{name} does not exist (paths are relative to the workspace; try list_directory)")
    if isinstance(exc, IsADirectoryError):
        return ToolError(f"{name} is a directory, not a file; use list_directory")
    if isinstance(exc, NotADirectoryError) and expect_directory:
        # O_DIRECTORY|O_NOFOLLOW on a symlink also lands here on some systems
        return ToolError(f"{name} is not a directory (or part of it became a symlink); access refused")
    if exc.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW met a symlink (EMLINK on FreeBSD)
        return ToolError(f"{name} is a symlink loop or changed while it was opened; access refused")
    if exc.errno == errno.ENXIO:  # a FIFO with no reader, opened for writing
        return ToolError(f"{name} is not a regular file (FIFO, socket, device); access refused")
    if isinstance(exc, PermissionError):
        return ToolError(f"permission denied for {name}")
    return ToolError(f"cannot open {name}: {exc.strerror or type(exc).__name__}")


def _refuse_protected(root: Path, protected: list[Path]) -> None:
    """Raise WorkspaceError if `root` contains, equals or lies inside a protected path."""
    if (root / ".env").exists():
        raise WorkspaceError(f"workspace {root} holds a .env file (secrets); choose a folder without one")
    for path in protected:
        target = Path(os.path.abspath(path))
        try:
            target = target.resolve(strict=False)
        except (OSError, RuntimeError):
            pass
        if target == root or target.is_relative_to(root) or root.is_relative_to(target):
            raise WorkspaceError(
                f"workspace {root} overlaps {target}, which the service trusts (secrets, configuration or "
                "database); the model could read or change it. Choose a folder that holds none of them"
            )


def _tree_size(root: Path) -> int:
    """The sizes of the regular files under `root`, symlinks not followed."""
    total = 0
    stack = [str(root)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except OSError:  # vanished meanwhile
                        continue
        except OSError:
            continue
    return total


def _size_or_zero(path: Path) -> int:
    """The size of the file at `path` (not following a final symlink), 0 if there is none yet."""
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def conversation_folder(conversation: str) -> str:
    """The folder of a conversation's files (`feishu:ou_…` → `feishu-ou_…-<hash>`): readable, and
    one folder per conversation even when two ids differ only in characters a name cannot hold."""
    readable = re.sub(r"[^A-Za-z0-9_-]+", "-", conversation).strip("-")[:60] or "conversation"
    return f"{readable}-{hashlib.sha256(conversation.encode('utf-8')).hexdigest()[:16]}"


def _over_quota(whose: str, quota: int, used: int, growth: int, setting: str) -> ToolError:
    return ToolError(
        f"the {whose} quota is {_megabytes(quota)}; {_megabytes(used)} is used and this write adds "
        f"{_megabytes(growth)}. Delete files you no longer need, or ask the operator to raise {setting} "
        "/ 空间已满，请删除不需要的文件或请管理员提高配额"
    )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _megabytes(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MB"


def _show(relative: PurePosixPath) -> str:
    return relative.as_posix() if relative.parts else "."


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _split_lines(text: str) -> list[str]:
    """Lines ending in "\\n", numbered as editors do (`str.splitlines` would also split on \\f, \\v…)."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


def _fit_lines(lines: list[str], max_chars: int) -> tuple[list[str], bool]:
    """As many whole lines as fit in `max_chars`; if not even the first fits, the start of it (partial)."""
    shown: list[str] = []
    used = 0
    for line in lines:
        if used + len(line) > max_chars:
            break
        shown.append(line)
        used += len(line)
    if lines and not shown:
        return [cut_text(lines[0], max_chars)[0]], True
    return shown, False


def _describe(entry: os.DirEntry[str]) -> dict[str, JSON]:
    if entry.is_symlink():
        return {"name": entry.name, "type": "symlink"}
    if entry.is_dir(follow_symlinks=False):
        return {"name": entry.name, "type": "directory"}
    if entry.is_file(follow_symlinks=False):
        return {"name": entry.name, "type": "file", "size": entry.stat(follow_symlinks=False).st_size}
    return {"name": entry.name, "type": "other"}


# -- tools bound to a workspace ---------------------------------------------------------------

PathArgument = Annotated[str, Field(description="Path relative to the workspace, e.g. notes/todo.md")]


def read_file_tool(workspace: Workspace) -> Tool:
    @tool(name="read_file", level=0, idempotent=True)
    def read_file(
        path: PathArgument,
        context: ToolContext,
        max_chars: Annotated[int, Field(ge=1, le=100_000, description="Most characters to return")] = 4000,
        start_line: Annotated[int | None, Field(ge=1, description="First line to show (1-based)")] = None,
        end_line: Annotated[int | None, Field(ge=1, description="Last line to show (inclusive)")] = None,
    ) -> dict[str, JSON]:
        """Read a text file in the workspace. Long files are cut at max_chars; the result then gives total_lines and the start_line to continue from. 读取工作区里的文本文件，可按行号范围读取；文件太长时会截断并告诉你总行数。"""  # noqa: E501
        return workspace.read_file(path, max_chars, start_line, end_line, conversation=_conversation(context))

    return read_file


def write_file_tool(workspace: Workspace) -> Tool:
    # Not idempotent: an append run twice appends twice (an overwrite would be harmless to repeat,
    # but one flag covers both modes, and a crash-replay must not duplicate an append).
    @tool(name="write_file", level=1, idempotent=False)
    def write_file(
        path: PathArgument,
        context: ToolContext,
        content: Annotated[str, Field(description="The full text to write (UTF-8)")],
        append: Annotated[bool, Field(description="Add to the end instead of replacing the file")] = False,
    ) -> dict[str, JSON]:
        """Create or overwrite a text file in the workspace (append=true adds to the end); parent folders are created. Only use it when the user wants a file saved or changed. 在工作区写入或追加文本文件，仅在用户要求保存或修改文件时使用。"""  # noqa: E501
        return workspace.write_file(path, content, append, conversation=_conversation(context))

    return write_file


def list_directory_tool(workspace: Workspace) -> Tool:
    @tool(name="list_directory", level=0, idempotent=True)
    def list_directory(
        context: ToolContext,
        path: Annotated[str, Field(description="Directory relative to the workspace; '.' is the top")] = ".",
    ) -> dict[str, JSON]:
        """List the files and folders in a workspace directory, with their sizes. 列出工作区目录里的文件和文件夹及大小。"""  # noqa: E501
        return workspace.list_directory(path, conversation=_conversation(context))

    return list_directory


def _conversation(context: ToolContext) -> str | None:
    """The conversation a call runs in (its uploads are the ones it may see), None outside one."""
    return context.session_id


def file_tools(workspace: Workspace) -> list[Tool]:
    """read_file, write_file and list_directory, all bound to `workspace`."""
    return [read_file_tool(workspace), write_file_tool(workspace), list_directory_tool(workspace)]


__all__ = [
    "DEFAULT_CONVERSATION_QUOTA_BYTES", "DEFAULT_QUOTA_BYTES", "MIB", "PRIVATE_FOLDER", "Workspace",
    "WorkspaceError", "conversation_folder", "default_protected", "file_tools",
    "list_directory_tool", "read_file_tool", "write_file_tool",
]  # fmt: skip
