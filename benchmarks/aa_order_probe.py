"""Is an A/A bias a matter of build order? aa_probe (session 4, H200) found the instance built
first slower than the one built second in 3 of 3 rounds (0.4-1.2%, eager+bf16 resnet50
inference, host-bound). This probe builds K instances one after the other, then times them
round-robin (the order rotates every rep so no instance always goes first), once with Python's
garbage collector on and once with it off, and reports each instance's paired time ratio to
instance 0 (below 1: faster than the first-built). Build order explains the bias if the ratio
falls with the index in both passes; the collector if the bias shrinks with it off.

    PYTHONPATH=src python3 benchmarks/aa_order_probe.py [--instances 4] [--reps 40]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from torchkiln.measure.environment import collect as collect_environment  # noqa: E402
from torchkiln.measure.stats import paired_speedup  # noqa: E402
from torchkiln.measure.timer import StepTimer, calibrate_steps, time_round_robin  # noqa: E402
from torchkiln.runner.executable import build_arm  # noqa: E402
from torchkiln.runner.trial import TrialSpec  # noqa: E402
from torchkiln.variants import parse_variant  # noqa: E402


def ratios(ms: list[list[float]]) -> list[dict]:
    out = []
    for i in range(1, len(ms)):
        # ms_i / ms_0 per rep: below 1, instance i (built later) ran faster than the first-built.
        s = paired_speedup(ms[i], ms[0])
        out.append({"instance": i, "this_ms_over_first_ms": s.median, "ci95": list(s.ci95)})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload", default="resnet50")
    p.add_argument("--variant", default="eager+bf16")
    p.add_argument("--step", default="infer")
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="full")
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--reps", type=int, default=40)
    args = p.parse_args()
    spec = TrialSpec(
        workload=args.workload,
        variant=args.variant,
        step=args.step,
        device=args.device,
        preset=args.preset,
    )
    variant = parse_variant(args.variant)
    timer = StepTimer(args.device)
    arms = []
    for _ in range(args.instances):
        arm = build_arm(spec, variant)
        for _ in range(20):
            arm.step()
        arms.append(arm)
    steps = calibrate_steps(timer, arms[0].step, spec.rep_ms)
    fns = [a.step for a in arms]
    out: dict = {"config": vars(args), "environment": collect_environment(args.device)}
    out["steps_per_rep"] = steps
    passes = {}
    for name in ("gc_on", "gc_off"):
        if name == "gc_off":
            gc.collect()
            gc.disable()
        ms = time_round_robin(timer, fns, args.reps, steps)
        gc.enable()
        passes[name] = {"ratios": ratios(ms), "ms": ms}
    out["passes"] = passes
    brief = {
        n: [[round(r["this_ms_over_first_ms"], 4), [round(x, 4) for x in r["ci95"]]] for r in rs]
        for n, rs in ((n, v["ratios"]) for n, v in passes.items())
    }
    print(json.dumps(brief), file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
