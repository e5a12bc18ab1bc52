"""Every panel's queries against Prometheus, as Grafana would send them (range or instant)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from tests.pictures.panels import Dashboard, Panel, Target, repeat, substitute, variable_query
from tests.prometheus_e2e import PrometheusError, PrometheusServer

STEP_S = 2
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


@dataclass(frozen=True)
class Window:
    start: float
    end: float

    @property
    def seconds(self) -> int:
        return round(self.end - self.start)


@dataclass(frozen=True)
class Series:
    ref_id: str
    name: str
    """The target's legendFormat filled in (or the labels, as Grafana shows a series without one)."""
    labels: dict[str, str]
    times: list[float]
    values: list[float]
    """NaN where Prometheus had no sample (a gap in the line)."""


@dataclass(frozen=True)
class PanelData:
    panel: Panel
    series: list[Series]
    queries: list[str]
    """Each target's PromQL as sent."""


def legend(target: Target, labels: dict[str, str]) -> str:
    if target.legend:
        return LEGEND_LABEL.sub(lambda m: labels.get(m.group(1), ""), target.legend)
    shown = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return "{" + shown + "}" if shown else "value"


async def _post(prom: PrometheusServer, path: str, form: dict[str, str]) -> dict[str, Any]:
    async with prom.session.post(f"{prom.url}/api/v1/{path}", data=form) as resp:
        body: dict[str, Any] = await resp.json(content_type=None)
    if body.get("status") != "success":
        raise PrometheusError(f"{form['query']}: {body.get('errorType')}: {body.get('error')}")
    data: dict[str, Any] = body["data"]
    return data


async def run_target(prom: PrometheusServer, target: Target, expr: str, window: Window) -> list[Series]:
    if target.instant:
        data = await _post(prom, "query", {"query": expr, "time": str(window.end)})
        points = {id(s): [s["value"]] for s in data["result"]}
    else:
        form = {"query": expr, "start": str(window.start), "end": str(window.end), "step": f"{STEP_S}s"}
        data = await _post(prom, "query_range", form)
        points = {id(s): s["values"] for s in data["result"]}
    series = []
    for result in data["result"]:
        labels: dict[str, str] = result["metric"]
        samples = points[id(result)]
        series.append(
            Series(
                target.ref_id,
                legend(target, labels),
                labels,
                [float(t) for t, _ in samples],
                [float(v) for _, v in samples],
            )
        )
    return series


async def fetch_panel(prom: PrometheusServer, panel: Panel, window: Window) -> PanelData:
    series: list[Series] = []
    queries = []
    for target in panel.targets:
        expr = substitute(target.expr, panel.variables, window.seconds)
        queries.append(expr)
        series.extend(await run_target(prom, target, expr, window))
    return PanelData(panel, series, queries)


async def expand_repeats(prom: PrometheusServer, dashboard: Dashboard, window: Window) -> Dashboard:
    """Repeat each ``repeat`` panel once per value its variable takes in Prometheus (All selected)."""
    for panel in [p for p in dashboard.panels if p.spec.get("repeat")]:
        selector, label = variable_query(dashboard.path, panel.spec["repeat"])
        match = substitute(selector, panel.variables, window.seconds)
        values = await prom.api(f"label/{label}/values", {"match[]": match, "start": str(window.start)})
        if values:
            dashboard = repeat(dashboard, panel, sorted(values))
    return dashboard


def has_data(data: PanelData) -> bool:
    return any(math.isfinite(v) for s in data.series for v in s.values)
