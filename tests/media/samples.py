"""Small, real media files for the media tests (built with Pillow or written byte by byte)."""

from __future__ import annotations

import base64
import io
import struct
import zlib

from PIL import Image


def image(fmt: str, size: tuple[int, int] = (32, 24), exif: bytes | None = None) -> bytes:
    out = io.BytesIO()
    picture = Image.new("RGB", size, (120, 40, 200))
    options = {"exif": exif} if exif is not None else {}
    picture.save(out, fmt, **options)
    return out.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height`` (no pixel data: only headers are read)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def wav(seconds: float, rate: int = 8000) -> bytes:
    frames = int(seconds * rate)
    data = b"\x00\x00" * frames
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + len(data))
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )


def mp4(duration_s: int, timescale: int = 1000) -> bytes:
    ftyp = b"ftypisom" + b"\x00\x00\x02\x00" + b"isomiso2mp41"
    ftyp = struct.pack(">I", 8 + len(ftyp) - 4) + ftyp
    mvhd_body = (
        b"\x00\x00\x00\x00" + struct.pack(">IIII", 0, 0, timescale, duration_s * timescale) + b"\x00" * 80
    )
    mvhd = struct.pack(">I", 8 + len(mvhd_body)) + b"mvhd" + mvhd_body
    moov = struct.pack(">I", 8 + len(mvhd)) + b"moov" + mvhd
    return ftyp + moov


def pdf(pages: int) -> bytes:
    kids = " ".join(f"{i + 3} 0 R" for i in range(pages))
    return (
        b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
        + f"2 0 obj << /Type /Pages /Kids [{kids}] /Count {pages} >> endobj\n".encode()
        + b"".join(f"{i + 3} 0 obj << /Type /Page /Parent 2 0 R >> endobj\n".encode() for i in range(pages))
        + b"trailer << /Root 1 0 R >>\n%%EOF\n"
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


PNG = image("PNG")
JPEG = image("JPEG")
GIF = image("GIF")
WEBP = image("WEBP")
