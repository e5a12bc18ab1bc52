"""Stream completeness per wire format, fed as TCP would split it (#11 findings 1 and 8)."""

from __future__ import annotations

import orjson
import pytest

from proxy.upstream.sse import BATCH_BYTES, MAX_EVENT_BYTES, StreamCheck, parse_sse, wire_format


def chunk(finish: str | None = None, index: int = 0, content: str = "x") -> bytes:
    choice = {"index": index, "delta": {"content": content}, "finish_reason": finish}
    return b"data: " + orjson.dumps({"object": "chat.completion.chunk", "choices": [choice]}) + b"\n\n"


DONE = b"data: [DONE]\n\n"
WHOLE = chunk() + chunk() + chunk("stop") + DONE


def fed(data: bytes, size: int, wire: str = "chat") -> StreamCheck:
    check = StreamCheck(wire)  # type: ignore[arg-type]
    for i in range(0, len(data), size):
        check.feed(data[i : i + size])
    return check


@pytest.mark.parametrize("size", [1, 2, 7, 64, 10_000])
def test_events_split_anywhere_are_framed_the_same(size: int) -> None:
    check = fed(WHOLE, size)
    assert (check.events, check.malformed, check.ended_complete()) == (4, 0, True)


@pytest.mark.parametrize("size", [1, 3, 10_000])
def test_crlf_framing_is_accepted(size: int) -> None:
    check = fed(WHOLE.replace(b"\n", b"\r\n"), size)
    assert (check.events, check.malformed, check.ended_complete()) == (4, 0, True)


def test_a_stream_cut_after_two_chunks_is_not_complete() -> None:
    check = fed(chunk() + chunk(), 5)
    assert check.events == 2 and not check.ended_complete()


def test_a_finish_reason_without_done_is_complete() -> None:
    assert fed(chunk() + chunk("stop"), 4).ended_complete()


def test_every_choice_must_finish_when_there_is_no_done() -> None:
    two = chunk(index=0) + chunk(index=1) + chunk("stop", index=0)
    assert not fed(two, 9).ended_complete()
    assert fed(two + chunk("length", index=1), 9).ended_complete()


def test_a_last_event_without_its_blank_line_is_judged() -> None:
    assert fed(chunk() + DONE.rstrip(b"\n"), 3).ended_complete()


def test_comments_are_not_events() -> None:
    check = fed(b": keep-alive\n\n: ping\n\n", 2)
    assert check.events == 0 and not check.ended_complete()


def test_malformed_data_is_counted_not_fatal() -> None:
    check = fed(chunk() + b"data: {oops\n\n" + chunk("stop") + DONE, 6)
    assert (check.malformed, check.first_malformed, check.ended_complete()) == (1, False, True)
    assert fed(b"data: {oops\n\n" + chunk(), 100).first_malformed


def test_an_upstream_error_event_ends_a_chat_stream() -> None:
    assert fed(chunk() + b'data: {"error": {"message": "overloaded"}}\n\n', 4).ended_complete()


def test_an_oversized_event_is_malformed_and_not_buffered() -> None:
    check = StreamCheck("chat")
    check.feed(b"data: " + b"x" * (MAX_EVENT_BYTES + 1))
    assert check.malformed == 1 and not check.ended_complete()


def responses_event(kind: str) -> bytes:
    return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind}) + b"\n\n"


@pytest.mark.parametrize("end", ["response.completed", "response.failed", "response.incomplete", "error"])
def test_a_responses_stream_ends_with_a_terminal_event(end: str) -> None:
    body = responses_event("response.created") + responses_event("response.output_text.delta")
    assert not fed(body, 5, "responses").ended_complete()
    assert fed(body + responses_event(end), 5, "responses").ended_complete()


def test_wire_formats_by_path() -> None:
    assert wire_format("/v1/chat/completions") == wire_format("/v1/completions") == "chat"
    assert wire_format("/v1/responses") == "responses"
    assert wire_format("/v1/audio/speech") is None


@pytest.mark.parametrize(
    ("buffer", "events", "rest"),
    [
        (b'event: ping\ndata: {"type": "ping"}\n\n', [("ping", '{"type": "ping"}')], b""),
        (b"event: a\r\ndata: 1\r\n\r\nevent: b\r\ndata: 2\r\n\r\n", [("a", "1"), ("b", "2")], b""),
        (b"data: line1\ndata: line2\n\n", [("message", "line1\nline2")], b""),
        (b": keep-alive\n\nevent: a\n: note\ndata: 1\n\n", [("a", "1")], b""),
        (b"event: a\ndata:no-space\n\n", [("a", "no-space")], b""),
        (b"event: a\ndata: 1\n\nevent: b\ndata: 2", [("a", "1")], b"event: b\ndata: 2"),
        (b"event: a\ndata: 1\n", [], b"event: a\ndata: 1\n"),
        (b"event: a\ndata: 1\r\n\r", [], b"event: a\ndata: 1\r\n\r"),
        (b"", [], b""),
    ],
    ids=[
        "one-event",
        "crlf",
        "multi-line-data",
        "comments-ignored",
        "no-space-after-colon",
        "incomplete-tail-kept",
        "missing-blank-line-kept",
        "half-crlf-kept",
        "empty",
    ],
)
def test_parse_sse_splits_complete_events_and_keeps_the_rest(
    buffer: bytes, events: list[tuple[str, str]], rest: bytes
) -> None:
    assert parse_sse(buffer) == (events, rest)


def test_a_stream_longer_than_a_batch_is_judged_whole() -> None:
    """Reads are judged in batches of ``BATCH_BYTES``: a malformed event and [DONE] far past the
    first batch are still seen, and every event is counted once."""
    body = chunk() * 300 + b"data: {oops\n\n" + chunk() * 300 + chunk("stop") + DONE
    assert len(body) > 3 * BATCH_BYTES
    check = fed(body, 97)
    assert (check.events, check.malformed, check.ended_complete()) == (603, 1, True)


def test_a_done_inside_a_batch_ends_the_stream_there() -> None:
    check = fed(chunk() + DONE + b"data: {oops\n\n", 10_000)
    assert check.ended_complete() and check.malformed == 0


def test_without_done_the_last_events_decide_past_a_batch() -> None:
    """For providers that send no [DONE], the choices named in the last batches must all finish."""
    opened = chunk(index=0) + chunk(index=1)
    tail = chunk(index=0) * 200 + chunk("stop", index=0)
    assert len(tail) > BATCH_BYTES
    assert not fed(opened + tail + chunk(index=1), 50).ended_complete()
    assert fed(opened + tail + chunk("length", index=1), 50).ended_complete()


@pytest.mark.parametrize("ending", ["complete", "cut"])
def test_sniff_gets_every_byte_fed_once_in_order(ending: str) -> None:
    """The usage sniffer is fed from the check's batches: a whole stream by its end, a cut one by
    ``flush``; nothing twice, nothing left behind."""
    data = (WHOLE if ending == "complete" else WHOLE[:-20]) + b": trailing comment\n\n"
    sniffed: list[bytes] = []
    check = StreamCheck("chat", sniff=sniffed.append)
    for i in range(0, len(data), 7):
        check.feed(data[i : i + 7])
        if i == 14:
            assert check.events == 0  # a count read mid-stream judges (and hands on) what came
    if ending == "complete":
        check.ended_complete()
    else:
        check.flush()
    assert b"".join(sniffed) == data
