"""Stream candidates the fastest cannot be told apart from: their steady seconds over the
fastest's, each over its own eager's on the same items, with an interval from resampling the
items; among the tied, the cheapest to warm up is picked. Numbers are fed."""

import numpy as np
import pytest

from torchkiln.tune.stream_search import _select
from torchkiln.tune.stream_ties import one_off_s, settle, steady_ratio

N = 400


def _stream(scale, *, host=1.0, noise=0.05, seed=1, total_s=10.0):
    """The same steady items in every trial, of sizes that vary 10x; eager and the candidate
    (``scale`` of eager's seconds) each with multiplicative noise of the trial's own (``seed``);
    ``host`` slows both (another process's host)."""
    sizes = np.random.default_rng(0).uniform(0.001, 0.01, N)
    rng = np.random.default_rng(seed)
    eager = sizes * host * rng.lognormal(0.0, noise, N)
    cand = sizes * host * scale * rng.lognormal(0.0, noise, N)
    return {
        "items": N,
        "steady_item_s": cand.tolist(),
        "eager_steady_item_s": eager.tolist(),
        "steady_time_per_item_s": float(cand.mean()),
        "eager_steady_time_per_item_s": float(eager.mean()),
        "total_s": total_s,
        "eager_total_s": float(eager.sum()),
    }


def test_a_clear_difference_is_not_a_tie_and_a_slower_host_cancels():
    fast, slow = _stream(0.5, seed=1), _stream(0.65, seed=2)
    r = steady_ratio(slow, fast)
    assert r["ratio"] == pytest.approx(1.3, rel=0.02)
    assert 1.0 < r["ci95"][0] < r["ratio"] < r["ci95"][1]
    # the same candidate measured in a process on a host twice as slow: each over its own eager
    # reads as the same speed, and the interval holds 1
    same = steady_ratio(_stream(0.5, host=2.0, seed=3), fast)
    assert same["ci95"][0] <= 1.0 <= same["ci95"][1]


def test_not_the_same_stream_or_no_items_kept_gives_no_comparison():
    a = _stream(0.5)
    assert steady_ratio({**a, "steady_item_s": a["steady_item_s"][:-1]}, a) is None
    assert steady_ratio({k: v for k, v in a.items() if k != "steady_item_s"}, a) is None
    short = {**a, "steady_item_s": a["steady_item_s"][:10]}
    short["eager_steady_item_s"] = a["eager_steady_item_s"][:10]
    assert steady_ratio(short, a) is None


def test_among_the_tied_the_cheapest_to_warm_up_wins():
    streams = {
        # fastest, but seven buckets to warm up
        "pow2": _stream(0.500, seed=1, total_s=84.0),
        # 0.6% slower on average, within the noise, four buckets
        "learned": _stream(0.503, seed=2, total_s=54.0),
        # clearly slower and cheapest: no tie
        "dynamic": _stream(0.9, seed=3, total_s=30.0),
    }
    # the ranking the steady means give (the fastest first), eager among them
    ranking = sorted(streams, key=lambda v: streams[v]["steady_time_per_item_s"])
    assert ranking[0] == "pow2"
    out = settle([*ranking[:2], "eager", ranking[2]], streams)
    assert out["best"] == "learned" and out["tied"] == ["pow2", "learned"]
    assert out["vs_fastest"]["dynamic"]["ci95"][0] > 1.0
    assert one_off_s(streams["learned"]) < one_off_s(streams["pow2"])
    assert out["reason"].startswith("tie: 2 candidates' steady seconds per item could not be told")
    assert "the cheapest to warm up wins: learned" in out["reason"]
    # when the fastest is also the cheapest it stays the pick, the tie still listed
    cheap = {**streams, "pow2": {**streams["pow2"], "total_s": 20.0}}
    out = settle([*ranking[:2], ranking[2]], cheap)
    assert out["best"] == "pow2" and out["tied"] == ["pow2", "learned"] and out["reason"] is None


def test_the_tune_selection_reports_the_tie_and_picks_the_cheaper():
    def trial(v, s):
        return {"variant": v, "status": "ok", "reason": "", "stream": s}

    trials = [
        trial("inductor:mode=reduce-overhead,dynamic=false+bucket=pow2",
              _stream(0.500, seed=1, total_s=84.0)),
        trial("inductor:mode=reduce-overhead,dynamic=false+bucket=learned",
              _stream(0.503, seed=2, total_s=54.0)),
    ]  # fmt: skip
    sel = _select(trials)
    assert sel["best"] == "inductor:mode=reduce-overhead,dynamic=false+bucket=learned"
    assert sel["tied"] == [t["variant"] for t in trials]
    assert sel["reason"].startswith("tie: 2 candidates")
    assert " ms an item against eager's " in sel["reason"]
    assert set(sel["steady_vs_fastest"]) == {trials[1]["variant"]}
    # without the items' seconds (results of an older kiln) the fastest is the pick
    for t in trials:
        del t["stream"]["steady_item_s"]
    sel = _select(trials)
    assert sel["best"] == trials[0]["variant"] and sel["tied"] == []
