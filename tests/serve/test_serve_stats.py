"""Serving counters: each bucket's first hits after warm-up are judged against its median."""

from __future__ import annotations

from torchkiln.serve.replay import render_table
from torchkiln.serve.stats import COLD_FACTOR, ServeStats


def _record(stats: ServeStats, label: str, ms: list[float]) -> None:
    for t in ms:
        stats.record_bucket(label, t / 1e3, real=10, padded=12)


def test_first_hits_far_above_the_median_are_counted_cold():
    stats = ServeStats()
    # The pattern seen on an H200 (bb4a839): two slow first hits (a graph recorded again), then
    # steady.
    _record(stats, "b1_s19", [22.3, 16.9] + [2.5] * 10)
    _record(stats, "b4_s32", [2.6, 2.4] + [2.5] * 10)  # warm from the start
    _record(stats, "b8_s64", [1.3, 0.5] + [0.4] * 10)  # over 3x its median, not 1 ms slower
    _record(stats, "b2_s26", [9.0] + [2.5] * 10)  # one cold hit
    cold = stats.snapshot()["cold_first_hits"]
    assert set(cold["by_bucket"]) == {"b1_s19", "b2_s26"}
    assert cold["buckets"] == 2 and cold["requests"] == 2 + 1
    assert cold["by_bucket"]["b1_s19"] == {"first_ms": [22.3, 16.9], "median_ms": 2.5}
    assert cold["by_bucket"]["b2_s26"]["first_ms"] == [9.0, 2.5]  # 9.0 > 3 x 2.5
    assert 1.3 > COLD_FACTOR * 0.4


def test_no_bucket_is_cold_when_first_hits_are_like_the_rest():
    stats = ServeStats()
    _record(stats, "a", [2.0, 2.1, 2.0, 1.9])
    assert stats.snapshot()["cold_first_hits"] == {"buckets": 0, "requests": 0, "by_bucket": {}}


def test_the_serve_bench_table_names_arms_with_cold_first_hits():
    arm = {"arm": "learned", "status": "ok", "requests": 3, "throughput_rps": 300.0,
           "latency_ms": {"p50": 2.6, "p99": 17.8}, "compilations_setup": 0,
           "compilations_replay": 0, "setup_s": 14.0, "padding_waste": 0.11,
           "eager_fallbacks": 0, "cold_first_hits": {"buckets": 21, "requests": 24}}  # fmt: skip
    result = {"trace": {"requests": 3}, "variant": "v", "device": "cuda:0", "arms": [arm]}
    assert "learned 21 bucket(s), 24 request(s)" in render_table(result)
    arm["cold_first_hits"] = {"buckets": 0, "requests": 0}
    assert "cold first hits" not in render_table(result)
