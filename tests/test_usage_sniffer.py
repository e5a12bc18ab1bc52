"""``UsageSniffer``: the last ``usage`` object of a forwarded stream, however TCP split it."""

from __future__ import annotations

import orjson
import pytest

from proxy.wire import SNIFF_BYTES, UsageSniffer

USAGE = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
DELTA = b'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
STREAM = DELTA * 3 + b"data: " + orjson.dumps({"choices": [], "usage": USAGE}) + b"\n\ndata: [DONE]\n\n"


@pytest.mark.parametrize("size", [1, 7, 40, 10_000])
def test_a_usage_frame_split_across_reads_is_found(size: int) -> None:
    sniffer = UsageSniffer()
    for i in range(0, len(STREAM), size):
        sniffer.feed(STREAM[i : i + size])
    assert sniffer.usage == USAGE


def test_the_last_usage_wins_past_a_batch() -> None:
    early = b"data: " + orjson.dumps({"choices": [], "usage": {"total_tokens": 1}}) + b"\n\n"
    body = early + DELTA * (2 * SNIFF_BYTES // len(DELTA)) + STREAM
    sniffer = UsageSniffer()
    for i in range(0, len(body), 100):
        sniffer.feed(body[i : i + 100])
    assert sniffer.usage == USAGE


def test_no_usage_is_an_empty_object() -> None:
    sniffer = UsageSniffer()
    sniffer.feed(DELTA * 3)
    assert sniffer.usage == {}
