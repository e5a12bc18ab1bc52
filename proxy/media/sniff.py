"""Magic-byte detection with ``puremagic`` (spec v2.5 §4.5.2): what the bytes are, not what the
client says they are.

puremagic over ``filetype`` and libmagic bindings: it is maintained (releases through 2026), pure
Python (no system libmagic to install or keep patched in the image), reads only the bytes it is
given (the head of a download is enough) and lists every candidate with a confidence, so a
declared type that is one of several readings (WebM audio vs. video) is not refused.
"""

from __future__ import annotations

import puremagic

from proxy.media.types import BY_EXTENSION, normalise

HEAD_BYTES = 8192
"""How much of the start of a file is sniffed: every signature puremagic knows for the allowed
types lies in its first few hundred bytes (MP4/MOV ``ftyp`` boxes, RIFF headers)."""

# Containers that carry more than one allowed type: a match on either reading is a match.
_SAME_CONTAINER = {
    "audio/webm": {"video/webm", "application/x-matroska", "audio/webm"},
    "video/webm": {"video/webm", "application/x-matroska"},
    "audio/ogg": {"audio/ogg", "video/ogg"},
}


def candidates(head: bytes) -> list[str]:
    """The media types ``head`` may be, most likely first (empty when nothing matches)."""
    try:
        found = puremagic.magic_string(head[:HEAD_BYTES])
    except puremagic.PureError:
        return []
    out: list[str] = []
    for match in found:
        media_type = normalise(match.mime_type) if match.mime_type else BY_EXTENSION.get(match.extension, "")
        if media_type and media_type not in out:
            out.append(media_type)
    return out


def matches(declared: str, found: list[str]) -> bool:
    """Whether the bytes' candidates include the declared (normalised) type."""
    accepted = _SAME_CONTAINER.get(declared, {declared})
    return any(c in accepted for c in found)
