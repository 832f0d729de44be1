"""What max-autotune spent its first call on, read from the trial's stderr: Inductor prints one
line per set of choices it benchmarks ("SingleProcess AUTOTUNE benchmarking takes 31.18
seconds and 0.0002 seconds precompiling for 21 choices"). A resnet50 fp32 max-autotune trial
on an H200 timed out at 600 s after 16 such rounds of 8-66 s each (commit 6d93ddb): the reason
should say so rather than only "timeout during first_call"."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_ROUND = re.compile(r"AUTOTUNE benchmarking takes ([0-9]+(?:\.[0-9]+)?) seconds")


def autotune_rounds(stderr: Path) -> dict[str, Any] | None:
    """Rounds, total and longest benchmarking seconds; None when nothing was autotuned."""
    if not stderr.exists():
        return None
    seconds = [float(m.group(1)) for m in _ROUND.finditer(stderr.read_text(errors="replace"))]
    if not seconds:
        return None
    return {"rounds": len(seconds), "benchmark_s": sum(seconds), "longest_s": max(seconds)}


def describe(rounds: dict[str, Any]) -> str:
    return (
        f"max-autotune benchmarked {rounds['rounds']} sets of kernel choices for "
        f"{rounds['benchmark_s']:.0f} s (the longest {rounds['longest_s']:.0f} s)"
    )
