"""How many trials a tune keeps in flight: one per GPU on several, on one GPU as many as the
host's cores and memory and the GPU's memory allow, one on the CPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchkiln.errors import KilnUserError
from torchkiln.runner.launch.concurrency import (
    COMPILE_WORKERS_ENV,
    auto_workers,
    parse_workers,
    search_slots,
)

GIB = 1 << 30


def _eager(gpu_bytes: int, peak: int) -> dict:
    return {
        "environment": {"gpu": {"memory_bytes": gpu_bytes}},
        "memory": {"peak_reserved_bytes": peak},
    }


def test_an_h200_host_keeps_four_small_trials_in_flight():
    n, why = auto_workers(16, 128 * GIB, 141 * GIB, 200 << 20)
    assert n == 4 and "default" in why


@pytest.mark.parametrize(
    ("cores", "host", "gpu", "peak", "want", "tightest"),
    [
        (8, 128 * GIB, 141 * GIB, 0, 2, "cores"),
        (64, 16 * GIB, 141 * GIB, 0, 2, "GiB host"),
        (64, 512 * GIB, 80 * GIB, 20 * GIB, 1, "GiB GPU"),  # a 20 GiB model: one at a time
        (2, 24 * GIB, None, None, 1, "cores"),  # never fewer than one
    ],
)
def test_the_tightest_limit_sets_the_count(cores, host, gpu, peak, want, tightest):
    n, why = auto_workers(cores, host, gpu, peak)
    assert n == want
    assert tightest in why


def test_slots_follow_the_device(monkeypatch):
    monkeypatch.delenv(COMPILE_WORKERS_ENV, raising=False)
    eager = _eager(141 * GIB, 0)
    assert search_slots("cpu", [], eager)[0] == [None]
    assert search_slots("cpu", [], eager, requested=3)[0] == [None]  # the CPU times itself
    assert search_slots("cuda", [0, 1], eager)[0] == [0, 1]  # one per GPU
    assert search_slots("cuda:0", [], eager, requested=3)[0] == [None, None, None]
    monkeypatch.setenv(COMPILE_WORKERS_ENV, "2")
    slots, why, compiles = search_slots("cuda", [0], eager)
    assert slots == [None, None] and "asked for" in why and compiles is None
    monkeypatch.setenv(COMPILE_WORKERS_ENV, "none")
    with pytest.raises(KilnUserError, match=COMPILE_WORKERS_ENV):
        search_slots("cuda", [0], eager)


def test_a_count_below_one_is_refused():
    with pytest.raises(KilnUserError, match="positive whole number"):
        parse_workers("0")
    proc = subprocess.run(
        [sys.executable, "-m", "torchkiln.cli", "tune", "simple", "--compile-workers", "0"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "--compile-workers" in proc.stderr


def test_on_one_gpu_twice_the_compile_slots_are_in_flight_as_memory_allows(monkeypatch):
    from torchkiln.runner.launch import concurrency

    monkeypatch.delenv(COMPILE_WORKERS_ENV, raising=False)
    assert concurrency.alive_trials(4, 128 * GIB, 141 * GIB, 200 << 20) == 8
    assert concurrency.alive_trials(4, 40 * GIB, 141 * GIB, 0) == 5  # host memory: 40 / 8
    assert concurrency.alive_trials(2, 512 * GIB, 80 * GIB, 20 * GIB) == 2  # never below
    monkeypatch.setattr(concurrency.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(concurrency, "_host_memory_bytes", lambda: 128 * GIB)
    slots, why, compiles = search_slots("cuda", [0], _eager(141 * GIB, 200 << 20))
    assert (len(slots), compiles) == (8, 4)
    assert why.startswith("8 at once, 4 compiling at most (default is the tightest limit")
