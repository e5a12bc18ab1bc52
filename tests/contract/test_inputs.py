"""Input validation before any model call: E1001, E1002, E1003, E1005."""

from __future__ import annotations

import pytest

from proxy.contract.inputs import check_input
from proxy.contract.validate import validate_envelope
from tests.conftest import ModuleFactory


def test_valid_input_passes(make_module: ModuleFactory) -> None:
    assert check_input(make_module(), {"code": "x = 1 + 2"}) is None


@pytest.mark.parametrize(
    ("value", "code", "path"),
    [
        ({}, "E1002", "input.code"),
        ({"code": 5}, "E1003", "input.code"),
        ({"language": 5}, "E1001", None),
        ("just text", "E1001", None),
        ([1], "E1001", None),
    ],
)
def test_bad_input_codes(make_module: ModuleFactory, value: object, code: str, path: str | None) -> None:
    envelope = check_input(make_module(), value)
    assert envelope is not None
    assert envelope["error"]["code"] == code
    assert envelope["meta"]["confidence"] == 0.0
    assert "caller" in envelope["meta"]["explain"].lower()
    assert envelope["error"]["recoverable"] is True
    assert validate_envelope(envelope) == []
    if path:
        assert envelope["error"]["details"]["violations"][0]["path"] == path


def test_input_too_large(make_module: ModuleFactory) -> None:
    module = make_module(runtime_requirements={"max_input_tokens": 10})
    assert check_input(module, {"code": "x"}) is None
    envelope = check_input(module, {"code": "x" * 100})
    assert envelope is not None and envelope["error"]["code"] == "E1005"
    assert envelope["error"]["details"]["max_input_tokens"] == 10
