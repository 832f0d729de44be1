"""Where does an A/A bias come from? kiln's A/A (eager+bf16 resnet50 inference against itself,
two model instances timed interleaved) gave 0.9895 [0.9853, 0.9926] on an H200 in session 3:
the interval excludes 1.00, with the instance built first ~1% slower. This probe separates the
candidate causes in one process, with kiln's own arm builder, timer and paired statistics:

* ``same``: one instance timed against itself (alternating slots). Only noise can move it.
* ``round N``: two fresh instances built one after the other (first, second), timed interleaved
  exactly as a kiln trial does. A bias that follows build order shows the same sign every
  round; one that belongs to the instance (where its memory landed) changes sign at random.

    PYTHONPATH=src python3 benchmarks/aa_probe.py [--workload resnet50] [--reps 60] [--rounds 3]

Prints one JSON line: first/second speedup (baseline = second, as kiln's A/A) per round.
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
from torchkiln.runner.protocol.executable import build_arm  # noqa: E402
from torchkiln.runner.protocol.trial import TrialSpec  # noqa: E402
from torchkiln.variants import Variant, parse_variant  # noqa: E402


def interleaved(timer: StepTimer, a, b, reps: int, steps: int) -> dict:
    """a against b, alternating which goes first, as measure_trial does; speedup = b / a
    (b is the baseline slot), so a slower ``a`` reads below 1."""
    a_ms, b_ms = time_round_robin(timer, [a, b], reps, steps)
    s = paired_speedup(b_ms, a_ms)
    return {"speedup": s.median, "ci95": list(s.ci95), "a_ms": a_ms, "b_ms": b_ms}


def add_arm_args(p: argparse.ArgumentParser) -> None:
    """The arm every A/A probe times (shared with aa_order_probe.py)."""
    p.add_argument("--workload", default="resnet50")
    p.add_argument("--variant", default="eager+bf16")
    p.add_argument("--step", default="infer")
    p.add_argument("--device", default="cuda")
    p.add_argument("--preset", default="full")


def arm_setup(args: argparse.Namespace) -> tuple[TrialSpec, Variant, StepTimer]:
    spec = TrialSpec(
        workload=args.workload,
        variant=args.variant,
        step=args.step,
        device=args.device,
        preset=args.preset,
    )
    return spec, parse_variant(args.variant), StepTimer(args.device)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_arm_args(p)
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    spec, variant, timer = arm_setup(args)

    def fresh():
        arm = build_arm(spec, variant)
        for _ in range(20):
            arm.step()
        return arm

    out: dict = {"config": vars(args), "environment": collect_environment(args.device)}
    first = fresh()
    steps = calibrate_steps(timer, first.step, spec.rep_ms)
    out["steps_per_rep"] = steps
    same = interleaved(timer, first.step, first.step, args.reps, steps)
    out["same"] = same
    rounds = []
    for _ in range(args.rounds):
        del first
        gc.collect()
        first = fresh()
        second = fresh()
        rounds.append(interleaved(timer, first.step, second.step, args.reps, steps))
        del second
    out["rounds"] = rounds
    brief = {
        "same": [round(same["speedup"], 4), [round(x, 4) for x in same["ci95"]]],
        "first_vs_second": [
            [round(r["speedup"], 4), [round(x, 4) for x in r["ci95"]]] for r in rounds
        ],
    }
    print(json.dumps(brief), file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
