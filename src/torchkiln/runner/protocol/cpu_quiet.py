"""Whether a process and everything it started have stopped using the CPU (Linux's /proc).

A max-autotune compile submits the builds of a GEMM's kernel choices to its compile workers when
it lowers the GEMM and benchmarks them later, so at the point where it may pause for a
neighbour's timed reps (compile_pause.py) builds of other choices can still be running in its
worker processes and threads. It pauses only once they have finished: the CPU seconds of the
process and its descendants stop growing."""

from __future__ import annotations

import os
import time

# CPU seconds per second of wall time below which the tree counts as quiet, over a window of
# WINDOW_S (/proc counts in ticks of 10 ms): idle workers' housekeeping stays far below it, one
# busy compile worker is 1.0. The waiting thread's own scans of /proc are left out.
QUIET_SHARE = 0.1
WINDOW_S = 0.2
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of ``pid`` from /proc/PID/stat; None when it is gone."""
    try:
        text = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def tree_cpu_s(root: int) -> float | None:
    """CPU seconds used so far by ``root`` and its living descendants; None without /proc."""
    if not os.path.isdir("/proc"):
        return None
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (s := _stat(int(name))) is not None:
            stats[int(name)] = s
    tree, total, frontier = {root}, 0.0, [root]
    while frontier:
        parent = frontier.pop()
        total += stats[parent][1] if parent in stats else 0.0
        for pid, (ppid, _) in stats.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return total


def wait_quiet(max_s: float, root: int | None = None) -> bool:
    """Wait until ``root`` (this process) and its descendants use less than QUIET_SHARE of a
    core over WINDOW_S, at most ``max_s``; whether they did. False where /proc is missing."""
    root = os.getpid() if root is None else root
    deadline = time.monotonic() + max_s
    before, own = tree_cpu_s(root), time.thread_time()
    if before is None:
        return False
    while True:
        t0 = time.monotonic()
        time.sleep(WINDOW_S)
        after = tree_cpu_s(root)
        if after is None:
            return False
        used = after - before - (time.thread_time() - own)
        if used < QUIET_SHARE * (time.monotonic() - t0):
            return True
        if time.monotonic() >= deadline:
            return False
        before, own = after, time.thread_time()
