"""Numbers from a torch.profiler Chrome trace: step wall time, GPU busy time and idle time split
by cause, kernel sizes, launch overhead, top kernels and host operators, time waiting for data.

Pure functions over the parsed event list (``torchkiln.measure.kernels.load_trace_events``); no
torch import, so the verdict built on them is unit-tested on committed trace fixtures.

The trace format is the profiler's own export (Kineto): complete events (``ph: "X"``, ``ts`` and
``dur`` in microseconds) with ``cat`` "kernel" / "gpu_memcpy" / "gpu_memset" on the device,
"cuda_runtime" / "cuda_driver" for the host-side API calls (linked to what they launch by
``args.correlation``), "cpu_op" for aten operators and "user_annotation" for
``record_function`` ranges, ``ProfilerStep#N`` among them.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
STEP_PREFIX = "ProfilerStep#"
DATA_WAIT = "kiln:data_wait"  # the worker's record_function around fetching the next batch
# Kernels this short are dominated by their fixed costs: a launch through the CUDA runtime
# costs the host ~2-5 us, and back-to-back dependent kernels leave ~1-2 us gaps on H100-class
# GPUs; at 10 us the fixed part is a third or more of the kernel's own time.
SMALL_KERNEL_US = 10.0
TOP = 10
NAME_CHARS = 160

SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",  # the synchronous copy: the host waits for the device
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
    }
)
GRAPH_LAUNCHES = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})

# Kernel classes, from the names the vendor libraries and Inductor give their kernels. Matrix
# units run GEMMs, convolutions and attention ("math"); elementwise, reductions, norms, copies
# and layout changes move bytes ("memory"). Math is tested first: "triton_tem_fused_mm" and
# "sm90_xmma_fprop_implicit_gemm" would otherwise match memory words in their epilogues.
_MATH = re.compile(
    r"gemm|gemv|matmul|\bmm\b|bmm|addmm|cutlass|cublas|nvjet|xmma|wgmma|hmma|"
    r"conv(?!ert)|convolve|fprop|dgrad|wgrad|flash|fmha|attention|sdpa|triton_tem|"
    r"scaled_mm|splitk",
    re.IGNORECASE,
)
_MEMORY = re.compile(
    r"elementwise|vectorized|unrolled|reduce|reduction|triton_poi|triton_red|triton_per|"
    r"copy|memcpy|memset|fill|cat|index|gather|scatter|softmax|norm|bn_|pool|nchw|nhwc|"
    r"transpose|permute|embedding|dropout|distribution|sort|cumsum|upsample|pad|where|masked",
    re.IGNORECASE,
)


def kernel_class(name: str) -> str:
    """``math``, ``memory`` or ``other`` for a device activity's name."""
    if _MATH.search(name):
        return "math"
    if _MEMORY.search(name):
        return "memory"
    return "other"


def _short(name: str) -> str:
    return name if len(name) <= NAME_CHARS else name[: NAME_CHARS - 1] + "\u2026"


def _span(e: dict[str, Any]) -> tuple[float, float]:
    ts = float(e["ts"])
    return ts, ts + float(e.get("dur", 0.0))


def _merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for lo, hi in sorted(intervals):
        if hi <= lo:
            continue
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


def _length(merged: list[tuple[float, float]]) -> float:
    return sum(hi - lo for lo, hi in merged)


def _overlap(merged: list[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in merged if b > lo and a < hi)


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _corr(e: dict[str, Any]) -> Any:
    return (e.get("args") or {}).get("correlation")


def step_window(xs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float, float, str]:
    """The profiled steps and the window they cover: first step start to the later of the
    last step's end and the last device activity (queued kernels run past the host)."""
    steps = sorted(
        (
            e
            for e in xs
            if e.get("cat") in ("user_annotation", "cpu_op")
            and str(e.get("name", "")).startswith(STEP_PREFIX)
        ),
        key=lambda e: float(e["ts"]),
    )
    if steps:
        start = float(steps[0]["ts"])
        end = max(_span(e)[1] for e in steps)
        source = "ProfilerStep annotations"
    else:
        spans = [_span(e) for e in xs if e.get("cat") not in (None, "Trace")]
        if not spans:
            raise ValueError("the trace holds no complete events to analyse")
        start, end = min(s for s, _ in spans), max(t for _, t in spans)
        source = "whole trace (no ProfilerStep annotations)"
    device_ends = [
        _span(e)[1] for e in xs if e.get("cat") in DEVICE_CATS and float(e["ts"]) >= start
    ]
    return steps, start, max([end, *device_ends]), source


def _host_ops(
    xs: list[dict[str, Any]], start: float, end: float, main_tid: Any, n: int, wall: float
) -> dict[str, Any]:
    """Top aten operators by self time (time not spent in a nested operator), and the share of
    the step the main thread spends inside any operator (the rest is Python and framework)."""
    by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in xs:
        if e.get("cat") == "cpu_op" and start <= float(e["ts"]) < end:
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    self_us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    main_top: list[tuple[float, float]] = []
    for (_, tid), evs in by_thread.items():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
        stack: list[tuple[float, str]] = []  # (end, name) of the enclosing operators
        for e in evs:
            lo, hi = _span(e)
            while stack and stack[-1][0] <= lo:
                stack.pop()
            name = str(e.get("name", "?"))
            if stack:
                self_us[stack[-1][1]] -= hi - lo
            elif tid == main_tid:
                main_top.append((lo, hi))
            self_us[name] += hi - lo
            calls[name] += 1
            stack.append((hi, name))
    ranked = sorted(self_us.items(), key=lambda kv: -kv[1])[:TOP]
    return {
        "in_ops_share": _share(_length(_merge(main_top)), wall),
        "op_calls_per_step": sum(calls.values()) / n,
        "top_ops": [
            {
                "name": name,
                "self_ms_per_step": us / n / 1e3,
                "share_of_step": _share(us, wall),
                "calls_per_step": calls[name] / n,
            }
            for name, us in ranked
        ],
    }


def _idle_split(
    device: list[dict[str, Any]],
    launches: dict[Any, dict[str, Any]],
    data_wait: list[tuple[float, float]],
    start: float,
    end: float,
) -> dict[str, float]:
    """Split the GPU's idle time (no activity on any stream) by what it was waiting for.

    For each idle gap, the activity that ends it was enqueued by a host API call: the part of
    the gap before that call returned is the GPU waiting on the host (data loading where the
    host was inside ``kiln:data_wait``, else dispatch, Python, synchronisation); the rest is the
    device's own gap between kernels that were already queued. The idle tail after the last
    activity is the host's. A gap whose activity has no launch in the trace is unattributed."""
    blocks: list[list[Any]] = []  # [lo, hi, first activity of the block]
    for e in sorted(device, key=lambda e: float(e["ts"])):
        lo, hi = _span(e)
        lo, hi = max(lo, start), min(hi, end)
        if blocks and lo <= blocks[-1][1]:
            blocks[-1][1] = max(blocks[-1][1], hi)
        else:
            blocks.append([lo, hi, e])
    split = {"data_wait": 0.0, "host": 0.0, "between_kernels": 0.0, "unattributed": 0.0}

    def host_wait(lo: float, hi: float) -> None:
        data = _overlap(data_wait, lo, hi)
        split["data_wait"] += data
        split["host"] += hi - lo - data

    prev = start
    for lo, hi, first in blocks:
        if lo > prev:
            launch = launches.get(_corr(first))
            if launch is None:
                split["unattributed"] += lo - prev
            else:
                enqueued = min(max(_span(launch)[1], prev), lo)
                host_wait(prev, enqueued)
                split["between_kernels"] += lo - enqueued
        prev = max(prev, hi)
    if end > prev:
        host_wait(prev, end)
    return split


def _device_metrics(
    xs: list[dict[str, Any]],
    start: float,
    end: float,
    n: int,
    wall: float,
    data_wait: list[tuple[float, float]],
) -> dict[str, Any] | None:
    device = [e for e in xs if e.get("cat") in DEVICE_CATS and _span(e)[1] > start]
    device = [e for e in device if float(e["ts"]) < end]
    if not device:
        return None
    apis = [e for e in xs if e.get("cat") in API_CATS]
    launches = {_corr(e): e for e in apis if _corr(e) is not None}
    busy = _length(_merge((max(a, start), min(b, end)) for a, b in map(_span, device)))
    idle = _idle_split(device, launches, data_wait, start, end)

    kernels = [e for e in device if e.get("cat") == "kernel"]
    durs = [float(e.get("dur", 0.0)) for e in kernels]
    kernel_us = sum(durs)
    small = [d for d in durs if d < SMALL_KERNEL_US]
    by_class: dict[str, float] = defaultdict(float)
    per_name: dict[str, list[float]] = defaultdict(list)
    for e in device:
        name = str(e.get("name", "?"))
        by_class[kernel_class(name) if e.get("cat") == "kernel" else "memory"] += float(
            e.get("dur", 0.0)
        )
        per_name[name].append(float(e.get("dur", 0.0)))
    device_us = sum(by_class.values())

    graph_corrs = {c for c, e in launches.items() if e.get("name") in GRAPH_LAUNCHES}
    launch_calls = [
        e
        for e in apis
        if start <= float(e["ts"]) < end
        and ("LaunchKernel" in str(e.get("name")) or "LaunchCooperative" in str(e.get("name")))
    ]
    graph_calls = [
        e for e in apis if start <= float(e["ts"]) < end and e.get("name") in GRAPH_LAUNCHES
    ]
    direct = [(e, launches[_corr(e)]) for e in kernels if _corr(e) in launches]
    direct = [(k, la) for k, la in direct if _corr(k) not in graph_corrs]
    graph_kernels = sum(1 for e in kernels if _corr(e) in graph_corrs)
    launch_us = sum(float(e.get("dur", 0.0)) for e in launch_calls)
    direct_kernel_us = sum(float(k.get("dur", 0.0)) for k, _ in direct)
    memcpy_us = sum(float(e.get("dur", 0.0)) for e in device if e.get("cat") == "gpu_memcpy")
    ranked = sorted(per_name.items(), key=lambda kv: -sum(kv[1]))[:TOP]
    return {
        "busy_ms_per_step": busy / n / 1e3,
        "busy_share": _share(busy, wall),
        "idle_share": _share(wall - busy, wall),
        "idle": {k: _share(v, wall) for k, v in idle.items()},
        "kernels_per_step": len(kernels) / n,
        "kernel_ms_per_step": kernel_us / n / 1e3,
        "mean_kernel_us": statistics.fmean(durs) if durs else None,
        "median_kernel_us": statistics.median(durs) if durs else None,
        "small_kernels": {
            "threshold_us": SMALL_KERNEL_US,
            "count_share": _share(len(small), len(durs)),
            "time_share": _share(sum(small), kernel_us),
        },
        "launch": {
            "calls_per_step": len(launch_calls) / n,
            "mean_api_us": statistics.fmean(float(e.get("dur", 0.0)) for e in launch_calls)
            if launch_calls
            else None,
            # Host time spent in launch calls per unit of kernel time they launched: near or
            # above 1 the host cannot launch work as fast as the GPU finishes it.
            "api_to_kernel_time": _share(launch_us, direct_kernel_us),
            "mean_queue_us": statistics.fmean(float(k["ts"]) - float(la["ts"]) for k, la in direct)
            if direct
            else None,
            "graph_launches_per_step": len(graph_calls) / n,
            "graph_kernels_per_step": graph_kernels / n,
            # Graph replays whose kernels never reached the trace leave the GPU looking idle.
            "graph_kernels_missing": bool(graph_calls) and graph_kernels == 0,
        },
        "memcpy_ms_per_step": memcpy_us / n / 1e3,
        "kernel_mix": {c: _share(by_class.get(c, 0.0), device_us) for c in CLASSES},
        "top_kernels": [
            {
                "name": _short(name),
                "class": kernel_class(name),
                "ms_per_step": sum(ds) / n / 1e3,
                "share_of_device_time": _share(sum(ds), device_us),
                "calls_per_step": len(ds) / n,
                "mean_us": statistics.fmean(ds),
            }
            for name, ds in ranked
        ],
    }


CLASSES = ("math", "memory", "other")
GPU_ONLY = (
    "gpu.busy_share",
    "gpu.idle (host wait / gaps between kernels)",
    "gpu.kernels_per_step",
    "gpu.small_kernels",
    "gpu.launch (launch overhead against kernel time)",
    "gpu.kernel_mix (compute- or memory-bound)",
    "gpu.top_kernels",
)


def analyze(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Metrics of the profiled steps; ``gpu`` is None when the trace holds no device activity
    (a CPU run), and ``unavailable`` then names the figures only a GPU timeline gives."""
    xs = [e for e in events if e.get("ph") == "X" and "ts" in e]
    steps, start, end, source = step_window(xs)
    n = max(1, len(steps))
    wall = end - start
    main_tid = steps[0].get("tid") if steps else None
    data_wait = _merge(
        (max(a, start), min(b, end))
        for a, b in (_span(e) for e in xs if e.get("name") == DATA_WAIT)
    )
    sync = _merge(
        (max(a, start), min(b, end))
        for a, b in (
            _span(e) for e in xs if e.get("cat") in API_CATS and e.get("name") in SYNC_CALLS
        )
    )
    gpu = _device_metrics(xs, start, end, n, wall, data_wait)
    return {
        "steps": n,
        "step_source": source,
        "wall_ms_per_step": wall / n / 1e3,
        "host_step_ms": [round(float(e.get("dur", 0.0)) / 1e3, 4) for e in steps],
        "data_wait": {
            "ms_per_step": _length(data_wait) / n / 1e3,
            "share": _share(_length(data_wait), wall),
        },
        "host": {
            "sync_share": _share(_length(sync), wall),
            **_host_ops(xs, start, end, main_tid, n, wall),
        },
        "gpu": gpu,
        "unavailable": [] if gpu is not None else list(GPU_ONLY),
    }
