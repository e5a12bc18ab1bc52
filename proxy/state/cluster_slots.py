"""A hash tag for each of a Redis Cluster's 16,384 slots, so a key can be put on another key's
slot (the outbox's marks, ``proxy.state.outbox``, live beside the keys they guard)."""

from __future__ import annotations

import binascii
import functools
import itertools

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

TAG_ALPHABET = "0123456789:;<=>?"
"""Four characters of these (``0x30 | n``) reach every slot: CRC16 is linear in the message bits."""


@functools.cache
def _tags() -> tuple[str, ...]:
    """The first four-character tag of each slot (built once, ~0.2 s, by the first cluster outbox)."""
    tags: dict[int, str] = {}
    for chars in itertools.product(TAG_ALPHABET, repeat=4):
        tag = "".join(chars)
        tags.setdefault(
            binascii.crc_hqx(tag.encode(), 0) % REDIS_CLUSTER_HASH_SLOTS, tag
        )  # no braces: all of it
    return tuple(tags[slot] for slot in range(REDIS_CLUSTER_HASH_SLOTS))


def slot_tag(key: str) -> str:
    """A hash tag whose slot is ``key``'s."""
    return _tags()[key_slot(key.encode())]
