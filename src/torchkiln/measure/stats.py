"""Summaries with intervals, and paired speedups. Pure numpy, no torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# 2000 resamples keep the 95% interval's endpoints stable to ~0.1% of the median on the
# 10-40 samples a trial takes, at a cost of a few milliseconds.
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class Summary:
    """A sample of per-step times (ms) or ratios summarised by its median."""

    median: float
    q25: float
    q75: float
    iqr: float
    cv: float  # coefficient of variation: std / mean
    ci95: tuple[float, float]  # bootstrap percentile interval of the median
    n: int
    samples: tuple[float, ...]

    def to_dict(self) -> dict:
        return {
            "median": self.median,
            "q25": self.q25,
            "q75": self.q75,
            "iqr": self.iqr,
            "cv": self.cv,
            "ci95": list(self.ci95),
            "n": self.n,
            "samples": list(self.samples),
        }


def bootstrap_median_ci(
    samples: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples")
    if x.size == 1:
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    medians = np.median(x[idx], axis=1)
    lo, hi = np.percentile(medians, [2.5, 97.5])
    return float(lo), float(hi)


def summarize(samples: Sequence[float], *, seed: int = 0) -> Summary:
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        raise ValueError("cannot summarise an empty sample")
    q25, med, q75 = np.percentile(x, [25, 50, 75])
    mean = float(x.mean())
    cv = float(x.std(ddof=1) / mean) if x.size > 1 and mean != 0 else 0.0
    return Summary(
        median=float(med),
        q25=float(q25),
        q75=float(q75),
        iqr=float(q75 - q25),
        cv=cv,
        ci95=bootstrap_median_ci(x, seed=seed),
        n=int(x.size),
        samples=tuple(float(v) for v in x),
    )


# Two separately built instances of the same model differ by up to ~0.1% in paired A/A runs on
# an H200 (simple, infer fp32: 1.001 [1.000, 1.001]); across processes fp32 steps vary by
# +-0.5%. A speedup is called significant only when its interval excludes 1.0 AND the median
# moves by at least this much, so noise-sized wins are never reported as wins.
MIN_EFFECT = 0.01


@dataclass(frozen=True)
class Speedup:
    """Paired speedup: the median over reps of baseline_ms / variant_ms, taken A B A B ..."""

    median: float
    ci95: tuple[float, float]
    n: int
    ratios: tuple[float, ...]
    min_effect: float = MIN_EFFECT
    # False when the arms could not be interleaved (ratio of medians, independent resampling).
    paired: bool = True

    @property
    def significant(self) -> bool:
        lo, hi = self.ci95
        return not (lo <= 1.0 <= hi) and abs(self.median - 1.0) >= self.min_effect

    @property
    def verdict(self) -> str:
        if not self.significant:
            return "no significant difference"
        return "faster" if self.median > 1.0 else "slower"

    def to_dict(self) -> dict:
        return {
            "median": self.median,
            "ci95": list(self.ci95),
            "n": self.n,
            "significant": self.significant,
            "min_effect": self.min_effect,
            "verdict": self.verdict,
            "paired": self.paired,
            "ratios": list(self.ratios),
        }


def paired_speedup(
    baseline_ms: Sequence[float], variant_ms: Sequence[float], *, seed: int = 0
) -> Speedup:
    b = np.asarray(baseline_ms, dtype=np.float64)
    v = np.asarray(variant_ms, dtype=np.float64)
    if b.shape != v.shape or b.size == 0:
        raise ValueError("paired samples must be non-empty and of equal length")
    ratios = b / v
    return Speedup(
        median=float(np.median(ratios)),
        ci95=bootstrap_median_ci(ratios, seed=seed),
        n=int(ratios.size),
        ratios=tuple(float(r) for r in ratios),
    )


def unpaired_speedup(
    baseline_ms: Sequence[float],
    variant_ms: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Speedup:
    """median(baseline) / median(variant) for arms timed one after the other, not interleaved:
    the interval resamples each arm on its own, so it is wider than a paired one and does not
    protect against drift between the two blocks (say so wherever it is used)."""
    b = np.asarray(baseline_ms, dtype=np.float64)
    v = np.asarray(variant_ms, dtype=np.float64)
    if b.size == 0 or v.size == 0:
        raise ValueError("both arms need samples")
    rng = np.random.default_rng(seed)
    mb = np.median(b[rng.integers(0, b.size, size=(resamples, b.size))], axis=1)
    mv = np.median(v[rng.integers(0, v.size, size=(resamples, v.size))], axis=1)
    lo, hi = np.percentile(mb / mv, [2.5, 97.5])
    return Speedup(
        median=float(np.median(b) / np.median(v)),
        ci95=(float(lo), float(hi)),
        n=int(min(b.size, v.size)),
        ratios=(),
        paired=False,
    )


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]
