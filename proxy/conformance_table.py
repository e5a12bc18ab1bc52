"""The conformance table: each MUST and SHOULD of conformance.md, composition.md,
context-protocol.md and spec v2.5 §9, its level, the test that proves it and whether it is held.

One place for the claim: ``cogproxy conformance --markdown`` renders the Conformance section of
``docs/contract-and-conformance.md`` from it (``--update-docs`` rewrites it there) and
``GET /v1/capabilities`` reads ``conformance_level`` and ``spec_versions`` here.
``tests/test_conformance_table.py`` fails when a row claims "held" without an existing test, when
that section differs from the rendering, or when a MUST of the claimed level is not held.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

SPEC_VERSIONS = ("2.5", "2.2", "2.1", "1.0")
"""Spec versions whose modules and envelopes this runtime serves (v2.5: streaming and media)."""


class Status(StrEnum):
    HELD = "held"
    PARTIAL = "partial"
    NOT_IMPLEMENTED = "not implemented"


Keyword = Literal["MUST", "SHOULD", "MAY"]


@dataclass(frozen=True, slots=True)
class Row:
    source: str
    """The spec document and section, e.g. ``conformance.md L1.1``."""
    level: int
    keyword: Keyword
    requirement: str
    status: Status
    tests: tuple[str, ...] = ()
    """pytest node ids (``tests/x.py::test_name``) that fail if the requirement broke."""
    note: str = ""
    """Where the proxy decides something the spec leaves open, or why a row is not held."""


# One requirement per line.
# fmt: off
ROWS: tuple[Row, ...] = (
    # conformance.md
    Row("conformance.md L1.1", 1, "MUST", "validate envelopes against response-envelope.schema.json; accept ok:true with meta+data and ok:false with meta+error; reject missing fields", Status.HELD, ("tests/contract/test_validate.py::test_official_vectors", "tests/contract/test_validate.py::test_envelope_violations_exactly")),
    Row("conformance.md L1.2", 1, "MUST", "meta.confidence in [0, 1], meta.risk in none/low/medium/high, meta.explain string <= 280; optional trace_id, model, latency_ms", Status.HELD, ("tests/contract/test_validate.py::test_envelope_violations_name_path_and_specific_code", "tests/contract/test_validate.py::test_official_vectors")),
    Row("conformance.md L1.3", 1, "MUST", "data.rationale present and a string; data.extensions.insights accepted", Status.HELD, ("tests/contract/test_validate.py::test_rationale_codes_only_for_the_rationale", "tests/contract/test_validate.py::test_overflow_limit_by_tier_and_manifest")),
    Row("conformance.md L1.4", 1, "MUST", "error.code and error.message are strings", Status.HELD, ("tests/contract/test_validate.py::test_failure_shapes_against_a_module",)),
    Row("conformance.md L1.5", 1, "MUST", "input validated against schema.json#/input, output against schema.json#/data, JSON Schema draft-07", Status.HELD, ("tests/contract/test_inputs.py::test_bad_input_codes", "tests/contract/test_validate.py::test_module_data_schema_is_enforced")),
    Row("conformance.md L1 vectors", 1, "MUST", "pass every official test vector of level 1", Status.HELD, ("tests/contract/test_validate.py::test_official_vectors", "tests/test_cli.py::test_conformance_without_an_argument_runs_the_vectors_shipped_in_the_package")),
    Row("conformance.md L2.1", 2, "MUST", "tiers exec, decision, exploration with their strictness and overflow defaults", Status.HELD, ("tests/module/test_loader.py::test_tier_defaults_apply_when_manifest_is_silent", "tests/contract/test_validate.py::test_high_strictness_rejects_undeclared_data_fields", "tests/contract/test_validate.py::test_low_strictness_requires_only_rationale")),
    Row("conformance.md L2.2", 2, "MUST", "standard error codes E1xxx-E3xxx, the right code for each validation failure", Status.HELD, ("tests/contract/test_errors.py::test_every_code_of_the_taxonomy_is_known", "tests/contract/test_engine.py::test_specific_output_codes_are_reported_in_details"), "the top-level code of a contract failure stays E3001 (spec v2.2 §4.1 MUST); the specific code of each violation (E3003, E3004, E3005) is in error.details.violations[].code"),
    Row("conformance.md L2.2", 2, "SHOULD", "recoverable and suggestion in error responses", Status.HELD, ("tests/contract/test_errors.py::test_every_error_envelope_is_a_valid_failure_envelope", "tests/contract/test_engine.py::test_prose_is_e1000_blaming_the_model_with_an_operator_suggestion")),
    Row("conformance.md L2.3", 2, "MUST", "extensions.insights, overflow.max_items, suggested_mapping when required", Status.HELD, ("tests/contract/test_validate.py::test_overflow_limit_by_tier_and_manifest", "tests/contract/test_validate.py::test_require_suggested_mapping")),
    Row("conformance.md L2.4", 2, "MUST", "enums.strategy extensible ({custom, reason}) and strict", Status.HELD, ("tests/contract/test_validate.py::test_custom_enum_form_only_under_extensible", "tests/contract/test_validate.py::test_unknown_plain_enum_value_is_rejected_even_when_extensible")),
    Row("conformance.md L2.5", 2, "SHOULD", "repair pass for minor violations", Status.HELD, ("tests/contract/test_engine.py::test_repairable_answer_passes_with_repairs",)),
    Row("conformance.md L2.5", 2, "MUST", "repair never changes business semantics nor invents enum values", Status.HELD, ("tests/contract/test_repair.py::test_types_are_never_changed", "tests/contract/test_repair.py::test_business_strings_are_not_trimmed", "tests/contract/test_repair.py::test_unknown_enum_values_are_not_invented", "tests/contract/test_repair.py::test_property_repair_never_changes_a_type_and_never_adds_keys_outside_meta")),
    Row("conformance.md L2.5", 2, "MAY", "truncate an over-long explain to 280 characters", Status.HELD, ("tests/contract/test_repair.py::test_explain_is_truncated_to_280_code_points",), "done; control-plane strings (explain) are also trimmed of whitespace, each trim recorded; business strings never are"),
    Row("conformance.md L2.6", 2, "SHOULD", "compat.accepts_v21_payload and v2.1 -> v2.2 auto-wrap", Status.HELD, ("tests/contract/test_engine.py::test_v21_payload_is_wrapped_when_module_accepts_it", "tests/contract/test_engine.py::test_v21_confidence_is_promoted_without_coercion")),
    Row("conformance.md L2 vectors", 2, "MUST", "pass every official test vector of levels 1 and 2", Status.HELD, ("tests/contract/test_validate.py::test_official_vectors",)),
    Row("conformance.md L3.1", 3, "MUST", "@call:module syntax in prompts", Status.HELD, ("tests/compose/test_patterns.py::test_call_directives_run_first_and_inject_results", "tests/compose/test_declaration.py::test_call_directives_are_parsed_and_their_lines_removed")),
    Row("conformance.md L3.1", 3, "MUST", "requires dependency declarations", Status.HELD, ("tests/compose/test_resolution.py::test_missing_and_unsatisfied_requirements", "tests/compose/test_declaration.py::test_version_ranges_of_composition_md_3_3")),
    Row("conformance.md L3.1", 3, "MUST", "maximum call depth (default 5)", Status.HELD, ("tests/compose/test_resolution.py::test_the_default_max_depth_is_five", "tests/compose/test_resolution.py::test_a_chain_deeper_than_max_depth_is_e4005")),
    Row("conformance.md L3.1", 3, "MUST", "detect and prevent circular dependencies", Status.HELD, ("tests/compose/test_resolution.py::test_a_cycle_is_e4004_with_its_path_and_the_rest_loads", "tests/compose/test_failures.py::test_an_unavailable_composite_answers_its_load_error_without_an_upstream_call")),
    Row("conformance.md L3.2", 3, "MUST", "context: fork and context: main (plain value or mode:)", Status.HELD, ("tests/compose/test_failures.py::test_main_mode_shares_one_context_across_steps_and_with_the_parent", "tests/compose/test_failures.py::test_fork_mode_gives_each_step_a_copy", "tests/module/test_loader.py::test_context_written_as_a_plain_mode_is_that_mode")),
    Row("conformance.md L3.2", 3, "SHOULD", "context type declarations (accepts, emits)", Status.HELD, ("tests/context/test_protocol.py::test_undeclared_context_is_dropped_and_reported", "tests/context/test_protocol.py::test_emitted_context_against_its_schema_fails_the_answer")),
    Row("conformance.md L3.2", 3, "MAY", "context caching with TTL", Status.HELD, ("tests/context/test_cache.py::test_repeated_input_is_a_cache_hit_without_an_upstream_call", "tests/context/test_units.py::test_items_expire_after_their_ttl_by_the_injected_clock")),
    Row("conformance.md L3.3", 3, "MUST", "validate runtime_requirements", Status.HELD, ("tests/compose/test_declaration.py::test_runtime_requirements_are_validated_at_load",)),
    Row("conformance.md L3.3", 3, "MUST", "verify the structured_output capability", Status.HELD, ("tests/compose/test_policies.py::test_targets_without_a_required_capability_are_skipped", "tests/compose/test_policies.py::test_no_capable_target_is_e4001_naming_the_capability"), "error-codes.md has no capability code: no target with the capability is E4001 (details.reason capability_unavailable, HTTP 503); E4003 is CONTEXT_OVERFLOW"),
    Row("conformance.md L3.3", 3, "MUST", "enforce max_input_tokens", Status.HELD, ("tests/contract/test_inputs.py::test_input_too_large",)),
    Row("conformance.md L3.3", 3, "SHOULD", "check preferred_capabilities compatibility", Status.HELD, ("tests/compose/test_policies.py::test_preferred_capabilities_order_a_rungs_targets", "tests/module/test_loader.py::test_an_unknown_preferred_capability_loads_is_recorded_and_warned"), "preferences order a rung's targets and never refuse; an unknown one is recorded and warned about by validate"),
    Row("conformance.md L3.4", 3, "MUST", "enforce policies from module.yaml", Status.HELD, ("tests/compose/test_policies.py::test_network_deny_refuses_url_inputs_before_any_upstream_call",), "network: deny is enforced on the input (URLs refused, E4007); filesystem_write, side_effects, code_execution: the proxy writes no files and runs nothing for a module, so a deny always holds"),
    Row("conformance.md L3.4", 3, "MUST", "tools.policy access control; block tools.denied", Status.HELD, ("tests/compose/test_policies.py::test_denied_tools_are_stripped_from_the_upstream_request", "tests/compose/test_policies.py::test_a_call_to_a_denied_tool_in_the_answer_fails_the_contract")),
    Row("conformance.md L3.5", 3, "MUST", "all error codes E1xxx-E4xxx; runtime errors handled", Status.HELD, ("tests/contract/test_errors.py::test_every_code_of_the_taxonomy_is_known", "tests/contract/test_errors.py::test_the_proxys_own_outcomes_use_the_table", "tests/api/test_honest_outcomes.py::test_an_internal_error_in_a_module_call_is_a_500_e4000_envelope")),
    Row("conformance.md L3.6", 3, "MUST", "pass all official test vectors", Status.HELD, ("tests/contract/test_validate.py::test_official_vectors", "tests/contract/test_validate.py::test_there_are_sixteen_official_vectors")),
    Row("conformance.md L3.6", 3, "SHOULD", "module-level test runner; tests declarations in module.yaml", Status.HELD, ("tests/test_cli.py::test_golden_tests_through_a_policy_use_the_pipeline", "tests/module/test_golden.py::test_example_that_breaks_the_contract_fails_its_case")),
    # composition.md
    Row("composition.md L3.2", 3, "MUST", "parse and validate the composition configuration", Status.HELD, ("tests/compose/test_declaration.py::test_composition_parse_errors_name_the_field",)),
    Row("composition.md §6.2 / L3.3", 3, "MUST", "resolve dependencies in the resolution order (local, user, registry, fallback, fail)", Status.PARTIAL, ("tests/module/test_loader.py::test_registry_first_directory_wins_on_duplicate_names", "tests/compose/test_failures.py::test_a_failed_required_step_uses_its_fallback", "tests/compose/test_resolution.py::test_missing_and_unsatisfied_requirements"), "the ordered --modules directories stand in for .cognitive/modules and ~/.cognitive/modules (first match wins; a shadowed module is a load problem in /readyz and validate); fallback and fail-if-required hold. Not honoured: the spec's own paths (a sidecar has no project directory, and reading a home directory makes a deployment depend on the image's user) and the registry (the spec names no registry protocol, and fetching module code while serving would let the network change what runs)"),
    Row("composition.md L3.4", 3, "MUST", "detect circular dependencies (E4004)", Status.HELD, ("tests/compose/test_resolution.py::test_a_cycle_is_e4004_with_its_path_and_the_rest_loads", "tests/compose/test_resolution.py::test_a_module_calling_itself_is_a_cycle")),
    Row("composition.md L3.5", 3, "MUST", "enforce max_depth (E4005)", Status.HELD, ("tests/compose/test_resolution.py::test_a_chain_deeper_than_max_depth_is_e4005",)),
    Row("composition.md L3.6-7", 3, "MUST", "sequential pattern; dataflow mapping expressions", Status.HELD, ("tests/compose/test_patterns.py::test_sequential_dataflow_maps_chains_and_merges", "tests/compose/test_declaration.py::test_mapping_paths_of_composition_md_4_2")),
    Row("composition.md §3.2", 3, "MUST", "a dependency names its module", Status.HELD, ("tests/compose/test_declaration.py::test_composition_parse_errors_name_the_field",)),
    Row("composition.md §3.2", 3, "SHOULD", "a dependency gives a semver range", Status.HELD, ("tests/compose/test_declaration.py::test_version_ranges_of_composition_md_3_3",)),
    Row("composition.md L3 rec.", 3, "SHOULD", "parallel and conditional patterns", Status.HELD, ("tests/compose/test_patterns.py::test_parallel_steps_run_concurrently_and_aggregate_as_array", "tests/compose/test_patterns.py::test_conditional_routing_on_a_steps_meta")),
    Row("composition.md L3 rec.", 3, "SHOULD", "timeout handling", Status.HELD, ("tests/compose/test_failures.py::test_a_step_timeout_cancels_the_step", "tests/compose/test_failures.py::test_the_total_timeout_cancels_what_still_runs")),
    Row("composition.md L3 rec.", 3, "SHOULD", "optional dependencies with fallbacks", Status.HELD, ("tests/compose/test_failures.py::test_a_failing_optional_step_is_null_with_a_warning", "tests/compose/test_failures.py::test_a_failed_required_step_uses_its_fallback")),
    # context-protocol.md
    Row("context-protocol.md §2", 3, "MUST", "all context explicit in the input (no hidden state)", Status.HELD, ("tests/context/test_protocol.py::test_context_of_a_module_that_declares_none_never_reaches_the_model", "tests/context/test_protocol.py::test_undeclared_context_is_dropped_and_reported")),
    Row("context-protocol.md L3.1", 3, "MUST", "parse context in module.yaml", Status.HELD, ("tests/context/test_units.py::test_manifest_errors_name_the_module_and_key", "tests/context/test_protocol.py::test_bundled_example_declares_the_spec_context")),
    Row("context-protocol.md L3.2 / §7.2", 3, "MUST", "validate _context against declared schemas (accepts[].schema and schema.json#/input/properties/_context)", Status.HELD, ("tests/context/test_protocol.py::test_schema_violation_in_context_is_e1001_with_its_path", "tests/context/test_protocol.py::test_a_context_schema_in_schema_json_is_applied")),
    Row("context-protocol.md L3.3", 3, "MUST", "mode: main and mode: fork", Status.HELD, ("tests/compose/test_failures.py::test_main_mode_shares_one_context_across_steps_and_with_the_parent", "tests/compose/test_failures.py::test_fork_mode_gives_each_step_a_copy")),
    Row("context-protocol.md L3.4", 3, "MUST", "propagate context to submodules", Status.HELD, ("tests/compose/test_failures.py::test_main_mode_shares_one_context_across_steps_and_with_the_parent",)),
    Row("context-protocol.md L3.5", 3, "MUST", "emit context in _emitted_context", Status.HELD, ("tests/context/test_protocol.py::test_second_call_in_a_session_gets_the_first_calls_result_and_state", "tests/context/test_protocol.py::test_undeclared_emitted_context_is_never_passed_on")),
    Row("context-protocol.md L3 rec.1-2", 3, "SHOULD", "TTL expiry; caching with key patterns", Status.HELD, ("tests/context/test_units.py::test_items_expire_after_their_ttl_by_the_injected_clock", "tests/context/test_units.py::test_key_patterns_need_the_ids_they_name", "tests/context/test_cache.py::test_a_module_that_emits_analysis_cache_is_cached")),
    Row("context-protocol.md L3 rec.3 / §7.1", 3, "SHOULD", "a Context Builder", Status.HELD, ("tests/context/test_protocol.py::test_conversation_history_comes_from_the_chat_messages", "tests/context/test_units.py::test_history_keeps_the_newest_turns_as_role_and_content")),
    Row("context-protocol.md L3 rec.4", 3, "SHOULD", "log context access for audit", Status.PARTIAL, ("tests/context/test_units.py::test_sanitise_redacts_names_and_credential_values_and_reports_paths",), "redactions are logged (proxy.context_redacted, paths only); reads and writes of the context store are not logged one by one (a log line per item would repeat user data volume in the log)"),
    Row("context-protocol.md §4.2", 3, "SHOULD", "not pass raw conversation; structured summaries", Status.NOT_IMPLEMENTED, (), "conversation_history is passed as role/content turns bounded by max_turns; the proxy writes no summaries (that would be a model call the caller did not ask for)"),
    # spec-v2.5
    Row("spec-v2.5 §9 L4", 4, "MUST", "streaming support", Status.HELD, ("tests/api/test_streaming.py::test_sse_stream_sends_meta_deltas_and_the_decided_final", "tests/api/test_stream_recovery.py::test_a_drop_after_seq_n_resumes_on_another_replica_with_the_same_final")),
    Row("spec-v2.5 §9 L4", 4, "MUST", "multimodal input", Status.HELD, ("tests/media/test_module_media.py::test_openai_receives_image_url_parts_with_the_exact_bytes", "tests/media/test_validation.py::test_a_magic_byte_mismatch_is_e1014_with_the_detected_type")),
    Row("spec-v2.5 §9 L4", 4, "MAY", "multimodal output", Status.NOT_IMPLEMENTED, (), "module answers are envelopes (text); modalities.output is recorded"),
    Row("spec-v2.5 §0.0.2", 4, "MUST", "v2.2 modules run without modification (an explicit sync request to an undeclared exploration module is answered sync)", Status.HELD, ("tests/stream/test_negotiate.py::test_an_undeclared_exploration_module_answers_an_explicit_sync_request",)),
    Row("spec-v2.5 §6.4.5", 4, "MUST", "exec tier below its threshold fails with E3001", Status.PARTIAL, ("tests/api/test_honest_outcomes.py::test_policy_reject_on_a_module_without_partial_data", "tests/policy/test_decide.py::test_decision_table"), "it fails (ok: false), with E2001 LOW_CONFIDENCE: the taxonomy's code for a confidence below threshold (conformance.md Level 2 table, error-codes.md); E3001 is an output schema violation, and one threshold miss answered with two codes by tier would make callers special-case exec"),
)
# fmt: on

CLAIMED_LEVEL = 2
"""The level every MUST up to which is held (``tests/test_conformance_table.py`` checks it).
Level 3 is held but for the rows marked partial above (each says why)."""


def held_level(rows: tuple[Row, ...] = ROWS) -> int:
    """The highest level whose MUST rows, and every lower level's, are all held."""
    level = 0
    for candidate in sorted({r.level for r in rows}):
        musts = [r for r in rows if r.level <= candidate and r.keyword == "MUST"]
        if any(r.status is not Status.HELD for r in musts):
            break
        level = candidate
    return level


# The page whose ``## Conformance`` section holds the generated table (relative to the repository).
DOCS_PAGE = "docs/contract-and-conformance.md"
BEGIN_MARKER = "<!-- BEGIN conformance table (cogproxy conformance --markdown) -->"
END_MARKER = "<!-- END conformance table -->"


def with_section(page: str) -> str:
    """``page`` with the text between its conformance markers replaced by ``markdown()``;
    raises ``ValueError`` when the markers are missing."""
    if BEGIN_MARKER not in page or END_MARKER not in page:
        raise ValueError(f"the markers {BEGIN_MARKER} and {END_MARKER} are missing")
    head, rest = page.split(BEGIN_MARKER, 1)
    _, tail = rest.split(END_MARKER, 1)
    return f"{head}{BEGIN_MARKER}\n{markdown()}{END_MARKER}{tail}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(rows: tuple[Row, ...] = ROWS) -> str:
    """The conformance section body of ``DOCS_PAGE`` (between its BEGIN/END markers)."""
    lines = [
        f"This implementation conforms to Cognitive Modules Specification v2.2 at **Level {CLAIMED_LEVEL}**"
        f" (`GET /v1/capabilities`: `conformance_level: {CLAIMED_LEVEL}`, `spec_versions: "
        f"{list(SPEC_VERSIONS)}`). Generated from `proxy/conformance_table.py` by "
        "`cogproxy conformance --markdown`; a test fails when this section differs from it.",
        "",
        "| source | level | keyword | requirement | status | tests | note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        tests = ", ".join(f"`{t}`" for t in r.tests) or "—"
        lines.append(
            f"| {_cell(r.source)} | {r.level} | {r.keyword} | {_cell(r.requirement)} | {r.status} "
            f"| {tests} | {_cell(r.note)} |"
        )
    return "\n".join(lines) + "\n"
