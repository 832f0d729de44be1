"""What dominates a stream's time: compilation, or CUDA graphs recorded again and again.

A stream trial (docs/streams.md) reports its seconds over the whole stream (``total_s``), the
seconds dynamo spent compiling (``compile_time_s``, a bucketed candidate's warm-up compiles in
``warmup_compile_time_s``) and the CUDA-graph recordings. Two verdicts read them:

- compilation dominates when compiling took more than ``COMPILE_DOMINATES`` of the stream's time:
  the stream is too short (or has too many shapes) for the compiled code to pay back its compile;
- CUDA graphs were re-recorded when there are more recordings than the graphs the stream needed:
  one per distinct shape (per bucket for a bucketed candidate) for each graph an item runs
  through (``graphs_per_item``, more than one when the model has graph breaks).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

COMPILE_DOMINATES = 0.5  # compile seconds over the stream's seconds above which compiling dominates


def compile_share(m: Mapping[str, Any]) -> float | None:
    """Compile seconds (the stream's and a bucketed warm-up's) over the stream's total seconds;
    None where this torch does not time compiles or the total is unknown."""
    compile_s, total = m.get("compile_time_s"), m.get("total_s")
    if compile_s is None or not total:
        return None
    return min(1.0, (compile_s + (m.get("warmup_compile_time_s") or 0.0)) / total)


def needed_recordings(m: Mapping[str, Any]) -> int | None:
    """The CUDA-graph recordings the stream needs at least: its distinct shapes (or buckets, for a
    bucketed candidate) times the graphs an item runs through."""
    buckets = m.get("buckets")
    if buckets:
        shapes = math.prod(len(b) for b in buckets.values())
    else:
        shapes = m.get("distinct_shapes")
    if not shapes:
        return None
    return shapes * max(1, int(m.get("graphs_per_item") or 1))


def stream_verdicts(m: Mapping[str, Any]) -> list[str]:
    """One sentence per cost that dominates the stream trial ``m``, none when nothing does."""
    out = []
    share = compile_share(m)
    if share is not None and share > COMPILE_DOMINATES:
        out.append(
            f"compilation dominates this stream: {share:.0%} of its time "
            f"({m['compile_time_s'] + (m.get('warmup_compile_time_s') or 0.0):.2f} s of "
            f"{m['total_s']:.2f} s)"
        )
    recorded, needed = m.get("cudagraph_recordings"), needed_recordings(m)
    if recorded is not None and needed is not None and recorded > needed:
        what = "buckets" if m.get("buckets") else "shapes"
        graphs = int(m.get("graphs_per_item") or 1)
        per = f" x {graphs} graphs an item" if graphs > 1 else ""
        extra = recorded - needed
        out.append(
            f"CUDA graphs re-recorded {extra} time{'s' if extra != 1 else ''}: "
            f"{recorded} recordings for {needed // graphs} {what}{per}"
        )
    return out
