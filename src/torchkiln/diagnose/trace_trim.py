"""Trim a profiler trace into a small fixture that analyses like the original: the first K
profiled steps, all the device activity those steps launched, the API calls that launched it,
top-level operators and kiln's annotations; args other than the correlation id dropped.

A full eager resnet50 trace is megabytes per step (410 kernels, each with its launch, flow
arrows and a tree of aten ops); two trimmed steps are a few hundred KB and give the same
verdict, which `benchmarks/capture_profile_fixtures.py` checks and records.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torchkiln.diagnose.trace_metrics import API_CATS, DEVICE_CATS, STEP_PREFIX, SYNC_CALLS

NAME_CHARS = 100


def _top_level(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Operators not nested in another operator on the same thread."""
    by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in ops:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    keep = []
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
        open_until = float("-inf")
        for e in evs:
            if float(e["ts"]) >= open_until:
                keep.append(e)
                open_until = float(e["ts"]) + float(e.get("dur", 0.0))
    return keep


def trim_events(
    events: list[dict[str, Any]],
    *,
    steps: int = 2,
    nested_ops: bool = False,
    name_chars: int = NAME_CHARS,
) -> list[dict[str, Any]]:
    """The first ``steps`` ProfilerStep windows of ``events``, rebased to start near 0."""
    xs = [e for e in events if e.get("ph") == "X" and "ts" in e]
    all_steps = sorted(
        (
            e
            for e in xs
            if e.get("cat") in ("user_annotation", "cpu_op")
            and str(e.get("name", "")).startswith(STEP_PREFIX)
        ),
        key=lambda e: float(e["ts"]),
    )
    if not all_steps:
        raise ValueError("the trace has no ProfilerStep annotations to trim by")
    kept_steps = all_steps[:steps]
    lo = float(kept_steps[0]["ts"])
    hi = max(float(e["ts"]) + float(e.get("dur", 0.0)) for e in kept_steps)

    def corr(e: dict[str, Any]) -> Any:
        return (e.get("args") or {}).get("correlation")

    def inside(e: dict[str, Any]) -> bool:
        return lo <= float(e["ts"]) < hi

    apis = [e for e in xs if e.get("cat") in API_CATS and inside(e)]
    launched = {corr(e) for e in apis if corr(e) is not None}
    # Device work belongs to the steps that launched it, however late it ran.
    device = [
        e
        for e in xs
        if e.get("cat") in DEVICE_CATS
        and (corr(e) in launched if corr(e) is not None else inside(e))
    ]
    device_corrs = {corr(e) for e in device}
    apis = [e for e in apis if corr(e) in device_corrs or e.get("name") in SYNC_CALLS]
    ops = [e for e in xs if e.get("cat") == "cpu_op" and inside(e)]
    if not nested_ops:
        ops = _top_level(ops)
    notes = [
        e
        for e in xs
        if e.get("cat") == "user_annotation"
        and inside(e)
        and str(e.get("name", "")).startswith((STEP_PREFIX, "kiln:"))
    ]
    base = lo - 1.0
    out = []
    for e in sorted([*notes, *ops, *apis, *device], key=lambda e: float(e["ts"])):
        name = str(e.get("name", ""))
        slim: dict[str, Any] = {
            "ph": "X",
            "cat": e.get("cat"),
            "name": name if len(name) <= name_chars else name[:name_chars],
            "pid": e.get("pid"),
            "tid": e.get("tid"),
            "ts": round(float(e["ts"]) - base, 3),
            "dur": round(float(e.get("dur", 0.0)), 3),
        }
        if corr(e) is not None:
            slim["args"] = {"correlation": corr(e)}
        out.append(slim)
    return out
