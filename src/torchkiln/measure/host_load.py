"""How busy the host was while a trial timed its steps, and with what.

Host-bound steps (eager, launch-bound) run at the speed of the CPU that launches them. On an
H200 host shared with a second queue that was compiling, eager bf16 resnet50 training read
16.2, 20.4 and 28.0 ms in three trials minutes apart (commit 31421e8), while
GPU-bound steps stayed within 1%. A trial cannot make the host quiet, but it can say it was not.

Two readings around the timed reps: the load averages (every OS kiln runs on has them, but the
1-minute average lags: right after a neighbour's compile ends it still reads high), and on
Linux the CPU time itself, from /proc: the host's busy CPU time, this process's and each
thread's, and every other process's. Their differences say how many CPUs other processes kept
busy during the reps and which ones. In the five-arm GPT-2 tune on an H100 (kiln 2d64c4c,
`tune_speed/h100/arms-gpt2-results.json`), the launch-bound arms read slower than in the plain
loop on the same machine (`part-loop.json`: eager bf16 14.3 ms against 11.7, default-mode bf16
5.1 against 3.7) while every other trial waited for its turn or paused its compile, and the
load average could not say whether anything ran.
"""

from __future__ import annotations

import os
import time
from typing import Any

# The lagging reading: other runnable threads, as a share of the usable CPUs, above which a
# trial carries a note. A second kiln queue compiling with half the cores of a 32-CPU host put
# ~16 there.
BUSY_SHARE = 0.25
# The measured reading: other processes keeping this many CPUs busy on average over the reps,
# a whole core beside the launching thread, is a busy host.
BUSY_OTHER_CPUS = 1.0
# CPU time a virtual machine's hypervisor gave other guests while this one's CPUs wanted to run,
# on average over the reps: a quarter of a CPU taken from under a one-thread launcher is noted.
STEAL_CPUS = 0.25
# How many of the busiest other processes, and of this process's threads, are named.
TOP = 5
# Reading a process's stat costs about 20 us in Python (84 processes in 1.8 ms on a 2-core CPU
# host); past this many the rest go unnamed, so that the reading stays short. The host's figure
# (/proc/stat) still counts them.
MAX_PROCS = 5000


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _ticks_per_s() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100


def _stat_fields(path: str) -> tuple[str, list[str]] | None:
    """(comm, the fields after it) of a /proc .../stat file; None when it is gone or cannot be
    read (a process that exited between the listing and the read)."""
    try:
        with open(path, "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    # comm is in parentheses and may itself hold spaces and parentheses: split at the last ')'.
    left, right = raw.find("("), raw.rfind(")")
    if left < 0 or right < left:
        return None
    return raw[left + 1 : right], raw[right + 2 :].split()


def _cpu_ticks(fields: list[str]) -> int:
    # After comm: state is fields[0], so utime and stime (stat's 14th and 15th) are [11], [12].
    return int(fields[11]) + int(fields[12])


def _host_ticks() -> tuple[int, int, int] | None:
    """(busy, total, steal) jiffies of all CPUs from /proc/stat's first line: idle and iowait
    are idle; steal (a virtual machine's CPUs taken by its hypervisor for other guests) is
    neither this host's work nor idle, so it is kept apart. guest time is already inside user
    time, so it is not added again."""
    try:
        with open("/proc/stat") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    values += [0] * (8 - len(values))  # old kernels end before steal
    idle, steal = values[3] + values[4], values[7]
    total = sum(values)
    return total - idle - steal, total, steal


def _processes() -> dict[int, list[Any]] | None:
    """{pid: [ppid, comm, cpu jiffies]} of every process readable now; None without /proc."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    out: dict[int, list[Any]] = {}
    for pid in pids[:MAX_PROCS]:
        got = _stat_fields(f"/proc/{pid}/stat")
        if got is not None:
            comm, fields = got
            out[pid] = [int(fields[1]), comm, _cpu_ticks(fields)]
    return out


def _threads() -> dict[int, list[Any]]:
    """{tid: [name, cpu jiffies]} of this process's threads."""
    out: dict[int, list[Any]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        got = _stat_fields(f"/proc/self/task/{tid}/stat")
        if got is not None:
            out[int(tid)] = [got[0], _cpu_ticks(got[1])]
    return out


def snapshot() -> dict[str, Any] | None:
    """The 1, 5 and 15 minute load averages now and the CPUs this process may use, or None
    where the OS has none; on Linux also the CPU time read from /proc (``cpu``, private: it is
    turned into ``during`` by ``usage`` and not kept in results)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return None
    snap: dict[str, Any] = {"loadavg": [one, five, fifteen], "cpus": usable_cpus()}
    host = _host_ticks()
    procs = _processes() if host is not None else None
    if host is not None and procs is not None:
        snap["cpu"] = {
            "at": time.monotonic(),
            "host": host,
            "pid": os.getpid(),
            "procs": procs,
            "threads": _threads(),
        }
    return snap


def public(snap: dict[str, Any] | None) -> dict[str, Any] | None:
    """A snapshot as results keep it: the load averages and CPUs, without the /proc tables."""
    if snap is None:
        return None
    return {k: v for k, v in snap.items() if k != "cpu"}


def _descendants(root: int, procs: dict[int, list[Any]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(400)
    except OSError:
        return None
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()[:160] or None


def usage(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """What kept the host's CPUs busy between two snapshots: ``host_cpus`` (busy CPUs on
    average), ``own_cpus`` (this process, all its threads), ``other_cpus`` (the rest),
    ``steal_cpus`` (CPUs a hypervisor gave to other guests while this one wanted them), the
    busiest other processes (``top_others``: pid, name, CPU seconds, ``ours`` for this process's
    own children and their descendants, such as compile workers, and the command line while
    the process is alive) and this process's busiest threads (``own_threads_top``). None when
    either snapshot has no /proc reading. A process that started and ended between the two is
    counted in the host's figure, not by name."""
    a = (before or {}).get("cpu")
    b = (after or {}).get("cpu")
    if not a or not b or a["pid"] != b["pid"]:
        return None
    hz = _ticks_per_s()
    wall = max(b["at"] - a["at"], 1e-9)
    host_busy = (b["host"][0] - a["host"][0]) / hz
    steal = (b["host"][2] - a["host"][2]) / hz if len(a["host"]) > 2 else 0.0
    pid = b["pid"]
    own = (b["procs"].get(pid, [0, "", 0])[2] - a["procs"].get(pid, [0, "", 0])[2]) / hz
    ours = _descendants(pid, b["procs"]) | _descendants(pid, a["procs"])
    others = []
    for p, (_, name, ticks) in b["procs"].items():
        if p == pid:
            continue
        # A process new since the first reading: all its CPU time was spent in the window.
        spent = (ticks - (a["procs"][p][2] if p in a["procs"] else 0)) / hz
        if spent > 0:
            others.append({"pid": p, "name": name, "cpu_s": round(spent, 3), "ours": p in ours})
    others.sort(key=lambda o: -o["cpu_s"])
    for o in others[:TOP]:
        o["cmdline"] = _cmdline(o["pid"])
    threads = []
    for tid, (name, ticks) in b["threads"].items():
        spent = (ticks - (a["threads"][tid][1] if tid in a["threads"] else 0)) / hz
        if spent > 0:
            threads.append({"tid": tid, "name": name, "cpu_s": round(spent, 3), "main": tid == pid})
    threads.sort(key=lambda t: -t["cpu_s"])
    other_cpus = max(0.0, host_busy - own) / wall
    return {
        "wall_s": round(wall, 3),
        "host_cpus": round(host_busy / wall, 3),
        "own_cpus": round(own / wall, 3),
        "other_cpus": round(other_cpus, 3),
        "steal_cpus": round(steal / wall, 3),
        "other_processes": len(others),
        "top_others": others[:TOP],
        "own_threads_top": threads[:TOP],
    }


def _named(during: dict[str, Any]) -> str:
    names = []
    for o in during["top_others"][:3]:
        whose = ", this trial's child" if o["ours"] else ""
        names.append(f"{o['name']} (pid {o['pid']}{whose}) {o['cpu_s']:.1f} s")
    return "; ".join(names) if names else "processes that ended before the reps did"


def busy_note(
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    own_threads: int,
    during: dict[str, Any] | None = None,
) -> str | None:
    """A note when the host was busy with other work during the timed reps.

    Measured (Linux): when other processes kept BUSY_OTHER_CPUS or more busy on average (named),
    or the hypervisor took STEAL_CPUS or more for other guests.
    Else from the load averages: when threads other than this trial's ``own_threads`` kept more
    than BUSY_SHARE of the usable CPUs busy; the 1-minute average lags, so the larger of the two
    readings counts. ``during``: ``usage(before, after)`` where the caller has it already."""
    during = during or usage(before, after)
    if during is not None:
        busy, stolen = during["other_cpus"] >= BUSY_OTHER_CPUS, during["steal_cpus"] >= STEAL_CPUS
        if not busy and not stolen:
            return None
        cpus = (after or before or {}).get("cpus", "?")
        what = []
        if busy:
            what.append(
                f"other processes kept {during['other_cpus']:.1f} of {cpus} usable CPUs busy "
                f"(busiest: {_named(during)})"
            )
        if stolen:
            what.append(
                f"the hypervisor gave {during['steal_cpus']:.2f} CPUs to other guests (steal)"
            )
        return (
            f"host busy during the timed reps: over {during['wall_s']:.1f} s, {'; '.join(what)}; "
            "host-bound (launch-bound) steps read slower and vary between trials on a busy "
            "host; the paired speedup compares the two arms under the same load"
        )
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


def reading(before: dict[str, Any] | None, own_threads: int) -> tuple[dict[str, Any], str | None]:
    """The record of the timed reps that began at snapshot ``before`` and end now, and its
    note: ``before`` and ``after`` (load averages), ``own_threads`` and, on Linux, ``during``
    (``usage``)."""
    after = snapshot()
    during = usage(before, after)
    record_ = {
        "before": public(before),
        "after": public(after),
        "own_threads": own_threads,
        "during": during,
    }
    return record_, busy_note(before, after, own_threads, during)


def record(result: dict[str, Any], before: dict[str, Any] | None, device: str) -> None:
    """Store the readings around the timed reps in ``result["host_load"]``, with a note when
    the host was busy. On the CPU the trial's own intra-op threads are part of the load."""
    import torch

    own = torch.get_num_threads() if device == "cpu" else 1
    result["host_load"], note = reading(before, own)
    if note:
        result["notes"].append(note)
