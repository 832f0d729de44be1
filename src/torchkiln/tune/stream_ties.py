"""Which stream candidates the fastest cannot be told apart from, and which of them to deploy.

A stream trial keeps its steady items' seconds, the candidate's and its paired eager's
(``steady_item_s``, ``eager_steady_item_s``: measure.stream_replay). Two trials replay the same
items in the same order, each in its own process, so a candidate's steady seconds over the
fastest's are compared as each one's seconds over its own eager (which cancels a difference
between the two processes' hosts), with a 95% interval from resampling the items, the same
resample for both. A candidate whose interval reaches 1 is tied with the fastest; among the tied
the one with the least one-off seconds (compiles and a bucketed warm-up) wins, as the
fixed-input tune lets the cheapest compile win a tie (tune/select.py). The interval says how far
the measured items decide the order; a steady mean read from a few hundred items of a few
hundred shapes moves with the sample, and a slower warm-up is paid by every server process.
"""

from __future__ import annotations

from typing import Any

import numpy as np

RESAMPLES = 2000
SEED = 0  # one resample for every comparison and every run: the same trials give the same pick


def _arrays(s: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    c, e = s.get("steady_item_s"), s.get("eager_steady_item_s")
    if not c or not e or len(c) != len(e):
        return None
    return np.asarray(c, dtype=float), np.asarray(e, dtype=float)


def steady_ratio(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """Stream metrics ``a``'s steady seconds over ``b``'s, each over its own eager's on the same
    items: ``ratio`` and ``ci95``; None when either lacks the items' seconds or they differ in
    number (not the same stream)."""
    xa, xb = _arrays(a), _arrays(b)
    if xa is None or xb is None or len(xa[0]) != len(xb[0]):
        return None
    (ca, ea), (cb, eb) = xa, xb
    point = (ca.sum() / ea.sum()) / (cb.sum() / eb.sum())
    rng = np.random.default_rng(SEED)
    idx = rng.integers(0, len(ca), size=(RESAMPLES, len(ca)))
    boot = (ca[idx].sum(1) / ea[idx].sum(1)) / (cb[idx].sum(1) / eb[idx].sum(1))
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"ratio": float(point), "ci95": [float(lo), float(hi)]}


def one_off_s(s: dict[str, Any]) -> float:
    """The seconds a candidate paid once on the stream (compiles, a bucketed warm-up): its whole
    stream's less what its items take at the steady rate."""
    return max(0.0, s["total_s"] - s["steady_time_per_item_s"] * s["items"])


def settle(ranking: list[str], streams: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The candidates tied with the fastest (``ranking[0]``, never eager) and the one to deploy:
    ``best``, ``tied`` (the fastest and those tied with it, fastest first), ``vs_fastest`` each
    compared candidate's ratio and interval, and ``reason`` when a tie changed the pick."""
    fastest = ranking[0]
    vs: dict[str, dict[str, Any]] = {}
    tied = [fastest]
    for v in ranking[1:]:
        if v == "eager":
            continue
        r = steady_ratio(streams[v], streams[fastest])
        if r is None:
            continue
        vs[v] = r
        if r["ci95"][0] <= 1.0:
            tied.append(v)
    best = min(tied, key=lambda v: one_off_s(streams[v]))
    reason = None
    if best != fastest:
        r = vs[best]
        reason = (
            f"tie: {len(tied)} candidates' steady seconds per item could not be told apart "
            f"({best}: {r['ratio']:.3f}x the fastest's, {fastest}, 95% interval "
            f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]); the cheapest to warm up wins: {best} "
            f"({one_off_s(streams[best]):.1f} s of compiles and warm-up against "
            f"{one_off_s(streams[fastest]):.1f} s)"
        )
    return {"best": best, "tied": tied if len(tied) > 1 else [], "vs_fastest": vs, "reason": reason}
