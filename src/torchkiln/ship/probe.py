"""One route measured as production meets it: ``python -m torchkiln.ship.probe JOB.json OUT.json``.

A fresh process with an empty compile cache builds the workload's model, calls
`torchkiln.load(DIR, model, route=...)`, and times the load, the first call, each of the next
calls (under CUDA graphs the graph is recorded on a later call, so the first fast output can
come after the first call), and the steady step with kiln's StepTimer. Where Dynamo keeps them,
the seconds of each compile phase are kept too, to say where a slow first call goes, and the
number of frames Dynamo traced."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

EARLY_CALLS = 5
# Before the steady reps, calls for this long, as a trial warms its arms up: the steady step of
# a process is compared with another process's, so neither may be read while still settling.
WARMUP_S = 0.5
STEADY_REPS = 11
STEADY_REP_MS = 100.0


def _compile_phases() -> dict[str, float]:
    """Dynamo's per-phase compile seconds (tracing, AOT, Inductor, ...), where it keeps them."""
    from torch._dynamo import utils

    spent = getattr(utils, "calculate_time_spent", None)
    if spent is None:
        return {}
    try:
        return {str(k): round(float(v), 4) for k, v in spent().items()}
    except (TypeError, ValueError, AttributeError) as exc:
        return {"unavailable": str(exc)}


def _dynamo_frames() -> int:
    """Frames Dynamo traced in this process (none, where a precompiled function served)."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["ok"])


def measure(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    from torchkiln.measure.timer import StepTimer, calibrate_steps
    from torchkiln.runner.protocol.settings import map_tensors
    from torchkiln.ship.build import call, train_call, workload_for
    from torchkiln.ship.load import load
    from torchkiln.ship.manifest import read_manifest

    ship_dir = Path(job["ship_dir"])
    m = read_manifest(ship_dir)
    device, step = m["device"], m["step"]
    wl = workload_for(m)
    model = wl.model.to(device)
    if step == "train":
        model.train()
    inputs = map_tensors(wl.example_inputs, lambda t: t.to(device))
    timer = StepTimer(device)
    t0 = time.perf_counter()
    shipped = load(ship_dir, model, route=job["route"])
    load_s = time.perf_counter() - t0

    def one() -> Any:
        if step == "infer":
            return call(shipped, inputs)
        return train_call(shipped, wl, inputs, device)

    first_s, out = timer.time_once_s(one)
    if job.get("output"):
        torch.save([t.detach().cpu() for t in _tensors(out)], job["output"])
    early = [timer.time_once_s(one)[0] * 1e3 for _ in range(EARLY_CALLS)]
    phases = _compile_phases()
    warmed = 0.0
    while warmed < WARMUP_S:
        warmed += timer.time_once_s(one)[0]
    steps = calibrate_steps(timer, one, STEADY_REP_MS)
    samples = [timer.time(one, steps) for _ in range(STEADY_REPS)]
    steady = statistics.median(samples)
    if job.get("pair_socket"):
        serve_reps(job["pair_socket"], lambda: timer.time(one, steps))
    # The first fast output: the first call, or the later one from which calls run near steady.
    fast_at, elapsed = 0, first_s
    if first_s * 1e3 > 2 * steady + 1.0:
        for i, ms in enumerate(early, start=1):
            elapsed += ms / 1e3
            if ms <= 2 * steady + 1.0:
                fast_at = i
                break
    return {
        "route": shipped.kiln_route,
        "reason": shipped.kiln_reason,
        "load_s": load_s,
        "load_phases_s": shipped.kiln_load_phases,
        "first_call_s": first_s,
        "first_fast_s": load_s + elapsed,
        "first_fast_call": fast_at + 1,
        "early_calls_ms": early,
        "steady_ms": {"median": steady, "samples": samples, "steps_per_rep": steps},
        "compile_phases_s": phases,
        "dynamo_frames": _dynamo_frames(),
        "fallback_calls": shipped.kiln_fallback_calls,
        "fallback_reason": shipped.kiln_fallback_reason,
    }


def serve_reps(address: str, rep: Callable[[], float]) -> int:
    """Timed reps on the parent's request (ship.pairing): connects to ``address`` and answers
    each `rep` line with the rep's milliseconds per step, until `exit` or the parent is gone.
    Returns the reps served."""
    import socket

    served = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(address)
        with conn.makefile("rwb") as stream:
            for line in stream:
                if line.strip() != b"rep":
                    break
                stream.write(f"{rep()!r}\n".encode())
                stream.flush()
                served += 1
    return served


def _tensors(out: Any) -> list[Any]:
    """The output's tensors, flat (logits of a Hugging Face output, the loss of a training step).
    Other objects in it (a decoder's DynamicCache) are left out: the file must load with
    `torch.load(weights_only=True)`."""
    import torch

    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _tensors(v)]
    return []


def main(argv: list[str]) -> int:
    from torchkiln.ship.child import child_main

    return child_main(argv, measure, lambda job: {"route": job.get("route")})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
