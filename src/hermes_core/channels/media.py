"""Pictures and files that arrive with a message: what a channel records, and the checks every
byte passes before the model sees it (docs/media.md).

A channel does not download anything when a message arrives (a Feishu event must be acked within
3 s): it records each attachment in `InboundMessage.attachments` as a small JSON-able dict, stored
with the message in the inbox:

    {"kind": "image", "key": "img_v3_…"}                       # fetched from the platform later
    {"kind": "file", "key": "file_v3_…", "name": "report.pdf"}
    {"kind": "image", "data": "<base64>", "mime": "image/png"} # carried inline (the webhook)
    {"kind": "image", "problem": "the image has no image_key"} # unusable: the user is told why
    {"kind": "audio", "key": "file_v3_…"}                      # voice and video: transcribed
    {"kind": "file", "key": "…", "name": "a.pdf", "message_id": "om_…"}  # held by another message
    {"kind": "quote", "message_id": "om_…"}                    # a reference, read at turn time

References (`REFERENCE_KINDS`: the message a reply quotes, the chat log a merge_forward carries)
are read when the turn runs by the channel they came in on (`ReferenceReader`): their text joins
the message's, their pictures and files become attachments of their own, each naming the message
that holds it, since a platform serves a resource only through that message.

The turn (gateway/media.py) fetches what has a `key` through the channel's `AttachmentSource`,
within `MediaLimits`, and checks it here: the size (a download stops at the limit, it never reads
the rest), the declared content type and the bytes themselves (magic numbers, or valid UTF-8 for
text). Nothing is fetched from a URL a user wrote.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Protocol, runtime_checkable

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as checked_dataclass

if TYPE_CHECKING:
    from .seam import InboundMessage

MB = 1024 * 1024
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
MEDIA_KINDS = ("audio", "video")  # voice and video messages: read through a transcription endpoint
REFERENCE_KINDS = ("quote", "forward")  # other messages this one points at, read at turn time
# the files a model can read with read_file, by extension: (canonical type, declared types accepted)
FILE_TYPES: dict[str, tuple[str, tuple[str, ...]]] = {
    ".pdf": ("application/pdf", ("application/pdf",)),
    ".txt": ("text/plain", ("text/",)),
    ".md": ("text/markdown", ("text/",)),
    ".markdown": ("text/markdown", ("text/",)),
    ".csv": ("text/csv", ("text/", "application/csv", "application/vnd.ms-excel")),
    ".docx": (DOCX, (DOCX, "application/zip")),
    ".xlsx": (XLSX, (XLSX, "application/zip")),
    ".pptx": (PPTX, (PPTX, "application/zip")),
}
# Office documents are ZIP files; each must hold the part its type says (the `office` extra reads them)
OFFICE_PARTS = {DOCX: "word/document.xml", XLSX: "xl/workbook.xml", PPTX: "ppt/presentation.xml"}
GENERIC_TYPES = ("", "application/octet-stream", "binary/octet-stream")
MAX_KEY_CHARS = 200  # a Feishu image_key / file_key is ~50 characters
MAX_NAME_CHARS = 120
MAX_ATTACHMENTS = 8  # per message; a post with more images is refused
_KEY = re.compile(r"^[A-Za-z0-9_.\-]+$")


@checked_dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class TranscriptionConfig:
    """`media.transcription`: an OpenAI-compatible `/audio/transcriptions` endpoint that turns voice
    and video messages into text. The key comes from the environment variable `api_key_env` only."""

    base_url: Annotated[str, Field(pattern=r"^https?://")]  # e.g. https://api.openai.com/v1
    model: Annotated[str, Field(min_length=1)] = "whisper-1"
    api_key_env: Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")] = "HERMES_TRANSCRIPTION_API_KEY"


@checked_dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class MediaLimits:
    """The YAML `media:` section: how large a picture or a file may be, how long a download may take.
    Pictures reach the model only with `model.vision: true`; files need `agent.workspace`."""

    max_image_mb: Annotated[float, Field(gt=0, le=100)] = 10.0  # a picture the model is shown
    max_file_mb: Annotated[float, Field(gt=0, le=100)] = 20.0  # a file saved in the workspace (Feishu: 100)
    download_timeout: Annotated[float, Field(gt=0, le=600)] = 30.0  # seconds for a download, headers and body
    folder: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$")] = "uploads"  # workspace folder the files go in
    # a document's text is read in a child process, stopped at this many seconds (gateway/documents.py)
    parse_timeout: Annotated[float, Field(gt=0, le=600)] = 30.0
    parse_memory_mb: Annotated[int, Field(ge=64, le=16384)] = 512  # the child's address space (RLIMIT_AS)
    transcription: TranscriptionConfig | None = None  # voice and video read as text; None: not read
    # files users sent (the `folder`) unchanged this long are deleted (retention.py); null: kept
    retention_days: Annotated[float | None, Field(gt=0)] = 30.0

    def limit(self, kind: str) -> int:
        return int((self.max_image_mb if kind == "image" else self.max_file_mb) * MB)


class MediaRefused(Exception):
    """An attachment that cannot be used. `reason` names the fixed reply (kernel/replies.py
    `attachment_<reason>`), `fields` fill it in; the message is for logs."""

    def __init__(self, reason: str, message: str, **fields: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.fields = fields


@dataclass(frozen=True)
class Fetched:
    """A downloaded attachment: its bytes, the declared Content-Type, the file name it was served with."""

    data: bytes
    content_type: str = ""
    file_name: str | None = None


class AttachmentSource(Protocol):
    """A channel whose attachments stay on the platform until a turn needs them (Feishu)."""

    async def fetch_attachment(
        self, message: InboundMessage, attachment: dict[str, Any], limit: int, timeout: float
    ) -> Fetched:
        """The attachment's bytes; `MediaRefused` when it is larger than `limit` bytes (reading
        stops there), missing, refused by the platform, or not there within `timeout` seconds."""
        ...


@runtime_checkable
class ReferenceReader(Protocol):
    """A channel whose messages can point at other messages (a quoted one, a forwarded chat log)."""

    async def read_references(self, message: InboundMessage, timeout: float) -> InboundMessage:
        """`message` with its `REFERENCE_KINDS` records read: their text put before the message's
        own, their pictures and files added as attachments (each with the `message_id` holding
        it). What cannot be read is said in the text; nothing here raises."""
        ...


def keyed(kind: str, key: Any, name: Any = None) -> dict[str, Any]:
    """The record of a platform attachment, or of why it cannot be used (a missing or odd key).
    `kind`: image, file, audio or video (the last three are fetched by their file_key)."""
    what = "image" if kind == "image" else "file"
    if not isinstance(key, str) or not key:
        return {"kind": kind, "problem": f"the {what} has no {what}_key"}
    if len(key) > MAX_KEY_CHARS or not _KEY.match(key):
        return {"kind": kind, "problem": f"the {what} key is not a valid key"}
    record: dict[str, Any] = {"kind": kind, "key": key}
    if kind == "file":
        record["name"] = safe_name(name if isinstance(name, str) else "")
    return record


def safe_name(name: str) -> str:
    """A file name that is one plain path component: no folders, no `..`, no control or hidden
    characters, no leading dot, at most `MAX_NAME_CHARS` characters (the extension kept)."""
    name = unicodedata.normalize("NFC", name.replace("\\", "/").rsplit("/", 1)[-1])
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] not in "CZ" or ch == " ").strip()
    name = name.lstrip(".").strip() or "file"
    if len(name) > MAX_NAME_CHARS:
        stem, dot, ext = name.rpartition(".")
        ext = ext[:16] if dot else ""
        name = (stem if dot else name)[: MAX_NAME_CHARS - len(ext) - 1] + (f".{ext}" if ext else "")
    return name


def inline_image(item: Any, limits: MediaLimits) -> dict[str, Any]:
    """A webhook's `images` entry (base64, or a `data:image/…;base64,` URL) as an attachment record,
    checked now; `ValueError` saying what is wrong. Links are refused, never fetched."""
    if not isinstance(item, str) or not item:
        raise ValueError("each entry of 'images' must be a base64 string or a data: URL")
    text = item.strip()
    if re.match(r"^[a-z][a-z0-9+.-]*://", text, re.IGNORECASE):
        raise ValueError("'images' takes base64 or data: URLs; links are not fetched")
    if text.startswith("data:"):
        header, comma, text = text.partition(",")
        if not comma or not header.endswith(";base64"):
            raise ValueError("a data: URL in 'images' must be base64 (data:image/png;base64,…)")
    if len(text) * 3 // 4 > limits.limit("image"):
        raise ValueError(f"an image is larger than the limit of {megabytes(limits.limit('image'))}")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("an entry of 'images' is not valid base64") from None
    try:
        mime = image_type(data, "")
    except MediaRefused as exc:
        raise ValueError(f"an entry of 'images' is {exc}") from None
    return {"kind": "image", "data": base64.b64encode(data).decode("ascii"), "mime": mime}


def image_type(data: bytes, declared: str) -> str:
    """The image type of `data` by its magic numbers; `MediaRefused("type")` when it is no PNG,
    JPEG, GIF or WebP, or the platform declared something that is not an image."""
    declared = _mime(declared)
    sniffed = sniff(data)
    if sniffed not in IMAGE_TYPES or not (declared in GENERIC_TYPES or declared.startswith("image/")):
        shown = sniffed or declared or "unknown"
        raise MediaRefused("type", f"not a PNG, JPEG, GIF or WebP image ({shown})", name="image")
    return sniffed


def file_kind(name: str) -> tuple[str, tuple[str, ...]]:
    """The type a file name says (its extension), and the declared types that may go with it;
    `MediaRefused("type")` for a type that is not read (before anything is downloaded)."""
    extension = "." + name.rpartition(".")[2].lower() if "." in name else ""
    kind = FILE_TYPES.get(extension)
    if kind is None:
        raise MediaRefused("type", f"{name}: files of this type are not read", name=name)
    return kind


def file_type(name: str, data: bytes, declared: str) -> str:
    """The type of a file by its extension, checked against its bytes (`%PDF-`, an Office ZIP holding
    its main part, or UTF-8 text without NUL bytes) and the declared Content-Type; `MediaRefused("type")`
    otherwise."""
    canonical, accepted = file_kind(name)
    declared = _mime(declared)
    if not (declared in GENERIC_TYPES or declared.startswith(accepted)):
        raise MediaRefused("type", f"{name} was served as {declared}, not as {canonical}", name=name)
    if canonical == "application/pdf" and not data.startswith(b"%PDF-"):
        raise MediaRefused("type", f"{name} is not a PDF document", name=name)
    if canonical in OFFICE_PARTS and sniff_office(data) != canonical:
        raise MediaRefused("type", f"{name} is not an Office document of its type", name=name)
    if canonical.startswith("text/") and not _is_text(data):
        raise MediaRefused("type", f"{name} is not UTF-8 text", name=name)
    return canonical


def media_container(data: bytes) -> str | None:
    """The file extension of an audio or video container a transcription endpoint takes (OpenAI:
    flac, mp3, mp4, m4a, ogg, wav, webm), by its magic numbers; None for anything else."""
    if data[4:8] == b"ftyp":
        return "m4a" if data[8:11] == b"M4A" else "mp4"
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return "webm"
    if data.startswith(b"OggS"):
        return "ogg"
    if data.startswith(b"RIFF") and data[8:12] == b"WAVE":
        return "wav"
    if data.startswith(b"fLaC"):
        return "flac"
    if data.startswith(b"ID3") or data[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2"):
        return "mp3"
    return None


def sniff(data: bytes) -> str | None:
    """The type its first bytes say (images and PDF), or None."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"%PDF-"):
        return "application/pdf"
    return None


def megabytes(size: int) -> str:
    return f"{size / MB:.1f} MB" if size >= MB else f"{max(1, round(size / 1024))} KB"


def _mime(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def sniff_office(data: bytes) -> str | None:
    """The Office type of a ZIP archive (`PK\\x03\\x04`) by the main part it holds
    (`word/document.xml`, `xl/workbook.xml`, `ppt/presentation.xml`), or None."""
    import io
    import zipfile

    if not data.startswith(b"PK\x03\x04"):
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, ValueError, OSError):
        return None
    return next((kind for kind, part in OFFICE_PARTS.items() if part in names), None)


def _is_text(data: bytes) -> bool:
    if b"\x00" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


__all__ = [
    "AttachmentSource",
    "Fetched",
    "MediaLimits",
    "ReferenceReader",
    "TranscriptionConfig",
    "MediaRefused",
    "file_kind",
    "file_type",
    "image_type",
    "inline_image",
    "keyed",
    "media_container",
    "sniff_office",
    "safe_name",
    "sniff",
]
