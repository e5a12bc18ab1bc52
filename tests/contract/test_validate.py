"""Stage 3: envelope rules (§0.1), module schemas with tier strictness, overflow, enums."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from proxy import schemas
from proxy.contract.validate import standard, validate_answer, validate_envelope
from proxy.json_schema import Violation, check, compile_schema
from tests.conftest import SCHEMA, VECTORS, ModuleFactory, schema_with, success

VECTOR_FILES = sorted(VECTORS.rglob("*.json"))


@pytest.mark.parametrize("path", VECTOR_FILES, ids=[p.stem for p in VECTOR_FILES])
def test_official_vectors(path: Any) -> None:
    vector = json.loads(path.read_text())
    violations = validate_envelope(vector["envelope"])
    if vector["$test"]["expects"] == "accept":
        assert violations == []
    else:
        assert violations, "must be rejected"


def test_there_are_sixteen_official_vectors() -> None:
    assert len(VECTOR_FILES) == 16


@pytest.mark.parametrize(
    ("mutate", "path", "code"),
    [
        (lambda e: e["data"].pop("rationale"), "data.rationale", "E3003"),
        (lambda e: e["data"].update(rationale="   "), "data.rationale", "E3003"),
        (lambda e: e["meta"].update(risk="critical"), "meta.risk", "E3005"),
        (lambda e: e["meta"].update(confidence="0.9"), "meta.confidence", "E3001"),
        (lambda e: e["meta"].update(confidence=True), "meta.confidence", "E3001"),
        (lambda e: e.update(extra=1), "extra", "E3001"),
        (lambda e: e.update(partial_data={}), "partial_data", "E3001"),
        (lambda e: e.pop("meta"), "meta", "E3001"),
    ],
)
def test_envelope_violations_name_path_and_specific_code(mutate: Any, path: str, code: str) -> None:
    envelope = success()
    mutate(envelope)
    violations = validate_envelope(envelope)
    assert any(v.path == path and v.code == code for v in violations), violations


def test_failure_envelope_partial_data_must_be_an_object() -> None:
    envelope = {
        "ok": False,
        "meta": {"confidence": 0.0, "risk": "high", "explain": "x"},
        "error": {"code": "E", "message": "m"},
        "partial_data": None,
    }
    assert [v.path for v in validate_envelope(envelope)] == ["partial_data"]


def test_module_data_schema_is_enforced(make_module: ModuleFactory) -> None:
    module = make_module()
    envelope = success()
    envelope["data"]["result"] = 42
    assert [str(v) for v in validate_answer(envelope, module)] == ["data.result: must be string"]


def test_module_error_schema_is_enforced_for_model_failures(make_module: ModuleFactory) -> None:
    module = make_module(
        schema=schema_with(
            error={
                "type": "object",
                "required": ["code", "message"],
                "properties": {"code": {"enum": ["UNSUPPORTED_LANGUAGE"]}, "message": {"type": "string"}},
            }
        )
    )
    failure: dict[str, Any] = {
        "ok": False,
        "meta": {"confidence": 0.2, "risk": "high", "explain": "no"},
        "error": {"code": "MADE_UP", "message": "m"},
    }
    assert [v.path for v in validate_answer(failure, module)] == ["error.code"]
    failure["error"]["code"] = "UNSUPPORTED_LANGUAGE"
    assert validate_answer(failure, module) == []


@pytest.mark.parametrize(
    ("tier", "manifest", "insights", "ok"),
    [
        ("decision", {}, 5, True),
        ("decision", {}, 6, False),
        ("exploration", {}, 20, True),
        ("exploration", {}, 21, False),
        ("exec", {}, 1, False),
        ("exec", {}, 0, True),
        ("decision", {"overflow": {"max_items": 2}}, 3, False),
        ("exec", {"overflow": {"enabled": True, "max_items": 3}}, 3, True),
        ("decision", {"overflow": {"enabled": False}}, 1, False),
    ],
)
def test_overflow_limit_by_tier_and_manifest(
    make_module: ModuleFactory, tier: str, manifest: dict[str, Any], insights: int, ok: bool
) -> None:
    module = make_module(tier=tier, **manifest)
    envelope = success(
        extensions={"insights": [{"text": f"i{i}", "suggested_mapping": "x"} for i in range(insights)]}
    )
    if tier == "exec":
        envelope["data"]["changes"] = []
        envelope["data"]["note"] = "n"
    violations = validate_answer(envelope, module)
    assert (violations == []) is ok, violations
    if not ok:
        assert any(v.code == "E3004" for v in violations)


def test_require_suggested_mapping(make_module: ModuleFactory) -> None:
    """The normative envelope schema always requires the key; the flag also refuses blanks."""
    module = make_module()
    relaxed = make_module(overflow={"require_suggested_mapping": False})
    missing = success(extensions={"insights": [{"text": "no mapping"}]})
    blank = success(extensions={"insights": [{"text": "blank", "suggested_mapping": " "}]})
    path = "data.extensions.insights[0].suggested_mapping"
    assert [v.path for v in validate_answer(missing, module)] == [path]
    assert [v.path for v in validate_answer(missing, relaxed)] == [path]
    assert [v.path for v in validate_answer(blank, module)] == [path]
    assert validate_answer(blank, relaxed) == []


CUSTOM = {"custom": "inline_callback", "reason": "not in the list"}


@pytest.mark.parametrize(
    ("manifest", "accepted"),
    [
        ({"tier": "decision"}, True),
        ({"tier": "exploration"}, True),
        ({"tier": "exec"}, False),
        ({"tier": "decision", "enums": {"strategy": "strict"}}, False),
        ({"tier": "exec", "enums": {"strategy": "extensible"}}, True),
    ],
)
def test_custom_enum_form_only_under_extensible(
    make_module: ModuleFactory, manifest: dict[str, Any], accepted: bool
) -> None:
    module = make_module(**manifest)
    envelope = success(changes=[{"type": CUSTOM, "risk": "low"}])
    violations = validate_answer(envelope, module)
    assert (violations == []) is accepted, violations


def test_unknown_plain_enum_value_is_rejected_even_when_extensible(make_module: ModuleFactory) -> None:
    module = make_module(tier="decision")
    envelope = success(changes=[{"type": "rename_everything", "risk": "low"}])
    assert validate_answer(envelope, module)


def test_high_strictness_rejects_undeclared_data_fields(make_module: ModuleFactory) -> None:
    strict = make_module(tier="exec")
    medium = make_module(tier="decision")
    envelope = success(surprise="field")
    assert [v.path for v in validate_answer(envelope, strict)] == ["data"]
    assert validate_answer(envelope, medium) == []


def test_low_strictness_requires_only_rationale(make_module: ModuleFactory) -> None:
    low = make_module(tier="exploration")
    medium = make_module(tier="decision")
    envelope = success()
    del envelope["data"]["result"]
    assert validate_answer(envelope, low) == []
    assert [v.path for v in validate_answer(envelope, medium)] == ["data.result"]
    wrong_type = copy.deepcopy(envelope)
    wrong_type["data"]["result"] = 1
    assert validate_answer(wrong_type, low), "types are still checked at low strictness"


def test_partial_data_refused_when_module_disallows_it(make_module: ModuleFactory) -> None:
    module = make_module(failure={"partial_allowed": False})
    failure = {
        "ok": False,
        "meta": {"confidence": 0.1, "risk": "high", "explain": "x"},
        "error": {"code": "E2004", "message": "m"},
        "partial_data": {"result": "x"},
    }
    assert [v.path for v in validate_answer(failure, module)] == ["partial_data"]


def test_compiling_a_schema_leaves_it_as_written() -> None:
    """fastjsonschema rewrites $refs in place; the shared envelope schema must not change."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#/definitions/x"}}, "definitions": {"x": {}}}
    before = json.dumps(schema, sort_keys=True)
    compile_schema(schema)
    assert json.dumps(schema, sort_keys=True) == before


# --- exact violations: path, message, rule and code ------------------------------------------------

META = {"confidence": 0.5, "risk": "low", "explain": "e"}
ERROR = {"code": "E2004", "message": "m"}
Row = tuple[str, str, str, str]


def rows(violations: list[Violation]) -> list[Row]:
    return [(v.path, v.message, v.rule, str(v.code)) for v in violations]


@pytest.mark.parametrize(
    ("envelope", "expected"),
    [
        ([1], [("", "the envelope must be a JSON object", "type", "E3001")]),
        ({"meta": META, "data": {"rationale": "r"}}, [("ok", "is required", "required", "E3001")]),
        ({"ok": "yes", "meta": META, "data": {}}, [("ok", "must be a boolean", "type", "E3001")]),
        ({"ok": True, "data": {"rationale": "r"}}, [("meta", "is required", "required", "E3001")]),
        ({"ok": True, "meta": META}, [("data", "is required when ok is true", "required", "E3001")]),
        (
            {"ok": True, "meta": META, "data": {"rationale": "r"}, "error": {"code": 5}, "partial_data": {}},
            [
                ("error", "must not be present when ok is true", "additionalProperties", "E3001"),
                ("partial_data", "must not be present when ok is true", "additionalProperties", "E3001"),
            ],
        ),
        ({"ok": False, "meta": META}, [("error", "is required when ok is false", "required", "E3001")]),
        (
            {"ok": False, "meta": META, "error": ERROR, "data": {}},
            [
                (
                    "data",
                    "must not be present when ok is false (use partial_data)",
                    "additionalProperties",
                    "E3001",
                )
            ],
        ),
        (
            {"ok": True, "meta": META, "data": {"rationale": "r"}, "extra": 1},
            [("extra", "is not a field of the v2.2 envelope", "additionalProperties", "E3001")],
        ),
        (
            {"meta": META, "error": {}, "extra": 1},
            [
                ("ok", "is required", "required", "E3001"),
                ("extra", "is not a field of the v2.2 envelope", "additionalProperties", "E3001"),
            ],
        ),
        (
            {"ok": True, "meta": META, "data": {"rationale": " "}},
            [("data.rationale", "must not be empty", "minLength", "E3003")],
        ),
        ({"ok": True, "meta": META, "data": [1]}, [("data", "must be object", "type", "E3001")]),
        (
            {"ok": False, "meta": META, "error": ERROR, "partial_data": None},
            [("partial_data", "must be an object (omit it instead of null)", "type", "E3001")],
        ),
        (
            {"ok": False, "meta": {**META, "confidence": 2}, "error": {"code": 5}},
            [
                ("meta.confidence", "must be smaller than or equal to 1", "maximum", "E3001"),
                ("error.message", "is required", "required", "E3001"),
                ("error.code", "must be string", "type", "E3001"),
            ],
        ),
        (
            {"ok": True, "meta": {**META, "risk": "critical"}, "data": {"rationale": "r"}},
            [("meta.risk", "must be one of ['none', 'low', 'medium', 'high']", "enum", "E3005")],
        ),
    ],
    ids=[
        "not-an-object",
        "no-ok",
        "ok-not-boolean",
        "no-meta",
        "success-without-data",
        "success-with-failure-fields",
        "failure-without-error",
        "failure-with-data",
        "unknown-field",
        "unknown-field-without-ok",
        "blank-rationale",
        "data-not-an-object",
        "null-partial-data",
        "failure-with-invalid-meta-and-error",
        "risk-not-in-the-enum",
    ],
)
def test_envelope_violations_exactly(envelope: Any, expected: list[Row]) -> None:
    assert rows(validate_envelope(envelope)) == expected


def test_the_standard_validators_compile_from_the_shipped_schema() -> None:
    standard.cache_clear()  # compile again here, not from an earlier test's cache
    validators = standard()
    assert rows(check(validators.meta, {**META, "confidence": -1}, "meta")) == [
        ("meta.confidence", "must be bigger than or equal to 0", "minimum", "E3001")
    ]
    assert rows(check(validators.error, {"code": "E"}, "error")) == [
        ("error.message", "is required", "required", "E3001")
    ]
    assert rows(check(validators.data, {}, "data")) == [
        ("data.rationale", "is required", "required", "E3001")
    ]


A_FAILURE: dict[str, Any] = {"ok": False, "meta": META, "error": ERROR}


@pytest.mark.parametrize(
    "envelope",
    [
        {"ok": True, "meta": META, "data": {"rationale": "r"}},
        {"ok": True, "meta": META, "data": {"rationale": "r"}, "error": ERROR},
        {"ok": True, "meta": META, "data": {"rationale": "r"}, "partial_data": {}},
        {"ok": True, "meta": META, "error": ERROR},
        {"ok": True, "meta": {**META, "risk": "odd"}, "data": {"rationale": "r"}},
        A_FAILURE,
        {**A_FAILURE, "partial_data": {"x": 1}},
        {**A_FAILURE, "data": {"rationale": "r"}},
        {"ok": False, "meta": META, "data": {"rationale": "r"}},
        {**A_FAILURE, "error": {"code": "E"}},
    ],
)
def test_the_backstop_branch_of_ok_agrees_with_the_whole_schema(envelope: dict[str, Any]) -> None:
    """``validate_envelope`` checks only the ``oneOf`` branch ``ok`` selects: it accepts exactly
    what the whole normative schema accepts."""
    validators = standard()
    whole = compile_schema(schemas.load("response-envelope.schema.json"))
    branch = validators.success if envelope["ok"] is True else validators.failure
    assert bool(check(branch, envelope, "")) == bool(check(whole, envelope, ""))


def test_a_failure_with_invalid_meta_keeps_every_violation(make_module: ModuleFactory) -> None:
    """must_return_error_schema adds the module's error check to the envelope's, never replaces it."""
    failure = {**A_FAILURE, "meta": {**META, "confidence": 2}, "error": {"code": 5, "message": "m"}}
    assert rows(validate_answer(failure, make_module())) == [
        ("meta.confidence", "must be smaller than or equal to 1", "maximum", "E3001"),
        ("error.code", "must be string", "type", "E3001"),
    ]


def test_failure_shapes_against_a_module(make_module: ModuleFactory) -> None:
    module = make_module()
    assert rows(validate_answer({"ok": False, "meta": META}, module)) == [
        ("error", "is required when ok is false", "required", "E3001")
    ]
    with_data = {**A_FAILURE, "data": {"result": 1}}
    assert rows(validate_answer(with_data, module)) == [
        ("data", "must not be present when ok is false (use partial_data)", "additionalProperties", "E3001")
    ]
    no_partial = make_module(failure={"partial_allowed": False})
    assert rows(validate_answer({**A_FAILURE, "partial_data": {}}, no_partial)) == [
        ("partial_data", "is not allowed (failure.partial_allowed is false)", "additionalProperties", "E3001")
    ]
    assert validate_answer({**A_FAILURE, "partial_data": {}}, module) == []


def test_overflow_violations_exactly(make_module: ModuleFactory) -> None:
    module = make_module(overflow={"enabled": True, "max_items": 1, "require_suggested_mapping": True})
    insights = [{"text": "a", "suggested_mapping": "x"}, "str", {"text": "c", "suggested_mapping": " "}]
    assert rows(validate_answer(success(extensions={"insights": insights}), module)) == [
        ("data.extensions.insights[1]", "must be object", "type", "E3001"),
        ("data.extensions.insights", "has 3 insights; overflow.max_items is 1", "maxItems", "E3004"),
        (
            "data.extensions.insights[1].suggested_mapping",
            "is required (overflow.require_suggested_mapping)",
            "required",
            "E3001",
        ),
        (
            "data.extensions.insights[2].suggested_mapping",
            "is required (overflow.require_suggested_mapping)",
            "required",
            "E3001",
        ),
    ]
    disabled = make_module(overflow={"enabled": False, "require_suggested_mapping": False})
    one = success(extensions={"insights": [{"text": "a", "suggested_mapping": "x"}]})
    assert rows(validate_answer(one, disabled)) == [
        (
            "data.extensions.insights",
            "has 1 insights; overflow is disabled for this module",
            "maxItems",
            "E3004",
        )
    ]


def test_insights_that_are_not_a_list_are_a_plain_schema_violation(make_module: ModuleFactory) -> None:
    envelope = success(extensions={"insights": "many"})
    assert rows(validate_answer(envelope, make_module())) == [
        ("data.extensions.insights", "must be array", "type", "E3001")
    ]


def test_a_module_without_a_meta_schema_uses_the_standard_one(make_module: ModuleFactory) -> None:
    module = make_module(schema={key: value for key, value in SCHEMA.items() if key != "meta"})
    envelope = success()
    envelope["meta"]["confidence"] = 2
    assert rows(validate_answer(envelope, module)) == [
        ("meta.confidence", "must be smaller than or equal to 1", "maximum", "E3001")
    ]


def test_rationale_codes_only_for_the_rationale(make_module: ModuleFactory) -> None:
    """E3003 names the rationale: a data schema that refuses it is E3003 too; an enum that merely
    lists the word 'rationale' is an ordinary enum violation (E3005)."""
    closed = copy.deepcopy(SCHEMA["data"])
    closed["additionalProperties"] = False
    del closed["properties"]["rationale"]
    closed["required"] = ["result"]
    module = make_module(schema=schema_with(data=closed))
    assert rows(validate_answer(success(), module)) == [
        ("data", "must not contain {'rationale'} properties", "additionalProperties", "E3003")
    ]
    listed = copy.deepcopy(SCHEMA["data"])
    listed["properties"]["note"] = {"enum": ["rationale"]}
    module = make_module(schema=schema_with(data=listed))
    assert rows(validate_answer(success(note="x"), module)) == [
        ("data.note", "must be one of ['rationale']", "enum", "E3005")
    ]
