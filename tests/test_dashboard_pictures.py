"""The dashboards' pictures (``make dashboard-pictures``, ``tests/pictures``): the script takes every
target of every panel of every dashboard, draws every panel type they use, lays repeated panels
out as Grafana does; and each dashboard's checked-in picture exists, is small, is linked from the
docs, and was drawn from every query the dashboard has now, each with data.

Neither matplotlib nor a run is needed: a picture's PNG text chunks name the queries it was drawn
from and the ones that returned nothing (``tests/pictures/draw.py``).
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tests.paths import ROOT
from tests.pictures import CAPTION
from tests.pictures.panels import Dashboard, Panel, dashboard_files, load, repeat, substitute

MAX_BYTES = 300 * 1024
LINKED_FROM = (ROOT / "docs" / "observability.md", ROOT / "grafana" / "README.md")
DASHBOARDS = dashboard_files()


def json_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from json_panels(panel.get("panels") or [])


def json_targets(path: Path) -> list[tuple[int, str, str]]:
    """(panel id, refId, expr) of every target, read from the JSON directly."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    return [
        (p["id"], t["refId"], t["expr"]) for p in json_panels(doc["panels"]) for t in p.get("targets") or []
    ]


def png_text(path: Path) -> dict[str, str]:
    with Image.open(path) as image:
        image.load()
        text: dict[str, str] = dict(getattr(image, "text", {}))
        return text


def test_there_are_dashboards() -> None:
    assert {p.name for p in DASHBOARDS} >= {"cognitive-overview.json", "cognitive-calibration.json"}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_the_script_takes_every_target_of_every_panel(path: Path) -> None:
    dashboard = load(path)
    taken = [(p.id, t.ref_id, t.expr) for p in dashboard.panels for t in p.targets]
    assert sorted(taken) == sorted(json_targets(path))
    for panel in dashboard.panels:
        for target in panel.targets:
            sent = substitute(target.expr, panel.variables, window_s=100)
            assert "$" not in sent, (panel.title, sent)
            assert "[100s]" in sent or "$__range" not in target.expr


def drawn_types() -> set[str]:
    """The keys of ``DRAW`` in tests/pictures/draw.py (read, not imported: no matplotlib here)."""
    tree = ast.parse((ROOT / "tests" / "pictures" / "draw.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "DRAW":
            assert isinstance(node.value, ast.Dict)
            return {
                k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            }
    raise AssertionError("no DRAW table in tests/pictures/draw.py")


def test_every_panel_type_of_the_dashboards_is_drawn() -> None:
    used = {p.type for path in DASHBOARDS for p in load(path).panels} - {"row"}
    assert used <= drawn_types(), f"panel types nobody draws: {sorted(used - drawn_types())}"


def panel_at(dashboard: Dashboard, panel_id: int) -> Panel:
    return next(p for p in dashboard.panels if p.id == panel_id)


def test_a_repeated_panel_is_laid_out_as_grafana_does() -> None:
    """The confidence heatmap repeats per module: side by side, maxPerRow a row, panels below moved
    down by the rows added, each copy with its own ``$module``."""
    dashboard = load(ROOT / "grafana" / "dashboards" / "cognitive-overview.json")
    heatmap = next(p for p in dashboard.panels if p.spec.get("repeat") == "module")
    below = next(p for p in dashboard.panels if p.y == heatmap.y + heatmap.h)
    two = repeat(dashboard, heatmap, ["a", "b"])
    copies = [p for p in two.panels if p.id == heatmap.id]
    assert [(p.x, p.y, p.w, p.variables["module"]) for p in copies] == [
        (0, heatmap.y, 12, "a"),
        (12, heatmap.y, 12, "b"),
    ]
    assert panel_at(two, below.id).y == below.y
    six = repeat(dashboard, heatmap, [str(i) for i in range(6)])  # maxPerRow 4: two rows
    assert [(p.x, p.y, p.w) for p in six.panels if p.id == heatmap.id][3:5] == [
        (18, heatmap.y, 6),
        (0, heatmap.y + heatmap.h, 6),
    ]
    assert panel_at(six, below.id).y == below.y + heatmap.h
    assert panel_at(six, 2).y == panel_at(dashboard, 2).y  # above: unmoved


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_each_dashboard_has_a_small_linked_picture_of_all_its_queries(path: Path) -> None:
    dashboard = load(path)
    picture = dashboard.picture
    assert picture.is_file(), f"{picture.relative_to(ROOT)} is missing: run `make dashboard-pictures`"
    assert picture.stat().st_size < MAX_BYTES, picture.stat().st_size
    text = png_text(picture)
    drawn = set(json.loads(text.get("queries", "[]")))
    missing = sorted({expr for _, _, expr in json_targets(path)} - drawn)
    assert not missing, "queries not in the picture (run `make dashboard-pictures`):\n" + "\n".join(missing)
    assert json.loads(text.get("empty", "null")) == [], f"panels drawn without data: {text.get('empty')}"
    assert CAPTION in text.get("Description", "")
    for page in LINKED_FROM:
        target = os.path.relpath(picture, page.parent)
        assert f"]({target})" in page.read_text(encoding="utf-8"), f"{page.name} does not link {target}"
