"""Thread-safe serving counters: requests, bucket hits, eager fallbacks, padding, latency."""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any

import numpy as np

# Latency samples kept per bucket: enough for stable p99s, bounded for a long-running server.
KEEP = 10_000
# Each bucket's first hits after warm-up are kept apart: on an H200 (commit 65f0de3) most of the
# learned buckets' batch-1 graphs took 12-29 ms on their first two hits and 2-3 ms after,
# which set the arm's p99. A first hit is "cold" when it is over COLD_FACTOR x the bucket's
# median and at least COLD_MIN_MS slower.
FIRST_HITS = 2
COLD_FACTOR, COLD_MIN_MS = 3.0, 1.0


def percentiles_ms(samples_s: Any) -> dict[str, float]:
    a = np.asarray(list(samples_s), dtype=np.float64) * 1e3
    if a.size == 0:
        return {"n": 0}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {
        "n": int(a.size),
        "mean": float(a.mean()),
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
        "max": float(a.max()),
    }


class ServeStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.hits: Counter[str] = Counter()
        self.fallbacks: Counter[str] = Counter()
        self.last_fallback: dict[str, str] = {}
        self.latency: dict[str, deque[float]] = {}
        self.first: dict[str, list[float]] = {}
        self.real = 0
        self.padded = 0
        self.recompile_attempts = 0
        self.last_recompile = ""

    def record_bucket(self, label: str, seconds: float, real: int, padded: int) -> None:
        with self._lock:
            self.requests += 1
            self.hits[label] += 1
            self.real += real
            self.padded += padded
            self.latency.setdefault(label, deque(maxlen=KEEP)).append(seconds)
            first = self.first.setdefault(label, [])
            if len(first) < FIRST_HITS:
                first.append(seconds)

    def record_eager(self, category: str, message: str, seconds: float) -> None:
        with self._lock:
            self.requests += 1
            self.fallbacks[category] += 1
            self.last_fallback[category] = message
            self.latency.setdefault("eager", deque(maxlen=KEEP)).append(seconds)

    def record_recompile(self, message: str) -> None:
        with self._lock:
            self.recompile_attempts += 1
            self.last_recompile = message

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": self.requests,
                "bucketed_requests": sum(self.hits.values()),
                "hits": dict(self.hits),
                "eager_fallbacks": sum(self.fallbacks.values()),
                "fallback_reasons": dict(self.fallbacks),
                "last_fallback": dict(self.last_fallback),
                # Padded elements beyond the real ones, over the real ones (bucketed requests).
                "padding_waste": (self.padded - self.real) / self.real if self.real else 0.0,
                "real_elements": self.real,
                "padded_elements": self.padded,
                "latency_ms": {k: percentiles_ms(v) for k, v in self.latency.items()},
                "cold_first_hits": cold_first_hits(self.first, self.latency),
                "recompiles_after_warmup": self.recompile_attempts,
                "last_recompile": self.last_recompile,
            }


def cold_first_hits(
    first: dict[str, list[float]], latency: dict[str, deque[float]]
) -> dict[str, Any]:
    """Buckets whose first hits after warm-up ran far slower than their median: the cost a
    warm-up left unpaid (a CUDA graph recorded again, a lazy initialisation)."""
    cold, requests = {}, 0
    for label, hits in first.items():
        median_ms = float(np.median(np.asarray(latency[label], dtype=np.float64))) * 1e3
        limit = max(COLD_FACTOR * median_ms, median_ms + COLD_MIN_MS)
        slow = sum(1 for h in hits if h * 1e3 > limit)
        if slow:
            requests += slow
            cold[label] = {"first_ms": [round(h * 1e3, 3) for h in hits], "median_ms": median_ms}
    return {"buckets": len(cold), "requests": requests, "by_bucket": cold}
