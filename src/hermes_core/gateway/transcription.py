"""Voice and video messages as text: an OpenAI-compatible transcription endpoint (`media.transcription`).

    POST {base_url}/audio/transcriptions   (platform.openai.com/docs/api-reference/audio/createTranscription)
    Authorization: Bearer <key from the environment variable `api_key_env`>
    multipart/form-data: file=<the audio or video, named with its container's extension>, model=<model>
    → 200 {"text": "…"}; an error → {"error": {"message", "type", …}} with a 4xx or 5xx status

The endpoint takes flac, mp3, mp4, m4a, ogg, wav and webm (gateway/media.py checks the container
by its magic numbers before anything is sent). Every failure is a `MediaRefused` the user is told
of ("unavailable", "timeout"); the key never appears in one.
"""

from __future__ import annotations

import asyncio
import json
import logging

from ..channels.media import MediaRefused, TranscriptionConfig

log = logging.getLogger("hermes_core.media")

ERROR_BODY_MAX = 64 * 1024


class Transcriber:
    def __init__(self, config: TranscriptionConfig, api_key: str | None) -> None:
        self.url = config.base_url.rstrip("/") + "/audio/transcriptions"
        self.model = config.model
        self._key = api_key

    def __repr__(self) -> str:
        return f"Transcriber(url={self.url!r}, model={self.model!r})"

    async def transcribe(self, data: bytes, file_name: str, timeout: float) -> str:
        """The text spoken in `data`; `MediaRefused` when the endpoint fails or is too slow."""
        import aiohttp

        form = aiohttp.FormData()
        form.add_field("file", data, filename=file_name, content_type="application/octet-stream")
        form.add_field("model", self.model)
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                session.post(self.url, data=form, headers=headers) as reply,
            ):
                raw = await reply.content.read(ERROR_BODY_MAX if reply.status != 200 else -1)
                status = reply.status
        except asyncio.TimeoutError:
            raise MediaRefused("timeout", f"transcription: no answer within {timeout:g} s") from None
        except aiohttp.ClientError as exc:
            log.warning("transcription endpoint unreachable: %s", type(exc).__name__)
            raise MediaRefused("unavailable", "transcription unreachable", why=_WHY) from None
        return _text_of(status, raw)


_WHY = "the speech-to-text service did not answer"


def _text_of(status: int, raw: bytes) -> str:
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        body = None
    if status == 200 and isinstance(body, dict) and isinstance(body.get("text"), str):
        return str(body["text"])
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    log.warning("transcription refused: HTTP %d %s", status, str(message)[:200])
    why = f"the speech-to-text service answered HTTP {status}"
    raise MediaRefused("unavailable", f"transcription: HTTP {status}: {message}", why=why)


__all__ = ["Transcriber"]
