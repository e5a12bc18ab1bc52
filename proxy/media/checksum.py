"""Client checksums of media bytes (spec v2.5 §4.5.5): sha256, md5, crc32."""

from __future__ import annotations

import hashlib
import zlib
from typing import Any

from proxy.media.types import MediaError

CHECKSUM_CODE = "E1001"
"""The spec names no code for a checksum mismatch (E1012 is a failed fetch): the bytes are a
well-formed input that fails its own declared constraint, which is E1001 INVALID_INPUT, with
``details.reason = "checksum_mismatch"``."""

ALGORITHMS = ("sha256", "md5", "crc32")


class Digest:
    """A running digest of one algorithm, fed chunk by chunk while the bytes are read."""

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self._crc = 0
        self._hash = None if algorithm == "crc32" else hashlib.new(algorithm, usedforsecurity=False)

    def update(self, chunk: bytes | bytearray) -> None:
        if self._hash is None:
            self._crc = zlib.crc32(chunk, self._crc)
        else:
            self._hash.update(chunk)

    def hexdigest(self) -> str:
        return f"{self._crc:08x}" if self._hash is None else self._hash.hexdigest()


def expected(raw: Any, where: str) -> tuple[str, str] | None:
    """``(algorithm, value)`` of a ``checksum`` object, None when absent; E1001 when malformed."""
    if raw is None:
        return None
    algorithm = raw.get("algorithm") if isinstance(raw, dict) else None
    value = raw.get("value") if isinstance(raw, dict) else None
    if algorithm not in ALGORITHMS or not isinstance(value, str):
        raise MediaError(
            CHECKSUM_CODE,
            f"{where}.checksum must be {{algorithm: sha256|md5|crc32, value: <hex>}}",
            {"reason": "checksum_malformed"},
        )
    return str(algorithm), value.strip().lower()


def verify(data: bytes | bytearray, claim: tuple[str, str] | None, where: str) -> None:
    """Raise E1001 when ``data`` does not have the claimed digest."""
    if claim is None:
        return
    algorithm, value = claim
    digest = Digest(algorithm)
    digest.update(data)
    actual = digest.hexdigest()
    if actual != value:
        raise MediaError(
            CHECKSUM_CODE,
            f"{where}: the {algorithm} checksum does not match the media bytes",
            {"reason": "checksum_mismatch", "algorithm": algorithm, "expected": value, "actual": actual},
        )
