"""How busy the host was while a trial timed its steps, and with what.

Host-bound steps (eager, launch-bound) run at the speed of the CPU that launches them. On an
H200 host shared with a second queue that was compiling, eager bf16 resnet50 training read
16.2, 20.4 and 28.0 ms in three trials minutes apart (commit 31421e8), while
GPU-bound steps stayed within 1%. A trial cannot make the host quiet, but it can say it was not.

Two readings around the timed reps: the load averages (every OS kiln runs on has them, but the
1-minute average lags: right after a neighbour's compile ends it still reads high), and on
Linux the CPU time itself, from /proc: the host's busy CPU time, this process's and each
thread's, every other process's, the scheduler's account of the thread that times the reps
(seconds waiting for a CPU while runnable, preemptions, migrations) and the cgroup's CPU-quota
stops. Their differences say how many CPUs other processes kept busy during the reps, which
ones, and whether the timing thread had its CPU. On H100 hosts a launch-bound GPT-2 step read
22% slower in a tune than in a plain loop on one host and 35% faster on another, with the load
average unable to say why; these readings then showed every timing thread alone on its CPU
(docs/decisions.md, "Launch-bound steps").
"""

from __future__ import annotations

import os
import threading
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
# The timing thread runnable but waiting for a CPU (the scheduler's run queue), as a share of the
# reps' wall time: a launch-bound step slows by about that share, so 5% is noted.
RUNQUEUE_SHARE = 0.05
# A CPU quota stops every thread of its cgroup for the rest of a period (100 ms by default) once
# spent: 1% of the reps so stopped is noted.
THROTTLED_SHARE = 0.01
# A step's rep-to-rep variation (coefficient of variation) that is noted. On a steady H100 host
# GPT-2 small's five arms, launch-bound and GPU-bound, read under 0.3% in a tune; on an unsteady
# one its launch-bound arms read 10-12% with every reading quiet (kiln ae506ed and 890fefb,
# docs/decisions.md "Launch-bound steps").
UNSTEADY_CV = 0.05
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


def _involuntary_switches(path: str) -> int | None:
    """A /proc status file's nonvoluntary_ctxt_switches; None where the kernel has no such line."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == "nonvoluntary_ctxt_switches":
                    return int(value)
    except (OSError, ValueError):
        return None
    return None


def _thread_sched(tid: int) -> dict[str, Any] | None:
    """The scheduler's account of one thread of this process: nanoseconds on a CPU and runnable
    but waiting for one (schedstat), context switches it did not ask for, the CPU it last ran
    on, and its migrations between CPUs where the kernel exposes them (sched, a debug file).
    None where schedstat is missing."""
    base = f"/proc/self/task/{tid}"
    try:
        with open(f"{base}/schedstat") as f:
            run_ns, wait_ns, slices = (int(v) for v in f.read().split()[:3])
    except (OSError, ValueError):
        return None
    got = _stat_fields(f"{base}/stat")
    out: dict[str, Any] = {
        "tid": tid,
        "run_ns": run_ns,
        "wait_ns": wait_ns,
        "slices": slices,
        "involuntary": _involuntary_switches(f"{base}/status"),
        # after comm, field 39 (processor) is at index 36
        "cpu": int(got[1][36]) if got and len(got[1]) > 36 else None,
        "migrations": None,
    }
    try:
        with open(f"{base}/sched") as f:
            for line in f:
                if line.startswith("se.nr_migrations"):
                    out["migrations"] = int(line.split(":")[1])
    except (OSError, ValueError, IndexError):
        pass  # sched is a debug file some kernels lack: migrations stay unknown
    return out


# cgroup v2 at the root of the container's namespace, then v1's cpu controller
_CGROUP_STATS = (
    ("/sys/fs/cgroup/cpu.stat", "throttled_usec", 1e-6),
    ("/sys/fs/cgroup/cpu/cpu.stat", "throttled_time", 1e-9),
    ("/sys/fs/cgroup/cpu,cpuacct/cpu.stat", "throttled_time", 1e-9),
)


def _cgroup_quota() -> float | None:
    """The CPUs the cgroup's quota allows (quota over period); None without a quota."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass  # not cgroup v2: v1's two files below
    for d in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
        try:
            with open(f"{d}/cpu.cfs_quota_us") as q, open(f"{d}/cpu.cfs_period_us") as p:
                quota, period = int(q.read()), int(p.read())
        except (OSError, ValueError):
            continue
        return None if quota <= 0 else quota / period
    return None


def _cgroup_cpu() -> dict[str, Any] | None:
    """The CPU controller's throttling counters of this process's cgroup (how often and how
    long its quota stopped every thread in it) and its quota in CPUs; None where unreadable."""
    for path, key, to_s in _CGROUP_STATS:
        try:
            with open(path) as f:
                stat = dict(line.split()[:2] for line in f if len(line.split()) >= 2)
            return {
                "throttled_periods": int(stat.get("nr_throttled", 0)),
                "throttled_s": int(stat.get(key, 0)) * to_s,
                "quota_cpus": _cgroup_quota(),
            }
        except (OSError, ValueError):
            continue
    return None


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
            # the thread taking the snapshot is the one timing the reps
            "timing": _thread_sched(threading.get_native_id()),
            "cgroup": _cgroup_cpu(),
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
        "timing_thread": _timing_delta(a.get("timing"), b.get("timing"), wall),
        "cgroup": _cgroup_delta(a.get("cgroup"), b.get("cgroup")),
    }


def _timing_delta(
    a: dict[str, Any] | None, b: dict[str, Any] | None, wall: float
) -> dict[str, Any] | None:
    """How the timing thread fared between two readings: ``cpu_s`` on a CPU,
    ``runqueue_wait_s`` runnable but waiting for one (and its share of the wall time), its
    ``involuntary_switches`` (preempted), ``migrations`` between CPUs where known, and the CPU
    it ran on at each reading. None when either reading lacks it or they are of two threads."""
    if not a or not b or a["tid"] != b["tid"]:
        return None
    wait_s = (b["wait_ns"] - a["wait_ns"]) / 1e9

    def diff(key: str) -> int | None:
        return None if a.get(key) is None or b.get(key) is None else b[key] - a[key]

    return {
        "tid": b["tid"],
        "cpu_s": round((b["run_ns"] - a["run_ns"]) / 1e9, 4),
        "runqueue_wait_s": round(wait_s, 4),
        "runqueue_share": round(wait_s / wall, 4),
        "timeslices": b["slices"] - a["slices"],
        "involuntary_switches": diff("involuntary"),
        "migrations": diff("migrations"),
        "cpus": [a.get("cpu"), b.get("cpu")],
    }


def _cgroup_delta(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """The cgroup's throttling between two readings: ``throttled_periods`` and
    ``throttled_s`` (every thread of the cgroup stopped by its CPU quota), with the quota."""
    if not a or not b:
        return None
    return {
        "quota_cpus": b["quota_cpus"],
        "throttled_periods": b["throttled_periods"] - a["throttled_periods"],
        "throttled_s": round(b["throttled_s"] - a["throttled_s"], 4),
    }


def _named(during: dict[str, Any]) -> str:
    names = []
    for o in during["top_others"][:3]:
        whose = ", this trial's child" if o["ours"] else ""
        names.append(f"{o['name']} (pid {o['pid']}{whose}) {o['cpu_s']:.1f} s")
    return "; ".join(names) if names else "processes that ended before the reps did"


def _busy(during: dict[str, Any]) -> tuple[bool, bool, bool, bool]:
    """Which lines a reading passed: other processes, hypervisor steal, the timing thread's
    waits for a CPU, the cgroup's quota."""
    timing = during.get("timing_thread") or {}
    cgroup = during.get("cgroup") or {}
    return (
        during["other_cpus"] >= BUSY_OTHER_CPUS,
        during["steal_cpus"] >= STEAL_CPUS,
        timing.get("runqueue_share", 0.0) >= RUNQUEUE_SHARE,
        cgroup.get("throttled_s", 0.0) >= THROTTLED_SHARE * during["wall_s"],
    )


def unsteady_notes(result: dict[str, Any]) -> list[str]:
    """One note when an arm's step varied UNSTEADY_CV or more rep to rep, naming each such arm
    and saying whether the host's reading (``host_load.during``) was quiet meanwhile: then the
    variation is the host's own speed moving, not a neighbour."""
    during = (result.get("host_load") or {}).get("during")
    quiet = during is not None and not any(_busy(during))
    varied = []
    for arm, key in (("variant", "steady_ms"), ("baseline", "baseline_ms")):
        cv = (result.get(key) or {}).get("cv") or 0.0
        if cv >= UNSTEADY_CV:
            varied.append(f"{arm} {cv * 100:.0f}%")
    if not varied:
        return []
    why = (
        ", with no other process busy and the timing thread on its CPU throughout" if quiet else ""
    )
    return [
        f"the step varied rep to rep (coefficient of variation: {', '.join(varied)}){why}: "
        "a host-bound step on a host whose speed moves; the speedup's interval carries it, but "
        "another process may read the step at another level"
    ]


def busy_note(
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    own_threads: int,
    during: dict[str, Any] | None = None,
) -> str | None:
    """A note when the host was busy with other work during the timed reps.

    Measured (Linux): when other processes kept BUSY_OTHER_CPUS or more busy on average (named),
    the hypervisor took STEAL_CPUS or more for other guests, the timing thread waited for a CPU
    RUNQUEUE_SHARE of the time or more, or the cgroup's CPU quota stopped its threads for
    THROTTLED_SHARE of it or more.
    Else from the load averages: when threads other than this trial's ``own_threads`` kept more
    than BUSY_SHARE of the usable CPUs busy; the 1-minute average lags, so the larger of the two
    readings counts. ``during``: ``usage(before, after)`` where the caller has it already."""
    during = during or usage(before, after)
    if during is not None:
        busy, stolen, waited, throttled = _busy(during)
        timing, cgroup = during.get("timing_thread") or {}, during.get("cgroup") or {}
        if not (busy or stolen or waited or throttled):
            return None
        cpus = (after or before or {}).get("cpus", "?")
        what = []
        if waited:
            what.append(
                f"the timing thread waited {timing['runqueue_wait_s']:.2f} s for a CPU while "
                f"runnable ({timing['runqueue_share'] * 100:.0f}% of the reps)"
            )
        if throttled:
            quota = cgroup.get("quota_cpus")
            of = f" of {quota:g} CPUs" if quota else ""
            what.append(
                f"the cgroup's CPU quota{of} stopped its threads for {cgroup['throttled_s']:.2f} s "
                f"({cgroup['throttled_periods']} periods)"
            )
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
