"""Stage 1: strict JSON, fenced blocks, prose extraction; never NaN; never repair."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.contract.parse import ParseFailure, parse_json_object


def test_strict_object_is_taken_as_is() -> None:
    parsed = parse_json_object('  {"ok": true, "n": [1, 2]}\n')
    assert parsed.value == {"ok": True, "n": [1, 2]}
    assert parsed.method == "strict"


def test_object_inside_markdown_fence_is_extracted() -> None:
    text = 'Here is the answer:\n```json\n{"ok": true}\n```\nHope it helps.'
    parsed = parse_json_object(text)
    assert parsed.value == {"ok": True}
    assert parsed.method == "fence"


def test_unlabelled_fence_and_later_fence_with_object() -> None:
    text = '```\nnot json\n```\nthen\n```\n{"a": 1}\n```'
    assert parse_json_object(text).value == {"a": 1}


def test_object_embedded_in_prose_is_extracted() -> None:
    parsed = parse_json_object('Sure! {"a": {"b": "}"}} and that is all {"c": 2}')
    assert parsed.value == {"a": {"b": "}"}}
    assert parsed.method == "prose"


@pytest.mark.parametrize(
    "text",
    ['{"c": NaN}', '{"c": Infinity}', '{"c": -Infinity}', 'answer: {"c": NaN}', '```json\n{"c": NaN}\n```'],
)
def test_non_standard_numbers_are_refused(text: str) -> None:
    with pytest.raises(ParseFailure):
        parse_json_object(text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no text"),
        ("   \n", "no text"),
        ("[1, 2]", "got an array"),
        ('"just a string"', "got a string"),
        ('{"ok": true, "meta": {', "no JSON object"),
        ("I cannot help with that.", "no JSON object"),
    ],
)
def test_no_object_is_a_parse_failure_with_reason(text: str, reason: str) -> None:
    with pytest.raises(ParseFailure) as info:
        parse_json_object(text)
    assert reason in info.value.reason


def test_truncated_object_is_not_completed() -> None:
    """A cut-off answer must not be 'repaired' into data the model never produced."""
    with pytest.raises(ParseFailure):
        parse_json_object('{"ok": true, "data": {"result": "x"')


def test_hostile_text_with_many_braces_fails_quickly() -> None:
    with pytest.raises(ParseFailure):
        parse_json_object("{" * 200_000)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(
    st.dictionaries(st.text(max_size=8), json_values, max_size=5), st.text(alphabet="abc .:\n", max_size=20)
)
def test_any_object_round_trips_through_prose(obj: dict[str, object], prose: str) -> None:
    import json

    text = prose + json.dumps(obj) + prose
    assert parse_json_object(text).value == obj


@given(st.text(max_size=200))
def test_arbitrary_text_either_parses_to_a_dict_or_fails_cleanly(text: str) -> None:
    try:
        parsed = parse_json_object(text)
    except ParseFailure:
        return
    assert isinstance(parsed.value, dict)
