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
    scale = (W - LEFT - 80) / top
    h = 30 + ROW * len(rows)
    out = [
        f'<svg width="{W}" height="{h}" role="img" aria-label="{escape(title)}">',
        f'<text x="4" y="16" class="t">{escape(title)}</text>',
    ]
    for i, (label, v, ci) in enumerate(rows):
        y = 26 + i * ROW
        out.append(f'<text x="{LEFT - 6}" y="{y + 15}" text-anchor="end">{escape(label)}</text>')
        out.append(f'<rect x="{LEFT}" y="{y + 3}" width="{v * scale:.1f}" height="16" class="b"/>')
        if ci:
            x1, x2 = LEFT + ci[0] * scale, LEFT + ci[1] * scale
            out.append(f'<line x1="{x1:.1f}" x2="{x2:.1f}" y1="{y + 11}" y2="{y + 11}" class="w"/>')
        out.append(
            f'<text x="{LEFT + v * scale + 6:.1f}" y="{y + 15}">{_fmt(v)} {escape(unit)}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def scatter(title: str, points: list[tuple[str, float, float]], xlab: str, ylab: str) -> str:
    """Labelled points (label, x, y)."""
    if not points:
        return ""
    h, pad = 320, 50
    xmax = max(p[1] for p in points) or 1.0
    ymax = max(p[2] for p in points) or 1.0
    sx, sy = (W - 2 * pad - 200) / xmax, (h - 2 * pad) / ymax
    out = [
        f'<svg width="{W}" height="{h}" role="img" aria-label="{escape(title)}">',
        f'<text x="4" y="16" class="t">{escape(title)}</text>',
        f'<line x1="{pad}" y1="{h - pad}" x2="{W - 200}" y2="{h - pad}" class="a"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" class="a"/>',
        f'<text x="{(W - 200) / 2}" y="{h - 12}">{escape(xlab)}</text>',
        f'<text x="6" y="{pad - 10}">{escape(ylab)}</text>',
    ]
    for label, x, y in points:
        cx, cy = pad + x * sx, h - pad - y * sy
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
    h, pad = 320, 50
    xmax = max(p[0] for p in pts) or 1.0
    ymax = max(p[1] for p in pts) or 1.0
    sx, sy = (W - 2 * pad - 200) / xmax, (h - 2 * pad) / ymax
    out = [
        f'<svg width="{W}" height="{h}" role="img" aria-label="{escape(title)}">',
        f'<text x="4" y="16" class="t">{escape(title)}</text>',
        f'<line x1="{pad}" y1="{h - pad}" x2="{W - 200}" y2="{h - pad}" class="a"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" class="a"/>',
        f'<text x="{(W - 200) / 2}" y="{h - 12}">{escape(xlab)} (0 to {_fmt(xmax)})</text>',
        f'<text x="6" y="{pad - 10}">{escape(ylab)} (0 to {_fmt(ymax)})</text>',
    ]
    for i, (label, s) in enumerate(series):
        path = " ".join(f"{pad + x * sx:.1f},{h - pad - y * sy:.1f}" for x, y in s)
        out.append(f'<polyline points="{path}" class="l{i % 6}" fill="none"/>')
        x, y = s[-1]
        out.append(
            f'<text x="{pad + x * sx + 4:.1f}" y="{h - pad - y * sy:.1f}">{escape(label)}</text>'
        )
    out.append("</svg>")
    return "".join(out)
