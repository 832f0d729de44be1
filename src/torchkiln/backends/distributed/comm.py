"""How much of a step's communication is not hidden behind compute, from the profiler.

GPU: collective kernels (NCCL) against every other kernel, on the device timeline. CPU (gloo):
gloo's collectives run on its own threads; compute is the aten ops of the training thread, so
the exposed share is the gloo time during which the training thread computed nothing (the
time it sat waiting). Both are fractions of the profiled steps' wall time."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

COMM = re.compile(r"nccl|gloo:|all_?reduce|all_?gather|reduce_?scatter|broadcast", re.I)


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(s, e) for s, e in out]


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the union ``a`` not covered by the union ``b`` (both sorted, disjoint)."""
    exposed = 0.0
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                exposed += b[k][0] - cur
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            exposed += e - cur
    return exposed


def exposed_share(
    comm: Iterable[tuple[float, float]], compute: Iterable[tuple[float, float]], wall: float
) -> dict[str, Any]:
    c, k = union(comm), union(compute)
    comm_t = length(c)
    exposed = subtract(c, k)
    return {
        "comm_us": comm_t,
        "exposed_comm_us": exposed,
        "wall_us": wall,
        "comm_share": comm_t / wall if wall else None,
        "exposed_comm_share": exposed / wall if wall else None,
    }


def profile_comm(step: Callable[[], Any], device: str, steps: int = 3) -> dict[str, Any]:
    import time

    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
        wall_us = (time.perf_counter() - t0) * 1e6
    events = list(prof.events())
    comm, compute = [], []
    if cuda:
        for ev in events:
            if ev.device_type != DeviceType.CUDA:
                continue
            span = (ev.time_range.start, ev.time_range.end)
            (comm if COMM.search(ev.name) else compute).append(span)
        method = "device timeline: NCCL kernels not overlapped by other kernels"
    else:
        cpu = [ev for ev in events if ev.device_type == DeviceType.CPU]
        main = _training_thread(cpu)
        for ev in cpu:
            span = (ev.time_range.start, ev.time_range.end)
            if COMM.search(ev.name) and ev.thread != main:
                comm.append(span)
            elif ev.thread == main and ev.name.startswith("aten::") and not _waits(ev.name):
                compute.append(span)
        method = "CPU: gloo collective time while the training thread ran no aten op"
    out = exposed_share(comm, compute, wall_us)
    out.update(method=method, steps=steps, comm_events=len(comm))
    return out


def _training_thread(events: list[Any]) -> int | None:
    counts: dict[int, int] = {}
    for ev in events:
        if ev.name.startswith("aten::"):
            counts[ev.thread] = counts.get(ev.thread, 0) + 1
    return max(counts, key=counts.get) if counts else None


def _waits(name: str) -> bool:
    return "wait" in name.lower()
