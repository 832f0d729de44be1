"""Choosing the winner honestly: only correct variants compete; a winner must beat the
runner-up with non-overlapping intervals, else the cheapest to compile among the tied wins;
with a known job length the choice minimises compile time + N x step time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchkiln.measure.stats import intervals_overlap


def passed(r: dict[str, Any]) -> bool:
    c = r.get("correctness")
    return r.get("status") == "ok" and bool(c and c.get("passed"))


def precision_of(r: dict[str, Any]) -> str:
    return (r.get("settings") or {}).get("precision", {}).get("variant", "fp32")


def allowed(r: dict[str, Any], allow_precision: set[str]) -> bool:
    return not r.get("changes_numerics") or precision_of(r) in allow_precision


def step_s(r: dict[str, Any], baseline: dict[str, Any]) -> float:
    """A variant's step time on the baseline's clock: the eager trial's median over the
    variant's paired speedup. Trials run at different times in different processes, so their
    absolute medians drift with the machine's load (seen on a shared 2-core CPU: 4 ms and 88 ms
    for the same eager step); each paired ratio does not."""
    if r is baseline or r["variant"] == baseline["variant"]:
        return baseline["steady_ms"]["median"] / 1e3
    return baseline["steady_ms"]["median"] / r["speedup"]["median"] / 1e3


def break_even_steps(r: dict[str, Any], baseline: dict[str, Any]) -> float | None:
    """Steps after which the variant's extra compile time is paid back by faster steps; None
    when it is not significantly faster per step (it never pays back)."""
    sp = r.get("speedup") or {}
    if not sp.get("significant") or sp.get("median", 0) <= 1.0:
        return None
    saved_s = step_s(baseline, baseline) - step_s(r, baseline)
    extra_s = r["first_call_s"] - baseline["first_call_s"]
    if saved_s <= 0:
        return None
    return max(0.0, extra_s / saved_s)


def total_time_s(r: dict[str, Any], steps: int, baseline: dict[str, Any]) -> float:
    """Compile (first call) plus the remaining steps at the steady-state rate."""
    return r["first_call_s"] + max(0, steps - 1) * step_s(r, baseline)


@dataclass
class Selection:
    best: dict[str, Any] | None
    reason: str
    tied: list[str] = field(default_factory=list)
    ranking: list[str] = field(default_factory=list)
    break_even: dict[str, float | None] = field(default_factory=dict)
    best_numerics_changing: dict[str, Any] | None = None
    rejected: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        b = self.best_numerics_changing
        return {
            "best": self.best["variant"] if self.best else None,
            "reason": self.reason,
            "tied": self.tied,
            "ranking": self.ranking,
            "break_even_steps": self.break_even,
            "rejected": self.rejected,
            "best_numerics_changing": None
            if b is None
            else {
                "variant": b["variant"],
                "speedup": b["speedup"]["median"],
                "speedup_ci95": b["speedup"]["ci95"],
                "worst_error_over_threshold": (b.get("correctness") or {}).get(
                    "worst_error_over_threshold"
                ),
                "passed": passed(b),
            },
        }


def select(
    results: list[dict[str, Any]],
    *,
    baseline: dict[str, Any],
    allow_precision: set[str] | frozenset[str] = frozenset(),
    steps: int | None = None,
) -> Selection:
    """``baseline`` is the eager trial (its first call is the no-compile cost)."""
    rejected = {}
    pool = []
    for r in results:
        if r.get("status") != "ok":
            rejected[r["variant"]] = f"{r.get('status')}: {r.get('reason')}"
        elif not passed(r):
            rejected[r["variant"]] = "failed the correctness check"
        elif not allowed(r, set(allow_precision)):
            rejected[r["variant"]] = f"changes numerics ({precision_of(r)}), not allowed"
        else:
            pool.append(r)
    numerics = [
        r
        for r in results
        if r.get("status") in ("ok", "accuracy_fail") and r.get("changes_numerics")
    ]
    best_num = max(numerics, key=lambda r: r["speedup"]["median"], default=None)
    be = {r["variant"]: break_even_steps(r, baseline) for r in results if r.get("status") == "ok"}
    sel = Selection(
        None, "no variant passed", break_even=be, rejected=rejected, best_numerics_changing=best_num
    )
    if not pool:
        return sel
    if steps is not None:
        ranked = sorted(pool, key=lambda r: total_time_s(r, steps, baseline))
        sel.best = ranked[0]
        sel.ranking = [r["variant"] for r in ranked]
        t = total_time_s(ranked[0], steps, baseline)
        sel.reason = f"least total time for {steps} steps: {t:.1f} s (compile + steps)"
        return sel
    ranked = sorted(pool, key=lambda r: -r["speedup"]["median"])
    sel.ranking = [r["variant"] for r in ranked]
    top = ranked[0]
    tied = [
        r for r in ranked[1:] if intervals_overlap(top["speedup"]["ci95"], r["speedup"]["ci95"])
    ]
    if not tied:
        sel.best = top
        runner = ranked[1]["variant"] if len(ranked) > 1 else None
        sel.reason = f"fastest, {top['speedup']['median']:.2f}x over eager" + (
            f", with an interval clear of the runner-up ({runner})" if runner else ""
        )
        return sel
    group = [top, *tied]
    cheapest = min(group, key=lambda r: r["first_call_s"])
    sel.best = cheapest
    sel.tied = [r["variant"] for r in group]
    sel.reason = (
        f"tie: {len(group)} variants have overlapping speedup intervals; the cheapest to "
        f"compile ({cheapest['first_call_s']:.1f} s first call) wins"
    )
    return sel
