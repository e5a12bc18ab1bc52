"""``CHECKPOINT_MARK``: the bytes ``follow`` takes for a delta's checkpoint are in every delta and
in no snapshot, whatever the field names and texts (model output) hold."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.stream.chunks import CHECKPOINT_MARK, delta_chunk, snapshot_chunk

PIECES = ('"', "\\", "checkpoint", ":", "{", '"offset":', '"checkpoint":{"offset":', "}", ",")
hostile = st.lists(st.sampled_from(PIECES) | st.text(max_size=4), max_size=12).map("".join)
"""Texts built from the mark's own pieces: quotes, backslashes, the key, the object's start."""


@given(st.dictionaries(hostile, hostile, max_size=4), st.integers(1, 10**6))
def test_no_snapshot_holds_the_mark(data: dict[str, str], seq: int) -> None:
    assert CHECKPOINT_MARK not in orjson.dumps(snapshot_chunk(seq, data))


@given(hostile, hostile, hostile, st.integers(1, 10**6))
def test_every_delta_holds_the_mark(field: str, delta: str, accumulated: str, seq: int) -> None:
    assert CHECKPOINT_MARK in orjson.dumps(delta_chunk(seq, field, delta, accumulated))
