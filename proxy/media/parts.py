"""Media as provider-native content parts, and provider bodies that carry them without holding
a base64 copy of every media in memory at once.

The parts are OpenAI chat parts (the wire every provider client takes): ``image_url`` with a
data URL, ``input_audio`` (base64 + format), ``file`` (data URL; PDFs, video). The Anthropic
client translates them into ``image`` and ``document`` blocks. The base64 text is a placeholder
(``Media.token``) until the body is written: ``body_chunks`` encodes each media slice by slice
while the request is sent.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson

from proxy.media.model import Media

ENCODE_SLICE = 3 * 256 * 1024
"""Raw bytes base64-encoded per chunk of a provider body (a multiple of 3: no padding midway)."""

_AUDIO_FORMAT = {"audio/mpeg": "mp3", "audio/wav": "wav", "audio/ogg": "ogg", "audio/webm": "webm"}


def part(media: Media) -> dict[str, Any]:
    """The OpenAI chat content part for ``media``."""
    if media.category == "image":
        return {"type": "image_url", "image_url": {"url": f"data:{media.media_type};base64,{media.token}"}}
    if media.category == "audio":
        return {
            "type": "input_audio",
            "input_audio": {"data": media.token, "format": _AUDIO_FORMAT[media.media_type]},
        }
    extension = media.media_type.rsplit("/", 1)[-1]
    return {
        "type": "file",
        "file": {
            "filename": f"input-{media.index}.{extension}",
            "file_data": f"data:{media.media_type};base64,{media.token}",
        },
    }


def user_content(text: str, media: Sequence[Media]) -> str | list[dict[str, Any]]:
    """The user message content: plain text, or text followed by one part per media."""
    if not media:
        return text
    return [{"type": "text", "text": text}, *(part(m) for m in media)]


def _split(encoded: bytes, media: Sequence[Media]) -> list[bytes | Media]:
    pieces: list[bytes | Media] = [encoded]
    for item in media:
        token = item.token.encode()
        out: list[bytes | Media] = []
        for piece in pieces:
            if isinstance(piece, bytes) and token in piece:
                segments = piece.split(token)
                for i, segment in enumerate(segments):
                    if i:
                        out.append(item)
                    out.append(segment)
            else:
                out.append(piece)
        pieces = out
    return pieces


async def _chunks(pieces: list[bytes | Media]) -> AsyncIterator[bytes]:
    for piece in pieces:
        if isinstance(piece, bytes):
            if piece:
                yield piece
            continue
        view = memoryview(piece.data)
        for start in range(0, len(view), ENCODE_SLICE):
            yield base64.b64encode(view[start : start + ENCODE_SLICE])


def body(payload: dict[str, Any], media: Sequence[Media]) -> bytes | AsyncIterator[bytes]:
    """``payload`` as JSON: bytes when it carries no media token, else chunks that encode each
    media's bytes in place of its token as they are sent."""
    encoded = orjson.dumps(payload)
    present = [m for m in media if m.token.encode() in encoded]
    if not present:
        return encoded
    return _chunks(_split(encoded, present))
