"""One validated media input, as the pipeline and the providers see it."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from proxy.media.facts import Buffer, Facts
from proxy.media.types import MediaCategory

TOKEN_NONCE = secrets.token_hex(12)
"""Makes the placeholders of media bytes in a provider body unguessable: a client that writes a
placeholder into its text cannot make the proxy splice media into it."""


@dataclass(frozen=True, slots=True)
class Media:
    index: int
    path: str
    """Where the input carried it, e.g. ``input.images[0]``."""
    form: str
    """url | base64 | file"""
    media_type: str
    category: MediaCategory
    data: Buffer
    facts: Facts
    source: str | None = None
    """The URL fetched (after redirects) or the file name; None for inline bytes."""

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def token(self) -> str:
        """The placeholder a provider body carries instead of this media's base64 text."""
        return f"cogproxy-media-{TOKEN_NONCE}-{self.index}"

    def describe(self) -> dict[str, Any]:
        """What the prompt says about it (the bytes travel as a provider part)."""
        return {
            "media": self.index,
            "type": self.category,
            "media_type": self.media_type,
            "size_bytes": self.size,
            **self.facts.as_dict(),
        }

    def validation(self) -> dict[str, Any]:
        """Its entry in ``meta.media_validation.validated`` (spec v2.5 §4.5.6)."""
        return {
            "index": self.index,
            "path": self.path,
            "media_type": self.media_type,
            "size_bytes": self.size,
            **self.facts.as_dict(),
            "valid": True,
        }
