"""The in-memory kernel count against the Chrome trace's, on small steps of known kinds.

``kernels_per_step`` counts device kernels from the profiler's in-memory events, with the CUDA
activity alone. The count it replaced exported a Chrome trace of a CPU + CUDA profile and counted
its cat "kernel" events. Per case this prints both of those, plus the in-memory count of the
CPU + CUDA profile and the trace count of the CUDA-only one (so a difference points at either the
activity set or the filter), the device activities that were not counted, and the seconds each
way took (median of a few rounds, profiling included). Cases: eager Linear+GELU layers (inference
and a training step), a step with a host->device copy and memsets, and the same layers under
torch.compile(mode="reduce-overhead") so that CUDA-graph replays are counted. Prints one JSON line;
exit 1 when any two counts of a case differ. Needs CUDA (without it, says so and exits 0).

    PYTHONPATH=src python3 benchmarks/check_kernel_count.py [--steps 3] [--rounds 3] [--out F]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from torchkiln.measure.kernels import (  # noqa: E402
    count_kernel_events,
    count_kernels_from_trace,
    count_profiler_kernels,
    is_kernel_event,
    kernels_per_step,
    load_trace_events,
    profile_steps,
)

DEVICE = "cuda"


def layers(width: int = 1024, depth: int = 4) -> torch.nn.Module:
    mods: list[torch.nn.Module] = []
    for _ in range(depth):
        mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*mods).to(DEVICE)


def cudart() -> Any:
    """The CUDA runtime torch loaded, for a memset it cannot be talked out of (torch.zeros may
    launch a fill kernel instead); None where it is not found."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        memset = lib.cudaMemsetAsync
        memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
        memset.restype = ctypes.c_int
        return lib
    return None


def cases() -> dict[str, Callable[[], Any]]:
    x = torch.randn(64, 1024, device=DEVICE)
    infer_model = layers().eval()

    def infer() -> Any:
        with torch.no_grad():
            return infer_model(x)

    train_model = layers()
    opt = torch.optim.SGD(train_model.parameters(), lr=1e-3)

    def train() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = train_model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    host = torch.randn(256, 1024)  # pageable: a plain host->device copy
    scratch = torch.empty(1 << 20, dtype=torch.uint8, device=DEVICE)
    rt = cudart()

    def copy_memset() -> Any:
        on_device = host.to(DEVICE)
        zeros = torch.zeros(256, 1024, device=DEVICE)
        if rt is not None:
            stream = torch.cuda.current_stream().cuda_stream
            err = rt.cudaMemsetAsync(scratch.data_ptr(), 0, scratch.numel(), stream)
            if err != 0:
                raise RuntimeError(f"cudaMemsetAsync returned {err}")
        return on_device + zeros

    compiled_model = torch.compile(layers().eval(), mode="reduce-overhead")

    def compiled() -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return compiled_model(x)

    return {
        "eager_infer": infer,
        "eager_train": train,
        "copy_memset": copy_memset,
        "compiled_reduce_overhead": compiled,
    }


def old_way(step: Callable[[], Any], steps: int) -> tuple[float, float, float]:
    """The count kernels_per_step used to take (CPU + CUDA, Chrome trace), the seconds it took,
    and the in-memory count of the same profile (taken aside, not timed)."""
    t0 = time.perf_counter()
    prof = profile_steps(step, steps, DEVICE, cpu=True)
    profiled = time.perf_counter()
    in_memory = count_profiler_kernels(prof.profiler.kineto_results.events()) / steps
    t1 = time.perf_counter()
    trace = count_kernels_from_trace(prof) / steps
    seconds = (profiled - t0) + (time.perf_counter() - t1)
    return trace, seconds, in_memory


def check_case(step: Callable[[], Any], steps: int, rounds: int) -> dict[str, Any]:
    for _ in range(5):  # compiles, autotunes and records CUDA graphs before anything is counted
        step()
    torch.cuda.synchronize()

    prof = profile_steps(step, steps, DEVICE)
    events = prof.profiler.kineto_results.events()
    in_memory = count_profiler_kernels(events) / steps
    cuda = torch.autograd.DeviceType.CUDA
    not_counted = Counter(
        e.name() for e in events if e.device_type() == cuda and not is_kernel_event(e, cuda)
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        trace = load_trace_events(path)
    trace_cuda_only = count_kernel_events(trace) / steps
    trace_cats = Counter(e.get("cat") for e in trace if e.get("ph") == "X")

    new_s, old_s, new_counts, old_counts = [], [], set(), set()
    for _ in range(rounds):  # alternating, so drift on the host lands on both
        t0 = time.perf_counter()
        new_counts.add(kernels_per_step(step, steps, DEVICE))
        new_s.append(time.perf_counter() - t0)
        trace_cpu_cuda, seconds, in_memory_cpu_cuda = old_way(step, steps)
        old_s.append(seconds)
        old_counts.add(trace_cpu_cuda)

    counts = {
        "in_memory": in_memory,
        "trace_cuda_only": trace_cuda_only,
        "trace_cpu_cuda": trace_cpu_cuda,
        "in_memory_cpu_cuda": in_memory_cpu_cuda,
    }
    agree = len(set(counts.values()) | new_counts | old_counts) == 1
    return {
        "kernels_per_step": counts,
        "agree": agree,
        "rounds_counted": {"new": sorted(new_counts), "old": sorted(old_counts)},
        "not_counted_per_step": {k: v / steps for k, v in sorted(not_counted.items())},
        "trace_device_categories_per_step": {
            k: v / steps
            for k, v in sorted(trace_cats.items())
            if k in ("kernel", "gpu_memcpy", "gpu_memset")
        },
        "seconds": {
            "in_memory_cuda_only": statistics.median(new_s),
            "trace_cpu_cuda": statistics.median(old_s),
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3, help="steps per count (kiln counts 3)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of each way")
    p.add_argument("--out", type=Path, help="also write the result, with its environment, here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("check_kernel_count.py needs a CUDA GPU; nothing to check here.")
        return 0
    results = {name: check_case(step, args.steps, args.rounds) for name, step in cases().items()}
    memcpy_memset = results["copy_memset"]["trace_device_categories_per_step"]
    doc = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "steps": args.steps,
        "agree": all(r["agree"] for r in results.values()),
        # Without both in the trace the check says nothing about leaving them out.
        "memcpy_and_memset_seen": {"gpu_memcpy", "gpu_memset"} <= set(memcpy_memset),
        "cases": results,
    }
    print(json.dumps(doc))
    if args.out:
        from torchkiln.measure.environment import collect

        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**doc, "environment": collect("cuda")}, indent=1))
    if not doc["memcpy_and_memset_seen"]:
        print("copy_memset: no memcpy or no memset reached the trace", file=sys.stderr)
    return 0 if doc["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
