"""Pictures and files below the gateway: the fake platform's message resource API (checked against
the official SDK's reader), the fake model's content-part checks, the name and type rules, and what
history, sessions and traces keep of a picture (a placeholder, the text parts redacted)."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hermes_core import Agent
from hermes_core.channels.media import (
    MediaLimits,
    MediaRefused,
    file_type,
    image_type,
    inline_image,
    safe_name,
    sniff,
)
from hermes_core.kernel.messages import user_message, without_images
from hermes_core.observe.traces import SQLiteTraceStore, Tracer
from hermes_core.sessions import SQLiteSessionStore
from hermes_core.testing import ScriptedModel, reply
from hermes_core.testing.fake_feishu import FakeFeishu
from hermes_core.testing.fake_openai import FakeOpenAIServer, FakeReply
from test_media_e2e import JPEG, data_url, png

SECRET = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0" * 2  # an OpenAI-shaped key a user pasted


async def token_of(feishu: FakeFeishu, http: aiohttp.ClientSession) -> str:
    body = {"app_id": feishu.app_id, "app_secret": feishu.app_secret}
    async with http.post(f"{feishu.base_url}/open-apis/auth/v3/tenant_access_token/internal", json=body) as r:
        return str((await r.json())["tenant_access_token"])


async def get_resource(
    feishu: FakeFeishu,
    http: aiohttp.ClientSession,
    message_id: str,
    key: str,
    kind: str | None,
    token: str | None,
) -> tuple[int, dict[str, str], bytes]:
    url = f"{feishu.base_url}/open-apis/im/v1/messages/{message_id}/resources/{key}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params = {"type": kind} if kind else {}
    async with http.get(url, params=params, headers=headers) as response:
        return response.status, dict(response.headers), await response.read()


# --- the fake's message resource API -------------------------------------------------------------


async def test_the_fake_serves_a_resource_with_the_platforms_headers(
    feishu: FakeFeishu, http: aiohttp.ClientSession
) -> None:
    envelope = feishu.file_message(b"a,b\n1,2\n", "销售 数据.csv", content_type="text/csv")
    message = envelope["event"]["message"]
    content = json.loads(message["content"])
    token = await token_of(feishu, http)
    status, headers, body = await get_resource(
        feishu, http, message["message_id"], content["file_key"], "file", token
    )
    assert status == 200 and body == b"a,b\n1,2\n"
    assert headers["Content-Type"] == "text/csv" and headers["Content-Length"] == "8"
    assert headers["Content-Disposition"].startswith("attachment; ")
    assert "filename*=UTF-8''%E9%94%80%E5%94%AE%20%E6%95%B0%E6%8D%AE.csv" in headers["Content-Disposition"]
    chunked = feishu.image_message(png(), chunked=True)["event"]["message"]
    image_key = json.loads(chunked["content"])["image_key"]
    status, headers, body = await get_resource(feishu, http, chunked["message_id"], image_key, "image", token)
    assert status == 200 and body == png() and "Content-Length" not in headers


async def test_the_fakes_refusals_carry_the_documented_codes(
    feishu: FakeFeishu, http: aiohttp.ClientSession
) -> None:
    message = feishu.image_message(png(), chat_id="oc_team")["event"]["message"]
    key = json.loads(message["content"])["image_key"]
    token = await token_of(feishu, http)

    async def code(
        message_id: str, file_key: str, kind: str | None, with_token: str | None = token
    ) -> tuple[int, Any]:
        status, headers, body = await get_resource(feishu, http, message_id, file_key, kind, with_token)
        assert headers["Content-Type"].startswith("application/json")
        parsed = json.loads(body)
        assert parsed["error"]["log_id"]
        return status, parsed["code"]

    assert await code(message["message_id"], key, None) == (400, 234001)  # no type
    assert await code(message["message_id"], key, "file") == (400, 234001)  # the wrong type for the key
    assert await code(message["message_id"], "img_v3_unknown", "image") == (400, 234003)
    assert await code("om_unknown", key, "image") == (400, 234003)
    assert await code(message["message_id"], key, "image", None) == (400, 99991661)
    assert await code(message["message_id"], key, "image", "t-forged") == (400, 99991663)
    feishu.resources_forbidden = True
    assert await code(message["message_id"], key, "image") == (400, 234002)
    feishu.resources_forbidden = False
    feishu.chats_without_bot.add("oc_team")
    assert await code(message["message_id"], key, "image") == (400, 234004)
    assert not any(read.complete for read in feishu.resource_reads)


@pytest.mark.slow
async def test_the_official_sdk_reads_the_fakes_resources(feishu: FakeFeishu) -> None:
    """lark-oapi's own `im.v1.message_resource.get` (a test dependency) against the fake: the bytes,
    the file name it parses from Content-Disposition, and an error's code."""
    import lark_oapi as lark
    from lark_oapi.api.im.v1 import GetMessageResourceRequest

    message = feishu.file_message(b"# Notes\n", "会议 纪要.md")["event"]["message"]
    key = json.loads(message["content"])["file_key"]
    client = (
        lark.Client.builder()
        .app_id(feishu.app_id)
        .app_secret(feishu.app_secret)
        .domain(feishu.base_url)
        .build()
    )

    def get(file_key: str) -> Any:
        request = (
            GetMessageResourceRequest.builder()
            .message_id(message["message_id"])
            .file_key(file_key)
            .type("file")
            .build()
        )
        return client.im.v1.message_resource.get(request)

    found = await asyncio.to_thread(get, key)
    assert found.success() and found.file.read() == b"# Notes\n" and found.file_name == "会议 纪要.md"
    missing = await asyncio.to_thread(get, "file_v3_nope")
    assert not missing.success() and missing.code == 234003


# --- the fake model's content parts --------------------------------------------------------------


async def test_the_fake_model_checks_image_parts_and_records_them(
    fake: FakeOpenAIServer, http: aiohttp.ClientSession
) -> None:
    url = f"{fake.base_url}/chat/completions"
    fake.script(FakeReply.text("ok"))

    async def ask(content: Any) -> tuple[int, Any]:
        body = {"model": "m", "messages": [{"role": "user", "content": content}]}
        async with http.post(url, json=body) as response:
            return response.status, await response.json()

    good = user_message("what is it?", [data_url(png())])["content"]
    assert (await ask(good))[0] == 200 and fake.requests[-1].images == [data_url(png())]
    status, answer = await ask([{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}])
    assert status == 400 and "image_url.url" in answer["error"]["message"]
    status, answer = await ask([{"type": "audio", "audio": "x"}])
    assert status == 400 and "content[0].type" in answer["error"]["message"]
    fake.vision = False
    status, answer = await ask(good)
    assert status == 400 and "only supported by certain models" in answer["error"]["message"]


# --- names and types -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("C:\\Users\\me\\notes.txt", "notes.txt"),
        ("...hidden.md", "hidden.md"),
        ("tab\there\nnew.csv", "tabherenew.csv"),
        ("\u202etxt.exe", "txt.exe"),  # a right-to-left override cannot disguise the extension
        ("", "file"),
        ("..", "file"),
        ("x" * 300 + ".markdown", "x" * (120 - len(".markdown")) + ".markdown"),
    ],
)
def test_safe_name_is_one_plain_path_component(name: str, safe: str) -> None:
    assert safe_name(name) == safe


def test_types_come_from_the_bytes_as_well_as_the_label() -> None:
    assert sniff(png()) == "image/png" and sniff(JPEG) == "image/jpeg" and sniff(b"GIF89a...") == "image/gif"
    assert sniff(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp" and sniff(b"%PDF-1.7") == "application/pdf"
    assert image_type(png(), "application/octet-stream") == "image/png"
    assert image_type(JPEG, "image/png") == "image/jpeg"  # the bytes decide which image it is
    for data, declared in ((b"<svg/>", "image/svg+xml"), (png(), "text/html"), (b"%PDF-1.4", "")):
        with pytest.raises(MediaRefused) as refused:
            image_type(data, declared)
        assert refused.value.reason == "type"
    assert file_type("a.pdf", b"%PDF-1.4\n", "application/pdf") == "application/pdf"
    assert file_type("a.md", "# 标题\n".encode(), "application/octet-stream") == "text/markdown"
    for name, data, declared in (
        ("a.pdf", b"<html>", "application/pdf"),
        ("a.txt", b"\xff\xfe\x00t", "text/plain"),
        ("a.csv", b"a,b", "image/png"),
        ("a.docx", b"PK\x03\x04", ""),
    ):
        with pytest.raises(MediaRefused):
            file_type(name, data, declared)


def test_inline_images_are_checked_when_accepted() -> None:
    record = inline_image(data_url(png()), MediaLimits())
    assert record == {"kind": "image", "data": base64.b64encode(png()).decode(), "mime": "image/png"}
    with pytest.raises(ValueError, match="links are not fetched"):
        inline_image("HTTP://internal.example/secret.png", MediaLimits())


# --- what is kept of a picture -------------------------------------------------------------------


def test_without_images_keeps_the_text_and_counts_the_pictures() -> None:
    picture = png(64, 64)
    messages = [
        {"role": "system", "content": "s"},
        user_message("compare these", [data_url(picture), data_url(picture)]),
        {"role": "assistant", "content": "same"},
    ]
    kept = without_images(messages)
    kb = max(1, round(2 * len(picture) / 1024))
    assert kept[1] == {"role": "user", "content": f"compare these\n[image: 2 attached, {kb} KB]"}
    assert kept[0] is messages[0] and kept[2] is messages[2]  # others untouched, not copied
    assert messages[1]["content"][1]["type"] == "image_url"  # the input is not changed


async def test_sessions_store_list_content_with_its_text_parts_redacted(tmp_path: Path) -> None:
    store = SQLiteSessionStore(tmp_path / "gateway.db")
    message = user_message(f"my key is {SECRET}", [data_url(png())])
    await store.append("webhook:u1", [message, {"role": "assistant", "content": "noted"}])
    loaded = (await store.load("webhook:u1")).messages
    assert loaded[0]["content"][1] == message["content"][1]  # the picture part round-trips
    assert SECRET not in str(loaded) and "[REDACTED" in loaded[0]["content"][0]["text"]
    await store.close()


async def test_a_traced_task_with_a_picture_keeps_a_placeholder_and_redacts_its_text(tmp_path: Path) -> None:
    store = SQLiteTraceStore(tmp_path / "traces.db")
    model = ScriptedModel([reply("a square")])
    agent = Agent(model=model, tracer=Tracer(store, xray_dir=tmp_path / "xray"), vision=True)
    result = await agent.run(f"what is this? {SECRET}", images=[data_url(png(32, 32))], task_id="t-image")
    assert result.ok and model.calls[0].messages[-1]["content"][1]["image_url"]["url"] == data_url(
        png(32, 32)
    )
    trace = await store.get("t-image")
    assert trace is not None
    recorded = str(trace["messages"])
    assert "[image: 1 attached" in recorded and "base64" not in recorded and SECRET not in recorded
    await store.close()


def test_the_configuration_names_vision_and_the_media_limits(tmp_path: Path) -> None:
    from hermes_core.config import ConfigError, load_settings

    config = tmp_path / "hermes.yaml"
    config.write_text(
        "model:\n  vision: true\nmedia:\n  max_image_mb: 5\n  download_timeout: 3\n", encoding="utf-8"
    )
    settings = load_settings(config, env={}, dotenv=None)
    assert settings.model.vision and settings.media == MediaLimits(max_image_mb=5, download_timeout=3)
    config.write_text("media:\n  max_file_mb: 500\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="media.max_file_mb"):
        load_settings(config, env={}, dotenv=None)
    config.write_text("media:\n  folder: ../outside\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="media.folder"):
        load_settings(config, env={}, dotenv=None)
