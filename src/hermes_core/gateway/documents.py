"""The text of a document a user sent (PDF, docx, xlsx, pptx), read in a child process that can be
stopped (docs/media.md).

Why a child process: a hostile document can keep a parser busy far past any timeout (a 4 KB PDF
whose pages share one compressed content stream of 100,000 text operators costs pypdf seconds per
page). A parser in a thread cannot be stopped: `asyncio.wait_for` gives up waiting, but the thread
runs on, holding the GIL, and every other conversation's turn slows down with it. A process can
be stopped: the parent kills it (its whole process group) at `MediaLimits.parse_timeout`, and the
child limits itself first thing with `resource.setrlimit` — CPU seconds (RLIMIT_CPU: the kernel
stops it even if the parent could not) and address space (RLIMIT_AS: a document that unpacks into
gigabytes fails with MemoryError instead of swapping the host).

The document goes in on stdin; one JSON object comes back on stdout: `{"text": …}`, or
`{"missing": …}` when the library is not installed (the `pdf` or `office` extra), or
`{"error": …}`. The child gets no environment but the path to this package: no secrets reach the
process that reads what a stranger sent.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import sys
from pathlib import Path

MAX_PDF_PAGES = 300
MAX_CHARS = 1_000_000
KINDS = ("pdf", "office")


class DocumentUnread(Exception):
    """The document's text could not be read: broken, encrypted, hostile, or over a limit."""


async def document_text(data: bytes, kind: str, timeout: float, memory_mb: int) -> str:
    """The text of `data` (`kind` "pdf" or "office"), read by a child process given at most
    `timeout` seconds (wall clock and CPU) and `memory_mb` of address space, and killed at the
    timeout. `ImportError` without the kind's extra; `DocumentUnread` for anything else."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    cpu_seconds = str(max(1, math.ceil(timeout)))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", __name__, kind, cpu_seconds, str(memory_mb),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        env=_child_environment(), start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(process.communicate(data), timeout)
    except asyncio.TimeoutError:
        raise DocumentUnread(f"not read within {timeout:g} s; the reader was stopped") from None
    finally:
        if process.returncode is None:  # the timeout, or the turn was cancelled
            _kill_group(process.pid)
            await process.wait()
    return _answer(output, process.returncode)


def _answer(output: bytes, returncode: int | None) -> str:
    try:
        answer = json.loads(output)
    except ValueError:  # killed by its CPU limit (SIGXCPU), or it died some other way
        raise DocumentUnread(f"the reader stopped without an answer (exit {returncode})") from None
    if "missing" in answer:
        raise ImportError(str(answer["missing"]))
    if "error" in answer:
        raise DocumentUnread(str(answer["error"]))
    return str(answer["text"])


def _child_environment() -> dict[str, str]:
    """Only what the child needs to import this package (from a checkout or an install)."""
    import hermes_core

    package_parent = str(Path(hermes_core.__file__).resolve().parent.parent)
    return {"PYTHONPATH": package_parent, "PATH": os.defpath, "LANG": "C.UTF-8"}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # already gone
        pass


def pdf_text(data: bytes, max_pages: int = MAX_PDF_PAGES, max_chars: int = MAX_CHARS) -> str:
    """The text of a PDF's first `max_pages` pages, at most `max_chars` characters (pypdf)."""
    from io import BytesIO

    from pypdf import PdfReader

    reader = PdfReader(BytesIO(data))
    if reader.is_encrypted:
        raise ValueError("the PDF is encrypted")
    parts: list[str] = []
    for page in reader.pages[:max_pages]:
        parts.append(page.extract_text() or "")
        if sum(map(len, parts)) > max_chars:
            break
    return "\n\n".join(parts)[:max_chars]


def _child(kind: str, cpu_seconds: int, memory_mb: int) -> dict[str, str]:
    """In the child: limit this process, read the document from stdin, return the answer."""
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    memory = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    data = sys.stdin.buffer.read()
    try:
        if kind == "pdf":
            return {"text": pdf_text(data)}
        from .office import office_text

        return {"text": office_text(data)}
    except ImportError as exc:
        return {"missing": str(exc)}
    except Exception as exc:  # a broken, encrypted or hostile document; MemoryError past RLIMIT_AS
        return {"error": f"{type(exc).__name__}: {exc}"}


if __name__ == "__main__":
    sys.stdout.write(json.dumps(_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))

__all__ = ["DocumentUnread", "document_text", "pdf_text"]
