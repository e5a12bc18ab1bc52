"""The PDF page count is one linear pass over bytes someone else controls (issue #26 finding 1):
its cost, counted in ``Scan.steps``, is bounded by the length of the text whatever its shape, and
it finds what the regex it replaced meant to find."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.media.pdf import MAX_COUNT_DIGITS, page_count
from tests.media import samples

TOKENS = [
    b"/Type",
    b"/Pages",
    b"/Count",
    b" ",
    b"\n",
    b"7",
    b"12",
    b">",
    b">>",
    b"<<",
    b"/PagesX",
    b"/Kids [1 0 R]",
]
MAX_STEPS_PER_BYTE = 5
"""Each byte is handed to at most five searches or one-by-one steps (see ``proxy.media.pdf.Scan``)."""


def hostile(tokens: list[bytes], repeat: int) -> bytes:
    return b"%PDF-1.4\n" + b"".join(tokens) * repeat


pdf_texts = st.one_of(
    st.builds(hostile, st.lists(st.sampled_from(TOKENS), max_size=12), st.integers(1, 3000)),
    st.builds(lambda n: b"/Type/Pages " * n, st.integers(0, 20000)),  # the reported stall
    st.builds(lambda n: b"/Type /Pages /Count" + b" " * n, st.integers(0, 100000)),
    st.builds(lambda n: b"/Count " + b"9" * n, st.integers(0, 100000)),
    st.binary(max_size=4000),
)


@settings(max_examples=200, deadline=None)
@given(pdf_texts)
def test_the_page_count_costs_at_most_a_constant_per_byte(text: bytes) -> None:
    assert page_count(text).steps <= MAX_STEPS_PER_BYTE * len(text) + 16


def reference(text: bytes) -> int | None:
    """What the page count means, by regex on small texts only: the largest ``/Count`` of a
    ``>``-free stretch that names ``/Type /Pages``."""
    counts = [
        int(n) if len(n) <= MAX_COUNT_DIGITS else 10**MAX_COUNT_DIGITS
        for stretch in text.split(b">")
        if re.search(rb"/Type\s*/Pages\b", stretch)
        for n in re.findall(rb"/Count\s+(\d+)", stretch)
    ]
    return max(counts) if counts else None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=40).map(b"".join))
def test_the_page_count_is_the_largest_count_of_a_pages_node(text: bytes) -> None:
    assert page_count(text).pages == reference(text)


def test_real_page_trees_are_counted() -> None:
    assert page_count(samples.pdf(3)).pages == 3
    assert page_count(samples.pdf(501)).pages == 501
    assert page_count(b"<< /Count 4 /Kids [3 0 R] /Type /Pages >>").pages == 4  # either order
    assert page_count(b"<< /Type /Page /Count 4 >>").pages is None  # a page, not the tree
    assert page_count(b"<< /Type /Pages >> << /Count 4 >>").pages is None  # another node's count
    assert page_count(b"<< /Type /Pages /Count " + b"9" * 5000 + b" >>").pages == 10**MAX_COUNT_DIGITS


def test_the_reported_120_kb_stall_is_a_few_steps_per_byte() -> None:
    text = b"%PDF-1.4\n" + b"/Type/Pages " * 10000
    assert page_count(text).steps <= 3 * len(text)
