"""How many trials a tune runs at once: one per GPU on several, and on one GPU several whose
compiles overlap while their timed reps take turns (host_lock.py).

A compile is host work (Dynamo's tracing, Inductor's code generation, Triton's and the C++
compiler's builds) that leaves the GPU idle for tens of seconds; a GPU tune of small models
spends most of its wall time there. The timed reps stay alone: a trial times its reps only
while no other trial imports, builds, compiles or checks. So on one GPU the search keeps
``n`` trials in flight, ``n`` following the host's cores and memory and the GPU's memory.
On the CPU the timed device is the compiler's own: one trial at a time.
"""

from __future__ import annotations

import os
from typing import Any

COMPILE_WORKERS_ENV = "KILN_COMPILE_WORKERS"
# At most this many trials at once on one GPU by default: beyond it the turns for the timed
# reps (each trial waits for every neighbour's current phase) eat what overlap saves.
MAX_AUTO = 4
# Per trial in flight: host cores for its compile workers, host memory for its process (an
# Inductor compile of a GPT-2-sized model peaks at a few GiB of RSS), GPU memory for its model.
CORES_PER_TRIAL = 4
HOST_GIB_PER_TRIAL = 8
# A compiled trial holds up to a few times the eager model's peak (CUDA-graph pools,
# autotuning's scratch buffers): room for this many eager peaks per trial, and never less
# than GPU_GIB_PER_TRIAL.
EAGER_PEAKS_PER_TRIAL = 4
GPU_GIB_PER_TRIAL = 8
# Trials in flight per compile slot, and at most, on one GPU (alive_trials).
ALIVE_PER_COMPILE = 2
MAX_ALIVE = 8

_GIB = 1 << 30


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def auto_workers(
    cores: int | None, host_bytes: int | None, gpu_bytes: int | None, eager_peak: int | None
) -> tuple[int, str]:
    """The number of trials in flight on one GPU and why, from what the host and GPU hold."""
    limits = {"default": MAX_AUTO}
    if cores:
        limits[f"{cores} cores / {CORES_PER_TRIAL}"] = cores // CORES_PER_TRIAL
    if host_bytes:
        limits[f"{host_bytes / _GIB:.0f} GiB host / {HOST_GIB_PER_TRIAL}"] = host_bytes // (
            HOST_GIB_PER_TRIAL * _GIB
        )
    if gpu_bytes:
        per = max(GPU_GIB_PER_TRIAL * _GIB, EAGER_PEAKS_PER_TRIAL * (eager_peak or 0))
        limits[f"{gpu_bytes / _GIB:.0f} GiB GPU / {per / _GIB:.1f}"] = gpu_bytes // per
    which = min(limits, key=lambda k: limits[k])
    n = max(1, int(limits[which]))
    return n, f"{n} at once ({which} is the tightest limit)"


def alive_trials(
    compiles: int, host_bytes: int | None, gpu_bytes: int | None, eager_peak: int | None
) -> int:
    """Trials kept in flight on one GPU when ``compiles`` may compile at once: twice as many,
    at most MAX_ALIVE and what the host's and the GPU's memory hold. A trial waiting for its
    timed turn compiles nothing; with no other trial to start, a long compile (max-autotune:
    83-96 s for GPT-2 small on an H200) left the host's other compile slots idle."""
    limits = [ALIVE_PER_COMPILE * compiles, MAX_ALIVE]
    if host_bytes:
        limits.append(host_bytes // (HOST_GIB_PER_TRIAL * _GIB))
    if gpu_bytes:
        per = max(GPU_GIB_PER_TRIAL * _GIB, EAGER_PEAKS_PER_TRIAL * (eager_peak or 0))
        limits.append(gpu_bytes // per)
    return max(compiles, int(min(limits)))


def search_slots(
    device: str, gpus: list[int], eager: dict[str, Any], requested: int | None = None
) -> tuple[list[int | None], str, int | None]:
    """Slots for the search's trials (executors.stream): a GPU index per slot, None unpinned;
    why; and how many of them may compile at once (None: no limit beyond the slots).
    ``gpus`` are the visible GPUs, ``eager`` the eager trial's result (its environment and peak
    memory size the default), ``requested`` the user's count (``--compile-workers``, else
    KILN_COMPILE_WORKERS): that many in flight, each free to compile."""
    if len(gpus) > 1:
        return list(gpus), f"{len(gpus)} at once, one per visible GPU", None
    if not device.startswith("cuda"):
        why = "1 at once: on the CPU the compiler and the timed steps share the cores"
        return [None], why, None
    if requested is None and os.environ.get(COMPILE_WORKERS_ENV):
        requested = parse_workers(os.environ[COMPILE_WORKERS_ENV], COMPILE_WORKERS_ENV)
    if requested is not None:
        return [None] * requested, f"{requested} at once (asked for)", None
    gpu = (eager.get("environment") or {}).get("gpu") or {}
    memory = eager.get("memory") or {}
    host, gpu_bytes = _host_memory_bytes(), gpu.get("memory_bytes")
    peak = memory.get("peak_reserved_bytes")
    n, why = auto_workers(os.cpu_count(), host, gpu_bytes, peak)
    alive = alive_trials(n, host, gpu_bytes, peak)
    if alive > n:
        why = f"{alive} at once, {n} compiling at most ({why.split('(', 1)[1]}"
    return [None] * alive, why, n


def parse_workers(text: str, what: str = "--compile-workers") -> int:
    """A count of trials in flight: a positive integer."""
    from torchkiln.errors import KilnUserError

    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise KilnUserError(f"{what}={text!r}: expected a positive whole number of trials")
    return n
