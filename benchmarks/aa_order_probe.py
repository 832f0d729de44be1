"""Is an A/A bias a matter of build order? aa_probe (session 4, H200) found the instance built
first slower than the one built second in 3 of 3 rounds (0.4-1.2%, eager+bf16 resnet50
inference, host-bound). This probe builds K instances one after the other, then times them
round-robin (the order rotates every rep so no instance always goes first), once with Python's
garbage collector on and once with it off, and reports each instance's paired time ratio to
instance 0 (below 1: faster than the first-built). Build order explains the bias if the ratio
falls with the index in both passes; the collector if the bias shrinks with it off.

    PYTHONPATH=src python3 benchmarks/aa_order_probe.py [--instances 4] [--reps 40]
        [--place reverse]

``--place reverse`` separates the two things build order sets: every model is constructed on
the host first (in index order: where its Python and C++ objects land), then moved to the
device in reverse order (where its weights land), and timed with a plain eager inference step
(no_grad and the variant's autocast, as kiln's). If instance 0 is still the slowest, host
placement is the cause; if the order flips, device placement is.
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
from torchkiln.measure.timer import calibrate_steps, time_round_robin  # noqa: E402
from torchkiln.runner.protocol.executable import build_arm  # noqa: E402
from torchkiln.runner.protocol.settings import autocast, call_model, seed_everything  # noqa: E402
from torchkiln.runner.protocol.trial import TrialSpec  # noqa: E402
from torchkiln.workloads import load_workload  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aa_probe import add_arm_args, arm_setup  # noqa: E402


def ratios(ms: list[list[float]]) -> list[dict]:
    out = []
    for i in range(1, len(ms)):
        # ms_i / ms_0 per rep: below 1, instance i (built later) ran faster than the first-built.
        s = paired_speedup(ms[i], ms[0])
        out.append({"instance": i, "this_ms_over_first_ms": s.median, "ci95": list(s.ci95)})
    return out


def built_in_order(spec: TrialSpec, variant, k: int) -> list:
    """kiln's own arms, each built (constructed and placed) after the one before."""
    return [build_arm(spec, variant).step for _ in range(k)]


def placed_in_reverse(spec: TrialSpec, variant, k: int) -> list:
    """Constructed on the host in index order, moved to the device in reverse order."""
    import torch

    if spec.step != "infer" or variant.name != "eager":
        raise SystemExit("--place reverse times eager inference only")
    workloads = []
    for _ in range(k):
        seed_everything(spec.seed)
        workloads.append(load_workload(spec.workload, preset=spec.preset, step=spec.step))
    for w in reversed(workloads):
        w.model.to(spec.device).eval()
    fns = []
    for w in workloads:
        inputs = tuple(t.to(spec.device) for t in w.example_inputs)

        def step(m=w.model, x=inputs):
            with torch.no_grad(), autocast(spec.device, variant.precision):
                return call_model(m, x)

        fns.append(step)
    return fns


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_arm_args(p)
    p.add_argument("--instances", type=int, default=4)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--place", choices=("with-build", "reverse"), default="with-build")
    args = p.parse_args()
    spec, variant, timer = arm_setup(args)
    fns = (
        built_in_order(spec, variant, args.instances)
        if args.place == "with-build"
        else (placed_in_reverse(spec, variant, args.instances))
    )
    for fn in fns:
        for _ in range(20):
            fn()
    steps = calibrate_steps(timer, fns[0], spec.rep_ms)
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
