"""Bytes a store keeps for long: a right-sized copy.

orjson (3.12 on) returns ``bytes`` whose allocation is its working buffer, at least 4 KiB,
never shrunk: a 20-byte chunk kept in a stream session held 4 KiB, 200 times what the memory
bound counted (issue #29 finding 5). Anything kept past the request that made it goes through
``retained``; the copy is one ``memcpy`` of the real length.
"""

from __future__ import annotations


def retained(data: bytes | bytearray | memoryview) -> bytes:
    """``data`` in an allocation of its own length."""
    return memoryview(data).tobytes()
