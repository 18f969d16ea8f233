"""A hostile document is read in a child process that the timeout really stops: end to end through
the gateway `serve` builds, the fake Feishu platform delivering the file and the fake
OpenAI-compatible server as the model.

Where the cases come from: issue 31 item 5 (a 66 KB PDF kept its text extraction running after the
timeout; the abandoned threads held the GIL, a trivial turn went from 5 ms to 464 ms) and the
hostile PDF of tests/documents.py (`hostile_pdf`: one compressed content stream shared by every
page, ISO 32000-1 §7.3.8 and §7.8.2).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import FrameType

import pytest

from documents import hostile_pdf, pdf
from hermes_core.gateway.documents import DocumentUnread, document_text
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from test_media_e2e import answered, media_gateway, user_parts
from waiting import eventually

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc to find the reader process")
READER = b"hermes_core.gateway.documents"


def readers_running() -> list[int]:
    """Reader processes this test process started that are still alive (not zombies)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        fields = stat.rpartition(")")[2].split()
        if READER in cmdline and fields[0] != "Z" and int(fields[1]) == os.getpid():
            found.append(int(entry.name))
    return found


def parsing_here() -> list[int]:
    """Threads of this process whose stack is inside pypdf (an extraction still running here)."""
    found = []
    for thread, frame in sys._current_frames().items():
        current: FrameType | None = frame
        while current is not None and "pypdf" not in current.f_code.co_filename:
            current = current.f_back
        if current is not None:
            found.append(thread)
    return found


async def trivial_turn(feishu: FakeFeishu, url: str, count: int) -> float:
    """Seconds from Bob's "hi" to the bot's reply (his `count`-th message answered)."""
    started = time.perf_counter()
    bob = feishu.user_message("hi", sender="ou_bob", chat_id="oc_bob")
    assert await answered(feishu, url, bob, count=count) == "hello"
    return time.perf_counter() - started


async def test_a_hostile_pdf_is_stopped_at_the_timeout_and_other_turns_stay_quick(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack: Alice sends a 6 KB PDF whose text takes pypdf over a minute. While it is read, Bob's
    trivial turn is timed (printed, not asserted: the machine is shared). When Alice is answered
    (the file kept, its text "could not be extracted"), nothing is parsing any more: no thread of
    this process is inside pypdf and no reader process is left."""
    fake.script(
        FakeReply.text("hello"), FakeReply.text("hello"), FakeReply.text("Your PDF could not be read.")
    )
    async with media_gateway(tmp_path, feishu, fake, monkeypatch, parse_timeout=4) as (url, folder):
        quiet = await trivial_turn(feishu, url, count=1)
        envelope = feishu.file_message(hostile_pdf(), "hostile.pdf", content_type="application/pdf",
                                       sender="ou_alice", chat_id="oc_alice")  # fmt: skip
        assert (await feishu.push(envelope, f"{url}/feishu/events")).ok
        await eventually(lambda: readers_running() or parsing_here(), what="the PDF being read")
        busy = await trivial_turn(feishu, url, count=2)
        print(f"\na trivial turn: {quiet * 1000:.0f} ms; while a hostile PDF is read: {busy * 1000:.0f} ms")
        await eventually(lambda: len(feishu.sent) >= 3, timeout=30)
        assert feishu.sent[2].text == "Your PDF could not be read."
        assert not parsing_here() and not readers_running(), (parsing_here(), readers_running())
    told = user_parts(fake.requests[-1])
    assert "hostile.pdf: its text could not be extracted]" in told, told
    assert list(folder.rglob("hostile.pdf"))  # the file itself is kept


async def test_the_reader_returns_a_documents_text_and_reports_broken_ones() -> None:
    """The child reads an ordinary PDF; a broken PDF or Office file comes back as `DocumentUnread`,
    never as a hang or an exception of another type."""
    assert await document_text(pdf("Quarterly revenue 42"), "pdf", 20, 512) == "Quarterly revenue 42"
    with pytest.raises(DocumentUnread):
        await document_text(b"%PDF-1.4\nnot really", "pdf", 20, 512)
    with pytest.raises(DocumentUnread):
        await document_text(b"PK\x03\x04 not a zip", "office", 20, 512)
