"""Step timers. Device work is asynchronous: CUDA steps are timed with events; CPU steps with a
host clock (synchronising first where a device is involved)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


class StepTimer:
    """Times ``steps`` back-to-back calls of ``fn`` and returns milliseconds per step."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self._cuda = device.startswith("cuda")

    def time(self, fn: Callable[[], Any], steps: int) -> float:
        if steps < 1:
            raise ValueError("steps must be >= 1")
        if self._cuda:
            import torch

            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            # Drain earlier work so the rep starts from an idle queue, as a fresh step would.
            torch.cuda.synchronize(self.device)
            start.record()
            for _ in range(steps):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / steps
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        return (time.perf_counter() - t0) * 1e3 / steps

    def time_once_s(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """Wall time of one call, synchronised: for first calls that include compilation."""
        synchronize(self.device)
        t0 = time.perf_counter()
        out = fn()
        synchronize(self.device)
        return time.perf_counter() - t0, out


def calibrate_steps(
    timer: StepTimer, fn: Callable[[], Any], target_ms: float, max_steps: int = 1000
) -> int:
    """How many steps make one rep last about ``target_ms`` (at least 1)."""
    one = timer.time(fn, 1)
    if one <= 0:
        return max_steps
    return int(max(1, min(max_steps, round(target_ms / one))))


def time_round_robin(
    timer: StepTimer,
    fns: Sequence[Callable[[], Any]],
    reps: int,
    steps: int | Sequence[int],
    until: Callable[[list[list[float]]], bool] | None = None,
) -> list[list[float]]:
    """``reps`` timed reps of each fn (ms per step), the order rotating every rep (A B, B A for
    two; A B C, B C A, C A B for three) so that drift, and whatever one arm leaves behind for
    the next, fall on every arm alike. Returns one list of samples per fn, paired by rep.
    ``steps``: steps per rep, for every fn or one per fn. ``until`` (measure.stopping) is asked
    after every rep whether the answer is known."""
    k = len(fns)
    per_fn = [steps] * k if isinstance(steps, int) else list(steps)
    if len(per_fn) != k:
        raise ValueError(f"{len(per_fn)} step counts for {k} functions")
    samples: list[list[float]] = [[] for _ in range(k)]
    for r in range(reps):
        for j in range(k):
            i = (r + j) % k
            samples[i].append(timer.time(fns[i], per_fn[i]))
        if until is not None and until(samples):
            break
    return samples
