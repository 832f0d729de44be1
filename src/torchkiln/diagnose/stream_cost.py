"""What dominates a stream's time: compilation, CUDA graphs recorded again and again, or shapes
met for the first time after warm-up.

A stream trial (docs/streams.md) reports its seconds over the whole stream (``total_s``), the
seconds dynamo spent compiling (``compile_time_s``, a bucketed candidate's warm-up compiles in
``warmup_compile_time_s``) and the CUDA-graph recordings. Two verdicts read them:

- compilation dominates when compiling took more than ``COMPILE_DOMINATES`` of the stream's time:
  the stream is too short (or has too many shapes) for the compiled code to pay back its compile;
- CUDA graphs were re-recorded when there are more recordings than the graphs the stream needed:
  one per distinct shape (per bucket for a bucketed candidate) for each graph an item runs
  through (``graphs_per_item``, more than one when the model has graph breaks);
- unseen shapes dominate the steady state when the items after warm-up whose shapes the replay
  had not met (``steady_first_seen_items``) cost more than ``NEW_SHAPES_DOMINATE`` of the steady
  seconds beyond what the seen shapes' pace predicts. The pace is read against eager on the same
  items: a log-normal stream's new shapes are mostly its rare long ones, slower for eager too
  (`kiln bench bert-base --stream-len 20` on a 2-core CPU: eager's own 15 new-shape items took
  96% of its steady seconds, 232.6 ms each against 138.2 ms for seen shapes, and the candidate's
  seconds alone blamed kernels specialised per size).
  Dynamo may count nothing for them: under dynamic shapes a compiled kernel is specialised again
  for sizes of new alignment and autotuned again, outside its counters. On an H200 (bert-base
  inference, bf16, 2,000 items, `stream/h200/bert-base-infer-plain`), plain `torch.compile`
  spent 6.39 s on 124 such items (52 ms each) and 8.12 s on the 1,476 others (5.5 ms each),
  with no compile counted after warm-up; padding to buckets bounds the shapes. A trial recorded
  without eager's split is read by the candidate's seconds alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

COMPILE_DOMINATES = 0.5  # compile seconds over the stream's seconds above which compiling dominates
# the unseen shapes' share of the steady seconds above which they dominate it: in the H200
# bert-base stream above they were 8% of the steady items, so a quarter of the seconds means an
# unseen shape costs several seen ones (there: 44%, nine times)
NEW_SHAPES_DOMINATE = 0.25


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


def repaid_after(m: Mapping[str, Any], eager_item_s: float | None = None) -> int | None:
    """Items after which trial ``m``'s one-off seconds (compiles and warm-up: its whole-stream
    seconds beyond what its items take at its steady rate) are repaid by its steady gain over
    eager (``eager_item_s``, default its own paired eager's steady seconds an item); None when
    it gains nothing after warm-up, or the trial lacks the figures."""
    steady, total, items = (m.get(k) for k in ("steady_time_per_item_s", "total_s", "items"))
    eager = eager_item_s if eager_item_s is not None else m.get("eager_steady_time_per_item_s")
    if steady is None or total is None or not items or eager is None or eager <= steady:
        return None
    return math.ceil(max(0.0, total - steady * items) / (eager - steady))


def stream_verdicts(m: Mapping[str, Any], eager_item_s: float | None = None) -> list[str]:
    """One sentence per cost that dominates the stream trial ``m``, none when nothing does; a
    dominating compile is repaid against ``eager_item_s`` (default the trial's own eager: a tune
    passes the eager its selection reads, so that both name one figure)."""
    out = []
    share = compile_share(m)
    if share is not None and share > COMPILE_DOMINATES:
        # a server pays it once per process: whether it is repaid, and when, is the question
        n = repaid_after(m, eager_item_s)
        if n is not None:
            then = f": a one-off cost, repaid against eager after {n} items"
        elif m.get("steady_time_per_item_s") is not None:
            then = ": never repaid, as it is no faster than eager after warm-up"
        else:
            then = ""
        out.append(
            f"compilation dominates this stream: {share:.0%} of its time "
            f"({m['compile_time_s'] + (m.get('warmup_compile_time_s') or 0.0):.2f} s of "
            f"{m['total_s']:.2f} s){then}"
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
    unseen = unseen_shapes_verdict(m)
    if unseen:
        out.append(unseen)
    return out


def unseen_shapes_verdict(m: Mapping[str, Any]) -> str | None:
    """A sentence when the steady items of shapes new to the replay cost more than
    NEW_SHAPES_DOMINATE of the steady seconds beyond the seen shapes' pace against eager (or, for
    a trial without eager's split, take more than that share), with what they cost an item
    against the shapes seen before; None otherwise, or where the trial did not split them."""
    new_n, new_s = m.get("steady_first_seen_items"), m.get("steady_first_seen_s")
    seen_n, seen_s = m.get("steady_seen_items"), m.get("steady_seen_s")
    if not new_n or new_s is None or seen_s is None:
        return None
    steady_s = new_s + seen_s
    if not steady_s:
        return None
    pace = None
    new_e, seen_e = m.get("steady_first_seen_eager_s"), m.get("steady_seen_eager_s")
    if new_e is not None and seen_e is not None:
        if not seen_n or not seen_e or not new_e:
            return None  # no seen shape to set a pace by
        pace = seen_s / seen_e
        beyond = new_s - pace * new_e
        if beyond / steady_s <= NEW_SHAPES_DOMINATE:
            return None
    elif new_s / steady_s <= NEW_SHAPES_DOMINATE:
        return None
    each = f"{new_s / new_n * 1e3:.1f} ms an item"
    if seen_n:
        each += f" against {seen_s / seen_n * 1e3:.1f} ms for shapes seen before"
    if pace is not None:
        each += (
            f"; {new_s / new_e:.2f}x eager's seconds on the same items against {pace:.2f}x on "
            f"seen shapes, {new_s - pace * new_e:.2f} s beyond that pace"
        )
    compiles = m.get("steady_compiles")
    if compiles:
        why = f"{compiles} compile{'s' if compiles != 1 else ''} after warm-up"
    elif compiles == 0:
        why = "nothing compiled after warm-up: kernels specialised or autotuned per size"
    else:
        why = "compiles not counted here"
    return (
        f"unseen shapes dominate the steady state: {new_n} item{'s' if new_n != 1 else ''} of "
        f"shapes new after warm-up took {new_s:.2f} s, {new_s / steady_s:.0%} of the steady "
        f"seconds ({each}; {why})"
    )
