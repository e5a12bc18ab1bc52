"""Strict base64 (spec v2.5 §4.3.2: ``data`` MUST be valid base64), decoded slice by slice into
one preallocated buffer whose size is checked against the limit before anything is decoded."""

from __future__ import annotations

import binascii

from proxy.media.types import MediaError

SLICE_CHARS = 4 * 256 * 1024
"""Base64 characters decoded per step (a multiple of 4): 1 MiB of text, 768 KiB of bytes."""


def decoded_size(text: str) -> int:
    """The byte length ``text`` decodes to, from its length and padding alone."""
    return len(text) // 4 * 3 - (2 if text.endswith("==") else 1 if text.endswith("=") else 0)


def _refuse(where: str, why: str) -> MediaError:
    return MediaError("E1013", f"{where}.data is not valid base64: {why}", {"reason": why})


def decode_strict(text: str, where: str, limit: int) -> bytearray:
    """The bytes of standard, padded base64 ``text`` (no whitespace, no URL-safe alphabet, no
    data: prefix); E1013 when malformed, E1011 when it decodes to more than ``limit`` bytes."""
    if text.startswith("data:"):
        raise _refuse(where, "a data: URL; send the base64 text alone")
    if not text:
        raise _refuse(where, "empty")
    if len(text) % 4:
        raise _refuse(where, "its length is not a multiple of 4 (missing padding?)")
    size = decoded_size(text)
    if size > limit:
        raise MediaError(
            "E1011",
            f"{where} decodes to {size} bytes; the limit for its type is {limit}",
            {"size_bytes": size, "max_bytes": limit},
        )
    out = bytearray(size)
    at = 0
    for start in range(0, len(text), SLICE_CHARS):
        piece = text[start : start + SLICE_CHARS]
        last = start + SLICE_CHARS >= len(text)
        if not last and piece.endswith("="):
            raise _refuse(where, "padding before the end")
        try:
            chunk = binascii.a2b_base64(piece.encode("ascii"), strict_mode=True)
        except (UnicodeEncodeError, binascii.Error) as exc:
            raise _refuse(where, str(exc) if isinstance(exc, binascii.Error) else "non-ASCII") from None
        out[at : at + len(chunk)] = chunk
        at += len(chunk)
    if at != size:  # strict mode already refuses this; kept so a short decode can never pass
        raise _refuse(where, "truncated")
    return out
