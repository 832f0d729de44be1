"""The HTML report's charts drawn by matplotlib, as inline SVG (the page still needs no network).
Same functions as report/svg.py, the hand-drawn fallback used when matplotlib is missing: the
`report` extra installs it. matplotlib lays out the ticks, and every label fits inside the
figure (`bbox_inches="tight"`); points and lines are told apart by a legend below the axes, not by
labels beside them, which overlapped wherever two variants measured alike."""

from __future__ import annotations

import io
import re
from html import escape
from typing import Any

# Width of a chart in inches at 96 px per inch: the page is 1100 px wide.
WIDTH_IN = 9.0
COLORS = ["#4a7ab7", "#c0392b", "#27ae60", "#8e44ad", "#d35400", "#7f8c8d", "#16a085", "#2c3e50"]


def _figure(height_in: float) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=96)
    fig.set_layout_engine("constrained")
    return fig


def _svg(fig: Any, title: str) -> str:
    """The figure as an <svg> element to inline: text kept as text (searchable, selectable),
    and ids salted by the title so that two charts on one page never share a clip path."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"kiln:{title}"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    # Inline in HTML the namespaces are implied and the RDF metadata says only "matplotlib":
    # dropped, so the page holds no address at all (nothing it could try to fetch).
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text)
    label = f'role="img" aria-label="{escape(title)}" '
    return re.sub(r"^<svg ", "<svg " + label, text, count=1)


def hbars(title: str, rows: list[tuple[str, float, tuple[float, float] | None]], unit: str) -> str:
    """Horizontal bars with optional interval whiskers: (label, value, (lo, hi))."""
    if not rows:
        return ""
    fig = _figure(0.9 + 0.32 * len(rows))
    ax = fig.subplots()
    labels = [label for label, _, _ in rows]
    values = [v for _, v, _ in rows]
    y = list(range(len(rows)))
    ax.barh(y, values, color=COLORS[0], height=0.6)
    for i, (_, v, ci) in enumerate(rows):
        if ci:
            ax.errorbar(v, i, xerr=[[v - ci[0]], [ci[1] - v]], fmt="none", ecolor="#111", capsize=3)
    top = max(max(v, (ci or (v, v))[1]) for _, v, ci in rows) or 1.0
    for i, v in enumerate(values):
        ax.annotate(
            f"{v:.3g} {unit}".strip(),
            (max(v, (rows[i][2] or (v, v))[1]), i),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    ax.set_xlim(0, top * 1.18)  # room for the value beside the longest bar
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()  # first row on top, as in the table
    ax.set_xlabel(unit or "count")
    ax.set_title(title, loc="left", fontsize=10, fontweight="bold")
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig, title)


def _legend_below(fig: Any) -> None:
    # A figure legend outside the axes: the layout gives it its own room, where an axes legend
    # as wide as a long variant name squeezed the axes to a sliver.
    fig.legend(loc="outside lower left", ncols=1, fontsize=8, frameon=False)


def scatter(title: str, points: list[tuple[str, float, float]], xlab: str, ylab: str) -> str:
    """Points (label, x, y), told apart by colour and marker in the legend."""
    if not points:
        return ""
    fig = _figure(3.6 + 0.17 * len(points))
    ax = fig.subplots()
    markers = "osD^vP*X"
    for i, (label, x, y) in enumerate(points):
        ax.scatter(
            [x],
            [y],
            s=36,
            color=COLORS[i % len(COLORS)],
            marker=markers[i % len(markers)],
            label=f"{label} ({x:.3g}, {y:.3g})",
            zorder=3,
        )
    ax.set_xlabel(xlab)
    ax.set_ylabel(ylab)
    ax.margins(0.08)
    ax.grid(alpha=0.3)
    ax.set_title(title, loc="left", fontsize=10, fontweight="bold")
    _legend_below(fig)
    return _svg(fig, title)


def lines(
    title: str, series: list[tuple[str, list[tuple[float, float]]]], xlab: str, ylab: str
) -> str:
    """Polylines (label, [(x, y), ...]) on shared axes, named in the legend."""
    if not any(s for _, s in series):
        return ""
    fig = _figure(3.6 + 0.17 * len(series))
    ax = fig.subplots()
    for i, (label, s) in enumerate(series):
        ax.plot(
            [x for x, _ in s],
            [y for _, y in s],
            color=COLORS[i % len(COLORS)],
            linestyle=["-", "--", ":", "-."][(i // len(COLORS)) % 4],
            linewidth=2,
            label=label,
        )
    ax.set_xlabel(xlab)
    ax.set_ylabel(ylab)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.set_title(title, loc="left", fontsize=10, fontweight="bold")
    _legend_below(fig)
    return _svg(fig, title)
