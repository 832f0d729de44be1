"""Bucket policies: powers of two, explicit lists, and the learned (exact DP) policy."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from torchkiln.serve import (
    BucketError,
    BucketGrid,
    explicit,
    generate_trace,
    learn_buckets,
    learned,
    padding_waste,
    powers_of_two,
)
from torchkiln.serve.buckets import round_up


def _padded_volume(sizes, weights, buckets):
    return sum(w * round_up(s, buckets) for s, w in zip(sizes, weights, strict=True))


def _brute_force(sizes, weights, k, top):
    """Every set of at most k boundaries among the observed sizes, the top one forced."""
    inner = sorted(set(sizes) - {top})
    best = None
    for r in range(0, k):
        for combo in itertools.combinations(inner, r):
            cost = _padded_volume(sizes, weights, (*combo, top))
            best = cost if best is None else min(best, cost)
    return best


def test_powers_of_two_stop_at_the_maximum_not_past_it():
    assert powers_of_two(512, min_size=8) == (8, 16, 32, 64, 128, 256, 512)
    assert powers_of_two(32) == (1, 2, 4, 8, 16, 32)
    # A model that takes 500 positions at most must not be compiled for 512.
    assert powers_of_two(500, min_size=100) == (128, 256, 500)
    with pytest.raises(BucketError):
        powers_of_two(4, min_size=8)


def test_explicit_sorts_dedups_and_rejects_nonpositive():
    assert explicit([32, 8, 8, 16]) == (8, 16, 32)
    with pytest.raises(BucketError):
        explicit([])
    with pytest.raises(BucketError):
        explicit([0, 4])


@pytest.mark.parametrize("seed", range(12))
def test_learned_equals_brute_force_on_small_cases(seed):
    rng = random.Random(seed)
    n, k = rng.randint(3, 14), rng.randint(1, 4)
    sizes = [rng.randint(1, 20) for _ in range(n)]
    weights = [rng.randint(1, 5) for _ in range(n)]
    top = max(sizes) + rng.choice([0, 0, 3])  # sometimes a forced top above the sample
    got = learned(sizes, k, weights=weights, max_size=top)
    assert len(got) <= k and got[-1] == top
    assert _padded_volume(sizes, weights, got) == _brute_force(sizes, weights, k, top)


def test_learned_with_enough_buckets_has_no_waste():
    sizes = [3, 9, 9, 17, 40]
    assert learned(sizes, 10) == (3, 9, 17, 40)
    assert padding_waste([{"s": s} for s in sizes], {"s": learned(sizes, 10)}) == 0.0


def test_padding_waste_counts_padded_over_real_elements():
    samples = [{"b": 1, "s": 3}, {"b": 2, "s": 5}]
    # padded: 2*4 + 2*8 = 24; real: 3 + 10 = 13
    assert padding_waste(samples, {"b": [2], "s": [4, 8]}) == pytest.approx(24 / 13 - 1)
    # A request bigger than every bucket runs eagerly and adds no padding.
    assert padding_waste([*samples, {"b": 9, "s": 1}], {"b": [2], "s": [4, 8]}) == pytest.approx(
        24 / 13 - 1
    )


def test_learned_beats_powers_of_two_on_a_skewed_sample():
    seqs = [r["seq"] for r in generate_trace(3000, seed=5)]
    pow2 = powers_of_two(512, min_size=8)
    mine = learned(seqs, k=len(pow2), max_size=512)
    held_out = [{"seq": r["seq"]} for r in generate_trace(3000, seed=6)]
    w_pow2 = padding_waste(held_out, {"seq": pow2})
    w_learned = padding_waste(held_out, {"seq": mine})
    assert w_learned < 0.75 * w_pow2, (w_learned, w_pow2)  # 26% vs 42% at seed 5/6
    # Even with fewer buckets than powers of two, learning wins on this long tail.
    assert padding_waste(held_out, {"seq": learned(seqs, k=5, max_size=512)}) < w_pow2


def test_joint_learning_never_loses_to_its_start_or_to_powers_of_two():
    sample = generate_trace(800, seed=1)
    tops = {"batch": 32, "seq": 512}
    joint = learn_buckets(sample, {"batch": 6, "seq": 7}, max_sizes=tops)
    assert all(joint[s][-1] == tops[s] for s in tops)
    assert len(joint["batch"]) <= 6 and len(joint["seq"]) <= 7
    # Its starting point: each symbol learned alone, weighted by the other's real sizes.
    start = {
        "batch": learned(
            [r["batch"] for r in sample], 6, weights=[r["seq"] for r in sample], max_size=32
        ),
        "seq": learned(
            [r["seq"] for r in sample], 7, weights=[r["batch"] for r in sample], max_size=512
        ),
    }
    pow2 = {"batch": powers_of_two(32), "seq": powers_of_two(512, min_size=8)}  # 6 x 7 buckets
    assert padding_waste(sample, joint) <= padding_waste(sample, start) + 1e-12
    assert padding_waste(sample, joint) < padding_waste(sample, pow2)


def test_joint_learning_of_one_symbol_is_the_exact_policy():
    sample = [{"seq": s} for s in (5, 7, 7, 30, 31, 64)]
    assert learn_buckets(sample, 3)["seq"] == learned([5, 7, 7, 30, 31, 64], 3)


def test_grid_lookup_and_cap():
    grid = BucketGrid({"batch": [2, 8], "seq": [16, 64]})
    assert grid.count == 4
    assert grid.bucket({"batch": 1, "seq": 17}) == (2, 64)
    assert grid.bucket({"batch": 8, "seq": 16}) == (8, 16)
    assert grid.bucket({"batch": 9, "seq": 1}) is None
    assert grid.label((2, 64)) == "batch=2,seq=64"
    with pytest.raises(BucketError, match="max_buckets=3"):
        BucketGrid({"batch": [2, 8], "seq": [16, 64]}, max_buckets=3)


def test_learned_rejects_a_top_below_the_sample():
    with pytest.raises(BucketError):
        learned([5, 50], 2, max_size=20)
    assert np.all(np.diff(learned(list(range(1, 200)), 7)) > 0)
