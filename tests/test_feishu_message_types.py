"""Every Feishu message type a person can send, and the message a reply quotes, end to end: the
gateway `serve` builds, the fake Feishu platform (events pushed over HTTP; messages read back with
`GET /open-apis/im/v1/messages/:message_id`, open.feishu.cn/document/server-docs/im-v1/message/get;
resources downloaded from the message resource API) and the fake OpenAI-compatible server, which
records what the model received and what the transcription endpoint was sent.

The shapes follow FEISHU.md §4 ("content per type") and §11 (quoted messages, merge_forward
children, 234043), and what the vendor's channel layer reads of each type
(lark_oapi/channel/normalize/converters/*.py, lark_oapi/channel/normalize/merge_forward.py)."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from hermes_core.tools.files import conversation_folder
from test_media_e2e import INBOX, answered, data_url, media_gateway, png, user_parts

USER = "ou_user1"
OGG = b"OggS\x00\x02" + bytes(200)  # an Ogg page header: Feishu's voice messages are Opus in Ogg
MP4 = b"\x00\x00\x00\x18ftypisom" + bytes(200)
AVI = b"RIFF\x00\x01\x00\x00AVI LIST" + bytes(200)


SPEAKER = '<at user_id="ou_user1">User user1</at>: '  # a group turn: who speaks (docs/feishu.md, groups)


def said(request: Any) -> str:
    """The text of the last user message a model request carried (parts joined)."""
    content = user_parts(request)
    if isinstance(content, str):
        return content
    return "\n".join(part["text"] for part in content if part.get("type") == "text")


def transcription(fake: FakeOpenAIServer) -> dict[str, Any]:
    from hermes_core.channels.media import TranscriptionConfig

    return {"transcription": TranscriptionConfig(base_url=fake.base_url, model="whisper-1")}


async def get_message(feishu: FakeFeishu, message_id: str) -> tuple[int, dict[str, Any]]:
    """`GET /open-apis/im/v1/messages/:message_id` with a fresh tenant token, as the bot calls it."""
    async with aiohttp.ClientSession() as session:
        token_path = f"{feishu.base_url}/open-apis/auth/v3/tenant_access_token/internal"
        credentials = {"app_id": feishu.app_id, "app_secret": feishu.app_secret}
        async with session.post(token_path, json=credentials) as reply:
            token = (await reply.json())["tenant_access_token"]
        path = f"{feishu.base_url}/open-apis/im/v1/messages/{message_id}"
        async with session.get(path, headers={"Authorization": f"Bearer {token}"}) as reply:
            return reply.status, await reply.json()


# --- the fake's get-message API ------------------------------------------------------------------


async def test_the_fake_reads_messages_back_as_the_get_message_page_documents(feishu: FakeFeishu) -> None:
    """The page's preconditions (the bot in the chat) and shapes: `data.items`, the forward first and
    then its children with `upper_message_id` (nested ones too); an unknown id is 230001."""
    text = feishu.user_message("hello", chat_id="oc_team", chat_type="group")
    status, body = await get_message(feishu, text["event"]["message"]["message_id"])
    assert status == 200 and body["code"] == 0
    [item] = body["data"]["items"]
    assert item["msg_type"] == "text" and item["body"]["content"] == '{"text": "hello"}'
    assert item["sender"] == {
        "id": USER,
        "id_type": "open_id",
        "sender_type": "user",
        "tenant_key": feishu.tenant_key,
    }
    forward = feishu.forward_message(
        [
            {"sender": "ou_a", "text": "one"},
            {"sender": "ou_b", "forward": [{"sender": "ou_c", "text": "two"}]},
        ]
    )
    forward_id = forward["event"]["message"]["message_id"]
    _, body = await get_message(feishu, forward_id)
    items = body["data"]["items"]
    assert [i["msg_type"] for i in items] == ["merge_forward", "text", "merge_forward", "text"]
    assert "upper_message_id" not in items[0] and items[1]["upper_message_id"] == forward_id
    assert items[3]["upper_message_id"] == items[2]["message_id"]
    assert (await get_message(feishu, "om_unknown"))[1]["code"] == 230001
    feishu.chats_without_bot.add("oc_team")
    assert (await get_message(feishu, text["event"]["message"]["message_id"]))[1]["code"] == 230002


# --- quoted messages -----------------------------------------------------------------------------


async def test_a_reply_to_a_file_in_a_group_brings_the_file_and_the_quote_to_the_model(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: a file cannot @mention the bot, so in a group it never arrives; the reply
    "@bot 总结一下" to it does, and the file is downloaded through the quoted message."""
    fake.script(FakeReply.text("总结：第三季度收入 42。"))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, folder):
        shared = feishu.file_message(b"Q3 revenue: 42\n", "q3.txt", chat_type="group", chat_id="oc_team")
        assert (await feishu.push(shared, f"{url}/feishu/events")).ok  # no mention: not answered
        file_id = shared["event"]["message"]["message_id"]
        ask = feishu.user_message(
            "总结一下", mention_bot=True, chat_type="group", chat_id="oc_team", reply_to=file_id
        )
        assert await answered(feishu, url, ask) == "总结：第三季度收入 42。"
        saved = f"uploads/{conversation_folder('feishu:oc_team')}/q3.txt"
        assert (folder / saved).read_bytes() == b"Q3 revenue: 42\n"
    told = said(fake.requests[0]).removeprefix(SPEAKER)  # a group's turn names who speaks first
    assert told.startswith(f"[quoted message from {USER}, ")
    assert "[end of quoted message]\n\n总结一下" in told and f"[file received: {saved} (text/plain" in told
    assert [read.message_id for read in feishu.resource_reads] == [file_id]  # fetched through the quote
    assert [c.path for c in feishu.requests if c.method == "GET" and c.path.endswith(file_id)]


async def test_a_quoted_text_and_a_quoted_picture_reach_the_model(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.script(FakeReply.text("Friday."), FakeReply.text("A grey square."))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        said_before = feishu.user_message("the launch is on Friday")
        before_id = said_before["event"]["message"]["message_id"]
        await answered(feishu, url, feishu.user_message("when?", reply_to=before_id))
        picture = feishu.image_message(png(8, 8))
        picture_id = picture["event"]["message"]["message_id"]
        await answered(feishu, url, feishu.user_message("what is this?", reply_to=picture_id), count=2)
    assert "the launch is on Friday\n[end of quoted message]\n\nwhen?" in said(fake.requests[0])
    assert fake.requests[1].images == [data_url(png(8, 8))]
    assert said(fake.requests[1]).endswith("what is this?")


async def test_a_quote_that_cannot_be_read_is_said_and_the_question_still_answered(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.script(FakeReply.text("I cannot see that message."))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        ask = feishu.user_message("and this?", reply_to="om_gone")  # unknown to the platform: 230001
        assert await answered(feishu, url, ask) == "I cannot see that message."
    assert said(fake.requests[0]).startswith("[the quoted message could not be read: ")


# --- merge_forward -------------------------------------------------------------------------------


async def test_a_forwarded_chat_log_is_expanded_into_a_transcript(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One get-message call, the tree rebuilt from `upper_message_id` (merge_forward.py); a picture
    inside cannot be downloaded (234043), so the transcript says so and nothing is fetched."""
    fake.script(FakeReply.text("They agreed to ship on Friday."))
    log = [
        {"sender": "ou_amy", "text": "shall we ship on Friday?"},
        {
            "sender": "ou_bob",
            "message_type": "image",
            "content": {"image_key": "img_v3_inner"},
            "data": png(),
        },
        {"sender": "ou_cat", "forward": [{"sender": "ou_dan", "text": "Friday works for QA"}]},
    ]
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        await answered(feishu, url, feishu.forward_message(log))
    told = said(fake.requests[0])
    assert told.startswith("[forwarded chat log, 3 messages]\n[")
    assert "UTC] ou_amy:\n    shall we ship on Friday?" in told
    assert "ou_bob:\n    [a picture: files inside a forwarded message cannot be downloaded]" in told
    assert "    [forwarded chat log]\n    [" in told and "ou_dan:\n        Friday works for QA" in told
    assert told.endswith("[end of forwarded chat log]") and feishu.resource_reads == []
    assert fake.requests[0].images == []


async def test_a_reply_to_a_forwarded_log_in_a_group_reads_the_log(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The usual way to hand a group's bot a chat log: forward it, then reply "@bot summarise"."""
    fake.script(FakeReply.text("Amy asked about the release."))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        entries = [{"sender": "ou_amy", "text": "when is the release?"}, {"sender": "ou_bob"}]
        log = feishu.forward_message(entries, chat_type="group", chat_id="oc_team")
        assert (await feishu.push(log, f"{url}/feishu/events")).ok  # no mention: not answered
        ask = feishu.user_message("summarise", mention_bot=True, chat_type="group", chat_id="oc_team",
                                  reply_to=log["event"]["message"]["message_id"])  # fmt: skip
        await answered(feishu, url, ask)
    told = said(fake.requests[0]).removeprefix(SPEAKER)
    assert told.startswith("[forwarded chat log, 2 messages]\n") and "    when is the release?" in told
    assert "ou_bob:\n    [empty]" in told and told.endswith("[end of forwarded chat log]\n\nsummarise")


# --- post, cards, shares -------------------------------------------------------------------------


async def test_a_post_is_read_in_full_and_cards_and_shares_as_a_line(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every post node (lark_oapi/channel/normalize/converters/post.py): links with their href, code
    blocks fenced with their language, emoji, rules; a card's title and text (interactive.py);
    shared chats and contacts (share.py)."""
    fake.script(*(FakeReply.text("ok") for _ in range(4)))
    paragraphs = [
        [{"tag": "text", "text": "see "}, {"tag": "a", "text": "the doc", "href": "https://example.com/d"},
         {"tag": "emotion", "emoji_type": "SMILE"}],
        [{"tag": "code_block", "language": "PYTHON", "text": "print(1)"}],
        [{"tag": "hr"}],
        [{"tag": "text", "text": "done"}],
    ]  # fmt: skip
    card = [[{"tag": "text", "text": "Build failed on main"}], [{"tag": "button", "text": "Retry"}]]
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        post = feishu.user_message(message_type="post", content={"title": "Notes", "content": paragraphs})
        await answered(feishu, url, post)
        await answered(feishu, url, feishu.card_message("CI", card), count=2)
        await answered(feishu, url, feishu.shared_chat_message("oc_design"), count=3)
        await answered(feishu, url, feishu.shared_user_message("ou_eve"), count=4)
    assert said(fake.requests[0]) == (
        "Notes\nsee [the doc](https://example.com/d):SMILE:\n```python\nprint(1)\n```\n---\ndone"
    )
    assert said(fake.requests[1]) == "[card: CI]\nBuild failed on main\nRetry"
    assert said(fake.requests[2]) == "[shared a group chat: oc_design]"
    assert said(fake.requests[3]) == "[shared a contact: ou_eve]"


# --- voice and video -----------------------------------------------------------------------------


async def test_voice_and_video_are_transcribed_by_the_configured_endpoint(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OpenAI transcription API's shape (multipart `file` + `model` → `{"text"}`): the audio is
    downloaded with type=file (FEISHU.md §11) and named by its container; a video's sound likewise."""
    monkeypatch.setenv("HERMES_TRANSCRIPTION_API_KEY", "sk-speech")
    fake.script_transcripts("please book the room", "the demo starts now")
    fake.script(FakeReply.text("Booked."), FakeReply.text("Noted."))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch, **transcription(fake)) as (url, _):
        assert await answered(feishu, url, feishu.audio_message(OGG)) == "Booked."
        await answered(feishu, url, feishu.video_message(MP4), count=2)
    assert said(fake.requests[0]) == "[voice message, transcribed]\nplease book the room\n[end of transcript]"
    assert "[video's sound, transcribed]\nthe demo starts now" in said(fake.requests[1])
    assert [(t.file_name, t.model, t.size, t.status) for t in fake.transcriptions] == [
        ("audio.ogg", "whisper-1", len(OGG), 200),
        ("video.mp4", "whisper-1", len(MP4), 200),
    ]
    assert [call.query for call in feishu.requests if "/resources/" in call.path] == [{"type": "file"}] * 2


async def test_voice_without_an_endpoint_or_in_an_unknown_container_gets_a_polite_reply(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        text = await answered(feishu, url, feishu.audio_message(OGG))
        assert "转不了文字" in text and "no speech-to-text service is set up here" in text
    async with media_gateway(tmp_path / "again", feishu, fake, monkeypatch, **transcription(fake)) as (
        url,
        _,
    ):
        text = await answered(feishu, url, feishu.video_message(AVI, file_name="clip.avi"), count=2)
        assert "its format is not supported" in text and "转不了文字" in text
    assert fake.requests == [] and fake.transcriptions == []


async def test_a_failing_transcription_endpoint_is_told_to_the_user(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.models = ["fake-model"]  # whisper-1 is then unknown: 404 model_not_found, as the API answers
    async with media_gateway(tmp_path, feishu, fake, monkeypatch, **transcription(fake)) as (url, _):
        text = await answered(feishu, url, feishu.audio_message(OGG))
    assert "speech-to-text service answered HTTP 404" in text and fake.requests == []
    assert [t.status for t in fake.transcriptions] == [404]


# --- Office documents ----------------------------------------------------------------------------


def docx_bytes() -> bytes:
    from docx import Document

    document = Document()
    document.add_paragraph("Quarterly report")
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "north", "120"
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def xlsx_bytes() -> bytes:
    from openpyxl import Workbook

    workbook = Workbook()
    sheet = workbook.active
    sheet.title = "Sales"
    sheet.append(["region", "sales"])
    sheet.append(["south", 340])
    buffer = io.BytesIO()
    workbook.save(buffer)
    return buffer.getvalue()


def pptx_bytes() -> bytes:
    from pptx import Presentation

    presentation = Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = "Roadmap"
    slide.placeholders[1].text = "ship the gateway"
    buffer = io.BytesIO()
    presentation.save(buffer)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("name", "build", "expected"),
    [
        ("report.docx", docx_bytes, "Quarterly report\n\n[table 1]\nnorth | 120"),
        ("sales.xlsx", xlsx_bytes, "[sheet Sales]\nregion\tsales\nsouth\t340"),
        ("deck.pptx", pptx_bytes, "[slide 1]\nRoadmap\nship the gateway"),
    ],
    ids=["docx", "xlsx", "pptx"],
)
async def test_office_documents_are_saved_with_their_text_beside_them(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch,
    name: str, build: Any, expected: str,
) -> None:  # fmt: skip
    """Built with python-docx, openpyxl and python-pptx themselves; read by the same libraries."""
    data = build()
    fake.script(FakeReply.text("ok"))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, folder):
        await answered(feishu, url, feishu.file_message(data, name))
        saved = f"{INBOX}/{name}"
        assert (folder / saved).read_bytes() == data
        assert (folder / f"{saved}.txt").read_text(encoding="utf-8") == expected
    told = said(fake.requests[0])
    assert f"[file received: {saved} (" in told and f"[its text: {saved}.txt" in told


def zip_of(parts: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in parts.items():
            archive.writestr(name, data)
    return buffer.getvalue()


async def test_a_zip_that_is_not_its_office_type_is_refused_and_a_zip_bomb_not_unpacked(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The type check (`PK\\x03\\x04` and the main part inside) before saving; the unpacked-size
    bound before a library opens the archive: 300 MB of zeros packed into ~300 KB keeps its file
    but not its text."""
    fake.script(FakeReply.text("ok"))
    bomb = zip_of({"word/document.xml": b"<w:document/>", "word/padding.xml": bytes(300 * 1024 * 1024)})
    assert len(bomb) < 1024 * 1024
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, folder):
        text = await answered(feishu, url, feishu.file_message(zip_of({"a.txt": b"x"}), "fake.docx"))
        assert "fake.docx" in text and fake.requests == []
        await answered(feishu, url, feishu.file_message(bomb, "bomb.docx"), count=2)
        assert not (folder / f"{INBOX}/bomb.docx.txt").exists()
    assert f"[{INBOX}/bomb.docx: its text could not be extracted]" in said(fake.requests[0])


# --- rate limits on downloads --------------------------------------------------------------------


async def test_a_rate_limited_download_waits_and_succeeds(
    tmp_path: Any, feishu: FakeFeishu, fake: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP 429 / 99991400 with `x-ogw-ratelimit-reset` (FEISHU.md §7) is a wait, not a failure."""
    fake.script(FakeReply.text("A small grey square."))
    feishu.fail_next(2, code=99991400, reset=0.2, paths=("/resources/",))
    async with media_gateway(tmp_path, feishu, fake, monkeypatch) as (url, _):
        assert await answered(feishu, url, feishu.image_message(png())) == "A small grey square."
    downloads = [call for call in feishu.requests if "/resources/" in call.path]
    assert [call.code for call in downloads] == [99991400, 99991400, 0]
    assert downloads[1].at - downloads[0].at >= 0.19
    assert fake.requests[0].images == [data_url(png())]


# --- hostile and odd contents (no I/O: what `inbound_from_event` and the readers make of them) ----


def receive(message_type: str, content: Any, **message: Any) -> Any:
    """An `im.message.receive_v1` envelope, one-to-one, with `content` as its JSON string."""
    from hermes_core.channels.feishu.events import inbound_from_event

    body = {"message_id": "om_1", "chat_id": "oc_1", "chat_type": "p2p", "message_type": message_type,
            "content": content if isinstance(content, str) else json.dumps(content), **message}  # fmt: skip
    event = {"sender": {"sender_id": {"open_id": USER}, "sender_type": "user"}, "message": body}
    envelope = {"schema": "2.0", "header": {"event_id": "e1", "event_type": "im.message.receive_v1"}}
    return inbound_from_event({**envelope, "event": event}, "ou_bot")


def test_a_parent_id_is_type_checked_and_only_a_plain_id_becomes_a_quote() -> None:
    """FEISHU.md §4: `parent_id` is a message id string on replies; anything else loses nothing."""
    from hermes_core.channels.feishu.events import Ignored

    assert receive("text", {"text": "hi"}, parent_id="om_2").attachments == [
        {"kind": "quote", "message_id": "om_2"}
    ]
    wrong = receive("text", {"text": "hi"}, parent_id=["om_2"])
    assert isinstance(wrong, Ignored) and "parent_id" in wrong.reason
    for odd in ("../../open-apis/auth", "om_" + "x" * 500, ""):
        assert receive("text", {"text": "hi"}, parent_id=odd).attachments == []
    assert receive("sticker", {"file_key": "k"}, parent_id="om_2").attachments == []  # unread anyway


def test_cards_shares_and_forwards_of_any_shape_are_read_without_raising() -> None:
    """lark_oapi/channel/normalize/converters/interactive.py and share.py: the text, bounded."""
    from hermes_core.channels.feishu.content import MAX_CARD_CHARS, card_text

    assert receive("interactive", "not json").text == "[card]"
    assert receive("interactive", {"elements": "nope", "title": 5}).text == "[card]"
    deep: Any = {"content": "x"}
    for _ in range(5000):
        deep = {"elements": [deep]}
    assert receive(
        "interactive", json.dumps({"elements": [[{"tag": "text", "text": "a" * 10**6}]]})
    ).text == ("[card]\n" + "a" * MAX_CARD_CHARS)
    assert card_text({"elements": [deep]}).startswith("[card]")  # nodes visited are bounded
    nested = '{"elements": [' + '{"elements": [' * 900 + '{"content": "x"}' + "]}" * 900 + "]}"
    assert receive("interactive", nested).text.startswith("[card]")  # parsed, and no RecursionError
    two = {"schema": "2.0", "header": {"title": {"tag": "plain_text", "content": "Deploy"}},
           "body": {"elements": [{"tag": "markdown", "content": "**done** in 3 min"}]}}  # fmt: skip
    assert card_text(two) == "[card: Deploy]\n**done** in 3 min"
    assert receive("share_chat", {"chat_id": ["x"]}).text == "[shared a group chat: unknown]"
    forward = receive("merge_forward", {"content": "Merged and Forwarded Message"})
    assert forward.text == "" and forward.attachments == [{"kind": "forward", "message_id": "om_1"}]
    video = receive("post", {"content": [[{"tag": "media", "file_key": "file_v3_1", "image_key": "i"}]]})
    assert video.attachments == [{"kind": "video", "key": "file_v3_1"}]


# --- the official SDK against the fake, and the transcription client against the fake model ------


async def test_the_official_sdk_reads_a_forward_from_the_fake() -> None:
    """lark-oapi's own `im.v1.message.get` (a test dependency) parses the fake's answer: the items,
    their types, bodies and `upper_message_id`, and an unknown id's code. The SDK caches tokens per
    app_id for the whole process (FEISHU.md §5), so this fake has an app_id of its own."""
    async with FakeFeishu(app_id="cli_types_sdk") as feishu:
        await _sdk_reads_a_forward(feishu)


async def _sdk_reads_a_forward(feishu: FakeFeishu) -> None:
    import asyncio

    import lark_oapi as lark
    from lark_oapi.api.im.v1 import GetMessageRequest

    forward = feishu.forward_message([{"sender": "ou_amy", "text": "hello"}])["event"]["message"]
    client = (
        lark.Client.builder()
        .app_id(feishu.app_id)
        .app_secret(feishu.app_secret)
        .domain(feishu.base_url)
        .build()
    )

    def get(message_id: str) -> Any:
        return client.im.v1.message.get(GetMessageRequest.builder().message_id(message_id).build())

    found = await asyncio.to_thread(get, forward["message_id"])
    assert found.success()
    [top, inner] = found.data.items
    assert (top.msg_type, inner.msg_type, inner.upper_message_id) == (
        "merge_forward",
        "text",
        forward["message_id"],
    )
    assert json.loads(inner.body.content) == {"text": "hello"} and inner.sender.id == "ou_amy"
    missing = await asyncio.to_thread(get, "om_nope")
    assert not missing.success() and missing.code == 230001


async def test_the_transcription_client_sends_the_key_from_the_environment(fake: FakeOpenAIServer) -> None:
    """The OpenAI API's authentication (a Bearer key) and its 401 for a wrong one."""
    from hermes_core.channels.media import MediaRefused, TranscriptionConfig
    from hermes_core.gateway.transcription import Transcriber

    fake.api_key = "sk-speech"
    fake.script_transcripts("hello")
    config = TranscriptionConfig(base_url=fake.base_url)
    assert await Transcriber(config, "sk-speech").transcribe(OGG, "audio.ogg", 5) == "hello"
    with pytest.raises(MediaRefused) as refused:
        await Transcriber(config, "sk-wrong").transcribe(OGG, "audio.ogg", 5)
    assert refused.value.reason == "unavailable" and "HTTP 401" in refused.value.fields["why"]
    assert "sk-" not in str(refused.value) and "sk-" not in repr(Transcriber(config, "sk-speech"))


def test_the_transcription_key_is_never_read_from_the_file(tmp_path: Any) -> None:
    from hermes_core.config import ConfigError, load_settings

    config = tmp_path / "hermes.yaml"
    config.write_text("media:\n  transcription:\n    base_url: https://speech.example/v1\n", encoding="utf-8")
    transcription = load_settings(config, env={}, dotenv=None).media.transcription
    assert transcription is not None and transcription.api_key_env == "HERMES_TRANSCRIPTION_API_KEY"
    config.write_text(
        "media:\n  transcription:\n    base_url: https://speech.example/v1\n    api_key: sk-1\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="api_key"):
        load_settings(config, env={}, dotenv=None)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)
_TYPES = ["text", "post", "image", "file", "audio", "media", "sticker", "interactive", "share_chat",
          "share_user", "merge_forward", "system", "location"]  # fmt: skip
_NODE = st.fixed_dictionaries(
    {"tag": st.sampled_from(["text", "a", "at", "img", "media", "emotion", "code_block", "hr", "md", "x"])},
    optional={"text": _JSON, "href": _JSON, "user_id": _JSON, "user_name": _JSON, "language": _JSON,
              "emoji_type": _JSON, "image_key": _JSON, "file_key": _JSON},
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(_TYPES),
    _JSON
    | st.dictionaries(st.sampled_from(["title", "elements", "content", "text", "chat_id"]), _JSON)
    | st.fixed_dictionaries({"content": st.lists(st.lists(_NODE, max_size=4), max_size=3)}),
    st.none() | st.text(max_size=30),
)
def test_any_content_of_any_type_becomes_a_message_or_is_ignored_and_never_raises(
    message_type: str, content: Any, parent: str | None
) -> None:
    """FEISHU.md §4's types with whatever JSON a sender (or a fuzzer) puts in their content."""
    from hermes_core.channels.feishu.events import Ignored

    extra = {"parent_id": parent} if parent is not None else {}
    result = receive(message_type, content, **extra)
    assert isinstance(result, Ignored) or isinstance(result.text, str)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["message_id", "upper_message_id", "msg_type", "body",
                                                 "sender", "create_time", "deleted", "mentions"]), _JSON),
                max_size=8))  # fmt: skip
def test_any_get_message_answer_is_read_into_a_transcript_without_raising(
    items: list[dict[str, Any]],
) -> None:
    """Whatever `data.items` holds (lark_oapi/channel/normalize/merge_forward.py tolerates the same)."""
    from hermes_core.channels.feishu.references import _item_text, _transcript

    assert _transcript(items, "om_root").startswith("[forwarded chat log, ")
    for item in items:
        text, found = _item_text(item)
        assert isinstance(text, str) and isinstance(found, list)
