"""The error taxonomy: every code, legacy names both ways, status mapping, envelopes."""

from __future__ import annotations

import pytest

from proxy.contract.errors import BY_CODE, Origin, error_envelope, http_status, to_numeric
from proxy.contract.validate import validate_envelope

ALL_CODES = (
    [f"E100{i}" for i in range(7)]
    + [f"E200{i}" for i in range(1, 8)]
    + [f"E300{i}" for i in range(1, 7)]
    + [f"E400{i}" for i in range(8)]
    + ["E2010", "E2011", "E4010", "E4012"]  # v2.5 streaming (E4012: §3.2.6.4)
    + [f"E101{i}" for i in range(8)]  # spec v2.5 §7.1 and §4.5 (media)
    + ["E4011"]
)


def test_every_code_of_the_taxonomy_is_known() -> None:
    assert sorted(BY_CODE) == sorted(ALL_CODES)


@pytest.mark.parametrize(
    ("legacy", "numeric"),
    [
        ("PARSE_ERROR", "E1000"),
        ("INVALID_INPUT", "E1001"),
        ("SCHEMA_VALIDATION_FAILED", "E3001"),
        ("UNSUPPORTED_LANGUAGE", "E1004"),
        ("NO_SIMPLIFICATION_POSSIBLE", "E2004"),
        ("BEHAVIOR_CHANGE_REQUIRED", "E2005"),
        ("INTERNAL_ERROR", "E4000"),
        ("MODULE_NOT_FOUND", "E4006"),
        ("LOW_CONFIDENCE", "E2001"),
    ],
)
def test_legacy_names_map_to_numeric_codes(legacy: str, numeric: str) -> None:
    assert to_numeric(legacy) == numeric
    assert to_numeric(numeric) == numeric


@pytest.mark.parametrize(
    ("numeric", "name"),
    [
        ("E1000", "PARSE_ERROR"),
        ("E3001", "SCHEMA_VALIDATION_FAILED"),
        ("E4002", "RATE_LIMITED"),
        ("E2004", "NO_ACTION_POSSIBLE"),
    ],
)
def test_numeric_codes_and_names_map_both_ways(numeric: str, name: str) -> None:
    assert BY_CODE[numeric].name == name and to_numeric(name) == numeric


def test_unknown_codes_map_to_nothing() -> None:
    assert to_numeric("E5001") is None and to_numeric("WHATEVER") is None


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("E1000", 400),
        ("E1001", 400),
        ("E1005", 400),
        ("E2001", 200),
        ("E3001", 200),
        ("E4000", 500),
        ("E4001", 503),
        ("E4002", 429),
        ("E4006", 404),
        ("E5001", 200),
        ("PARSE_ERROR", 400),
    ],
)
def test_one_mapping_from_code_to_http_status(code: str, status: int) -> None:
    assert http_status(code) == status


@pytest.mark.parametrize("code", ["E1000", "E1001", "E4000", "E4001", "E4002", "E4006", "E5001"])
@pytest.mark.parametrize("origin", [Origin.MODEL, Origin.CONTRACT])
def test_a_module_that_ran_answers_200_whatever_code_it_carries(code: str, origin: Origin) -> None:
    assert http_status(code, origin) == 200


@pytest.mark.parametrize(
    ("code", "origin", "status"),
    [
        ("E1000", Origin.CALLER, 400),
        ("E1001", Origin.CALLER, 400),
        ("E2001", Origin.POLICY, 200),
        ("E2002", Origin.RUNTIME, 200),
        ("E4000", Origin.RUNTIME, 500),
        ("E4001", Origin.RUNTIME, 503),
        ("E4002", Origin.RUNTIME, 429),
    ],
)
def test_the_proxys_own_outcomes_use_the_table(code: str, origin: Origin, status: int) -> None:
    assert http_status(code, origin) == status


@pytest.mark.parametrize("code", ALL_CODES)
def test_every_error_envelope_is_a_valid_failure_envelope(code: str) -> None:
    envelope = error_envelope(code, "something happened")
    assert validate_envelope(envelope) == []
    assert envelope["meta"]["confidence"] == 0.0
    assert envelope["meta"]["risk"] == "high"
    spec = BY_CODE[code]
    if spec.recoverable is None:
        assert "recoverable" not in envelope["error"]
    else:
        assert envelope["error"]["recoverable"] is spec.recoverable


def test_input_error_explain_blames_the_caller() -> None:
    assert error_envelope("E1001", "bad").get("meta", {})["explain"].startswith("Caller error")
    assert error_envelope("E4001", "down")["meta"]["explain"].startswith("System failure")


def test_explain_is_capped() -> None:
    assert len(error_envelope("E4000", "x" * 1000)["meta"]["explain"]) == 280
