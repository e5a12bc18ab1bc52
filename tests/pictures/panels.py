"""The dashboards' panels and their queries, with Grafana's variables substituted (no matplotlib)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tests.paths import ROOT
from tests.test_grafana import GRAFANA_VARIABLE, fill_variables, walk_panels

DASHBOARDS = ROOT / "grafana" / "dashboards"
IMAGES = ROOT / "docs" / "images"
GRID_COLUMNS = 24
RATE_INTERVAL = "10s"
"""``$__rate_interval``: ten scrapes at the pictures' 1 s scrape interval, for smooth lines."""
ALL = ".*"
"""A multi-value variable with "All" selected (the dashboards' ``allValue``)."""


@dataclass(frozen=True)
class Target:
    ref_id: str
    expr: str
    """As the dashboard writes it (variables unsubstituted)."""
    legend: str
    instant: bool


@dataclass(frozen=True)
class Panel:
    id: int
    type: str
    title: str
    x: int
    y: int
    w: int
    h: int
    targets: tuple[Target, ...]
    spec: Mapping[str, Any]
    """The panel's JSON: options and fieldConfig, for the drawing."""
    variables: Mapping[str, str]
    """Values of the template variables for this panel (a repeated panel has its own)."""

    @property
    def unit(self) -> str:
        unit: str = self.spec.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        return unit


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    path: Path
    panels: tuple[Panel, ...]
    """Rows and panels, in the dashboard's order (rows have no targets)."""

    @property
    def picture(self) -> Path:
        return IMAGES / f"dashboard-{self.uid}.png"

    @property
    def height(self) -> int:
        return max(p.y + p.h for p in self.panels)


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS.glob("*.json"))


def load(path: Path) -> Dashboard:
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    variables = {v["name"]: ALL for v in doc["templating"]["list"] if v["type"] == "query"}
    panels = tuple(_panel(spec, variables) for spec in walk_panels(doc["panels"]))
    return Dashboard(doc["uid"], doc["title"], path, panels)


def _panel(spec: dict[str, Any], variables: Mapping[str, str]) -> Panel:
    grid = spec["gridPos"]
    targets = tuple(
        Target(t["refId"], t["expr"], t.get("legendFormat", ""), bool(t.get("instant")))
        for t in spec.get("targets") or []
    )
    return Panel(
        spec["id"],
        spec["type"],
        spec["title"],
        grid["x"],
        grid["y"],
        grid["w"],
        grid["h"],
        targets,
        spec,
        variables,
    )


def substitute(expr: str, variables: Mapping[str, str], window_s: int) -> str:
    """Grafana's variables -> PromQL: the template variables' values, ``$__rate_interval``,
    ``$__range`` (the pictures' whole window) and ``$__interval``."""
    values = {
        **variables,
        "__rate_interval": RATE_INTERVAL,
        "__range": f"{window_s}s",
        "__interval": RATE_INTERVAL,
        "datasource": "",
    }
    return fill_variables(expr, values)


def title(panel: Panel) -> str:
    return GRAFANA_VARIABLE.sub(
        lambda m: panel.variables.get(m.group(1) or m.group(2), m.group(0)), panel.title
    )


def variable_query(path: Path, name: str) -> tuple[str, str]:
    """(series selector, label) of a ``label_values(selector, label)`` template variable."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    var = next(v for v in doc["templating"]["list"] if v["name"] == name)
    query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
    match = re.fullmatch(r"label_values\((.+), (\w+)\)", query)
    if match is None:
        raise ValueError(f"${name}: not a label_values() query: {query}")
    return match.group(1), match.group(2)


def repeat(dashboard: Dashboard, panel: Panel, values: list[str]) -> Dashboard:
    """The dashboard with ``panel`` repeated once per value of its ``repeat`` variable, side by
    side as Grafana lays them out (``maxPerRow`` a row, the panels below moved down)."""
    per_row = max(1, min(len(values), panel.spec.get("maxPerRow", 4)))
    width = GRID_COLUMNS // per_row
    copies = tuple(
        replace(
            panel,
            x=(i % per_row) * width,
            y=panel.y + (i // per_row) * panel.h,
            w=width,
            variables={**panel.variables, panel.spec["repeat"]: value},
        )
        for i, value in enumerate(values)
    )
    extra = (max(len(values), 1) - 1) // per_row * panel.h
    panels: list[Panel] = []
    for other in dashboard.panels:
        if other is panel:
            panels.extend(copies)
        else:
            panels.append(replace(other, y=other.y + extra) if other.y >= panel.y + panel.h else other)
    return replace(dashboard, panels=tuple(panels))
