"""Panels drawn with matplotlib in the dashboard's grid (gridPos), one PNG per dashboard.

Each panel type is drawn the way Grafana shows it, simply: timeseries as lines (stacked where the
panel stacks, a right axis where an override puts one, threshold lines), stat as its last value,
heatmap as bucket counts over time, state-timeline as coloured bands, bargauge and barchart as
bars, table as a table. Titles, units and legends come from the dashboard's JSON.
"""

from __future__ import annotations

import io
import itertools
import json
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import matplotlib
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from tests.pictures import CAPTION
from tests.pictures.fetch import PanelData, Series, Window, has_data
from tests.pictures.panels import GRID_COLUMNS, Dashboard, Panel, title

matplotlib.rcParams["text.parse_math"] = False  # titles and legends have "$" in them

WIDTH_IN = 20.0
ROW_IN = 0.36
"""Height of one grid unit (Grafana: 30 px against a column of some 75 px)."""
HEADER_IN = 0.9
BACKGROUND, PANEL_BG, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
PALETTE = ("#73bf69", "#f2cc0c", "#8ab8ff", "#ff780a", "#f2495c", "#5794f2", "#b877d9", "#705da0", "#37872d")
NAMED = {"green": "#73bf69", "red": "#f2495c", "orange": "#ff9830", "yellow": "#fade2a", "blue": "#5794f2"}
LEGEND_ROWS = 6
TICK_S = 20
"""Time axis ticks: seconds since the start of the run, every 20 s (m:ss)."""
PNG_COLOURS = 128
DPI = 72
"""1440 px wide: legends legible, each picture well under 300 KB."""


def unit_format(unit: str) -> Callable[[float], str]:
    def fmt(v: float) -> str:
        if not math.isfinite(v):
            return "-"
        if unit == "percentunit":
            return f"{v * 100:.1f}%" if abs(v) < 0.1 else f"{v * 100:.0f}%"
        if unit == "s":
            return (
                f"{v * 1e6:.0f} µs" if abs(v) < 1e-3 else f"{v * 1e3:.1f} ms" if abs(v) < 1 else f"{v:.2f} s"
            )
        if unit == "currencyUSD":
            return f"${v:.2g}" if abs(v) < 0.01 else f"${v:,.2f}"
        suffix = " req/s" if unit == "reqps" else ""
        if abs(v) >= 1e6:
            return f"{v / 1e6:.1f}M{suffix}"
        if abs(v) >= 1e3:
            return f"{v / 1e3:.1f}k{suffix}"
        return f"{v:.3g}{suffix}"

    return fmt


def colour(name: str) -> str:
    return NAMED.get(name, name)


def thresholds(panel: Panel) -> list[tuple[float, str]]:
    steps = panel.spec.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    return [(-math.inf if s["value"] is None else float(s["value"]), colour(s["color"])) for s in steps]


def threshold_colour(panel: Panel, value: float, default: str) -> str:
    found = default
    for start, col in thresholds(panel):
        if value >= start:
            found = col
    return found


def last(series: Series) -> float:
    finite = [v for v in series.values if math.isfinite(v)]
    return finite[-1] if finite else math.nan


def _style(ax: Axes, panel: Panel, fmt: Callable[[float], str], window: Window) -> None:
    ax.set_facecolor(PANEL_BG)
    ax.tick_params(colors=TEXT, labelsize=7)
    for spine in ax.spines.values():
        spine.set_color(GRID)
    ax.grid(color=GRID, linewidth=0.5)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda t, _: f"{int(t - window.start) // 60}:{int(t - window.start) % 60:02d}")
    )
    ax.set_xlim(window.start, window.end)
    ax.set_xticks([window.start + t for t in range(0, window.seconds + 1, TICK_S)])
    defaults = panel.spec.get("fieldConfig", {}).get("defaults", {})
    if "min" in defaults or "max" in defaults:
        ax.set_ylim(defaults.get("min"), defaults.get("max"))


def _right_axis(panel: Panel) -> dict[str, str]:
    """refId -> unit of the targets an override puts on a right axis."""
    right = {}
    for override in panel.spec.get("fieldConfig", {}).get("overrides", []):
        if override["matcher"]["id"] != "byFrameRefID":
            continue
        props = {p["id"]: p["value"] for p in override["properties"]}
        if props.get("custom.axisPlacement") == "right":
            right[override["matcher"]["options"]] = props.get("unit", panel.unit)
    return right


def _calcs(panel: Panel, series: Series, fmt: Callable[[float], str]) -> str:
    """The legend's calcs (mean, max) of a series, as Grafana's table legend shows them."""
    finite = [v for v in series.values if math.isfinite(v)]
    found = (
        {"mean": sum(finite) / len(finite), "max": max(finite), "lastNotNull": finite[-1]} if finite else {}
    )
    calcs = panel.spec.get("options", {}).get("legend", {}).get("calcs", [])
    return "".join(f"   {c} {fmt(found[c])}" for c in calcs if c in found)


def _legend(ax: Axes, lines: list[tuple[Any, str]], panel: Panel) -> None:
    shown = lines[:LEGEND_ROWS]
    labels = [name for _, name in shown]
    if len(lines) > LEGEND_ROWS:
        labels[-1] += f"  (+{len(lines) - LEGEND_ROWS} more)"
    height_in = ax.get_position().height * cast(Figure, ax.figure).get_figheight()
    ax.legend(
        [h for h, _ in shown],
        labels,
        loc="upper left",
        bbox_to_anchor=(0, -0.3 / height_in),
        ncol=2 if len(shown) > 3 else 1,
        fontsize=6.5,
        frameon=False,
        labelcolor=TEXT,
    )


def draw_timeseries(ax: Axes, data: PanelData, window: Window) -> None:
    panel = data.panel
    _style(ax, panel, unit_format(panel.unit), window)
    right_units = _right_axis(panel)
    right = ax.twinx() if right_units else None
    if right is not None:
        unit = next(iter(right_units.values()))
        right.tick_params(colors=TEXT, labelsize=7)
        right.yaxis.set_major_formatter(FuncFormatter(lambda v, _: unit_format(unit)(v)))
    stacked = panel.spec.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {})
    base: dict[float, float] = {}
    lines: list[tuple[Any, str]] = []
    for i, series in enumerate(data.series):
        target = right if right is not None and series.ref_id in right_units else ax
        values = series.values
        if stacked.get("mode") == "normal":
            values = [
                v + base.get(t, 0.0) if math.isfinite(v) else v
                for t, v in zip(series.times, values, strict=True)
            ]
            base.update({t: v for t, v in zip(series.times, values, strict=True) if math.isfinite(v)})
        style = "--" if target is right else "-"
        (line,) = target.plot(series.times, values, style, color=PALETTE[i % len(PALETTE)], linewidth=1.2)
        fmt = unit_format(right_units.get(series.ref_id, panel.unit))
        lines.append((line, series.name + _calcs(panel, series, fmt)))
    mode = panel.spec.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("thresholdsStyle", {})
    if mode.get("mode", "off") != "off":
        for start, col in thresholds(panel):
            if math.isfinite(start):
                ax.axhline(start, color=col, linestyle="--", linewidth=1)
    _legend(ax, lines, panel)


def draw_stat(ax: Axes, data: PanelData, window: Window) -> None:
    panel = data.panel
    fmt = unit_format(panel.unit)
    ax.set_facecolor(PANEL_BG)
    ax.set_xticks([])
    ax.set_yticks([])
    n = max(len(data.series), 1)
    for i, series in enumerate(data.series):
        value = last(series)
        col = threshold_colour(panel, value, PALETTE[i % len(PALETTE)])
        x = (i + 0.5) / n
        ax.text(
            x,
            0.55,
            fmt(value),
            color=col,
            fontsize=20 if n == 1 else 15,
            ha="center",
            va="center",
            transform=ax.transAxes,
            weight="bold",
        )
        if series.name != "value" and (n > 1 or panel.targets[0].legend):
            ax.text(x, 0.18, series.name, color=TEXT, fontsize=7, ha="center", transform=ax.transAxes)
    spark = ax.inset_axes((0, 0, 1, 0.4))
    spark.set_axis_off()
    for series in data.series[:1]:
        if len(series.times) > 1:
            spark.fill_between(
                series.times,
                [v if math.isfinite(v) else 0 for v in series.values],
                alpha=0.2,
                color=threshold_colour(panel, last(series), PALETTE[0]),
            )
            spark.set_xlim(window.start, window.end)


def draw_heatmap(ax: Axes, data: PanelData, window: Window) -> None:
    """Prometheus' cumulative ``le`` buckets de-accumulated per time step, as Grafana's heatmap format."""
    _style(ax, data.panel, lambda v: f"{v:.1f}", window)
    buckets = sorted(data.series, key=lambda s: float(s.labels.get("le", "inf")))
    if not buckets:
        return
    times = buckets[0].times
    rows = [[0.0 if not math.isfinite(v) else v for v in s.values] for s in buckets]
    counts = [rows[0]] + [
        [max(b - a, 0.0) for a, b in zip(lower, upper, strict=True)]
        for lower, upper in itertools.pairwise(rows)
    ]
    edges = [0.0] + [min(float(s.labels["le"]), 1.1) for s in buckets]
    step = (times[1] - times[0]) if len(times) > 1 else 1.0
    xs = [t - step / 2 for t in times] + [times[-1] + step / 2]
    mesh = ax.pcolormesh(
        xs,
        edges,
        [[math.sqrt(c) if c > 0 else math.nan for c in row] for row in counts],
        cmap="Oranges",
        shading="flat",
    )
    mesh.set_edgecolor(PANEL_BG)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("confidence (le)", color=TEXT, fontsize=7)


def draw_state_timeline(ax: Axes, data: PanelData, window: Window) -> None:
    panel = data.panel
    mappings = {
        float(k): (v.get("text", k), colour(v.get("color", "blue")))
        for m in panel.spec.get("fieldConfig", {}).get("defaults", {}).get("mappings", [])
        for k, v in m.get("options", {}).items()
    }
    _style(ax, panel, lambda v: "", window)
    ax.grid(False)
    names = []
    for row, series in enumerate(data.series):
        names.append(series.name)
        spans: list[tuple[float, float, float]] = []
        for t, v in zip(series.times, series.values, strict=True):
            if spans and spans[-1][2] == v:
                spans[-1] = (spans[-1][0], t + 2, v)
            elif math.isfinite(v):
                spans.append((t, t + 2, v))
        for start, end, v in spans:
            text, col = mappings.get(v, (str(v), PALETTE[0]))
            ax.broken_barh([(start, end - start)], (row + 0.05, 0.9), color=col, alpha=0.8)
            ax.text((start + end) / 2, row + 0.5, text, color="#111217", ha="center", va="center", fontsize=8)
    ax.set_yticks([i + 0.5 for i in range(len(names))], names)
    ax.set_ylim(0, max(len(names), 1))


def draw_bars(ax: Axes, data: PanelData, window: Window) -> None:
    """bargauge (horizontal, one bar per series) and barchart (grouped by the most varied label)."""
    panel = data.panel
    fmt = unit_format(panel.unit)
    ax.set_facecolor(PANEL_BG)
    ax.tick_params(colors=TEXT, labelsize=7)
    if panel.type == "bargauge":
        series = sorted(data.series, key=lambda s: s.name)
        values = [last(s) for s in series]
        bars = ax.barh(
            range(len(series)), values, color=[PALETTE[i % len(PALETTE)] for i in range(len(series))]
        )
        ax.set_yticks(range(len(series)), [s.name for s in series])
        ax.invert_yaxis()
        ax.bar_label(bars, [fmt(v) for v in values], color=TEXT, fontsize=8, padding=3)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
        ax.set_xlim(0, max([v for v in values if math.isfinite(v)] + [0]) * 1.3 or 1)
        return
    _grouped_bars(ax, data.series)


def _grouped_bars(ax: Axes, series: Sequence[Series]) -> None:
    """Bars along the label with the most values (the barchart's string field), one colour per
    legend (the series' legend without that label's value)."""
    keys = sorted({k for s in series for k in s.labels})
    axis = max(keys, key=lambda k: len({s.labels.get(k) for s in series}), default="")
    xs = sorted({s.labels.get(axis, "") for s in series})
    bars: dict[str, dict[str, float]] = {}
    for s in series:
        x = s.labels.get(axis, "")
        bars.setdefault(" ".join(word for word in s.name.split() if word != x), {})[x] = last(s)
    width = 0.8 / max(len(bars), 1)
    for g, (group, values) in enumerate(sorted(bars.items())):
        ax.bar(
            [i + g * width for i in range(len(xs))],
            [values.get(x, 0) for x in xs],
            width,
            color=PALETTE[g % len(PALETTE)],
            label=group,
        )
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(xs))], xs)
    ax.set_xlabel(axis, color=TEXT, fontsize=7)
    ax.legend(fontsize=6.5, frameon=False, labelcolor=TEXT, loc="upper left")


def draw_table(ax: Axes, data: PanelData, window: Window) -> None:
    """One row per label set, one value column per target (renamed as the panel's organize step)."""
    panel = data.panel
    fmt = unit_format(panel.unit)
    ax.set_axis_off()
    renames: dict[str, str] = {}
    for step in panel.spec.get("transformations") or []:
        renames.update(step.get("options", {}).get("renameByName", {}))
    refs = [t.ref_id for t in panel.targets]
    columns = [renames.get(f"Value #{r}", "Value" if len(refs) == 1 else f"Value #{r}") for r in refs]
    rows: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    for s in data.series:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "__name__"))
        rows.setdefault(key, {})[s.ref_id] = last(s)
    labels = sorted({k for key in rows for k, _ in key})
    cells = [
        [dict(key).get(label, "") for label in labels] + [fmt(v.get(r, math.nan)) for r in refs]
        for key, v in sorted(rows.items())
    ]
    fit = max(1, int(panel.h * 1.6) - 2)
    if len(cells) > fit:
        cells = [*cells[: fit - 1], ["…"] * (len(labels) + len(refs))]
    table = ax.table(
        cellText=cells or [["no data"]],
        colLabels=[*labels, *columns] if cells else None,
        loc="upper center",
        cellLoc="left",
    )
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    for cell in table.get_celld().values():
        cell.set_facecolor(PANEL_BG)
        cell.set_edgecolor(GRID)
        cell.get_text().set_color(TEXT)


DRAW: dict[str, Callable[[Axes, PanelData, Window], None]] = {
    "timeseries": draw_timeseries,
    "stat": draw_stat,
    "heatmap": draw_heatmap,
    "state-timeline": draw_state_timeline,
    "bargauge": draw_bars,
    "barchart": draw_bars,
    "table": draw_table,
}


def _legend_in(data: PanelData) -> float:
    """Height the legend below a panel's plot needs, in inches."""
    if data.panel.type != "timeseries":
        return 0.0
    shown = min(len(data.series), LEGEND_ROWS)
    return (math.ceil(shown / 2) if shown > 3 else shown) * 0.16 + 0.25


def _fraction(
    fig: Figure, left: float, top: float, width: float, height: float
) -> tuple[float, float, float, float]:
    """A box given in inches from the figure's top left -> (left, bottom, width, height) fractions."""
    w, h = fig.get_figwidth(), fig.get_figheight()
    return left / w, 1 - (top + height) / h, width / w, height / h


def _draw_panel(fig: Figure, data: PanelData, window: Window) -> None:
    panel = data.panel
    col = WIDTH_IN / GRID_COLUMNS
    left, top, width, height = panel.x * col, HEADER_IN + panel.y * ROW_IN, panel.w * col, panel.h * ROW_IN
    box = _fraction(fig, left + 0.03, top + 0.03, width - 0.06, height - 0.06)
    fig.patches.append(
        Rectangle(
            box[:2], box[2], box[3], transform=fig.transFigure, facecolor=PANEL_BG, edgecolor=GRID, zorder=-1
        )
    )
    fig.text(
        *_fraction(fig, left + 0.12, top + 0.2, 0, 0)[:2],
        title(panel),
        color=TEXT,
        fontsize=9,
        weight="bold",
        va="center",
    )
    right = 0.7 if _right_axis(panel) else 0.2
    plain = panel.type == "stat"
    margin_left = (
        0.12 if plain else 1.6 if panel.type == "bargauge" else 1.0 if panel.type == "state-timeline" else 0.7
    )
    bottom = 0.12 if plain else 0.32 + _legend_in(data)
    ax = fig.add_axes(
        _fraction(fig, left + margin_left, top + 0.38, width - margin_left - right, height - 0.38 - bottom)
    )
    DRAW[panel.type](ax, data, window)


def draw_dashboard(dashboard: Dashboard, panels: list[PanelData], window: Window, about: str) -> bytes:
    """The dashboard as a PNG, palette-quantised. Its text chunks: ``Description`` (the caption),
    ``queries`` (every query drawn, as the dashboard writes it), ``empty`` (panels without data)."""
    height_in = HEADER_IN + dashboard.height * ROW_IN + 0.1
    fig = Figure(figsize=(WIDTH_IN, height_in), facecolor=BACKGROUND)
    fig.text(
        *_fraction(fig, 0.15, 0.3, 0, 0)[:2],
        dashboard.title,
        color=TEXT,
        fontsize=15,
        weight="bold",
        va="center",
    )
    fig.text(
        *_fraction(fig, 0.15, 0.65, 0, 0)[:2],
        f"{CAPTION} ({about})",
        color="#9fa7b3",
        fontsize=9,
        va="center",
    )
    for panel in dashboard.panels:
        if panel.type == "row":
            x, y = _fraction(
                fig, panel.x * WIDTH_IN / GRID_COLUMNS + 0.1, HEADER_IN + (panel.y + 0.5) * ROW_IN, 0, 0
            )[:2]
            fig.text(x, y, panel.title, color=TEXT, fontsize=11, weight="bold", va="center")
    for data in panels:
        _draw_panel(fig, data, window)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, facecolor=BACKGROUND)
    text = {
        "Description": f"{CAPTION} ({about})",
        "queries": json.dumps(sorted({t.expr for d in panels for t in d.panel.targets})),
        "empty": json.dumps([title(d.panel) for d in panels if not has_data(d)]),
    }
    return _compact(buffer.getvalue(), text)


def _compact(png: bytes, text: dict[str, str]) -> bytes:
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(PNG_COLOURS)
    info = PngInfo()
    for key, value in text.items():
        info.add_text(key, value)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True, pnginfo=info)
    return out.getvalue()
