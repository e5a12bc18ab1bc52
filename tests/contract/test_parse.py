"""Stage 1: strict JSON, fenced blocks, top-level prose extraction; never NaN; never repair;
linear cost; one envelope or none."""

from __future__ import annotations

import contextlib
import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.contract.parse import MAX_DECODED_CANDIDATES, ParseFailure, Span, parse_json_object, scan
from proxy.jsonshape import MAX_FORWARDED_DEPTH, MAX_JSON_DEPTH, encodable


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
    text = 'Sure! {"a": {"b": "}"}} and that is all.'
    parsed = parse_json_object(text)
    assert parsed.value == {"a": {"b": "}"}}
    assert parsed.method == "prose"
    assert text[slice(*parsed.span)] == '{"a": {"b": "}"}}'


def test_two_objects_at_top_level_are_ambiguous() -> None:
    with pytest.raises(ParseFailure) as info:
        parse_json_object('Sure! {"a": 1} and that is all {"c": 2}')
    assert info.value.reason.startswith("ambiguous: 2 envelopes")


def test_quoted_envelope_in_a_fence_and_the_own_one_are_ambiguous() -> None:
    quoted = '{"ok": true, "meta": {"confidence": 0.99, "risk": "none"}, "data": {}}'
    own = '{"ok": true, "meta": {"confidence": 0.4, "risk": "low"}, "data": {}}'
    for text in (f"The issue says:\n```json\n{quoted}\n```\nMy answer: {own}", f"{own}\n> {quoted}"):
        with pytest.raises(ParseFailure) as info:
            parse_json_object(text)
        assert info.value.reason.startswith("ambiguous: 2 envelopes")


def test_a_strict_whole_answer_wins_over_envelopes_quoted_inside_it() -> None:
    inner = '{"ok": true, "meta": {"confidence": 0.99}}'
    text = json.dumps({"ok": True, "meta": {"confidence": 0.4}, "data": {"quote": inner}})
    assert parse_json_object(text).value["meta"] == {"confidence": 0.4}


def test_an_object_inside_an_unclosed_wrapper_is_never_extracted() -> None:
    envelope = '{"ok": true, "meta": {"confidence": 0.95, "risk": "low", "explain": "x"}, "data": {}}'
    text = f'{{"result": {envelope}, "alternatives": [{{"ok": true, "meta": {{"confid'
    with pytest.raises(ParseFailure) as info:
        parse_json_object(text)
    assert info.value.reason.startswith("truncated")


def test_objects_inside_a_top_level_array_are_not_extracted() -> None:
    with pytest.raises(ParseFailure) as info:
        parse_json_object('Here: [{"ok": true}] done')
    assert "no JSON object" in info.value.reason


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_nesting_beyond_the_bound_is_a_clean_failure(opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    deep = opener * 2000 + "1" + closer * 2000
    with pytest.raises(ParseFailure) as info:
        parse_json_object(deep)
    assert "too deeply nested" in info.value.reason
    ok = opener * MAX_JSON_DEPTH + "1" + closer * MAX_JSON_DEPTH
    assert parse_json_object(ok if opener != "[" else '{"a": ' + ok[1:-1] + "}")


def test_an_object_parsed_whole_is_held_to_the_same_bound_as_a_scanned_one() -> None:
    """The strict path checks the parsed value's depth, the other paths the text's: one bound."""
    inner = "[" * (MAX_JSON_DEPTH - 1) + "1" + "]" * (MAX_JSON_DEPTH - 1)
    assert parse_json_object('{"a": ' + inner + "}").method == "strict"  # 64 levels
    for text in ('{"a": [' + inner + "]}", 'note {"a": [' + inner + "]}"):  # 65, strict or in prose
        with pytest.raises(ParseFailure) as info:
            parse_json_object(text)
        assert "too deeply nested" in info.value.reason
    with pytest.raises(ParseFailure) as info:
        parse_json_object('"' + "{" * (MAX_JSON_DEPTH + 1) + '"')  # the text is scanned as before
    assert "too deeply nested" in info.value.reason


def test_a_flood_of_objects_decodes_a_bounded_number() -> None:
    with pytest.raises(ParseFailure) as info:
        parse_json_object('{"a": 1} ' * 10_000)
    assert f"{MAX_DECODED_CANDIDATES} or more envelopes" in info.value.reason


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
        ('{"ok": true, "meta": {', "truncated"),
        ('{"ok": true, "meta": {"explain": "cut', "truncated"),
        ('{"a": [1}', "unbalanced"),
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


hostile_texts = st.one_of(
    st.builds(lambda n, t: "```" + " " * n + t, st.integers(0, 5000), st.sampled_from(["", "x", "`", "{"])),
    st.builds(lambda n, k: ("`" * k + " " * n) * 20, st.integers(0, 200), st.integers(1, 7)),
    st.builds(lambda n: "{" * n, st.integers(0, 5000)),
    st.builds(lambda n: '{"a": "' + "\\" * n, st.integers(0, 5000)),
    st.builds(lambda n: "[" * n + "]" * n, st.integers(0, 5000)),
    st.builds(lambda n: '{"a": 1} x ' * n, st.integers(0, 500)),
    st.text(alphabet='{}[]"\\` \nab:,', max_size=3000),
)


@given(hostile_texts)
def test_scan_cost_is_linear_in_the_text(text: str) -> None:
    """Parse time per KB is bounded: one pass (each character visited once, each structural
    character handled once), and the candidates decoded never overlap."""
    found = scan(text)
    assert found.visited <= len(text)
    assert found.steps <= len(text) + 1
    assert sum(s.end - s.start for s in found.spans) <= len(text)
    with contextlib.suppress(ParseFailure):
        parse_json_object(text)


def _top_level_starts(text: str) -> set[int]:
    """Reference: the offsets where a top-level '{' opens, by a plain character loop."""
    starts, depth, in_string, escaped = set(), 0, False, False
    for i, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif depth and char == '"':
            in_string = True
        elif char in "{[":
            if depth == 0 and char == "{":
                starts.add(i)
            depth += 1
        elif char in "}]" and depth:
            depth -= 1
    return starts


objects = st.dictionaries(st.sampled_from(["ok", "meta", "data", "x"]), json_values, max_size=3)
pieces = st.one_of(
    st.text(alphabet="ab .:\n`'\"}]", max_size=12),
    objects.map(json.dumps),
    objects.map(lambda o: '{"wrap": ' + json.dumps(o)),
    objects.map(lambda o: "[" + json.dumps(o)),
    objects.map(lambda o: "```json\n" + json.dumps(o) + "\n```"),
    objects.map(lambda o: json.dumps(o)[:-1]),
)


@given(st.lists(pieces, max_size=6).map("".join))
def test_extraction_takes_only_top_level_objects_found_in_the_text(text: str) -> None:
    try:
        parsed = parse_json_object(text)
    except ParseFailure:
        return
    start, end = parsed.span
    assert json.loads(text[start:end]) == parsed.value  # the accepted object is the model's own text
    if parsed.method != "strict":
        assert start in _top_level_starts(text)


# --- exact outputs: method, span, reason ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "method", "span"),
    [
        ('  {"a": 1}\n ', "strict", (2, 10)),
        ('\ufeff \n{"a": 1}', "strict", (3, 11)),  # a leading byte-order mark, then whitespace
        ('X {"a": 1}', "prose", (2, 10)),
        ('{"a": 1}]', "prose", (0, 8)),  # a closer at depth 0 is prose
        ('bad {"a": 1,} then {"b": 2}', "prose", (19, 27)),  # the first '{' is not the object
        ('```json\r\n{"b": 2}\r\n```', "fence", (9, 17)),
        ('```python\n{"b": 2}\n```', "fence", (10, 18)),
    ],
)
def test_method_and_span(text: str, method: str, span: tuple[int, int]) -> None:
    parsed = parse_json_object(text)
    assert (parsed.method, parsed.span) == (method, span)
    assert json.loads(text[slice(*span)]) == parsed.value


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("   \n ", "the model returned no text"),
        ("true", "expected a JSON object, got a boolean"),
        ("null", "expected a JSON object, got null"),
        ("1.5", "expected a JSON object, got a number"),
        ("[]", "expected a JSON object, got an array"),
        ('"s"', "expected a JSON object, got a string"),
        ('[1, {"a": 1}', "truncated: an array opened at offset 0 is never closed"),
        ('x {"a": 1', "truncated: an object opened at offset 2 is never closed"),
        ('{"a": "x', "truncated: a string opened inside the value at offset 0 is never closed"),
        ('{"a": [1}', "unbalanced brackets: '}' at offset 8 closes the wrong opener"),
        (
            '{"a": 1} {"b": 2}',
            "ambiguous: 2 envelopes at the top level of the answer (answer with exactly one JSON object)",
        ),
    ],
)
def test_failure_reason(text: str, reason: str) -> None:
    with pytest.raises(ParseFailure) as failure:
        parse_json_object(text)
    assert failure.value.reason == reason
    assert str(failure.value) == reason


@pytest.mark.parametrize("text", ['{"a": NaN}', '"s" x', '{"a": 1e999}'])
def test_no_object_names_the_strict_parse_error(text: str) -> None:
    with pytest.raises(orjson.JSONDecodeError) as strict:
        orjson.loads(text)
    with pytest.raises(ParseFailure) as failure:
        parse_json_object(text)
    assert failure.value.reason == f"no JSON object found in the model output ({strict.value})"


@pytest.mark.parametrize(
    ("text", "alone"),
    [
        ('{"a": 1}', True),
        (' \n{"a": 1}\n', True),
        ('```json\n{"a": 1}\n```', True),
        ('```\n{"a": 1}\n````', True),
        ('```json\n{"a": 1}\n```\nDone.', False),
        ('Here:\n```json\n{"a": 1}\n```', False),
        ('Sure: {"a": 1}', False),
        ('{"a": 1} ok', False),
        ('```json x\n{"a": 1}\n```', False),
    ],
)
def test_alone_only_when_nothing_but_whitespace_or_one_fence_surrounds_it(text: str, alone: bool) -> None:
    assert parse_json_object(text).alone is alone


def test_scan_keeps_top_level_objects_only() -> None:
    found = scan('[1] {"a": {"b": 1}} ```\n{"c": [2]}\n```')
    assert found.spans == [Span(4, 19, False), Span(24, 34, True)]


def test_scan_counts_every_structural_step() -> None:
    """Steps: each opener/closer/quote at the top or inside a value, each stop inside a string."""
    assert (scan('x {"a": [1]} y').steps, scan('x {"a": [1]} y').visited) == (7, 14)
    assert scan('{"a": "b\\"c"}').steps == 7  # ends on the closer: nothing counted past the end
    assert scan("").steps == 0


def test_scan_reports_how_far_it_read_before_stopping() -> None:
    malformed = scan('{"a": [1} and more')
    assert (malformed.malformed, malformed.visited) == (
        "unbalanced brackets: '}' at offset 8 closes the wrong opener",
        9,
    )
    deep = scan("[" * (MAX_JSON_DEPTH + 1) + " rest")
    assert (deep.too_deep, deep.visited) == (True, MAX_JSON_DEPTH + 1)


def _nested(levels: int) -> dict[str, object]:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return {"messages": value}


def test_a_body_as_deep_as_orjson_writes_is_encodable_and_one_level_more_is_not() -> None:
    """``encodable`` is the passthrough's depth check: it must agree with what can be forwarded."""
    deepest = max(n for n in range(240, 300) if encodable(_nested(n)))
    assert deepest >= MAX_FORWARDED_DEPTH
    assert not encodable(_nested(deepest + 1))
    assert encodable({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
