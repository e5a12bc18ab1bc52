"""Response mode negotiation (spec v2.5 §3.2.5): the priority order and the mismatch table."""

from __future__ import annotations

import pytest

from proxy.stream.negotiate import BadMode, ModeSignals, Negotiated, negotiate, requested, transport_of
from tests.conftest import ModuleFactory

SSE, NDJSON, JSON = "text/event-stream", "application/x-ndjson", "application/json"


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        (ModeSignals(header="sync", option="streaming", query="streaming", accept=SSE), "sync"),
        (ModeSignals(header="streaming", option="sync", query="sync", accept=JSON), "streaming"),
        (ModeSignals(option="sync", query="streaming", accept=SSE), "sync"),
        (ModeSignals(option="streaming", query="sync"), "streaming"),
        (ModeSignals(query="sync", accept=SSE), "sync"),
        (ModeSignals(query="streaming", accept=JSON), "streaming"),
        (ModeSignals(accept=SSE), "streaming"),
        (ModeSignals(accept=NDJSON), "streaming"),
        (ModeSignals(accept=JSON), None),
        (ModeSignals(accept="*/*"), None),
        (ModeSignals(), None),
        (ModeSignals(header="", option=None, query="", accept=SSE), "streaming"),
        (ModeSignals(header=" Streaming "), "streaming"),
    ],
)
def test_priority_header_then_body_then_query_then_accept(signals: ModeSignals, expected: str | None) -> None:
    assert requested(signals) == expected


@pytest.mark.parametrize(
    "signals", [ModeSignals(header="fast"), ModeSignals(option=3), ModeSignals(query="both")]
)
def test_a_malformed_mode_is_refused(signals: ModeSignals) -> None:
    with pytest.raises(BadMode):
        requested(signals)


@pytest.mark.parametrize(
    ("mode", "ask", "can_stream", "answer", "reason", "refused"),
    [
        ("both", "streaming", True, "streaming", None, False),
        ("both", "streaming", False, "sync", "provider_limitation", False),
        ("both", "sync", True, "sync", None, False),
        ("both", "sync", False, "sync", None, False),
        ("streaming", "sync", True, "sync", None, True),
        ("streaming", "streaming", True, "streaming", None, False),
        ("sync", "streaming", True, "sync", "module_sync_only", False),
        ("sync", "streaming", False, "sync", "module_sync_only", False),
    ],
)
def test_the_mismatch_table(
    make_module: ModuleFactory,
    mode: str,
    ask: str,
    can_stream: bool,
    answer: str,
    reason: str | None,
    refused: bool,
) -> None:
    module = make_module(response={"mode": mode})
    got = negotiate(module, ModeSignals(header=ask), can_stream=can_stream)
    assert (got.mode, got.fallback_reason, got.refused) == (answer, reason, refused)
    if reason:
        assert got.warning_header == f"STREAMING_UNAVAILABLE; fallback=sync; reason={reason}"
        assert got.warnings()[0]["code"] == "W4010" and got.warnings()[0]["fallback_used"] == "sync"
    else:
        assert got.warning_header is None and got.warnings() == []


@pytest.mark.parametrize(
    ("tier", "declared", "answer"),
    [
        ("exec", None, "sync"),
        ("decision", None, "sync"),
        ("exploration", None, "sync"),  # tier default streaming: no signal still reads JSON
        ("decision", "streaming", "streaming"),  # declared in module.yaml: streams unasked
        ("exec", "both", "sync"),
    ],
)
def test_no_signal_is_sync_unless_module_yaml_declares_streaming(
    make_module: ModuleFactory, tier: str, declared: str | None, answer: str
) -> None:
    module = make_module(tier=tier, **({"response": {"mode": declared}} if declared else {}))
    assert negotiate(module, ModeSignals(accept=JSON)).mode == answer


@pytest.mark.parametrize(
    "signals", [ModeSignals(query="sync"), ModeSignals(header="sync"), ModeSignals(option="sync")], ids=str
)
def test_an_undeclared_exploration_module_answers_an_explicit_sync_request(
    make_module: ModuleFactory, signals: ModeSignals
) -> None:
    """v2.5 §0.0.2: an unmodified v2.2 exploration module keeps answering sync; only a declared
    ``response.mode: streaming`` makes a module streaming-only."""
    module = make_module(tier="exploration")
    assert module.response_mode == "streaming"
    got = negotiate(module, signals)
    assert (got.mode, got.refused, got.warnings()) == ("sync", False, [])
    assert negotiate(module, ModeSignals(accept=NDJSON)).transport == "ndjson"
    declared = make_module(tier="exploration", response={"mode": "streaming"})
    assert negotiate(declared, signals).refused is True


@pytest.mark.parametrize(
    ("signals", "message"),
    [
        (ModeSignals(header="fast"), "X-Cognitive-Response-Mode must be sync or streaming, not 'fast'"),
        (ModeSignals(option=3), "_options.response_mode must be sync or streaming, not '3'"),
        (ModeSignals(option=True), "_options.response_mode must be sync or streaming, not 'True'"),
        (
            ModeSignals(query="both"),
            "the response_mode query parameter must be sync or streaming, not 'both'",
        ),
        (
            ModeSignals(header="x" * 50),
            f"X-Cognitive-Response-Mode must be sync or streaming, not '{'x' * 40}'",
        ),
        (ModeSignals(header="sync", option="fast"), None),  # a lower signal is not read once one decided
    ],
)
def test_the_refusal_names_the_signal_and_a_cut_value(signals: ModeSignals, message: str | None) -> None:
    if message is None:
        assert requested(signals) == "sync"
        return
    with pytest.raises(BadMode) as refused:
        requested(signals)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("value", "mode"),
    [("SYNC", "sync"), (" sync\t", "sync"), ("STREAMING", "streaming"), ("streaming ", "streaming")],
)
def test_every_signal_is_read_case_and_space_insensitively(value: str, mode: str) -> None:
    assert requested(ModeSignals(header=value)) == mode
    assert requested(ModeSignals(option=value)) == mode
    assert requested(ModeSignals(query=value)) == mode


@pytest.mark.parametrize(
    ("accept", "mode", "transport"),
    [
        ("Text/Event-Stream", "streaming", "sse"),
        ("APPLICATION/X-NDJSON", "streaming", "ndjson"),
        ("application/json, application/x-ndjson;q=0.5", "streaming", "ndjson"),
        ("application/json", None, "sse"),
        ("", None, "sse"),
    ],
)
def test_accept_is_read_case_insensitively_for_mode_and_transport(
    accept: str, mode: str | None, transport: str
) -> None:
    assert requested(ModeSignals(accept=accept)) == mode
    assert transport_of(accept) == transport


@pytest.mark.parametrize(
    ("declared", "ask", "can_stream"),
    [
        ("streaming", None, True),
        ("streaming", None, False),
        ("both", "sync", True),
        ("streaming", "sync", True),
        ("sync", "streaming", True),
        ("both", "streaming", False),
        ("both", "streaming", True),
    ],
)
def test_every_answer_keeps_the_asked_transport(
    make_module: ModuleFactory, declared: str, ask: str | None, can_stream: bool
) -> None:
    module = make_module(response={"mode": declared})
    got = negotiate(module, ModeSignals(header=ask, accept=f"{NDJSON}, {JSON}"), can_stream=can_stream)
    assert got.transport == "ndjson"


def test_a_declared_streaming_module_asked_nothing_answers_sync_when_no_provider_can_stream(
    make_module: ModuleFactory,
) -> None:
    module = make_module(response={"mode": "streaming"})
    got = negotiate(module, ModeSignals(accept=JSON), can_stream=False)
    assert (got.mode, got.fallback_reason, got.refused) == ("sync", None, False)
    assert negotiate(module, ModeSignals(accept=JSON)) == Negotiated("streaming", "sse")


@pytest.mark.parametrize("reason", ["module_sync_only", "provider_limitation"])
def test_the_fallback_warning_body_and_header(reason: str) -> None:
    got = Negotiated("sync", fallback_reason=reason)
    assert got.warning_header == f"STREAMING_UNAVAILABLE; fallback=sync; reason={reason}"
    assert got.warnings() == [
        {
            "code": "W4010",
            "message": f"Streaming requested but not available ({reason}), returned sync response",
            "fallback_used": "sync",
        }
    ]
    assert Negotiated("sync").warnings() == [] and Negotiated("sync").warning_header is None
