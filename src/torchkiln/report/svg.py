"""Tiny inline-SVG charts for the self-contained HTML report (no network, no JS, no matplotlib).
Every label passes through html.escape: names come from users' code and from PyTorch."""

from __future__ import annotations

from html import escape

W, ROW, LEFT = 760, 26, 300


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def hbars(title: str, rows: list[tuple[str, float, tuple[float, float] | None]], unit: str) -> str:
    """Horizontal bars with optional interval whiskers: (label, value, (lo, hi))."""
    if not rows:
        return ""
    top = max(max(v, (ci or (v, v))[1]) for _, v, ci in rows) or 1.0
    # Room for the longest label (about 6.5 px a character at 11 px), not a fixed 300 px that
    # cut long variant specs; the bars keep their width beside it.
    left = max(LEFT, int(6.5 * max(len(label) for label, _, _ in rows)) + 12)
    width = W - LEFT + left
    scale = (width - left - 80) / top
    h = 30 + ROW * len(rows)
    out = [
        f'<svg width="{width}" height="{h}" role="img" aria-label="{escape(title)}">',
        f'<text x="4" y="16" class="t">{escape(title)}</text>',
    ]
    for i, (label, v, ci) in enumerate(rows):
        y = 26 + i * ROW
        out.append(f'<text x="{left - 6}" y="{y + 15}" text-anchor="end">{escape(label)}</text>')
        out.append(f'<rect x="{left}" y="{y + 3}" width="{v * scale:.1f}" height="16" class="b"/>')
        if ci:
            x1, x2 = left + ci[0] * scale, left + ci[1] * scale
            out.append(f'<line x1="{x1:.1f}" x2="{x2:.1f}" y1="{y + 11}" y2="{y + 11}" class="w"/>')
        out.append(
            f'<text x="{left + v * scale + 6:.1f}" y="{y + 15}">{_fmt(v)} {escape(unit)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


H, PAD = 320, 50


def _axes(title: str, xy: list[tuple[float, float]], xlab: str, ylab: str):
    """Opening of an x-y chart: the frame, labels with ranges, and a point-to-pixel mapping."""
    xmax = max(x for x, _ in xy) or 1.0
    ymax = max(y for _, y in xy) or 1.0
    sx, sy = (W - 2 * PAD - 200) / xmax, (H - 2 * PAD) / ymax
    out = [
        f'<svg width="{W}" height="{H}" role="img" aria-label="{escape(title)}">',
        f'<text x="4" y="16" class="t">{escape(title)}</text>',
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 200}" y2="{H - PAD}" class="a"/>',
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{H - PAD}" class="a"/>',
        f'<text x="{(W - 200) / 2}" y="{H - 12}">{escape(xlab)} (0 to {_fmt(xmax)})</text>',
        f'<text x="6" y="{PAD - 10}">{escape(ylab)} (0 to {_fmt(ymax)})</text>',
    ]
    return out, lambda x, y: (PAD + x * sx, H - PAD - y * sy)


def scatter(title: str, points: list[tuple[str, float, float]], xlab: str, ylab: str) -> str:
    """Labelled points (label, x, y)."""
    if not points:
        return ""
    out, at = _axes(title, [(x, y) for _, x, y in points], xlab, ylab)
    for label, x, y in points:
        cx, cy = at(x, y)
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4" class="p"/>')
        out.append(
            f'<text x="{cx + 6:.1f}" y="{cy - 4:.1f}">{escape(label)} ({_fmt(x)}, {_fmt(y)})</text>'
        )
    out.append("</svg>")
    return "".join(out)


def lines(
    title: str, series: list[tuple[str, list[tuple[float, float]]]], xlab: str, ylab: str
) -> str:
    """Polylines (label, [(x, y), ...]) on shared axes."""
    pts = [p for _, s in series for p in s]
    if not pts:
        return ""
    out, at = _axes(title, pts, xlab, ylab)
    for i, (label, s) in enumerate(series):
        path = " ".join("{:.1f},{:.1f}".format(*at(x, y)) for x, y in s)
        out.append(f'<polyline points="{path}" class="l{i % 6}" fill="none"/>')
        lx, ly = at(*s[-1])
        out.append(f'<text x="{lx + 4:.1f}" y="{ly:.1f}">{escape(label)}</text>')
    out.append("</svg>")
    return "".join(out)
