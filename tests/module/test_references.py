"""``{{step.path}}`` references are found in one linear pass (issue #26 parser sweep): the text
holds the client's ``$ARGUMENTS`` when results are injected, and the regex this replaces was
super-linear on it (11 s for 40 KB of ``{{a.data.data…``). The pass finds what the regex found,
and its cost (``Found.steps``) is bounded by the length whatever the text."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.module.prompt import inject_results
from proxy.module.references import scan

OLD = re.compile(
    r"\{\{\s*(?P<name>[a-z0-9][a-z0-9._-]*?)\.(?P<path>(?:ok|meta|data|error|partial_data)(?:\.[A-Za-z0-9_-]+)*)\s*\}\}"
)
TOKENS = [
    "{{",
    "}}",
    "{",
    "}",
    ".",
    "a",
    "B",
    "7",
    "-",
    "_",
    " ",
    "\n",
    "data",
    "meta",
    "ok",
    "partial_data",
    "x",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=30).map("".join))
def test_the_scan_finds_what_the_regex_found(text: str) -> None:
    expected = [(m.start(), m.end(), m["name"], m["path"]) for m in OLD.finditer(text)]
    assert [(r.start, r.end, r.name, r.path) for r in scan(text).references] == expected


hostile = st.one_of(
    st.builds(lambda n: "{{a" + ".data" * n, st.integers(0, 20000)),  # the super-linear case
    st.builds(lambda n: "{{a" + ".data" * n + "}", st.integers(0, 20000)),
    st.builds(lambda n: "{" * n, st.integers(0, 20000)),
    st.builds(lambda n: "{{" + " " * n + "a.data" + " " * n, st.integers(0, 20000)),
    st.builds(
        lambda t, n: "".join(t) * n, st.lists(st.sampled_from(TOKENS), max_size=10), st.integers(1, 2000)
    ),
)


@settings(max_examples=200, deadline=None)
@given(hostile)
def test_the_scan_costs_at_most_a_constant_per_character(text: str) -> None:
    assert scan(text).steps <= 3 * len(text) + 4


def test_results_are_injected_and_unknown_names_left_as_written() -> None:
    text = "risk {{ lint.meta.risk }}, {{other.data.x}}, {{lint.data.items}}"
    results = {"lint": {"meta": {"risk": "low"}, "data": {"items": [1, 2]}}}
    assert inject_results(text, results) == "risk low, {{other.data.x}}, [1,2]"
