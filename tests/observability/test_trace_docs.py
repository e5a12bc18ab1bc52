"""docs/observability.md draws the span tree (a mermaid chart under *Traces*): its span names are
the ones the code gives, so a renamed or new internal span fails here until the picture follows."""

from __future__ import annotations

import re
from pathlib import Path

from proxy.api.routes import ROUTES

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "observability.md"


def _chart() -> str:
    traces = PAGE.read_text(encoding="utf-8").split("## Traces", 1)[1].split("\n## ", 1)[0]
    return traces.split("```mermaid", 1)[1].split("```", 1)[0]


def _span_names() -> dict[str, str]:
    """Each node of the chart and the span name it shows (its label's first line)."""
    labels = re.findall(r'^\s*(\w+)\["(.+?)"\]$', _chart(), re.M)
    return {node: label.split("<br/>")[0] for node, label in labels}


def _traced_in_code() -> set[str]:
    """The internal spans' names: every literal handed to ``traced`` under proxy/."""
    source = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "proxy").rglob("*.py"))
    return set(re.findall(r'\btraced\(\s*"([^"]+)"', source))


def test_the_span_trees_internal_spans_are_exactly_the_ones_the_code_makes() -> None:
    internal = {name for name in _span_names().values() if " " not in name}
    assert internal == _traced_in_code()


def test_the_span_trees_other_names_are_the_codes_patterns() -> None:
    """The server span is ``{method} {route template}`` of a real route, the module call
    ``module_call {module}``, each attempt ``chat {model}`` (``proxy.observability.tracing``)."""
    named = [name for name in _span_names().values() if " " in name]
    (server,) = [name for name in named if name.split(" ", 1)[0] == "POST"]
    assert server.split(" ", 1)[1] in {route.path for route in ROUTES}
    rest = sorted(name.split(" ", 1)[0] for name in named if name != server)
    assert rest == ["chat", "chat", "module_call"]


def test_every_node_of_the_span_tree_hangs_from_the_server_span() -> None:
    chart, nodes = _chart(), _span_names()
    edges = re.findall(r"^\s*(\w+) --> (\w+)$", chart, re.M)
    parents = {child: parent for parent, child in edges}
    (root,) = [node for node in nodes if node not in parents]
    assert nodes[root].startswith("POST ")
    assert set(parents) | {root} == set(nodes) and set(parents.values()) <= set(nodes)
