"""Device kernels launched per step, counted from the profiler's own Chrome trace."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any


def load_trace_events(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict)]


def count_kernel_events(events: list[dict[str, Any]]) -> int:
    """Device kernels (cat "kernel"); memcpy and memset are separate categories and not counted."""
    return sum(1 for e in events if e.get("cat") == "kernel" and e.get("ph") == "X")


def counts_kernels(device: str) -> bool:
    """Whether ``kernels_per_step`` counts on ``device`` (CUDA only)."""
    return device.startswith("cuda")


def kernels_per_step(fn: Callable[[], Any], steps: int, device: str) -> float | None:
    """Run ``steps`` steps under torch.profiler and count device kernels; None off CUDA."""
    if not counts_kernels(device):
        return None
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize(device)
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        return count_kernel_events(load_trace_events(path)) / steps
    finally:
        os.unlink(path)
