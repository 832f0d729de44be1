"""Why did kiln time resnet50 bf16 eager inference at 6.4 ms/step when a plain loop gave 9.8?

One process, one model, several ways of timing the same step, each with its kernel count:
  plain-50   the plain loop of plain_loop.py (50 back-to-back steps between events)
  plain-10   the same with 10-step reps and a synchronize before each rep (kiln's rep shape)
  single     one synchronised step at a time (kiln's warm-up)
  kiln-arm   kiln's own build_arm step timed by kiln's StepTimer with 10-step reps
  host       host wall clock per step over 50 steps (synchronised at the end only)

    PYTHONPATH=src python3 benchmarks/diagnose_plain_gap.py [--workload resnet50] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from plain_loop import build, time_rep  # noqa: E402
from torchkiln.measure.kernels import kernels_per_step  # noqa: E402
from torchkiln.measure.timer import StepTimer  # noqa: E402
from torchkiln.runner.protocol.executable import build_arm  # noqa: E402
from torchkiln.runner.protocol.trial import TrialSpec  # noqa: E402
from torchkiln.variants import parse_variant  # noqa: E402


def events_ms(fn, steps: int, reps: int, sync_each_rep: bool) -> list[float]:
    out = []
    for _ in range(reps):
        if sync_each_rep:
            torch.cuda.synchronize()
        out.append(time_rep(fn, steps))  # the plain loop's own rep
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workload", default="resnet50")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, x, _, fwd = build(args.workload, "infer")
    model.eval()

    def plain_step():
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            return fwd(model, x)

    spec = TrialSpec(workload=args.workload, variant="eager+bf16", device="cuda")
    arm = build_arm(spec, parse_variant("eager+bf16"))
    for _ in range(10):
        plain_step()
        arm.step()
    torch.cuda.synchronize()
    rows = {}
    rows["plain-50"] = events_ms(plain_step, 50, 5, sync_each_rep=False)
    rows["plain-10"] = events_ms(plain_step, 10, 10, sync_each_rep=True)
    rows["single"] = events_ms(plain_step, 1, 20, sync_each_rep=True)
    rows["kiln-arm"] = [StepTimer("cuda").time(arm.step, 10) for _ in range(10)]
    rows["kiln-arm-50"] = events_ms(arm.step, 50, 5, sync_each_rep=False)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50):
        plain_step()
    torch.cuda.synchronize()
    rows["host-plain"] = [(time.perf_counter() - t0) * 1e3 / 50]
    result = {
        "workload": args.workload,
        "median_ms": {k: statistics.median(v) for k, v in rows.items()},
        "samples_ms": rows,
        "kernels_per_step": {
            "plain": kernels_per_step(plain_step, 3, "cuda"),
            "kiln-arm": kernels_per_step(arm.step, 3, "cuda"),
        },
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    for k, v in result["median_ms"].items():
        print(f"{k:12s} {v:8.3f} ms/step")
    print("kernels/step", result["kernels_per_step"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
