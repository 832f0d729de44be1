"""How busy the host was while a trial timed its steps.

Host-bound steps (eager, launch-bound) run at the speed of the CPU that launches them. On an
H200 host shared with a second queue that was compiling, eager bf16 resnet50 training read
16.2, 20.4 and 28.0 ms in three trials minutes apart (commit 31421e8), while
GPU-bound steps stayed within 1%. A trial cannot make the host quiet, but it can say it was not:
the load average before and after the timed reps, against the CPUs this process may use.
"""

from __future__ import annotations

import os
from typing import Any

# Other runnable threads, as a share of the usable CPUs, above which a trial carries a note.
# A second kiln queue compiling with half the cores of a 32-CPU host put ~16 there.
BUSY_SHARE = 0.25


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def snapshot() -> dict[str, Any] | None:
    """The 1, 5 and 15 minute load averages now, or None where the OS has none."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return None
    return {"loadavg": [one, five, fifteen], "cpus": usable_cpus()}


def busy_note(
    before: dict[str, Any] | None, after: dict[str, Any] | None, own_threads: int
) -> str | None:
    """A note when threads other than this trial's ``own_threads`` kept more than BUSY_SHARE of
    the usable CPUs busy. The 1-minute average lags, so the larger of the two readings counts."""
    readings = [s for s in (before, after) if s]
    if not readings:
        return None
    cpus = readings[-1]["cpus"]
    load = max(s["loadavg"][0] for s in readings)
    others = load - own_threads
    if others <= max(1.0, BUSY_SHARE * cpus):
        return None
    return (
        f"host busy during the timed reps: load average {load:.1f} on {cpus} usable CPUs, "
        f"about {others:.0f} runnable threads besides this trial's {own_threads}; host-bound "
        "(launch-bound) steps read slower and vary between trials on a busy host; the paired "
        "speedup compares the two arms under the same load"
    )


def record(result: dict[str, Any], before: dict[str, Any] | None, device: str) -> None:
    """Store the readings around the timed reps in ``result["host_load"]``, with a note when
    the host was busy. On the CPU the trial's own intra-op threads are part of the load."""
    import torch

    own = torch.get_num_threads() if device == "cpu" else 1
    after = snapshot()
    result["host_load"] = {"before": before, "after": after, "own_threads": own}
    note = busy_note(before, after, own)
    if note:
        result["notes"].append(note)
