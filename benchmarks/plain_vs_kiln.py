"""kiln's timer against the plain loop, interleaved in one process: the check of the instrument
that host drift cannot fake.

Launch-bound steps (eager bf16) moved by 20% or more between processes minutes apart on the H200
hosts (docs/decisions.md, "The plain-loop check runs in kiln's process"), in both directions, so
comparing kiln's trial with a plain loop run later in another process tests the host, not kiln. Here
both run in one process, rep by rep, alternating which goes first: the plain loop of plain_loop.py
(its own model build, 50 steps between CUDA events) and kiln's arm and StepTimer (kiln's build,
kiln's calibrated rep length, a synchronise before each rep). The result is the paired ratio kiln /
plain with its bootstrap 95% interval. Prints one JSON line.

    PYTHONPATH=src python3 benchmarks/plain_vs_kiln.py resnet50 infer bf16 eager [--pairs 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from plain_loop import make_step, time_rep  # noqa: E402
from torchkiln.measure.kernels import kernels_per_step  # noqa: E402
from torchkiln.measure.stats import paired_speedup  # noqa: E402
from torchkiln.measure.timer import StepTimer, calibrate_steps  # noqa: E402
from torchkiln.runner.protocol.executable import build_arm  # noqa: E402
from torchkiln.runner.protocol.trial import TrialSpec  # noqa: E402
from torchkiln.variants import parse_variant  # noqa: E402

PLAIN_STEPS = 50


def kiln_variant(precision: str, mode: str) -> str:
    spec = {"eager": "eager", "default": "inductor"}.get(mode, f"inductor:mode={mode}")
    return spec if precision == "fp32" else f"{spec}+{precision}"


def compare(workload: str, step: str, precision: str, mode: str, pairs: int) -> dict:
    plain = make_step(workload, step, precision, mode)
    variant = kiln_variant(precision, mode)
    spec = TrialSpec(workload=workload, variant=variant, step=step, device="cuda")
    arm = build_arm(spec, parse_variant(variant))
    timer = StepTimer("cuda")
    for _ in range(10):
        plain()
        arm.step()
    torch.cuda.synchronize()
    steps = calibrate_steps(timer, arm.step, spec.rep_ms)
    plain_ms, kiln_ms = [], []
    for i in range(pairs):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for which in order:
            if which == 0:
                torch.cuda.synchronize()
                plain_ms.append(time_rep(plain, PLAIN_STEPS))
            else:
                kiln_ms.append(timer.time(arm.step, steps))
    ratio = paired_speedup(kiln_ms, plain_ms)  # kiln / plain, paired rep by rep
    lo, hi = ratio.ci95
    return {
        "config": [workload, step, precision, mode],
        "kiln_variant": variant,
        "pairs": pairs,
        "kiln_steps_per_rep": steps,
        "plain_steps_per_rep": PLAIN_STEPS,
        "plain_ms": statistics.median(plain_ms),
        "kiln_ms": statistics.median(kiln_ms),
        "kiln_over_plain": ratio.median,
        "kiln_over_plain_ci95": [lo, hi],
        "agree_within_10pct": 0.9 <= lo and hi <= 1.1,
        "plain_samples_ms": plain_ms,
        "kiln_samples_ms": kiln_ms,
        "kernels_per_step": {
            "plain": kernels_per_step(plain, 3, "cuda"),
            "kiln": kernels_per_step(arm.step, 3, "cuda"),
        },
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload")
    p.add_argument("step", choices=["infer", "train"])
    p.add_argument("precision", choices=["fp32", "bf16"])
    p.add_argument("mode", choices=["eager", "default", "reduce-overhead"])
    p.add_argument("--pairs", type=int, default=10)
    args = p.parse_args()
    print(json.dumps(compare(args.workload, args.step, args.precision, args.mode, args.pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
