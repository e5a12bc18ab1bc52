"""docs/architecture.md: its "Layout" names every module and package of proxy/, and nothing that is
gone; its layers picture is the import contract `make lint` checks."""

from __future__ import annotations

import re
import tomllib

from tests.paths import ROOT

PROXY = ROOT / "proxy"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_the_layout_lists_every_entry_of_proxy() -> None:
    text = ARCHITECTURE.read_text()
    block = text.split("## Layout", 1)[1].split("```")[1]
    listed = set(re.findall(r"^proxy/(\S+?)/?\s", block, re.M))
    present = {
        p.name
        for p in PROXY.iterdir()
        if p.name != "__init__.py" and not p.name.startswith(".") and (p.suffix == ".py" or p.is_dir())
    } - {"__pycache__"}
    assert listed == present


def test_the_layers_picture_is_the_import_contract() -> None:
    """The Mermaid chart lists the `[tool.importlinter]` layers top to bottom, each above the next (a
    node: the layer's name, ``<br/>``, its modules as the contract writes them)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layers = pyproject["tool"]["importlinter"]["contracts"][0]["layers"]
    chart = ARCHITECTURE.read_text().split("## Layers", 1)[1].split("```mermaid", 1)[1].split("```", 1)[0]
    labels = re.findall(r'^\s*(L\d+)\["(.+?)"\]$', chart, re.M)
    nodes = {node: label.split("<br/>")[-1] for node, label in labels}
    edges = re.findall(r"^\s*(L\d+) --> (L\d+)$", chart, re.M)
    assert list(nodes.values()) == layers
    assert edges == list(zip(list(nodes)[:-1], list(nodes)[1:], strict=True))
