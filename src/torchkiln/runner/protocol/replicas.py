"""Instance replicates (`TrialSpec.replicas = k > 1`): k variant and k baseline instances built
in a balanced order, timed round-robin, and the speedup's interval taken over the k pairs.

Why: a trial's usual interval comes from rep-to-rep noise of one instance per arm, but two
instances of the same model differ by more than that. On an H200 (torch 2.11,
commits 6d93ddb and 50de622) two eager resnet50 bf16 instances in one process differed by 0.2-2.8%
(host-bound steps), two reduce-overhead ones by 0.06% against a rep interval of +-0.03%: an A/A
run then excludes 1.00 with a tight interval. Replicating the instance puts that variation
where it belongs, in the interval (a t interval over the pairs' log ratios, k - 1 degrees of
freedom), at k times the timed work.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from torchkiln.measure.stats import MIN_EFFECT, Speedup, paired_speedup

# Two-sided 95% quantiles of Student's t by degrees of freedom (standard tables).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
        9: 2.262, 10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}  # fmt: skip


def t975(df: int) -> float:
    """The 97.5% quantile of t with `df` degrees of freedom (the next tabulated lower df, which
    errs wide; 1.96 past 30)."""
    if df < 1:
        raise ValueError("a t interval needs at least two replicates")
    if df > 30:
        return 1.96
    return T975[max(d for d in T975 if d <= df)]


def build_order(k: int) -> list[str]:
    """B V V B B V ...: each arm's mean build position is the same, so a trend with build
    order (later-built eager instances ran faster on the H200) moves both arms alike."""
    out: list[str] = []
    for j in range(k):
        out += ["B", "V"] if j % 2 == 0 else ["V", "B"]
    return out


def replicated_speedup(
    baseline_ms: list[list[float]], variant_ms: list[list[float]], min_effect: float = MIN_EFFECT
) -> Speedup:
    """Each pair's paired median ratio (baseline instance j over variant instance j); their
    geometric mean with a t interval over the k pairs."""
    ratios = [paired_speedup(b, v).median for b, v in zip(baseline_ms, variant_ms, strict=True)]
    k = len(ratios)
    logs = np.log(np.asarray(ratios))
    mean = float(logs.mean())
    half = t975(k - 1) * float(logs.std(ddof=1)) / math.sqrt(k)
    return Speedup(
        median=math.exp(mean),
        ci95=(math.exp(mean - half), math.exp(mean + half)),
        n=k,
        ratios=tuple(ratios),
        min_effect=min_effect,
    )


def replicas_record(
    order: list[str],
    baseline_ms: list[list[float]],
    variant_ms: list[list[float]],
    speedup: Speedup,
) -> dict[str, Any]:
    """What the result keeps about the replicates: the build order, each instance's median and
    each pair's ratio (the replicated speedup's own)."""
    return {
        "k": len(variant_ms),
        "build_order": order,
        "variant_median_ms": [float(np.median(v)) for v in variant_ms],
        "baseline_median_ms": [float(np.median(b)) for b in baseline_ms],
        "pair_ratios": list(speedup.ratios),
        "interval": "t over the pairs' log ratios, k - 1 degrees of freedom",
    }
