"""Compiler counters read before and after a replay: compiles, recompiles, graph breaks, CUDA-graph
recordings. Each counter is read only where this torch has it; an absent one is reported as None."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _dynamo_counters() -> Mapping[str, Mapping[str, int]] | None:
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # a torch without dynamo's counters: nothing to read
        return None
    return counters


_RECORDINGS = [0, False]  # recordings seen, whether the count is hooked on this torch


def watch_cudagraph_recordings() -> None:
    """Count CUDA-graph tree recordings from now on (once per process); where this torch has no
    ``CUDAGraphNode`` the count stays None."""
    if _RECORDINGS[1]:
        return
    try:
        from torch._inductor import cudagraph_trees
    except ImportError:  # a torch without inductor's CUDA-graph trees
        return
    node = getattr(cudagraph_trees, "CUDAGraphNode", None)
    if node is None:
        return
    init = node.__init__

    def counting_init(self: Any, *args: Any, **kwargs: Any) -> None:
        _RECORDINGS[0] += 1
        init(self, *args, **kwargs)

    node.__init__ = counting_init
    _RECORDINGS[1] = True


def snapshot() -> dict[str, Any]:
    """Totals so far: frames compiled (``stats.unique_graphs``), recompiles (frames compiled
    beyond the first per code object), graph breaks, CUDA-graph recordings."""
    c = _dynamo_counters()
    if c is None:
        return {
            "compiles": None,
            "graph_breaks": None,
            "cudagraph_recordings": None,
            "eager_fallbacks": None,
            "compile_time_s": None,
        }
    stats = c.get("stats", {})
    frames = c.get("frames", {})
    return {
        "compiles": int(stats.get("unique_graphs", 0)),
        "graph_breaks": int(sum(c.get("graph_break", {}).values())),
        # inductor has no counter of recordings (cudagraph_recorded_non_static_inputs counts
        # inputs): CUDAGraphNode records once per node, and each node is counted where it is made
        "cudagraph_recordings": _RECORDINGS[0] if _RECORDINGS[1] else None,
        # frames dynamo tried and did not compile (recompile limit hit, unsupported code)
        # run eagerly
        "eager_fallbacks": int(frames.get("total", 0)) - int(frames.get("ok", 0)),
        "compile_time_s": _compile_seconds(),
    }


def _compile_seconds() -> float | None:
    try:
        from torch._dynamo.utils import compilation_time_metrics
    except ImportError:  # older or newer torch without the per-phase timings
        return None
    return float(sum(compilation_time_metrics.get("_compile.compile_inner", [])))


def delta(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in after.items():
        b = before.get(k)
        out[k] = None if v is None or b is None else v - b
    return out
