"""The redaction's decisions (``proxy.redact``), in-process: which texts are masked and how, which
key names are credentials, how deep a value is walked and how many key verdicts are remembered."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from proxy import redact
from proxy.redact import REDACTED, is_secret_key, redact_text, scrub
from tests.support.nesting import leaf_of, nested

KEY = "sk-" + "a" * 24


class Text(str):
    """A ``str`` subclass, as a library may hand one over."""


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("Authorization: Bearer abc.DEF_123~+/=-x", "Authorization: Bearer [REDACTED]"),
        ("bearer abcdef", "bearer [REDACTED]"),  # six characters: a token
        ("BEARER\tabcdefgh", "BEARER\t[REDACTED]"),
        ("key sk-abcdefgh here", "key [REDACTED] here"),  # eight characters: a key
        ("sk-ant-api03-abcdefgh", REDACTED),
        ("pk-live_12345678", REDACTED),
        ("rk-test-12345678", REDACTED),
        ("x=sk-abcdefgh,y=pk-abcdefgh", "x=[REDACTED],y=[REDACTED]"),
        ("Bearer sk-abcdefgh", "Bearer [REDACTED]"),
        (KEY, REDACTED),
    ],
)
def test_bearer_tokens_and_provider_keys_are_masked(text: str, masked: str) -> None:
    assert redact_text(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "bearer abcde",  # five characters: too short to be a token
        "sk-abcdefg",  # seven characters after the prefix
        "ask-abcdefgh",  # no word boundary before the prefix
        "unbearer abcdefgh",
        "max_tokens=5 prompt_tokens=3",
        "no-secret-here",
        "plain words only",
        "nodashnospace",
        "",
    ],
)
def test_texts_without_a_secret_are_unchanged(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(
    "key",
    [
        "password", "PASSWD", "client_secret", "credentials", "Authorization", "cookie", "Set-Cookie",
        "api_key", "api-key", "APIKEY", "key", "x_key", "x-key", "token", "access_token", "x-auth-token",
    ],
)  # fmt: skip
def test_credential_names_are_secret_keys(key: str) -> None:
    assert is_secret_key(key) is True
    assert is_secret_key(key) is True  # and again from the remembered verdict


@pytest.mark.parametrize(
    "key",
    ["max_tokens", "prompt_tokens", "tokens", "keyboard", "monkey", "keys", "trace_id", "module", "route",
     "kinds", "event", "tokenizer"],
)  # fmt: skip
def test_other_names_are_not(key: str) -> None:
    assert is_secret_key(key) is False
    assert is_secret_key(key) is False


def test_a_non_string_key_is_never_secret() -> None:
    assert is_secret_key(1) is False
    assert is_secret_key(None) is False
    assert is_secret_key(("token",)) is False


def test_a_str_subclass_key_is_judged_like_a_str() -> None:
    assert is_secret_key(Text("password")) is True
    assert is_secret_key(Text("model")) is False


@pytest.fixture
def empty_verdicts() -> Iterator[dict[str, bool]]:
    saved = dict(redact.KEY_VERDICTS)
    redact.KEY_VERDICTS.clear()
    yield redact.KEY_VERDICTS
    redact.KEY_VERDICTS.clear()
    redact.KEY_VERDICTS.update(saved)


def test_verdicts_are_remembered_up_to_the_bound_then_judged_afresh(empty_verdicts: dict[str, bool]) -> None:
    for i in range(redact.KEY_VERDICTS_MAX - 1):
        is_secret_key(f"field_{i}")
    is_secret_key("api_key")
    assert len(empty_verdicts) == redact.KEY_VERDICTS_MAX == 4096
    assert empty_verdicts["api_key"] is True and empty_verdicts["field_0"] is False
    assert is_secret_key("access_token") is True  # not remembered, still judged
    assert is_secret_key("another") is False
    assert len(empty_verdicts) == redact.KEY_VERDICTS_MAX


def test_scrub_replaces_credential_valued_keys_and_masks_strings() -> None:
    value = {
        "password": {"nested": "anything"},
        "token": 12,
        "note": f"Bearer abcdefgh and {KEY}",
        "items": ("plain", KEY, 3, None),
        "count": 3,
        "flag": True,
        7: "seven",
    }
    assert scrub(value) == {
        "password": REDACTED,
        "token": REDACTED,
        "note": f"Bearer {REDACTED} and {REDACTED}",
        "items": ["plain", REDACTED, 3, None],
        "count": 3,
        "flag": True,
        7: "seven",
    }


def test_scrub_masks_a_str_subclass() -> None:
    assert scrub(Text(KEY)) == REDACTED
    assert scrub([Text(f"Bearer {KEY}")]) == [f"Bearer {REDACTED}"]


@pytest.mark.parametrize("depth", [0, 1, 7, 8])
def test_scrub_walks_eight_levels(depth: int) -> None:
    assert leaf_of(scrub(nested(depth, KEY))) == REDACTED
    assert scrub(nested(depth, {"token": "x"})) == nested(depth, {"token": REDACTED})


def test_scrub_leaves_what_is_deeper_than_eight_levels() -> None:
    assert leaf_of(scrub(nested(9, KEY))) == KEY
    assert scrub(nested(7, [KEY])) == nested(7, [REDACTED])  # the list at 7, its items at 8
    assert scrub(nested(8, [KEY])) == nested(8, [KEY])
    assert scrub(KEY, depth=9) == KEY
    assert scrub(KEY, depth=8) == REDACTED


class LookAlike(str):
    """A ``str`` subclass that hashes and compares like any other text, as a careless one may."""

    def __hash__(self) -> int:
        return hash("model")

    def __eq__(self, other: object) -> bool:
        return True


def test_a_str_subclass_is_judged_afresh_not_by_a_look_alike(empty_verdicts: dict[str, bool]) -> None:
    assert is_secret_key("model") is False
    assert is_secret_key(LookAlike("password")) is True


def test_a_remembered_verdict_answers_without_judging_again(empty_verdicts: dict[str, bool]) -> None:
    """The log path judges its few key names once; the memo is what answers after that."""
    assert is_secret_key("password") is True
    assert empty_verdicts == {"password": True}
    empty_verdicts["password"] = False  # a marker: only the memo can answer False for it
    assert is_secret_key("password") is False
