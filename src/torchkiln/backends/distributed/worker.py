"""One rank of a distributed trial:
``torchrun ... -m torchkiln.backends.distributed.worker SPEC RANKDIR``.

Each rank measures its own step times (paired against the eager baseline under the same
wrapper), peak memory, first losses and communication share, and writes ``rank<R>.json``.
Rank 0 also times the same variant in one plain process (the scaling reference) and merges
every rank's figures into the trial's overall result. A rank that fails writes its error and
exits non-zero, which makes torchrun end the others."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from torchkiln.runner.launch.orphan import exit_with_launcher
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.runner.protocol.worker import Phases, classify_error, write_json

LOSS_STEPS = 3  # first call + 2 warm-up steps: enough to see that updates agree across ranks
COMM_STEPS = 3


def _agree_max(value: float, device: str) -> float:
    """The largest ``value`` over ranks: every rank must run the same number of steps, or
    their collectives would pair up wrongly and hang."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _warm(step: Any, n: int) -> list[float]:
    return [float(step()) for _ in range(n)]


def _paired(timer: Any, arm: Any, base: Any, steps: int, reps: int) -> tuple[list, list]:
    import torch.distributed as dist

    var_ms, base_ms = [], []
    for i in range(reps):
        order = [(arm, var_ms), (base, base_ms)]
        for a, sink in order if i % 2 == 0 else order[::-1]:
            dist.barrier()  # every rank starts the rep together: a step waits for the slowest
            sink.append(timer.time(a.step, steps))
    return var_ms, base_ms


def _single_process(spec: TrialSpec, variant: Any, steps: int, reps: int) -> dict:
    """The same variant without any wrapper, in this process: the one-process reference that
    scaling efficiency is measured against (weak scaling: same per-rank batch). Warmed as a
    bench trial's arms are (steps and seconds), and with Dynamo's counters around it: on the
    H200 this reference read 27.8 ms for simple inductor training where its own process read
    18.8 (benchmarks/README.md), and the counters show whether it recompiled or ran eager."""
    from torchkiln.measure.stats import summarize
    from torchkiln.measure.timer import StepTimer
    from torchkiln.runner.protocol.executable import build_arm
    from torchkiln.runner.protocol.measure_trial import dynamo_counters, warm_up

    timer = StepTimer(spec.device)
    if variant.backend.name != "eager":
        import torch

        # Compile afresh, as its own process would. Without this, the new instance passed the
        # guards of the graph Dynamo had made for the DDP-wrapped model (parameters are graph
        # inputs, so guards check structure, not identity) and ran it: no new graph was made
        # (seen on the CPU with gloo). That graph was traced through DDP's wrapper, and for a
        # model larger than one gradient bucket Dynamo's DDPOptimizer splits it at bucket
        # boundaries: not what a plain run compiles.
        torch._dynamo.reset()
    before = dynamo_counters()
    arm = build_arm(replace(spec, step="train"), variant)
    losses = [float(arm.step())] + _warm(arm.step, LOSS_STEPS - 1)
    warmup = warm_up(arm, timer, spec)
    after_warmup = dynamo_counters()
    ms = [timer.time(arm.step, steps) for _ in range(reps)]
    return {
        "steady_ms": summarize(ms).to_dict(),
        "losses": losses[:LOSS_STEPS],
        "warmup": warmup,
        "dynamo_before": before,
        "dynamo_after_warmup": after_warmup,
        "dynamo_after_measure": dynamo_counters(),
    }


def measure_rank(spec: TrialSpec, out: dict[str, Any], phases: Phases) -> None:
    import torch
    import torch.distributed as dist

    from torchkiln.backends.distributed.arm import build_dist_arm, dist_unsupported
    from torchkiln.errors import UnsupportedVariant
    from torchkiln.measure.memory import MemoryTracker
    from torchkiln.measure.stats import summarize
    from torchkiln.measure.timer import StepTimer
    from torchkiln.runner.protocol.measure_trial import dynamo_counters
    from torchkiln.variants import parse_variant

    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    opts = spec.extra["dist"]
    cuda = spec.device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(local)
    device = f"cuda:{local}" if cuda else "cpu"
    spec = replace(spec, device=device)
    # Collectives give up before the trial's own timeout, so a rank stuck waiting on a hung
    # peer reports where it waited instead of being killed silently.
    pg_timeout = timedelta(seconds=max(30.0, 0.8 * float(opts["timeout_s"])))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=pg_timeout)
    world = dist.get_world_size()
    out.update(world_size=world, backend=dist.get_backend(), device=device)
    out["threads"] = torch.get_num_threads()
    torch.backends.cudnn.benchmark = spec.cudnn_benchmark  # as measure_trial sets it
    variant, baseline = parse_variant(spec.variant), parse_variant(spec.baseline)
    for v in (variant, baseline):
        reason = (
            v.backend.unsupported_reason(device)
            or v.backend.step_unsupported_reason("train")
            or dist_unsupported(v)
        )
        if reason:
            raise UnsupportedVariant(reason)
    timer = StepTimer(device)
    strategy = opts["strategy"]

    phases("build")
    with MemoryTracker(device) as mem:
        arm = build_dist_arm(spec, variant, strategy, local)
        phases("first_call")
        out["first_call_s"], loss = timer.time_once_s(arm.step)
        phases("warmup")
        losses = [float(loss)] + _warm(arm.step, spec.warmup_steps)
        one_ms = _agree_max(timer.time(arm.step, 1), device)
        extra = int(_agree_max(math.ceil(spec.warmup_s * 1e3 / max(one_ms, 1e-3)), device))
        _warm(arm.step, min(extra, 1000))
    out["memory"] = mem.report.to_dict()
    out["losses"] = losses[:LOSS_STEPS]
    out["dynamo"] = dynamo_counters()

    phases("baseline")
    base = build_dist_arm(spec, baseline, strategy, local)
    out["baseline_first_call_s"], _ = timer.time_once_s(base.step)
    _warm(base.step, spec.warmup_steps)

    phases("measure")
    steps = int(max(1, min(1000, round(spec.rep_ms / max(one_ms, 1e-3)))))
    var_ms, base_ms = _paired(timer, arm, base, steps, spec.reps)
    out.update(steps_per_rep=steps, reps=spec.reps, var_samples=var_ms, base_samples=base_ms)
    out["steady_ms"] = summarize(var_ms).to_dict()
    out["baseline_ms"] = summarize(base_ms).to_dict()
    del base

    phases("comm")
    dist.barrier()
    out["comm"] = profile_comm_safe(arm.step, device)
    out["batch_per_rank"] = arm.batch

    phases("single")
    dist.barrier()
    single = None
    if rank == 0 and opts.get("single_process", True):
        del arm
        single = _single_process(spec, variant, steps, spec.reps)
    dist.barrier()

    phases("merge")
    everyone = [None] * world
    dist.all_gather_object(everyone, {k: out.get(k) for k in _SHARED})
    if rank == 0:
        from torchkiln.measure.environment import collect

        out["trial"] = overall(variant, everyone, single)
        out["trial"]["environment"] = collect(device)


_SHARED = (
    "rank",
    "var_samples",
    "base_samples",
    "memory",
    "losses",
    "comm",
    "first_call_s",
    "batch_per_rank",
    "steady_ms",
)


def profile_comm_safe(step: Any, device: str) -> dict[str, Any]:
    """The profiler is evidence, not the measurement: if it fails the trial goes on, saying so."""
    from torchkiln.backends.distributed.comm import profile_comm

    try:
        return profile_comm(step, device, COMM_STEPS)
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
        return {"error": f"{type(exc).__name__}: {exc}", "exposed_comm_share": None}


def losses_agree(per_rank: list[list[float]], precision: str) -> dict[str, Any]:
    rtol = 1e-2 if precision in ("bf16", "fp16") else 1e-4
    ref = per_rank[0]
    worst = 0.0
    for losses in per_rank[1:]:
        for a, b in zip(ref, losses, strict=False):
            worst = max(worst, abs(a - b) / max(abs(a), 1e-12))
    return {"per_rank": per_rank, "max_rel_diff": worst, "rtol": rtol, "match": worst <= rtol}


def overall(variant: Any, ranks: list[dict], single: dict | None) -> dict[str, Any]:
    """The trial as a whole: a rep lasts as long as its slowest rank."""
    from torchkiln.measure.stats import paired_speedup, summarize

    world = len(ranks)
    var_ms = [max(r["var_samples"][i] for r in ranks) for i in range(len(ranks[0]["var_samples"]))]
    base_ms = [
        max(r["base_samples"][i] for r in ranks) for i in range(len(ranks[0]["base_samples"]))
    ]
    steady = summarize(var_ms).to_dict()
    batch = ranks[0]["batch_per_rank"]
    result: dict[str, Any] = {
        "variant": variant.spec,
        "steady_ms": steady,
        "baseline_ms": summarize(base_ms).to_dict(),
        "speedup": paired_speedup(base_ms, var_ms).to_dict(),
        "first_call_s": max(r["first_call_s"] for r in ranks),
        "memory": ranks[0]["memory"],
        "throughput_samples_s": world * batch / (steady["median"] * 1e-3) if batch else None,
        "losses": losses_agree([r["losses"] for r in ranks], variant.precision),
        "notes": ["every rank steps on the same seeded batch (weak scaling)"],
    }
    shares = [r["comm"].get("exposed_comm_share") for r in ranks if r.get("comm")]
    shares = [s for s in shares if s is not None]
    result["exposed_comm_share"] = max(shares) if shares else None
    if single:
        one = single["steady_ms"]["median"]
        result["single_process"] = single
        # Weak scaling: N ranks do N times one process's work; perfect scaling keeps the step
        # time of one process, so efficiency = one process's step time / the N-rank step time.
        result["scaling_efficiency"] = one / steady["median"]
        result["scaling_efficiency_ci95"] = [one / steady["ci95"][1], one / steady["ci95"][0]]
        ref = losses_agree([single["losses"], ranks[0]["losses"]], variant.precision)
        result["losses"]["vs_single_process"] = ref
    return result


def main(argv: list[str]) -> int:
    spec_path, rank_dir = argv
    spec = TrialSpec.from_dict(json.loads(Path(spec_path).read_text()))
    rank = int(os.environ["RANK"])
    if spec.threads:
        import torch

        torch.set_num_threads(spec.threads)
    phases = Phases(str(Path(rank_dir) / f"rank{rank}-phase.txt"))
    out: dict[str, Any] = {"rank": rank, "status": None, "reason": None}
    code = 0
    try:
        measure_rank(spec, out, phases)
        out["status"] = "ok"
        out["phase"] = "done"
    except Exception as exc:  # noqa: BLE001  (every failure becomes a reported status)
        out["failed_at"] = time.time()
        out["status"] = classify_error(exc, phases.current)
        out["reason"] = f"{type(exc).__name__} during {phases.current}: {exc}"[:4000]
        out["traceback"] = traceback.format_exc()[-8000:]
        out["phase"] = phases.current
        code = 1
    phases("done")
    out["phase_s"] = phases.seconds
    write_json(Path(rank_dir) / f"rank{rank}.json", out)
    if code == 0:
        import torch.distributed as dist

        dist.destroy_process_group()
    return code


if __name__ == "__main__":
    exit_with_launcher()  # a trial must not outlive the kiln that launched it
    sys.exit(main(sys.argv[1:]))
