"""Thread-safe serving counters: requests, bucket hits, eager fallbacks, padding, latency."""

from __future__ import annotations

import threading
from collections import Counter, deque
from typing import Any

import numpy as np

# Latency samples kept per bucket: enough for stable p99s, bounded for a long-running server.
KEEP = 10_000


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
                "recompiles_after_warmup": self.recompile_attempts,
                "last_recompile": self.last_recompile,
            }
