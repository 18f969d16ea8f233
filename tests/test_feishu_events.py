"""Feishu inbound: the public conformance vectors, message parsing, and the frame codec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hermes_core.channels.feishu import crypto
from hermes_core.channels.feishu.events import (
    FeishuEventVerifier,
    Ignored,
    inbound_from_event,
    strip_mentions,
)
from hermes_core.channels.feishu.frames import Frame, FrameError

VECTORS = json.loads(
    (Path(__file__).resolve().parent / "data" / "feishu_event_vectors.json").read_text("utf-8")
)["vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["id"])
def test_conformance_vector(vector: dict[str, Any]) -> None:
    timestamp = vector["headers"].get("X-Lark-Request-Timestamp")
    verifier = FeishuEventVerifier(
        vector["verification_token"],
        vector["encrypt_key"] or None,
        now=lambda: float(timestamp) if timestamp else 0.0,  # the vectors were signed at a fixed time
    )
    check = verifier.check(vector["headers"], vector["body"].encode("utf-8"))
    expected = vector["expected"]
    assert check.accepted is expected["accept"]
    if expected["accept"]:
        assert check.body == expected["response_json"]
        if "challenge" not in check.body:
            assert check.envelope == json.loads(vector["plaintext"])
    else:
        assert 400 <= check.status < 500 and check.envelope is None  # never the SDK's retried 500


def test_the_official_decryption_vector_and_signature() -> None:
    assert crypto.decrypt("P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk=", "test key") == "hello world"
    body = b'{"encrypt":"P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk="}'
    expected = "651c41e37268e4e00e77ccde1b4b9d16e624029b82bafa51660c3a382d4f0588"
    assert crypto.signature("1700000000", "nonce-abc", "test key", body) == expected


def test_signed_request_outside_the_replay_window_is_refused() -> None:
    vector = next(v for v in VECTORS if v["id"] == "feishu-04")
    verifier = FeishuEventVerifier(
        vector["verification_token"], vector["encrypt_key"], now=lambda: 1700000000 + 90000
    )
    check = verifier.check(vector["headers"], vector["body"].encode())
    assert check.status == 401 and "replay window" in check.body["error"]


@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b'{"encrypt": 5}', b'{"schema": ""}', b"\xff"])
def test_malformed_requests_are_4xx(body: bytes) -> None:
    check = FeishuEventVerifier("vt", "key").check({}, body)
    assert 400 <= check.status < 500 and check.envelope is None


def receive_event(**message: Any) -> dict[str, Any]:
    base = {"message_id": "om_1", "chat_id": "oc_1", "chat_type": "p2p", "message_type": "text",
            "content": json.dumps({"text": "hello"})}  # fmt: skip
    return {
        "schema": "2.0",
        "header": {"event_id": "ev_1", "event_type": "im.message.receive_v1", "token": "vt"},
        "event": {
            "sender": {"sender_id": {"open_id": "ou_user"}, "sender_type": "user"},
            "message": base | message,
        },
    }


def test_one_to_one_message_is_keyed_by_sender_and_threaded() -> None:
    message = inbound_from_event(receive_event(), "ou_bot")
    assert not isinstance(message, Ignored)
    assert (message.conversation, message.text, message.reply_to, message.event_id) == (
        "feishu:ou_user", "hello", "om_1", "ev_1",
    )  # fmt: skip


def test_group_message_needs_a_mention_of_the_bot() -> None:
    mentions = [
        {"key": "@_user_1", "id": {"open_id": "ou_bot"}, "name": "bot"},
        {"key": "@_user_10", "id": {"open_id": "ou_amy"}, "name": "Amy"},
    ]
    text = json.dumps({"text": "@_user_1 ask @_user_10 about it"})
    mentioned = inbound_from_event(
        receive_event(chat_type="group", content=text, mentions=mentions), "ou_bot"
    )
    assert not isinstance(mentioned, Ignored)
    assert mentioned.conversation == "feishu:oc_1" and mentioned.text == "ask @Amy about it"
    other = [{"key": "@_user_1", "id": {"open_id": "ou_amy"}, "name": "Amy"}]
    assert isinstance(inbound_from_event(receive_event(chat_type="group", mentions=other), "ou_bot"), Ignored)
    assert isinstance(inbound_from_event(receive_event(chat_type="group"), "ou_bot"), Ignored)


def test_non_text_and_other_events() -> None:
    sticker = inbound_from_event(receive_event(message_type="sticker", content='{"file_key": "k"}'), "ou_bot")
    assert not isinstance(sticker, Ignored) and sticker.kind == "non_text" and sticker.attachments == []
    audio = inbound_from_event(receive_event(message_type="audio", content='{"file_key": "k"}'), "ou_bot")
    assert not isinstance(audio, Ignored) and audio.attachments == [{"kind": "audio", "key": "k"}]
    image = inbound_from_event(receive_event(message_type="image", content='{"image_key": "k"}'), "ou_bot")
    assert not isinstance(image, Ignored) and image.attachments == [{"kind": "image", "key": "k"}]
    post = {
        "title": "周报",
        "content": [[{"tag": "text", "text": "本周 "}, {"tag": "a", "text": "链接", "href": "x"}]],
    }
    rich = inbound_from_event(receive_event(message_type="post", content=json.dumps(post)), "ou_bot")
    assert not isinstance(rich, Ignored) and rich.text == "周报\n本周 [链接](x)"
    other = {"schema": "2.0", "header": {"event_type": "im.chat.member.bot.added_v1"}, "event": {}}
    assert isinstance(inbound_from_event(other, "ou_bot"), Ignored)


def test_mention_keys_do_not_match_longer_keys() -> None:
    mentions = [{"key": "@_user_1", "id": {"open_id": "ou_bot"}}]
    assert strip_mentions("@_user_1 hi @_user_12", mentions, "ou_bot") == "hi @_user_12"


def test_frame_round_trip_and_known_bytes() -> None:
    frame = Frame(seq_id=1, log_id=2, service=7, method=1, headers=[("type", "event")], payload=b"{}")
    # derived by hand from the proto2 wire format: tag bytes (field << 3 | type), varints, lengths
    assert frame.encode() == bytes.fromhex("08011002180720012a0d0a047479706512056576656e7442027b7d")
    assert Frame.decode(frame.encode()) == frame
    assert Frame.decode(Frame(service=-5).encode()).service == -5


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_crash_the_frame_decoder(data: bytes) -> None:
    try:
        Frame.decode(data)
    except FrameError:
        pass


@given(
    st.integers(0, 2**64 - 1), st.integers(-(2**31), 2**31 - 1),
    st.lists(st.tuples(st.text(max_size=10), st.text(max_size=10)), max_size=5), st.binary(max_size=50),
)  # fmt: skip
def test_frames_round_trip(seq: int, service: int, headers: list[tuple[str, str]], payload: bytes) -> None:
    frame = Frame(seq_id=seq, log_id=seq // 3, service=service, method=1, headers=headers, payload=payload)
    assert Frame.decode(frame.encode()) == frame
