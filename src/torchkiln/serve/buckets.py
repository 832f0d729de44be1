"""Bucket policies: the padded sizes each dynamic dimension ("symbol") is compiled for.

A policy yields a sorted tuple of sizes per symbol; a request is padded, symbol by symbol, up to
the smallest bucket that holds it. With several symbols the buckets are the Cartesian product of
the per-symbol sizes (`BucketGrid`).

Policies: `explicit` lists, `powers_of_two`, and `learned` from a sample of observed sizes: at
most K sizes minimising the expected padded volume, exactly, by dynamic programming over the
sorted distinct sizes. `learn_buckets` learns several symbols jointly (see its docstring for what
is exact there and what is not).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from torchkiln.errors import KilnUserError


class BucketError(KilnUserError):
    """A bucket list or policy that cannot work (empty, non-positive, too many buckets)."""


Buckets = tuple[int, ...]


def explicit(sizes: Iterable[int]) -> Buckets:
    """Validate and sort an explicit list of bucket sizes."""
    out = sorted({int(s) for s in sizes})
    if not out:
        raise BucketError("a bucket list needs at least one size")
    if out[0] < 1:
        raise BucketError(f"bucket sizes must be >= 1, got {out[0]}")
    return tuple(out)


def powers_of_two(max_size: int, min_size: int = 1) -> Buckets:
    """Powers of two from the first one >= ``min_size`` up to ``max_size``.

    The largest bucket is ``max_size`` itself, not the next power of two: a model that accepts at
    most 500 positions must not be compiled for 512.
    """
    if min_size < 1 or max_size < min_size:
        raise BucketError(
            f"powers_of_two needs 1 <= min_size <= max_size, got {min_size}, {max_size}"
        )
    size = 1
    while size < min_size:
        size *= 2
    out = []
    while size < max_size:
        out.append(size)
        size *= 2
    out.append(max_size)
    return tuple(out)


def _cheapest_partition(values: np.ndarray, weights: np.ndarray, k: int) -> list[int]:
    """Exact DP: split the sorted distinct ``values`` into at most ``k`` contiguous groups, each
    padded to its largest value, minimising sum(weight * padded value). Returns the boundaries.

    cost(i, j) = values[j-1] * (W[j] - W[i]) for the group values[i:j], with W the prefix sums of
    the weights; best[g][j] = min_i best[g-1][i] + cost(i, j). O(k n^2) work, O(k n) numpy calls.
    """
    n = len(values)
    k = min(k, n)
    prefix = np.concatenate([[0.0], np.cumsum(weights, dtype=np.float64)])
    best = np.full((k + 1, n + 1), np.inf)
    best[0, 0] = 0.0
    choice = np.zeros((k + 1, n + 1), dtype=np.int64)
    for g in range(1, k + 1):
        # A group ending at j needs g-1 groups before it, so i >= g-1 and j >= g.
        for j in range(g, n + 1):
            cand = best[g - 1, :j] + values[j - 1] * (prefix[j] - prefix[:j])
            i = int(np.argmin(cand))
            best[g, j] = cand[i]
            choice[g, j] = i
    # More groups never cost more, so exactly k groups is optimal among "at most k".
    bounds = []
    j, g = n, k
    while j > 0:
        bounds.append(int(values[j - 1]))
        j, g = int(choice[g, j]), g - 1
    return sorted(bounds)


def learned(
    sizes: Sequence[int],
    k: int,
    *,
    weights: Sequence[float] | None = None,
    max_size: int | None = None,
) -> Buckets:
    """At most ``k`` bucket sizes minimising the expected padded volume over ``sizes`` (exact).

    ``weights`` scale each observation's cost (e.g. the batch size, when learning sequence
    buckets, makes the objective padded tokens). ``max_size`` forces the top bucket (for sizes
    larger than any in the sample that traffic may still bring); default: the sample's maximum.
    """
    if k < 1:
        raise BucketError(f"k must be >= 1, got {k}")
    arr = np.asarray(sizes, dtype=np.int64)
    if arr.size == 0:
        raise BucketError("learned buckets need a non-empty sample of sizes")
    if arr.min() < 1:
        raise BucketError(f"observed sizes must be >= 1, got {int(arr.min())}")
    w = np.ones(arr.size) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != arr.shape:
        raise BucketError(f"{w.size} weights for {arr.size} sizes")
    top = int(arr.max()) if max_size is None else int(max_size)
    if top < arr.max():
        raise BucketError(f"max_size={top} is smaller than an observed size ({int(arr.max())})")
    values, inverse = np.unique(np.append(arr, top), return_inverse=True)
    # The forced top value carries no weight: it only guarantees coverage up to max_size.
    summed = np.bincount(inverse[:-1], weights=w, minlength=len(values))
    return tuple(_cheapest_partition(values.astype(np.float64), summed, k))


def round_up(size: int, buckets: Buckets) -> int | None:
    """The smallest bucket >= size, or None when size exceeds the largest bucket."""
    i = bisect.bisect_left(buckets, size)
    return buckets[i] if i < len(buckets) else None


def _padded(sizes: np.ndarray, buckets: Buckets) -> np.ndarray:
    b = np.asarray(buckets)
    idx = np.searchsorted(b, sizes)
    out = np.where(idx < len(b), b[np.minimum(idx, len(b) - 1)], -1)
    return out


def padding_waste(
    samples: Sequence[Mapping[str, int]], buckets: Mapping[str, Sequence[int]]
) -> float:
    """Padded elements over real elements (product over symbols), for the samples that fit.

    Requests larger than a symbol's largest bucket would run eagerly, unpadded, so they are left
    out here as they are from BucketedModule's waste.
    """
    real_total = 0.0
    padded_total = 0.0
    real = np.ones(len(samples))
    padded = np.ones(len(samples))
    for sym, b in buckets.items():
        sizes = np.array([s[sym] for s in samples], dtype=np.float64)
        up = _padded(sizes, tuple(sorted(b)))
        real *= sizes
        padded *= up
    fits = padded > 0
    real_total = float(real[fits].sum())
    padded_total = float(padded[fits].sum())
    return padded_total / real_total - 1.0 if real_total else 0.0


def learn_buckets(
    samples: Sequence[Mapping[str, int]],
    k: int | Mapping[str, int],
    *,
    max_sizes: Mapping[str, int] | None = None,
    max_rounds: int = 20,
) -> dict[str, Buckets]:
    """Learn buckets for several symbols at once, minimising the padded volume of the sample.

    With one symbol this is `learned` (exact). With several, the padded volume of a request is the
    product of its padded sizes, which does not split by symbol; the search is coordinate descent:
    start from each symbol's exact buckets weighted by the other symbols' real sizes, then re-solve
    one symbol at a time, exactly, with the others' padded sizes as weights, keeping a change only
    when the total volume drops. Each round is exact given the other symbols, so the volume never
    rises; the result is a local optimum of the joint problem, not a certified global one.
    """
    if not samples:
        raise BucketError("learn_buckets needs a non-empty sample")
    symbols = list(samples[0])
    ks = {s: k for s in symbols} if isinstance(k, int) else dict(k)
    missing = [s for s in symbols if s not in ks]
    if missing:
        raise BucketError(f"no k for symbol(s) {missing}; give k for each of {symbols}")
    tops = dict(max_sizes or {})
    sizes = {s: np.array([r[s] for r in samples], dtype=np.float64) for s in symbols}

    def others(sym: str, table: Mapping[str, np.ndarray]) -> np.ndarray:
        out = np.ones(len(samples))
        for o in symbols:
            if o != sym:
                out = out * table[o]
        return out

    bounds = {
        s: learned(sizes[s].astype(np.int64), ks[s], weights=others(s, sizes), max_size=tops.get(s))
        for s in symbols
    }
    if len(symbols) == 1:
        return bounds

    def volume(b: Mapping[str, Buckets]) -> float:
        return float(np.prod([_padded(sizes[s], b[s]) for s in symbols], axis=0).sum())

    current = volume(bounds)
    for _ in range(max_rounds):
        improved = False
        for sym in symbols:
            padded = {s: _padded(sizes[s], bounds[s]).astype(np.float64) for s in symbols}
            candidate = learned(
                sizes[sym].astype(np.int64),
                ks[sym],
                weights=others(sym, padded),
                max_size=tops.get(sym),
            )
            trial = {**bounds, sym: candidate}
            v = volume(trial)
            if v < current - 1e-9:
                bounds, current, improved = trial, v, True
        if not improved:
            break
    return bounds


class BucketGrid:
    """The Cartesian product of per-symbol bucket sizes, and the lookup of a request's bucket."""

    def __init__(self, buckets: Mapping[str, Sequence[int]], max_buckets: int | None = None):
        if not buckets:
            raise BucketError("give buckets for at least one symbol")
        self.symbols: tuple[str, ...] = tuple(buckets)
        self.sizes: dict[str, Buckets] = {s: explicit(b) for s, b in buckets.items()}
        self.count = int(np.prod([len(b) for b in self.sizes.values()]))
        if max_buckets is not None and self.count > max_buckets:
            shape = " x ".join(f"{len(b)} {s}" for s, b in self.sizes.items())
            raise BucketError(
                f"{self.count} buckets ({shape}) exceed max_buckets={max_buckets}; use fewer sizes "
                "or raise max_buckets (each specialised bucket is one compilation at warm-up)"
            )

    def bucket(self, sizes: Mapping[str, int]) -> tuple[int, ...] | None:
        """The bucket (one size per symbol, in `symbols` order), or None if a size is too big."""
        key = []
        for s in self.symbols:
            up = round_up(sizes[s], self.sizes[s])
            if up is None:
                return None
            key.append(up)
        return tuple(key)

    def keys(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*(self.sizes[s] for s in self.symbols)))

    def largest(self) -> dict[str, int]:
        return {s: b[-1] for s, b in self.sizes.items()}

    def label(self, key: Sequence[int]) -> str:
        return ",".join(f"{s}={v}" for s, v in zip(self.symbols, key, strict=True))
