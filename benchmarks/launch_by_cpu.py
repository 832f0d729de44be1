"""A launch-bound step's speed by the CPU its launching thread runs on.

A host-bound (launch-bound) step runs at the speed of the CPU that launches its kernels, and a
process's thread mostly stays on the CPU the scheduler first gave it. Where CPUs of one machine
launch at different speeds (a socket far from the GPU, a core whose sibling hyperthread another
guest keeps busy, a hypervisor taking the CPU), two processes timing the same step read
different medians though each is steady. This script builds one step (plain_loop.py's, no kiln
code in the timed path), pins its thread to each usable CPU in turn and times it there, in
`--sweeps` sweeps (forward, then backward: a CPU slow in both is slow by where it is, one slow
in one sweep was slowed for a while), with the machine's CPU topology, the GPU's local CPUs and
each CPU's hypervisor steal during its turn. `unpinned` is the step timed with the affinity the
process started with, before and after the sweeps; `--processes N` then times it in N fresh
processes one after another, each with the CPU its thread ran on.

    PYTHONPATH=src python3 benchmarks/launch_by_cpu.py \\
        --out benchmarks/results/launch/h100/launch-eager.json
    PYTHONPATH=src python3 benchmarks/launch_by_cpu.py --device cpu --preset tiny --out /tmp/l.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

import plain_loop  # noqa: E402


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_topology(cpus: list[int]) -> dict[int, dict[str, Any]]:
    """Per CPU: its core, package, sibling hyperthreads and NUMA node from sysfs, and its clock
    as /proc/cpuinfo reports it (a virtual machine often reports the nominal one)."""
    mhz: dict[int, float] = {}
    current = None
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "processor":
            current = int(value)
        elif key.strip() == "cpu MHz" and current is not None:
            mhz[current] = float(value)
    out = {}
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}"
        nodes = glob.glob(f"{base}/node*")
        out[cpu] = {
            "core_id": _read(f"{base}/topology/core_id"),
            "package": _read(f"{base}/topology/physical_package_id"),
            "siblings": _read(f"{base}/topology/thread_siblings_list"),
            "node": os.path.basename(nodes[0])[4:] if nodes else None,
            "mhz": mhz.get(cpu),
        }
    return out


def gpu_locality() -> dict[str, Any] | None:
    """The GPU's PCI address and, from sysfs, its NUMA node and local CPUs (None off CUDA)."""
    try:
        bus = subprocess.run(
            ["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"nvidia-smi: {exc}"}
    if not bus:
        return None
    # nvidia-smi writes an 8-digit domain (00000000:1B:00.0); sysfs a 4-digit one, lower case
    domain, _, rest = bus.partition(":")
    dev = f"/sys/bus/pci/devices/{domain[-4:].lower()}:{rest.lower()}"
    return {
        "pci_bus_id": bus,
        "numa_node": _read(f"{dev}/numa_node"),
        "local_cpulist": _read(f"{dev}/local_cpulist"),
    }


def steal_by_cpu() -> dict[int, int]:
    """Each CPU's steal jiffies from /proc/stat (a hypervisor's time for other guests)."""
    out = {}
    for line in (_read("/proc/stat") or "").splitlines():
        parts = line.split()
        if parts and parts[0].startswith("cpu") and parts[0] != "cpu" and len(parts) > 8:
            out[int(parts[0][3:])] = int(parts[8])
    return out


def time_here(one, cuda: bool, steps: int, reps: int, warm: int) -> dict[str, Any]:
    """`reps` medians of `steps` steps on the CPU the thread is on now, after `warm` steps."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warm):
        one()
    sync()
    hz = os.sysconf("SC_CLK_TCK")
    steal0, sched0, t0 = steal_by_cpu(), plain_loop.sched_ns(), time.perf_counter()
    rep = plain_loop.time_rep if cuda else plain_loop.time_rep_cpu
    reps_ms = [rep(one, steps) for _ in range(reps)]
    wall, steal1, sched1 = time.perf_counter() - t0, steal_by_cpu(), plain_loop.sched_ns()
    cpu = os.sched_getaffinity(0)
    here = min(cpu) if len(cpu) == 1 else None
    out: dict[str, Any] = {
        "median_ms": statistics.median(reps_ms),
        "reps_ms": reps_ms,
        "wall_s": wall,
    }
    if here is not None and here in steal0 and here in steal1:
        out["steal_share"] = (steal1[here] - steal0[here]) / hz / wall
    if sched0 and sched1:
        out["runqueue_share"] = (sched1[1] - sched0[1]) / 1e9 / wall
    return out


def fresh_processes(args: argparse.Namespace, out: Path, doc: dict[str, Any]) -> list[dict]:
    """The step in `args.processes` fresh plain_loop.py processes, unpinned, one after another:
    each one's median, its reps and the CPU its thread ended on (None for a process that
    failed, with its exit code)."""
    runs = []
    cmd = [sys.executable, str(ROOT / "benchmarks" / "plain_loop.py")]
    cmd += [args.workload, args.step, args.precision, args.mode, args.device, args.preset]
    for i in range(args.processes):
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        got = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
        runs.append(
            {
                "started": t0,
                "rc": proc.returncode,
                "median_ms": got and got["median_ms"],
                "reps_ms": got and got["reps_ms"],
                "cpu": got and (got.get("timing_thread") or {}).get("cpu"),
                "stderr_tail": None if got else proc.stderr[-400:],
            }
        )
        print(f"process {i}: {runs[-1]['median_ms']} ms on cpu {runs[-1]['cpu']}", flush=True)
        doc["processes"] = runs
        out.write_text(json.dumps(doc, indent=2, default=str))
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the result file (JSON)")
    ap.add_argument("--workload", default="gpt2")
    ap.add_argument("--step", default="infer")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--mode", default="eager", help="eager or a torch.compile mode")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--sweeps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20, help="steps per rep")
    ap.add_argument("--reps", type=int, default=3, help="reps on each CPU")
    ap.add_argument("--warm", type=int, default=5, help="steps on a CPU before its reps")
    ap.add_argument(
        "--processes",
        type=int,
        default=0,
        help="then time the step unpinned in this many fresh processes (plain_loop.py), one "
        "after another: whether a level a process reads follows its CPU or the minute",
    )
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("launch_by_cpu: no CUDA GPU here (--device cpu for the CPU check)")
        return 2
    started = os.sched_getaffinity(0)
    cpus = sorted(started)
    one = plain_loop.make_step(
        args.workload, args.step, args.precision, args.mode, args.device, args.preset
    )
    t0 = time.perf_counter()
    one()
    first_call_s = time.perf_counter() - t0
    doc: dict[str, Any] = {
        "schema": "kiln.launch_by_cpu/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "step": {k: getattr(args, k) for k in ("workload", "step", "precision", "mode", "preset")},
        "first_call_s": first_call_s,
        "cpus": cpus,
        "topology": cpu_topology(cpus),
        "gpu": gpu_locality() if cuda else None,
        "unpinned": [],
        "sweeps": [],
    }
    from torchkiln.measure.environment import collect

    doc["environment"] = collect(args.device)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    kw = {"steps": args.steps, "reps": args.reps, "warm": args.warm}

    def unpinned() -> None:
        os.sched_setaffinity(0, started)
        doc["unpinned"].append(time_here(one, cuda, **kw))

    try:
        unpinned()
        for s in range(args.sweeps):
            order = cpus if s % 2 == 0 else cpus[::-1]
            sweep = {}
            for cpu in order:
                os.sched_setaffinity(0, {cpu})
                sweep[cpu] = time_here(one, cuda, **kw)
                print(f"sweep {s} cpu {cpu:3d}: {sweep[cpu]['median_ms']:.3f} ms", flush=True)
            doc["sweeps"].append(sweep)
            out.write_text(json.dumps(doc, indent=2, default=str))
        unpinned()
    finally:
        os.sched_setaffinity(0, started)
    if args.processes:
        doc["processes"] = fresh_processes(args, out, doc)
    medians = {c: statistics.median(s[c]["median_ms"] for s in doc["sweeps"]) for c in cpus}
    fastest = min(medians.values())
    doc["by_cpu"] = {
        c: {"median_ms": m, "over_fastest": m / fastest, **doc["topology"][c]}
        for c, m in medians.items()
    }
    out.write_text(json.dumps(doc, indent=2, default=str))
    print(f"gpu: {doc['gpu']}")
    print(f"unpinned: {[round(u['median_ms'], 3) for u in doc['unpinned']]} ms")
    for i, r in enumerate(doc.get("processes") or []):
        print(f"fresh process {i}: {r['median_ms']} ms, thread on cpu {r['cpu']} (rc {r['rc']})")
    print("cpu  node core  sweeps (ms)           over fastest")
    for c in cpus:
        row = doc["by_cpu"][c]
        per = " ".join(f"{s[c]['median_ms']:7.3f}" for s in doc["sweeps"])
        print(f"{c:3d}  {row['node']!s:4} {row['core_id']!s:4}  {per}   {row['over_fastest']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
