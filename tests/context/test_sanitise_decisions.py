"""The context sanitiser's decisions (``proxy.context.sanitise``), in-process: which names and
values are redacted, where strings and nesting are cut, and the paths reported."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.context.sanitise import MAX_DEPTH, MAX_STRING_CHARS, TRUNCATED, NameMatcher, sanitise
from proxy.redact import REDACTED
from tests.support.nesting import leaf_of, nested

KEY = "sk-" + "a" * 24


def test_the_depth_cut_is_at_32_levels() -> None:
    assert MAX_DEPTH == 32
    kept = sanitise(nested(MAX_DEPTH, "leaf"))
    assert leaf_of(kept.value) == "leaf"
    assert kept.truncated == []
    cut = sanitise(nested(MAX_DEPTH + 1, "leaf"))
    assert leaf_of(cut.value) == TRUNCATED
    assert cut.truncated == ["_context" + ".a" * (MAX_DEPTH + 1)]


def test_lists_count_as_levels_too() -> None:
    value: Any = "leaf"
    for _ in range(MAX_DEPTH + 1):
        value = [value]
    out = sanitise(value)
    inner = out.value
    for _ in range(MAX_DEPTH):
        inner = inner[0]
    assert inner == [TRUNCATED]
    assert out.truncated == ["_context" + "[0]" * (MAX_DEPTH + 1)]


def test_strings_are_cut_after_10000_characters_with_their_path() -> None:
    out = sanitise({"history": ["a" * MAX_STRING_CHARS, "b" * (MAX_STRING_CHARS + 1)]})
    assert out.value == {"history": ["a" * MAX_STRING_CHARS, "b" * MAX_STRING_CHARS + TRUNCATED]}
    assert (out.truncated, out.redacted) == (["_context.history[1]"], [])


def test_credential_values_are_masked_whatever_their_name_and_reported_by_path() -> None:
    out = sanitise({"notes": [f"use {KEY} here", "plain"], "auth": {"header": "Bearer abcdefgh123"}})
    assert out.value == {
        "notes": [f"use {REDACTED} here", "plain"],
        "auth": {"header": f"Bearer {REDACTED}"},
    }
    assert out.redacted == ["_context.notes[0]", "_context.auth.header"]
    assert out.truncated == []


def test_a_masked_long_string_is_reported_both_ways() -> None:
    out = sanitise({"log": KEY + " " + "x" * MAX_STRING_CHARS})
    assert out.value["log"].startswith(REDACTED + " x")
    assert out.value["log"].endswith(TRUNCATED)
    assert len(out.value["log"]) == MAX_STRING_CHARS + len(TRUNCATED)
    assert (out.redacted, out.truncated) == (["_context.log"], ["_context.log"])


def test_sensitive_names_are_replaced_without_walking_their_value() -> None:
    out = sanitise({"user": {"password": {"deep": KEY}, "name": "ann"}, "api_key": 42})
    assert out.value == {"user": {"password": REDACTED, "name": "ann"}, "api_key": REDACTED}
    assert out.redacted == ["_context.user.password", "_context.api_key"]


@pytest.mark.parametrize("scalar", [None, 0, 1.5, True, False])
def test_other_values_are_kept_as_they_are(scalar: Any) -> None:
    out = sanitise({"v": scalar, 3: scalar})
    assert out.value == {"v": scalar, 3: scalar}
    assert out.value["v"] is scalar
    assert (out.redacted, out.truncated) == ([], [])


def test_keys_that_are_not_strings_are_kept_and_walked() -> None:
    out = sanitise({7: {"token": "t"}, None: KEY})
    assert out.value == {7: {"token": REDACTED}, None: REDACTED}
    assert out.redacted == ["_context.7.token", "_context.None"]


def test_a_scalar_context_is_walked_at_the_root() -> None:
    out = sanitise(KEY)
    assert (out.value, out.redacted) == (REDACTED, ["_context"])


@pytest.mark.parametrize(
    ("name", "sensitive"),
    [
        ("password", True),
        ("Password", True),
        ("user_passwd", True),
        ("api_key", True),
        ("apiKey", True),
        ("X-Auth-Token", True),
        ("sessionToken", True),
        ("client.secret", True),
        ("SECRET", True),
        ("Authorization", True),
        ("cookie", True),
        ("credentials", True),  # the log redaction's pattern
        ("key", True),
        ("max_tokens", False),
        ("keyboard", False),
        ("monkey", False),
        ("tokenizer", False),
        ("locale", False),
        ("", False),
    ],
)
def test_default_names(name: str, sensitive: bool) -> None:
    assert NameMatcher()(name) is sensitive


def test_names_are_configurable_and_case_blind() -> None:
    matcher = NameMatcher(["SSN", "Dob"])
    verdicts = [matcher(name) for name in ("ssn", "user_SSN", "patientDob", "dobby")]
    assert verdicts == [True, True, True, False]
    assert matcher("password") is True  # the log redaction's names stay
    assert matcher("locale") is False
    out = sanitise({"ssn": "1", "x": {"Dob": "2"}, "y": "3"}, matcher)
    assert out.value == {"ssn": REDACTED, "x": {"Dob": REDACTED}, "y": "3"}
