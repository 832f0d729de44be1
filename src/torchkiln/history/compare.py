"""`kiln compare --against history[:N] NEW`: is NEW slower than the recent past?

For each variant of NEW, the last N comparable runs in the store (same workload, step, preset,
device and precision; N = 5 by default) are its reference. Their medians' spread is the noise
floor: a run-to-run wobble the past already showed is not a regression, however the threshold
is set. A regression is a median slower than the reference median by more than the threshold
and the floor, with NEW's 95% interval entirely above every one of the N runs' intervals; the
reference run named is the one whose median is the median of the N.
"""

from __future__ import annotations

import statistics
from typing import Any

from torchkiln.errors import KilnUserError
from torchkiln.history.records import kind_of, measurement_rows, run_row
from torchkiln.history.store import Store

DEFAULT_N = 5


def parse_against(text: str) -> int:
    """'history' or 'history:N' -> N."""
    name, _, n = text.partition(":")
    if name != "history" or (n and not n.isdigit()) or n == "0":
        raise KilnUserError(f"--against {text!r}; give history or history:N (N >= 1)")
    return int(n) if n else DEFAULT_N


def verdict(new: dict[str, Any], past: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """Compare one measurement with its past ones (newest first, all with a median)."""
    medians = [p["median_ms"] for p in past]
    ref_median = statistics.median(medians)
    ref = min(past, key=lambda p: (abs(p["median_ms"] - ref_median), -p["run_id"]))
    floor = (max(medians) - min(medians)) / ref_median if ref_median else 0.0
    band_hi = max(p["hi_ms"] if p["hi_ms"] is not None else p["median_ms"] for p in past)
    band_lo = min(p["lo_ms"] if p["lo_ms"] is not None else p["median_ms"] for p in past)
    new_lo = new["lo_ms"] if new["lo_ms"] is not None else new["median_ms"]
    new_hi = new["hi_ms"] if new["hi_ms"] is not None else new["median_ms"]
    ratio = new["median_ms"] / ref_median if ref_median else float("inf")
    allowed = max(threshold, floor)
    if ratio > 1 + allowed and new_lo > band_hi:
        what = "regression"
    elif ratio < 1 - allowed and new_hi < band_lo:
        what = "improvement"
    else:
        what = "no significant change"
    return {
        "variant": new["variant"],
        "precision": new["precision"],
        "new_ms": new["median_ms"],
        "new_ci95": [new_lo, new_hi],
        "history_ms": ref_median,
        "history_band": [band_lo, band_hi],
        "runs": [p["run_id"] for p in past],
        "against": {"run_id": ref["run_id"], "created": ref["created"], "ms": ref["median_ms"]},
        "noise_floor": floor,
        "ratio": ratio,
        "verdict": what,
    }


def against_history(
    doc: dict[str, Any], store: Store, n: int = DEFAULT_N, threshold: float = 0.05
) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows for the variants with comparable runs, and the variants that had none."""
    kind = kind_of(doc)
    run = run_row(doc, kind)
    own = store.find(doc)  # NEW itself is in the store when its bench appended it
    rows, alone = [], []
    for m in measurement_rows(doc, kind):
        if m["median_ms"] is None or m["status"] != "ok":
            continue
        past = store.earlier_comparable(run, m, own)[:n]
        if past:
            rows.append(verdict(m, past, threshold))
        else:
            alone.append(m["variant"])
    return rows, alone


def format_row(r: dict[str, Any]) -> str:
    lo, hi = r["history_band"]
    a = r["against"]
    return (
        f"{r['variant']:40s} {r['history_ms']:9.3f} [{lo:.3f}, {hi:.3f}] -> {r['new_ms']:9.3f} ms "
        f"({r['ratio']:.3f}x, noise floor {r['noise_floor']:.1%})  {r['verdict']}; against run "
        f"{a['run_id']} of {a['created']} ({len(r['runs'])} runs: {r['runs']})"
    )
