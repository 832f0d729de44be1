"""Trend charts for the HTML report: each variant's median step time, with its 95% interval,
over the earlier comparable runs in the history store and this one. A point where the
environment changed (torch, triton, kiln's commit, the device, the host) is marked, since a step
time that moves there may have moved for that reason rather than by noise.

Self-contained inline SVG, like svg.py; every label passes through html.escape."""

from __future__ import annotations

import sqlite3
from html import escape
from pathlib import Path
from typing import Any

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 760, 230, 60, 150, 28, 40
MAX_POINTS = 30  # the latest runs drawn per variant
# The model's own source file too (a `file.py:factory` workload): its edits move step times.
ENV_KEYS = ("device_name", "host", "torch", "triton", "kiln_git_sha", "source_hash")


def env_change(prev: dict[str, Any], cur: dict[str, Any]) -> str | None:
    """What changed in the environment between two points, in a few words, or None."""
    changed = []
    for key in ENV_KEYS:
        a, b = prev.get(key), cur.get(key)
        if a != b:
            short = (lambda v: str(v)[:8]) if key in ("kiln_git_sha", "source_hash") else str
            label = {"device_name": "device", "source_hash": "source"}.get(key, key)
            changed.append(f"{label} {short(a)}→{short(b)}")
    return ", ".join(changed) or None


def chart(title: str, points: list[dict[str, Any]]) -> str:
    """Medians with interval whiskers, in order, the last one (this run) drawn apart; a dashed
    line before every point whose environment differs from the one before it."""
    if not points:
        return ""
    top = max(max(p["hi_ms"] or p["median_ms"], p["median_ms"]) for p in points) * 1.1 or 1.0
    n = len(points)
    step = (W - PAD_L - PAD_R) / max(1, n - 1)
    x = lambda i: PAD_L + i * step  # noqa: E731
    y = lambda v: H - PAD_B - v / top * (H - PAD_T - PAD_B)  # noqa: E731
    out = [
        f'<svg width="{W}" height="{H}" role="img" aria-label="{escape(title)}">',
        f'<text x="4" y="16" class="t">{escape(title)}</text>',
        f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" class="a"/>',
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" class="a"/>',
        f'<text x="6" y="{PAD_T + 4}">{top:.3g} ms</text>',
        f'<text x="6" y="{H - PAD_B}">0</text>',
        f'<text x="{PAD_L}" y="{H - 22}">{escape(points[0]["created"][:10])}</text>',
        f'<text x="{W - PAD_R}" y="{H - 22}" text-anchor="end">'
        f"{escape(points[-1]['created'][:10])}</text>",
    ]
    for i in range(1, n):
        what = env_change(points[i - 1], points[i])
        if what:
            cx = x(i) - step / 2
            out.append(
                f'<line x1="{cx:.1f}" y1="{PAD_T}" x2="{cx:.1f}" y2="{H - PAD_B}" '
                'class="a" stroke-dasharray="4 3"><title>'
                f"environment changed: {escape(what)}</title></line>"
            )
            out.append(
                f'<text x="{cx + 2:.1f}" y="{PAD_T + 10}" class="env">{escape(what[:40])}</text>'
            )
    path = " ".join(f"{x(i):.1f},{y(p['median_ms']):.1f}" for i, p in enumerate(points))
    out.append(f'<polyline points="{path}" class="l0" fill="none"/>')
    for i, p in enumerate(points):
        lo, hi = p.get("lo_ms"), p.get("hi_ms")
        if lo is not None and hi is not None:
            out.append(
                f'<line x1="{x(i):.1f}" x2="{x(i):.1f}" y1="{y(lo):.1f}" y2="{y(hi):.1f}" '
                'class="w"/>'
            )
        label = f"run {p['run_id']}" if p.get("run_id") else "this run"
        out.append(
            f'<circle cx="{x(i):.1f}" cy="{y(p["median_ms"]):.1f}" r="{5 if i == n - 1 else 3}" '
            f'class="p"><title>{escape(label)}, {escape(p["created"])}: '
            f"{p['median_ms']:.4g} ms</title></circle>"
        )
    last = points[-1]
    out.append(
        f'<text x="{x(n - 1) + 8:.1f}" y="{y(last["median_ms"]):.1f}">'
        f"this run {last['median_ms']:.4g} ms</text></svg>"
    )
    return "".join(out)


def series(doc: dict[str, Any], store: Any) -> dict[str, list[dict[str, Any]]]:
    """Per variant measured in ``doc``: the earlier comparable runs' points, oldest first, then
    this run's; only variants with at least one earlier run."""
    from torchkiln.history.records import measurement_rows, run_row

    run = run_row(doc, None)
    own = store.find(doc)
    out = {}
    for m in measurement_rows(doc, run["kind"]):
        if m["median_ms"] is None or m["status"] != "ok":
            continue
        earlier = store.earlier_comparable(run, m, own)[: MAX_POINTS - 1]
        if earlier:
            this = {**{k: run[k] for k in ("created", *ENV_KEYS)}, **m, "run_id": own}
            out[m["variant"]] = [*reversed(earlier), this]
    return out


def section(doc: dict[str, Any], history: str | Path | bool | None = None) -> str:
    """The report's trend charts, from the store ``history`` names (None: the default); empty
    when history is off or there is no earlier comparable run."""
    from torchkiln.history.store import HistoryError, Store, resolve

    path = resolve(history)
    if path is None or not path.exists():
        return ""
    try:
        with Store(path) as store:
            found = series(doc, store)
    except (HistoryError, sqlite3.Error, ValueError) as exc:
        return f"<p>No trend chart: the history store could not be read ({escape(str(exc))}).</p>"
    if not found:
        return ""
    charts = "".join(
        f"<div>{chart(f'{v}: median step time over runs (95% interval)', pts)}</div>"
        for v, pts in found.items()
    )
    return (
        f"<h2>Trend (history store {escape(str(path))})</h2><p>Earlier comparable runs: same "
        "workload, step, preset, device and precision. Dashed lines: the environment changed."
        f"</p>{charts}"
    )
