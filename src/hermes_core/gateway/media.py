"""A message's pictures and files, made ready for its turn (docs/media.md).

`MediaDesk.prepare` runs before the model is called, never when the message is accepted:
- a picture is refused at once, with a fixed reply and no download, when the model cannot take
  pictures (`model.vision: false`); otherwise it is fetched (Feishu) or decoded (webhook), checked
  (channels/media.py: size, declared type, magic numbers) and handed to the model as an OpenAI
  content part, a `data:` URL;
- a file is fetched and checked the same way, then saved into the workspace of the file tools
  under `<media.folder>/<conversation>/<name>`, and the message the model reads says where it is,
  how large and of what type, so read_file can open it. Without a workspace it is refused.

- a message's references (the message it quotes, a forwarded chat log) are read first through its
  channel (`ReferenceReader`): their text joins the message's, a quoted picture or file is then
  handled like the message's own;
- a voice or video message is downloaded and read through the transcription endpoint
  (`media.transcription`, gateway/transcription.py); without one it is refused politely;
- Word, Excel and PowerPoint files (docx, xlsx, pptx) have their text saved beside them, like a PDF's;
  every document is read in a child process with CPU, memory and time limits (gateway/documents.py).

Any refusal answers the message with the reason (kernel/replies.py `attachment_*`) instead of a turn:
a model never sees half of what the user sent.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..channels.media import (
    MEDIA_KINDS,
    OFFICE_PARTS,
    REFERENCE_KINDS,
    AttachmentSource,
    Fetched,
    MediaLimits,
    MediaRefused,
    ReferenceReader,
    file_kind,
    file_type,
    image_type,
    media_container,
    megabytes,
    safe_name,
)
from ..tools.files import conversation_folder
from .documents import DocumentUnread, document_text

if TYPE_CHECKING:
    from ..channels.seam import InboundMessage
    from ..tools.files import Workspace
    from .transcription import Transcriber

log = logging.getLogger("hermes_core.media")

NO_TRANSCRIPTION = "no speech-to-text service is set up here"
FORMAT = "its format is not supported"


@dataclass
class Prepared:
    """What the turn runs on: the text the model reads (saved files named in it) and the pictures."""

    text: str
    images: list[str] = field(default_factory=list)  # data: URLs


class MediaDesk:
    def __init__(
        self,
        limits: MediaLimits | None = None,
        *,
        sources: Mapping[str, AttachmentSource] | None = None,
        workspace: Workspace | None = None,
        vision: bool = False,
        transcriber: Transcriber | None = None,
    ) -> None:
        self.limits = limits or MediaLimits()
        self.sources = dict(sources or {})
        if workspace is not None and workspace.private != self.limits.folder:  # uploads must be private
            raise ValueError(f"the workspace's private folder must be media.folder ({self.limits.folder!r})")
        self.workspace = workspace
        self.vision = vision
        self.transcriber = transcriber  # voice and video as text; None: they are refused politely

    async def prepare(self, message: InboundMessage) -> Prepared:
        """The message's text and pictures for the model, its files saved; `MediaRefused` otherwise."""
        message = await self._read_references(message)
        attachments = message.attachments
        for attachment in attachments:
            if attachment.get("problem"):
                raise MediaRefused("unusable", str(attachment["problem"]), why=str(attachment["problem"]))
        if any(a.get("kind") == "image" for a in attachments) and not self.vision:
            raise MediaRefused("no_vision", "the model does not take pictures")
        files = [a for a in attachments if a.get("kind") == "file"]
        if files and self.workspace is None:
            raise MediaRefused("no_workspace", "files need agent.workspace")
        if any(a.get("kind") in MEDIA_KINDS for a in attachments) and self.transcriber is None:
            raise MediaRefused("media", "voice and video need media.transcription", why=NO_TRANSCRIPTION)
        for attachment in files:  # a type that is never read is refused before any download
            file_kind(safe_name(str(attachment.get("name") or "")))
        prepared = Prepared(message.text)
        notes: list[str] = []
        for attachment in attachments:
            if attachment.get("kind") == "image":
                prepared.images.append(await self._image(message, attachment))
            elif attachment.get("kind") in MEDIA_KINDS:
                notes.append(await self._transcript(message, attachment))
            else:
                notes.append(await self._file(message, attachment))
        if notes:
            prepared.text = "\n".join([message.text, *notes]).strip()
        return prepared

    async def _read_references(self, message: InboundMessage) -> InboundMessage:
        """The message with the messages it points at read by its channel; references a channel
        cannot read are dropped (the message's own text still reaches the model)."""
        if not any(a.get("kind") in REFERENCE_KINDS for a in message.attachments):
            return message
        source = self.sources.get(message.channel)
        if isinstance(source, ReferenceReader):
            return await source.read_references(message, self.limits.download_timeout)
        kept = [a for a in message.attachments if a.get("kind") not in REFERENCE_KINDS]
        return dataclasses.replace(message, attachments=kept)

    async def _transcript(self, message: InboundMessage, attachment: dict[str, Any]) -> str:
        """A voice or video message as text: downloaded (within the file limit), its container
        checked (one the endpoint takes: OpenAI's list), then transcribed."""
        assert self.transcriber is not None  # checked in prepare
        kind = str(attachment.get("kind"))
        fetched = await self._fetch(message, attachment)
        container = media_container(fetched.data)
        if container is None or (kind == "video" and container not in ("mp4", "webm")):
            raise MediaRefused(
                "media", f"{kind}: a format the transcription endpoint does not take", why=FORMAT
            )
        text = await self.transcriber.transcribe(
            fetched.data, f"{kind}.{container}", self.limits.download_timeout
        )
        what = "voice message" if kind == "audio" else "video's sound"
        return f"[{what}, transcribed]\n{text.strip()}\n[end of transcript]"

    async def _image(self, message: InboundMessage, attachment: dict[str, Any]) -> str:
        fetched = await self._fetch(message, attachment)
        mime = image_type(fetched.data, fetched.content_type)
        return f"data:{mime};base64,{base64.b64encode(fetched.data).decode('ascii')}"

    async def _file(self, message: InboundMessage, attachment: dict[str, Any]) -> str:
        assert self.workspace is not None  # checked in prepare
        name = safe_name(str(attachment.get("name") or ""))
        fetched = await self._fetch(message, attachment)
        mime = file_type(name, fetched.data, fetched.content_type)
        folder = f"{self.limits.folder}/{conversation_folder(message.conversation)}"
        from ..kernel.tools.declare import ToolError

        try:
            path = self.workspace.save_new(f"{folder}/{name}", fetched.data)
        except ToolError as exc:
            raise MediaRefused("unsaved", f"{name}: {exc}", name=name) from None
        log.info("saved %s (%s, %d bytes) for %s", path, mime, len(fetched.data), message.conversation)
        size = megabytes(len(fetched.data))
        note = f"[file received: {path} ({mime}, {size}); it is in the workspace, read it with read_file]"
        if mime == "application/pdf":
            note += "\n" + await self._document_text(path, fetched.data, "pdf")
        elif mime in OFFICE_PARTS:
            note += "\n" + await self._document_text(path, fetched.data, "office")
        return note

    async def _document_text(self, path: str, data: bytes, kind: str) -> str:
        """The document's text saved as `<path>.txt` (a PDF with the `pdf` extra, pypdf; an Office
        document with the `office` extra: gateway/office.py), and the line saying so. It is read in
        a child process, stopped at `parse_timeout` (gateway/documents.py)."""
        assert self.workspace is not None
        try:
            text = await document_text(data, kind, self.limits.parse_timeout, self.limits.parse_memory_mb)
        except ImportError:
            return f"[{path}: its text is not extracted here (the {kind} extra is not installed)]"
        except DocumentUnread as exc:  # broken, encrypted or hostile: the file is kept, its text is not
            log.info("no text from %s: %s", path, exc)
            return f"[{path}: its text could not be extracted]"
        from ..kernel.tools.declare import ToolError

        try:
            saved = self.workspace.save_new(f"{path}.txt", text.encode("utf-8"))
        except ToolError:
            return f"[{path}: its text could not be saved]"
        return f"[its text: {saved} ({megabytes(len(text.encode()))}); read that one with read_file]"

    async def _fetch(self, message: InboundMessage, attachment: dict[str, Any]) -> Fetched:
        kind = str(attachment.get("kind"))
        limit = self.limits.limit(kind)
        if "data" in attachment:  # carried in the message (the webhook), checked when it was accepted
            try:
                data = base64.b64decode(str(attachment["data"]), validate=True)
            except (binascii.Error, ValueError):
                raise MediaRefused("unusable", "inline data is not base64", why="not base64") from None
            if len(data) > limit:
                raise MediaRefused("too_large", "inline image too large", size=megabytes(len(data)),
                                   limit=megabytes(limit))  # fmt: skip
            return Fetched(data, str(attachment.get("mime") or ""))
        source = self.sources.get(message.channel)
        if source is None:
            raise MediaRefused("unusable", f"{message.channel} cannot fetch attachments", why=message.channel)
        return await source.fetch_attachment(message, attachment, limit, self.limits.download_timeout)


__all__ = ["MediaDesk", "Prepared"]
