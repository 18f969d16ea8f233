"""Pictures and files, end to end: the gateway `serve` builds (build_gateway), the fake Feishu
platform (events pushed over HTTP, resources downloaded from its message resource API) and the fake
OpenAI-compatible model server, which records the image parts each request carried.

The cases come from the platform's message shapes (FEISHU.md §4: `image`, `file`, a `post` with
`img` nodes), the resource API's documented refusals, and what a hostile sender can put in an event
(a missing or huge key, a file name that climbs out of the folder)."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from documents import pdf
from gateway_harness import post, serving
from hermes_core.channels.media import MediaLimits
from hermes_core.config import AgentConfig, FeishuConfig, GatewayConfig, Settings, build_agent
from hermes_core.gateway.server import build_gateway
from hermes_core.models.settings import ModelSettings
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from hermes_core.tools.files import conversation_folder
from waiting import eventually

USER = "ou_user1"
INBOX = f"uploads/{conversation_folder(f'feishu:{USER}')}"  # where a file USER sends is saved


def png(width: int = 2, height: int = 2) -> bytes:
    """A valid PNG image (8-bit greyscale), built from its chunks."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(range(width)) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + bytes(200) + b"\xff\xd9"


@asynccontextmanager
async def media_gateway(
    tmp_path: Path,
    feishu: FakeFeishu,
    fake: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    *,
    vision: bool = True,
    workspace: bool = True,
    agent_options: dict[str, Any] | None = None,
    **limits: Any,
) -> AsyncIterator[tuple[str, Path]]:
    """The gateway of a configuration with Feishu (webhook mode) and the webhook channel, a model
    on the fake server and, with `workspace`, a workspace folder. Yields the base URL and the folder."""
    monkeypatch.setenv("FEISHU_APP_SECRET", feishu.app_secret)
    monkeypatch.setenv("FEISHU_VERIFICATION_TOKEN", feishu.verification_token)
    folder = tmp_path / "workspace"
    folder.mkdir(parents=True)
    settings = Settings(
        model=ModelSettings(model="fake-model", base_url=fake.base_url, vision=vision, max_retries=0),
        agent=AgentConfig(workspace=str(folder) if workspace else None, **(agent_options or {})),
        gateway=GatewayConfig(data_dir=str(tmp_path / "data")),
        # one final message per reply: streaming has its own tests (test_streaming_feishu.py)
        feishu=FeishuConfig(app_id=feishu.app_id, base_url=feishu.base_url, stream=False),
        media=MediaLimits(**limits),
    )
    agent = build_agent(settings)
    gateway, routes = build_gateway(settings, agent)
    try:
        async with serving(gateway, routes) as url:
            yield url, folder
    finally:
        await gateway.runner.aclose()  # type: ignore[attr-defined]
        await agent.aclose()


async def answered(feishu: FakeFeishu, url: str, envelope: dict[str, Any], count: int = 1) -> str:
    """Push the event to the gateway; the text of the bot's `count`-th message once it is sent."""
    result = await feishu.push(envelope, f"{url}/feishu/events")
    assert result.ok, result
    await eventually(lambda: len(feishu.sent) >= count, timeout=30)
    return feishu.sent[count - 1].text


def user_parts(request: Any) -> Any:
    return [m for m in request.messages if m["role"] == "user"][-1]["content"]


# --- pictures ------------------------------------------------------------------------------------


async def test_an_image_message_reaches_the_model_as_an_image_part_and_history_keeps_a_placeholder(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    picture = png(16, 16)
    fake.script(FakeReply.text("A small grey square."), FakeReply.text("It was grey."))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        assert await answered(feishu, url, feishu.image_message(picture)) == "A small grey square."
        assert fake.requests[0].images == [data_url(picture)]
        download = next(call for call in feishu.requests if "/resources/" in call.path)
        assert download.query == {"type": "image"} and download.headers["Authorization"].startswith(
            "Bearer t-"
        )
        assert feishu.resource_reads[0].complete
        await answered(feishu, url, feishu.user_message("what colour was it?"), count=2)
    later = fake.requests[1]
    assert later.images == []  # the picture was for its own turn only
    history = [m["content"] for m in later.messages if m["role"] == "user"]
    assert history[0] == f"[image: 1 attached, {max(1, round(len(picture) / 1024))} KB]"
    assert "base64" not in str(later.messages)


async def test_a_post_with_text_and_two_pictures_sends_the_text_part_first(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.script(FakeReply.text("两张图：一张 PNG，一张 JPEG。"))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        envelope = feishu.post_message("这两张图有什么不同？", [png(), JPEG])
        await answered(feishu, url, envelope)
    parts = user_parts(fake.requests[0])
    assert parts[0] == {"type": "text", "text": "这两张图有什么不同？"}
    assert [part["type"] for part in parts] == ["text", "image_url", "image_url"]
    assert fake.requests[0].images == [data_url(png()), data_url(JPEG, "image/jpeg")]


async def test_a_text_only_model_gets_no_picture_and_the_user_a_polite_reply(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with media_gateway(tmp_path, feishu, fake, monkeypatch, vision=False) as (url, _):
        text = await answered(feishu, url, feishu.image_message(png()))
        assert "看不了图片" in text and "cannot look at pictures" in text  # a bare picture: both languages
        english = await answered(feishu, url, feishu.post_message("What is this?", [png()]), count=2)
        assert english.startswith("Sorry, the model I use cannot look at pictures")
    assert fake.requests == [] and feishu.resource_reads == []  # not called, nothing downloaded


# --- files ---------------------------------------------------------------------------------------


async def test_a_file_is_saved_in_the_workspace_and_read_file_reads_it(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    csv = b"region,sales\nnorth,120\nsouth,340\n"
    saved = f"{INBOX}/sales.csv"
    fake.script(FakeReply.tool_call("read_file", {"path": saved}), FakeReply.text("South sold more."))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, folder):
        envelope = feishu.file_message(csv, "sales.csv", content_type="text/csv")
        assert await answered(feishu, url, envelope) == "South sold more."
        assert (folder / saved).read_bytes() == csv
    told = user_parts(fake.requests[0])
    assert f"[file received: {saved} (text/csv, 1 KB)" in told and "read_file" in told
    tool_result = fake.requests[1].messages[-1]
    assert tool_result["role"] == "tool" and "south,340" in tool_result["content"]


async def test_a_second_file_of_the_same_name_does_not_overwrite_the_first(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.script(FakeReply.text("ok"), FakeReply.text("ok"))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, folder):
        await answered(feishu, url, feishu.file_message(b"first\n", "notes.md"))
        await answered(feishu, url, feishu.file_message(b"second\n", "notes.md"), count=2)
        inbox = folder / INBOX
        assert (inbox / "notes.md").read_text() == "first\n"
        assert (inbox / "notes-2.md").read_text() == "second\n"
        fake.script(FakeReply.text("ok"))
        await answered(feishu, url, feishu.file_message(b"first\n", "notes.md"), count=3)
        assert sorted(p.name for p in inbox.iterdir()) == ["notes-2.md", "notes.md"]  # same bytes: reused
        assert f"[file received: {INBOX}/notes.md " in user_parts(fake.requests[-1])


async def test_files_without_a_workspace_and_unread_types_are_refused_before_any_download(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with media_gateway(tmp_path, feishu, fake, monkeypatch, workspace=False) as (url, _):
        text = await answered(feishu, url, feishu.file_message(b"a,b\n", "a.csv"))
        assert "no workspace" in text and "工作区" in text
    async with media_gateway(tmp_path / "again", feishu, fake, monkeypatch) as (url, _):
        text = await answered(feishu, url, feishu.file_message(b"MZ\x90\x00", "setup.exe"), count=2)
        assert "setup.exe" in text and "PDF, Word, Excel, PowerPoint, TXT" in text
    assert fake.requests == [] and feishu.resource_reads == []


# --- limits, types, timeouts ---------------------------------------------------------------------


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_an_oversize_picture_is_refused_and_its_download_stopped_early(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, chunked: bool
) -> None:
    big = png() + bytes(48 * 1024 * 1024)  # 48 MB; the limit is 1 MB
    async with media_gateway(tmp_path, feishu, fake, monkeypatch, max_image_mb=1) as (url, _):
        text = await answered(feishu, url, feishu.image_message(big, chunked=chunked))
        await eventually(lambda: bool(feishu.resource_reads) and feishu.resource_reads[0].cut_off, timeout=30)
    assert "too large" in text and "1.0 MB" in text
    read = feishu.resource_reads[0]
    assert not read.complete and read.served < len(big) // 3  # the rest was never sent
    assert fake.requests == []


@pytest.mark.parametrize(
    ("data", "content_type"),
    [(b"<html><body>not a picture</body></html>", "image/png"), (png(), "text/html")],
    ids=["html-bytes-labelled-png", "png-bytes-labelled-html"],
)
async def test_a_picture_whose_bytes_or_type_are_not_an_image_is_refused(
    tmp_path: Path,
    feishu: FakeFeishu,
    fake: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    data: bytes,
    content_type: str,
) -> None:
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        text = await answered(feishu, url, feishu.image_message(data, content_type=content_type))
    assert "cannot read this attachment" in text and fake.requests == []


async def test_a_file_whose_bytes_do_not_match_its_name_is_refused_and_not_saved(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, folder):
        text = await answered(feishu, url, feishu.file_message(png(), "report.pdf"))
        binary = await answered(feishu, url, feishu.file_message(b"\x00\x01\x02", "data.csv"), count=2)
        assert "report.pdf" in text and "data.csv" in binary
        assert not (folder / "uploads").exists() and fake.requests == []


async def test_a_download_that_takes_too_long_is_given_up(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with media_gateway(tmp_path, feishu, fake, monkeypatch, download_timeout=0.3) as (url, _):
        text = await answered(feishu, url, feishu.image_message(png(), delay=3.0))
    assert "timed out" in text and fake.requests == []


@pytest.mark.parametrize(
    ("knob", "expected"),
    [("forbidden", "may not read this message"), ("missing", "does not belong to this message")],
)
async def test_the_platforms_refusals_are_told_to_the_user(
    tmp_path: Path,
    feishu: FakeFeishu,
    fake: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    knob: str,
    expected: str,
) -> None:
    envelope = feishu.image_message(png())
    if knob == "forbidden":
        feishu.resources_forbidden = True  # 234002
    else:
        feishu.resources.clear()  # 234003
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        text = await answered(feishu, url, envelope)
    assert expected in text and fake.requests == []


# --- hostile events ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({}, "the image has no image_key"),
        ({"image_key": ""}, "the image has no image_key"),
        ({"image_key": ["img_1"]}, "the image has no image_key"),
        ({"image_key": "img_" + "x" * 5000}, "the image key is not a valid key"),
        ({"image_key": "../../auth/v3/tenant_access_token/internal"}, "the image key is not a valid key"),
    ],
    ids=["no-key", "empty-key", "list-key", "huge-key", "path-key"],
)
async def test_a_hostile_image_key_is_answered_clearly_and_nothing_is_requested(
    tmp_path: Path,
    feishu: FakeFeishu,
    fake: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    content: dict[str, Any],
    expected: str,
) -> None:
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        text = await answered(feishu, url, feishu.user_message(message_type="image", content=content))
    assert expected in text
    assert not any("/resources/" in call.path for call in feishu.requests) and fake.requests == []


@pytest.mark.parametrize(
    ("name", "saved"),
    [
        ("../../../etc/passwd.txt", "passwd.txt"),
        ("..\\..\\boot.ini.txt", "boot.ini.txt"),
        ("/abs/olute.md", "olute.md"),
        (".env.txt", "env.txt"),
        ("a\x00b\u202e.csv", "ab.csv"),
        ("", None),  # no name: "file", which has no readable type
    ],
)
async def test_file_names_cannot_leave_the_conversation_folder(
    tmp_path: Path,
    feishu: FakeFeishu,
    fake: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    saved: str | None,
) -> None:
    fake.script(FakeReply.text("got it"))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, folder):
        text = await answered(feishu, url, feishu.file_message(b"hello\n", name))
    files = sorted(
        str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and "data" not in p.parts
    )
    if saved is None:
        assert "cannot read this attachment" in text and files == []
    else:
        assert text == "got it" and files == [f"workspace/{INBOX}/{saved}"]


# --- the webhook ---------------------------------------------------------------------------------


async def test_webhook_pictures_as_base64_or_data_urls_reach_the_model(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.script(FakeReply.text("Two pictures."))
    picture = png(4, 4)
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        body = {
            "message": "compare",
            "user_id": "u1",
            "images": [data_url(picture), base64.b64encode(JPEG).decode()],
        }
        status, answer = await post(f"{url}/webhook", body)
    assert status == 200 and answer["reply"] == "Two pictures."
    assert fake.requests[0].images == [data_url(picture), data_url(JPEG, "image/jpeg")]


@pytest.mark.parametrize(
    ("images", "expected"),
    [
        (["https://example.com/cat.png"], "links are not fetched"),
        (["file:///etc/passwd"], "links are not fetched"),
        (["not base64 at all!"], "not valid base64"),
        ([base64.b64encode(b"<svg onload=alert(1)>").decode()], "not a PNG, JPEG, GIF or WebP"),
        (["data:image/png,rawbytes"], "must be base64"),
        ([123], "base64 string or a data: URL"),
        ("a string", "a list of at most 8"),
        ([data_url(png())] * 9, "a list of at most 8"),
        ([base64.b64encode(png() + bytes(300 * 1024)).decode()], "larger than the limit"),
    ],
    ids=["https", "file", "garbage", "svg", "raw-data-url", "number", "not-a-list", "too-many", "too-large"],
)
async def test_webhook_images_that_are_not_pictures_are_a_400(
    tmp_path: Path,
    feishu: FakeFeishu,
    fake: FakeOpenAIServer,
    monkeypatch: pytest.MonkeyPatch,
    images: Any,
    expected: str,
) -> None:
    async with media_gateway(tmp_path, feishu, fake, monkeypatch, max_image_mb=0.2) as (url, _):
        status, answer = await post(f"{url}/webhook", {"message": "look", "user_id": "u1", "images": images})
    assert status == 400 and expected in answer["error"]
    assert fake.requests == []


async def test_a_pdf_is_saved_with_its_text_beside_it_for_read_file(
    tmp_path: Path, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder_name = INBOX
    fake.script(
        FakeReply.tool_call("read_file", {"path": f"{folder_name}/report.pdf.txt"}),
        FakeReply.text("Revenue was 42."),
    )
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, folder):
        envelope = feishu.file_message(
            pdf("Quarterly revenue 42"), "report.pdf", content_type="application/pdf"
        )
        assert await answered(feishu, url, envelope) == "Revenue was 42."
        assert (folder / folder_name / "report.pdf").read_bytes().startswith(b"%PDF-")
    told = user_parts(fake.requests[0])
    assert (
        f"{folder_name}/report.pdf (application/pdf" in told
        and f"[its text: {folder_name}/report.pdf.txt" in told
    )
    assert "Quarterly revenue 42" in fake.requests[1].messages[-1]["content"]
