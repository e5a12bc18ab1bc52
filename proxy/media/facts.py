"""What the headers of media say (spec v2.5 §4.5.3-§4.5.4), read without decoding the content.

Images: Pillow's ``Image.open`` is lazy — it parses the header (size, mode, format) and decodes no
pixels until asked; a GIF's first frame is the one described. Audio/video: duration where the
container states it in a fixed header (WAV ``fmt``/``data`` chunks, MP4/MOV ``mvhd``); other
containers report none. PDF: the largest ``/Count`` of a ``/Type /Pages`` node in the file's
uncompressed text, in one linear pass (``proxy.media.pdf``) — a PDF that keeps its page tree in
a compressed object stream reports no page count (checked no further: a full PDF parser is a
dependency this does not earn).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any

from PIL import Image

from proxy.media.pdf import page_count
from proxy.media.types import LIMITS, MAX_IMAGE_PIXELS, MIN_IMAGE_SIDE, MediaCategory, MediaError

Buffer = bytes | bytearray

PDF_SCAN_BYTES = 4 * 1024 * 1024
"""How much of a PDF's start and end is scanned for its page tree (the root is usually near one
end); bounds the scan of a 50 MB document."""
MP4_SCAN_BOXES = 64
"""Top-level boxes walked looking for ``moov``; a real file has a handful."""


@dataclass(frozen=True, slots=True)
class Facts:
    width: int | None = None
    height: int | None = None
    mode: str | None = None
    duration_ms: int | None = None
    pages: int | None = None
    has_exif: bool = False

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.width is not None and self.height is not None:
            out["dimensions"] = {"width": self.width, "height": self.height}
        if self.mode is not None:
            out["color_mode"] = self.mode
            out["has_alpha"] = "A" in self.mode
        if self.duration_ms is not None:
            out["duration_ms"] = self.duration_ms
        if self.pages is not None:
            out["pages"] = self.pages
        return out


class ViewReader(io.RawIOBase):
    """A seekable read-only file over a buffer, without copying it (``BytesIO`` would)."""

    def __init__(self, data: Buffer) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._view[self._pos : self._pos + len(buffer)]
        n = len(chunk)
        buffer[:n] = chunk
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._view.release()
        super().close()


PILLOW_FORMATS = ("PNG", "JPEG", "GIF", "WEBP")
"""The plugins Pillow may use: those of the allowlist's image types. Without the list it would try
every plugin it has (some accept any bytes) on bytes the magic-byte check already typed."""


def open_image(data: Buffer) -> Image.Image:
    """The lazily opened image (header parsed, no pixel decoded)."""
    return Image.open(io.BufferedReader(ViewReader(data)), formats=PILLOW_FORMATS)


def _image(data: Buffer, where: str) -> Facts:
    try:
        with open_image(data) as image:
            width, height = image.size
            mode = image.mode
            has_exif = bool(image.info.get("exif")) or "exif" in image.info
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Pillow's own bomb guard fires above ~89 M pixels, past E1017's bound: the same refusal.
        raise MediaError("E1017", f"{where}: {exc}", {"max_pixels": MAX_IMAGE_PIXELS}) from None
    except Exception as exc:
        raise MediaError("E1013", f"{where}: the image header cannot be read: {exc}", {}) from None
    limit = LIMITS["image"].max_dimension or (0, 0)
    dims = {"width": width, "height": height}
    # Pixels first: an image too large both ways is refused as Pillow's bomb guard refuses it.
    if width * height > MAX_IMAGE_PIXELS:
        raise MediaError("E1017", f"{where}: {width * height} pixels exceed {MAX_IMAGE_PIXELS}", dims)
    if width > limit[0] or height > limit[1]:
        raise MediaError("E1015", f"{where}: {width}x{height} exceeds {limit[0]}x{limit[1]}", dims)
    if width < MIN_IMAGE_SIDE or height < MIN_IMAGE_SIDE:
        raise MediaError(
            "E1016", f"{where}: {width}x{height} is below {MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE}", dims
        )
    return Facts(width, height, mode, has_exif=has_exif)


def _wav_duration(data: Buffer) -> int | None:
    view = memoryview(data)
    at, byte_rate = 12, 0
    while at + 8 <= min(len(view), 1 << 20):
        chunk_id, size = bytes(view[at : at + 4]), struct.unpack_from("<I", view, at + 4)[0]
        if chunk_id == b"fmt " and size >= 16:
            byte_rate = struct.unpack_from("<I", view, at + 16)[0]
        elif chunk_id == b"data":
            return size * 1000 // byte_rate if byte_rate else None
        at += 8 + size + (size & 1)
    return None


def _mp4_duration(data: Buffer) -> int | None:
    view = memoryview(data)
    at = 0
    for _ in range(MP4_SCAN_BOXES):
        if at + 8 > len(view):
            return None
        size, kind = struct.unpack_from(">I4s", view, at)
        header = 8
        if size == 1 and at + 16 <= len(view):
            size, header = struct.unpack_from(">Q", view, at + 8)[0], 16
        if kind == b"moov":
            return _mvhd(view[at + header : at + size])
        if size < header:
            return None
        at += size
    return None


def _mvhd(moov: memoryview) -> int | None:
    at = 0
    while at + 8 <= len(moov):
        size, kind = struct.unpack_from(">I4s", moov, at)
        if kind == b"mvhd" and at + 32 <= len(moov):
            version = moov[at + 8]
            if version == 1 and at + 44 <= len(moov):
                timescale, duration = struct.unpack_from(">IQ", moov, at + 28)
            else:
                timescale, duration = struct.unpack_from(">II", moov, at + 20)
            return duration * 1000 // timescale if timescale else None
        if size < 8:
            return None
        at += size
    return None


def _pdf_pages(data: Buffer) -> int | None:
    view = memoryview(data)
    regions = [bytes(view[:PDF_SCAN_BYTES])]
    if len(view) > PDF_SCAN_BYTES:
        regions.append(bytes(view[-PDF_SCAN_BYTES:]))
    counts = [c for c in (page_count(region).pages for region in regions) if c is not None]
    return max(counts) if counts else None


def _bounded(category: MediaCategory, facts: Facts, where: str) -> Facts:
    limits = LIMITS[category]
    duration, max_duration = facts.duration_ms, limits.max_duration_ms
    if max_duration is not None and duration is not None and duration > max_duration:
        raise MediaError(
            "E1011",
            f"{where} lasts {duration} ms; the limit for {category} is {max_duration} ms",
            {"duration_ms": duration, "max_duration_ms": max_duration},
        )
    if limits.max_pages is not None and facts.pages is not None and facts.pages > limits.max_pages:
        raise MediaError(
            "E1011",
            f"{where} has {facts.pages} pages; the limit is {limits.max_pages}",
            {"pages": facts.pages, "max_pages": limits.max_pages},
        )
    return facts


def read_facts(data: Buffer, media_type: str, category: MediaCategory, where: str) -> Facts:
    """The header facts of ``data``; E1015-E1017 (image bounds), E1011 (duration, pages)."""
    if category == "image":
        return _image(data, where)
    try:
        if media_type == "audio/wav":
            facts = Facts(duration_ms=_wav_duration(data))
        elif media_type in ("video/mp4", "video/quicktime"):
            facts = Facts(duration_ms=_mp4_duration(data))
        elif media_type == "application/pdf":
            facts = Facts(pages=_pdf_pages(data))
        else:
            facts = Facts()
    except (struct.error, ValueError, IndexError, ZeroDivisionError):
        facts = Facts()  # a header the scan cannot follow states no duration: none is reported
    return _bounded(category, facts, where)
