"""The media allowlist, the limits of spec v2.5 §4.1.3 and the error a refused input raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Modality = Literal["text", "image", "audio", "video", "document"]
MODALITIES: tuple[Modality, ...] = ("text", "image", "audio", "video", "document")
MediaCategory = Literal["image", "audio", "video", "document"]

ALLOWED: dict[str, MediaCategory] = {
    # spec v2.5 §4.1.1, the whole list: anything else is E1010.
    "image/jpeg": "image",
    "image/png": "image",
    "image/webp": "image",
    "image/gif": "image",
    "audio/mpeg": "audio",
    "audio/wav": "audio",
    "audio/ogg": "audio",
    "audio/webm": "audio",
    "video/mp4": "video",
    "video/webm": "video",
    "video/quicktime": "video",
    "application/pdf": "document",
}

MB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """One category's row of spec v2.5 §4.1.3."""

    max_bytes: int
    max_dimension: tuple[int, int] | None = None
    max_duration_ms: int | None = None
    max_pages: int | None = None


LIMITS: dict[MediaCategory, Limits] = {
    "image": Limits(20 * MB, (8192, 8192)),
    "audio": Limits(25 * MB, max_duration_ms=10 * 60 * 1000),
    "video": Limits(100 * MB, (3840, 2160), max_duration_ms=5 * 60 * 1000),
    "document": Limits(50 * MB, max_pages=500),
}
MIN_IMAGE_SIDE = 10
"""§4.5.3: width and height of at least 10 px (E1016)."""
MAX_IMAGE_PIXELS = 67_108_864
"""§4.5.3: at most 8192 x 8192 pixels (E1017)."""

# Spellings of the allowed types that clients and servers send; normalised before any check.
ALIASES = {
    "image/jpg": "image/jpeg",
    "image/pjpeg": "image/jpeg",
    "audio/mp3": "audio/mpeg",
    "audio/mpeg3": "audio/mpeg",
    "audio/x-mpeg": "audio/mpeg",
    "audio/x-wav": "audio/wav",
    "audio/wave": "audio/wav",
    "audio/vnd.wave": "audio/wav",
    "application/ogg": "audio/ogg",
    "audio/x-ogg": "audio/ogg",
    "application/x-pdf": "application/pdf",
}

# module.yaml's file extension -> media type, for the `file` form (§4.3.3: inferred from extension).
BY_EXTENSION = {
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".png": "image/png",
    ".webp": "image/webp",
    ".gif": "image/gif",
    ".mp3": "audio/mpeg",
    ".wav": "audio/wav",
    ".ogg": "audio/ogg",
    ".oga": "audio/ogg",
    ".weba": "audio/webm",
    ".mp4": "video/mp4",
    ".webm": "video/webm",
    ".mov": "video/quicktime",
    ".pdf": "application/pdf",
}


def normalise(media_type: str) -> str:
    """``media_type`` lower-cased, parameters dropped and aliases resolved."""
    base = media_type.split(";", 1)[0].strip().lower()
    return ALIASES.get(base, base)


class MediaError(Exception):
    """A media input refused: ``code`` is the spec's E-code, ``details`` go into the envelope."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}
