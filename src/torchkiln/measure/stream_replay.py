"""Replay a stream in order through a compiled candidate and through eager, paired per item.

Item i runs eagerly, then through the candidate, so both see the same host and device state; the
candidate's first call of each new shape includes its compile, which is the point of a stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from torchkiln.errors import KilnUserError
from torchkiln.measure import compile_watch
from torchkiln.workloads.stream import Stream


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn: Callable[..., Any], x: Any, device: str) -> tuple[Any, float]:
    _sync(device)
    t0 = time.perf_counter()
    out = fn(**x) if isinstance(x, dict) else fn(*x)
    _sync(device)
    return out, time.perf_counter() - t0


def _values(x: Any) -> Any:
    return x.values() if isinstance(x, dict) else x


def _shape(x: Any) -> tuple[tuple[int, ...], ...]:
    """An item's input shapes: what decides whether a compiled candidate has met it before."""
    return tuple(tuple(a.shape) for a in _values(x) if isinstance(a, torch.Tensor))


def _to(x: Any, device: str) -> Any:
    if isinstance(x, dict):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in x.items()}
    return tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in x)


def replay(
    candidate: Callable[..., Any],
    eager: Callable[..., Any],
    stream: Stream,
    *,
    warmup_fraction: float = 0.2,
    device: str = "cpu",
    check: Callable[[Any, Any], bool] | None = None,
    prime: Callable[..., Any] | None = None,
    on_item: Callable[[int, int], None] | None = None,
    on_steady: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Per-item times of ``candidate`` and ``eager`` over ``stream`` and the compiler's counters
    during the replay. ``check(candidate_out, eager_out)`` marks an item mismatched when False.
    ``prime`` is eager's untimed first call on item 0 (default ``eager`` itself; a training
    replay primes without an optimizer step, so eager's weights stay paired with the candidate's).
    ``on_item(done, total)`` is told after each item (a trial's progress file);
    ``on_steady()`` before the first steady item (a trial in flight with others takes the host
    alone from there: stream_progress.py).
    """
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"warmup_fraction={warmup_fraction} must be in [0, 1)")
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    # eager's first call pays one-off setup (allocator, kernel loading) that is no part of its
    # steady cost: it is paid here, untimed, so item 0 pairs like every other item
    first = _to(stream.items[0], device)
    try:
        with torch.no_grad():
            _timed(prime or eager, first, device)
    except (RuntimeError, ValueError, TypeError, IndexError) as exc:
        raise KilnUserError(f"{stream.where(0)}: the input does not fit the model ({exc})") from exc
    compile_watch.watch_cudagraph_recordings()
    before = compile_watch.snapshot()
    t_c: list[float] = []
    t_e: list[float] = []
    mismatched: list[int] = []
    k = int(len(stream) * warmup_fraction)
    # per item: was its shape new to the replay? A steady mean far above the median is often new
    # shapes paying what dynamo does not count (kernels specialised per size, autotuning,
    # CUDA-graph recordings): their seconds are reported apart from the seen shapes'
    seen: set[tuple[tuple[int, ...], ...]] = set()
    first_seen: list[bool] = []
    steady_before = before
    for i, x in enumerate(stream):
        shape = _shape(x)
        first_seen.append(shape not in seen)
        seen.add(shape)
        if i == k:
            if on_steady is not None:
                on_steady()
            steady_before = compile_watch.snapshot()
        x = _to(x, device)
        try:
            with torch.no_grad():
                ref, te = _timed(eager, x, device)
        except (RuntimeError, ValueError, TypeError, IndexError) as exc:
            raise KilnUserError(
                f"{stream.where(i)}: the input does not fit the model ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''})"
            ) from exc
        with torch.no_grad():
            out, tc = _timed(candidate, x, device)
        t_e.append(te)
        t_c.append(tc)
        if i == 0:
            first_item = compile_watch.delta(before, compile_watch.snapshot())
        if check is not None and not check(out, ref):
            mismatched.append(i)
        if on_item is not None:
            on_item(i + 1, len(stream))
    after = compile_watch.snapshot()
    counts = compile_watch.delta(before, after)
    steady = compile_watch.delta(steady_before, after)
    c, e = np.asarray(t_c), np.asarray(t_e)
    ratios = e[k:] / c[k:]
    new = np.asarray(first_seen[k:], dtype=bool)
    return {
        "items": len(stream),
        "distinct_shapes": len(seen),
        "warmup_items": k,
        "time_per_item_s": float(c.mean()),
        "steady_time_per_item_s": float(c[k:].mean()),
        "p50_s": float(np.percentile(c[k:], 50)),
        "p99_s": float(np.percentile(c[k:], 99)),
        "eager_time_per_item_s": float(e.mean()),
        "eager_steady_time_per_item_s": float(e[k:].mean()),
        "speedup": float(e.sum() / c.sum()),
        "steady_speedup": float(e[k:].sum() / c[k:].sum()),
        "steady_speedup_median_paired": float(np.median(ratios)),
        # each steady item's seconds, the candidate's and eager's: what a comparison of two
        # candidates on the same stream resamples (tune.stream_ties)
        "steady_item_s": [round(float(x), 7) for x in c[k:]],
        "eager_steady_item_s": [round(float(x), 7) for x in e[k:]],
        "steady_first_seen_items": int(new.sum()),
        "steady_first_seen_s": float(c[k:][new].sum()),
        "steady_seen_items": int((~new).sum()),
        "steady_seen_s": float(c[k:][~new].sum()),
        # eager on the same two parts: new shapes are often the stream's rarer, larger sizes, so
        # their seconds are read against eager's on them (diagnose.stream_cost)
        "steady_first_seen_eager_s": float(e[k:][new].sum()),
        "steady_seen_eager_s": float(e[k:][~new].sum()),
        "steady_compiles": steady["compiles"],
        "steady_compile_time_s": steady["compile_time_s"],
        "steady_cudagraph_recordings": steady["cudagraph_recordings"],
        "compile_time_s": counts["compile_time_s"],
        "eager_fallbacks": counts["eager_fallbacks"],
        "compiles": counts["compiles"],
        "recompiles": None if counts["compiles"] is None else max(0, counts["compiles"] - 1),
        # the graphs one item runs through: what the first item compiled (more than one when
        # the model has graph breaks), each recorded once per shape under CUDA graphs
        "graphs_per_item": first_item["compiles"],
        "graph_breaks": counts["graph_breaks"],
        "cudagraph_recordings": counts["cudagraph_recordings"],
        "peak_memory_bytes": int(torch.cuda.max_memory_allocated())
        if device.startswith("cuda")
        else None,
        "mismatched_items": mismatched,
    }
