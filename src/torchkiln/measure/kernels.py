"""Device kernels launched per step, counted from the profiler's in-memory results.

A kernel here is what the profiler's Chrome trace files under cat "kernel": memcpy and memset
are other categories there and are not counted. ``count_kernels_from_trace`` still counts from
the exported trace, so a GPU check can hold the two counts against each other.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

# Kineto's names for the device activities that are not kernels (memcpy "Memcpy HtoD (Pageable
# -> Device)", memset "Memset (Device)", and the synchronisation records it makes when asked
# to); needed where torch's events carry no activity type (torch 2.11).
_NOT_KERNEL_PREFIXES = (
    "Memcpy",
    "Memset",
    "Event Sync",
    "Stream Sync",
    "Stream Wait Event",
    "Context Sync",
)


def load_trace_events(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict)]


def count_kernel_events(events: list[dict[str, Any]]) -> int:
    """Device kernels (cat "kernel"); memcpy and memset are separate categories and not counted."""
    return sum(1 for e in events if e.get("cat") == "kernel" and e.get("ph") == "X")


def is_kernel_event(event: Any, cuda: Any) -> bool:
    """Whether a profiler event (``_KinetoEvent``) is a device kernel; ``cuda`` is the event's
    device type for CUDA (``torch.autograd.DeviceType.CUDA``)."""
    if event.device_type() != cuda:
        return False
    activity_type = getattr(event, "activity_type", None)
    if activity_type is not None:
        # Kineto's own name for the activity, the same string the Chrome trace writes as "cat".
        return activity_type() == "kernel"
    # Without it every CUDA-side activity looks alike: the range a record_function leaves on
    # the GPU says so itself, and kineto names the others (memcpy, memset, syncs) by kind.
    if event.is_user_annotation():
        return False
    return not event.name().startswith(_NOT_KERNEL_PREFIXES)


def count_profiler_kernels(events: Iterable[Any]) -> int:
    """Device kernels among a finished profile's events
    (``prof.profiler.kineto_results.events()``)."""
    from torch.autograd import DeviceType

    return sum(1 for e in events if is_kernel_event(e, DeviceType.CUDA))


def count_kernels_from_trace(prof: Any) -> int:
    """Device kernels in a finished profile's exported Chrome trace. Slower than
    ``count_profiler_kernels`` (the whole trace is written and read back); kept as the reference
    the in-memory count is checked against."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        return count_kernel_events(load_trace_events(path))
    finally:
        os.unlink(path)


def counts_kernels(device: str) -> bool:
    """Whether ``kernels_per_step`` counts on ``device`` (CUDA only)."""
    return device.startswith("cuda")


def profile_steps(fn: Callable[[], Any], steps: int, device: str, *, cpu: bool = False) -> Any:
    """``steps`` steps under torch.profiler, finished. Only the CUDA activity by default: CUPTI
    records every kernel (CUDA-graph replays too) without it, and recording each CPU op is most
    of the profiler's cost on a host-bound step."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA]
    if cpu:
        activities.insert(0, ProfilerActivity.CPU)
    torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize(device)
    return prof


def kernels_per_step(fn: Callable[[], Any], steps: int, device: str) -> float | None:
    """Run ``steps`` steps under torch.profiler and count device kernels; None off CUDA."""
    if not counts_kernels(device):
        return None
    prof = profile_steps(fn, steps, device)
    return count_profiler_kernels(prof.profiler.kineto_results.events()) / steps
