"""Field deltas from a growing model answer, and the checkpoints of the chunks."""

from __future__ import annotations

import hashlib
import json
import re

from hypothesis import given
from hypothesis import strategies as st

from proxy.stream.chunks import checkpoint
from proxy.stream.fields import MAX_PARSED_BYTES, FieldDiffer, streamable_fields
from tests.conftest import ModuleFactory

FIELDS = ("data.rationale", "data.result")


def feed_all(differ: FieldDiffer, pieces: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for piece in pieces:
        for field, delta, accumulated in differ.feed(piece):
            out[field] = out.get(field, "") + delta
            assert out[field] == accumulated
    return out


@given(
    rationale=st.text(max_size=80),
    result=st.text(max_size=40),
    cuts=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=60),
)
def test_deltas_add_up_to_the_final_strings_however_the_text_is_cut(
    rationale: str, result: str, cuts: list[int]
) -> None:
    text = json.dumps(
        {"ok": True, "meta": {"confidence": 0.9}, "data": {"result": result, "rationale": rationale}}
    )
    pieces, at = [], 0
    for size in cuts * 40:
        if at >= len(text):
            break
        pieces.append(text[at : at + size])
        at += size
    pieces.append(text[at:])
    got = feed_all(FieldDiffer(FIELDS), pieces)
    assert got.get("data.rationale", "") == rationale and got.get("data.result", "") == result


def test_text_before_the_object_and_non_streamed_fields_are_ignored() -> None:
    text = 'Sure! ```json\n{"data": {"rationale": "ab", "other": "zz", "result": 3}}\n```'
    got = feed_all(FieldDiffer(FIELDS), re.findall(".{1,3}", text, re.S))
    assert got == {"data.rationale": "ab"}


def test_a_reset_starts_the_fields_over() -> None:
    differ = FieldDiffer(FIELDS)
    assert feed_all(differ, ['{"data": {"rationale": "first']) == {"data.rationale": "first"}
    differ.reset()
    assert feed_all(differ, ['{"data": {"rationale": "sec', 'ond"}}']) == {"data.rationale": "second"}


def test_parsing_stops_beyond_the_bound() -> None:
    differ = FieldDiffer(FIELDS)
    got = feed_all(differ, ['{"data": {"rationale": "', "x" * MAX_PARSED_BYTES, "tail"])
    assert got == {}  # the whole answer still arrives in the final chunk


def test_checkpoint_is_utf8_offset_and_six_hex_of_sha256() -> None:
    text = "héllo ✓"
    assert checkpoint(text) == {
        "offset": len(text.encode()),
        "hash": hashlib.sha256(text.encode()).hexdigest()[:6],
    }
    assert checkpoint(text)["offset"] == 10


def test_streamable_fields_default_and_declared(make_module: ModuleFactory) -> None:
    assert streamable_fields(make_module()) == ("data.rationale", "data.result", "data.note")
    declared = make_module(response={"mode": "both", "stream_fields": ["data.note", "meta.explain"]})
    assert streamable_fields(declared) == ("data.note",)
