"""One trial, in order: the variant alone (first call, warm-up, memory), then the baseline, then
interleaved paired reps, kernel counts, FLOPs, and the correctness check last (so its extra
builds cannot warm the caches that the first call is timed against). An eager baseline is two
instances, built before and after the variant (`baseline_instances`); with `replicas` k > 1,
k instances of each arm (`runner.protocol.replicas`).
A backend with a protocol of its own (`Backend.protocol`: xla, which cannot share a process's
PyTorch with its baseline) is measured by it instead."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from torchkiln.measure import host_load
from torchkiln.measure.environment import collect as collect_environment
from torchkiln.measure.kernels import counts_kernels, kernels_per_step
from torchkiln.measure.memory import MemoryTracker
from torchkiln.measure.stats import paired_speedup, summarize
from torchkiln.measure.stopping import StopRule
from torchkiln.measure.timer import StepTimer, calibrate_steps, time_round_robin
from torchkiln.runner.protocol import compile_pause, compile_pool
from torchkiln.runner.protocol.executable import Arm, build_arm
from torchkiln.runner.protocol.references import (
    apply_correctness,
    capture,
    check_correctness,
    flops_and_peak,
    prepay,
    snapshot,
)
from torchkiln.runner.protocol.replicas import build_order, replicas_record, replicated_speedup
from torchkiln.runner.protocol.settings import active_dropout
from torchkiln.runner.protocol.trial import PREPAY, TrialSpec
from torchkiln.runner.store.fixed import FixedStore, workload_key
from torchkiln.runner.store.reuse import settings_env
from torchkiln.variants import Variant, parse_variant
from torchkiln.variants.regions import model_facts


def warm_up(
    arm: Arm, timer: StepTimer, spec: TrialSpec, floor_s: float | None = None
) -> dict[str, Any]:
    """Run steps until at least `warmup_steps` and ``floor_s`` (default `warmup_s`) have passed
    (CUDA-graph recording happens on the 2nd-3rd call, so a single warm-up step would not be
    enough; the time floor lets the device's clocks settle)."""
    floor_s = spec.warmup_s if floor_s is None else floor_s
    t0 = time.perf_counter()
    steps = 0
    times = []
    while steps < spec.warmup_steps or time.perf_counter() - t0 < floor_s:
        times.append(timer.time(arm.step, 1))
        steps += 1
        if steps >= 10_000:
            break
    return {"steps": steps, "seconds": time.perf_counter() - t0, "last_ms": times[-3:]}


def dynamo_counters() -> dict[str, Any]:
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values())
    return {
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
        "graph_breaks": int(breaks),
        "graph_break_reasons": sorted(counters["graph_break"])[:20],
        "recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else 0,
        # Compiled code loaded from the compile cache instead of compiled: a first call with
        # hits was not a cold compile (a lent cache, runner/launch/compile_cache.lend).
        "cache_hits": {
            "fx_graph": int(counters["inductor"].get("fxgraph_cache_hit", 0)),
            "autograd": int(counters["aot_autograd"].get("autograd_cache_hit", 0)),
        },
    }


def variant_alone(
    spec: TrialSpec, variant: Variant, timer: StepTimer, result: dict[str, Any], phases
) -> tuple[Arm, list]:
    """Build the variant, time its first call (compilation included), warm it up; records
    first_call_s, warmup and memory. Returns the arm and the first call's outputs."""
    phases("build")
    result["compile_pauses"] = compile_pause.install(phases, variant)
    with MemoryTracker(spec.device) as mem:
        arm = build_arm(spec, variant)
        before = snapshot(arm)
        phases("first_call")
        paused = phases.paused_s
        result["first_call_s"], first_outputs = capture(arm, timer, before)
        if phases.paused_s > paused:
            # Its pauses for neighbours' timed turns (compile_pause.py) are not compile time.
            result["first_call_paused_s"] = phases.paused_s - paused
            result["first_call_s"] -= result["first_call_paused_s"]
        del before
        phases("warmup")
        result["warmup"] = warm_up(arm, timer, spec)
    result["memory"] = mem.report.to_dict()
    return arm, first_outputs


def bracketed(spec: TrialSpec, baseline: Variant) -> bool:
    """Whether the baseline is timed as two instances around the variant. Only an eager
    baseline: it builds in a second, where a compiled one (tune's head-to-head, against the
    leader) would compile twice."""
    return spec.bracket and baseline.name == "eager"


def mean_per_rep(samples: list[list[float]]) -> list[float]:
    return [sum(rep) / len(rep) for rep in zip(*samples, strict=True)]


# Build order moves a host-bound eager step: on an H200 (commit 6d93ddb, eager+bf16 resnet50 and
# bert-base inference, an A/A build-order probe) an instance built later in a process
# ran faster than the one before in 12 of 16 adjacent pairs (by 0.2-2.8%, median 0.6%), and a
# variant against itself, built first, read 0.987 [0.976, 0.995]. One baseline instance built
# before the variant and one after bracket it; their mean is the baseline of every rep. Three
# bracketed A/A runs read 1.004, 1.014 and 0.999: less biased, not unbiased (commit 6d93ddb).
INSTANCE_NOTE_BAND = 0.01


def baseline_instances(before_ms: list[float], after_ms: list[float], notes: list[str]) -> dict:
    """The two baseline instances' medians and their paired speed ratio (the one built after
    over the one built before: above 1, the first-built was slower); a note when they differ
    significantly by more than 1%."""
    ratio = paired_speedup(before_ms, after_ms)
    if ratio.significant and abs(ratio.median - 1.0) > INSTANCE_NOTE_BAND:
        notes.append(
            f"the baseline's two instances (built before and after the variant) differ by "
            f"{abs(ratio.median - 1) * 100:.1f}%: speedups closer to 1 than that are within "
            "what a rebuild of the same model moves"
        )
    return {
        "built": ["before the variant", "after the variant"],
        "median_ms": [summarize(before_ms).median, summarize(after_ms).median],
        "samples_ms": [list(before_ms), list(after_ms)],
        "after_over_before": ratio.to_dict(),
    }


def warm_baseline(arms: list[Arm], timer: StepTimer, spec: TrialSpec, result: dict) -> None:
    """Further arms' first calls and warm-ups: `warmup_steps` steps each, without the variant's
    time floor. That floor is for the device's clocks, which the variant's warm-up has just
    settled, and every arm's steps are calibrated before the reps anyway; on GPT-2 small
    inference on an H100 the floor made the two eager instances' warm-ups about 1 s of a
    trial's 6.6 s outside its compile and reps (kiln 163c5d8). Records the first arm's first
    call (`baseline_first_call_s`) and every arm's warm-up (`baseline_warmup`)."""
    warm = []
    for i, arm in enumerate(arms):
        first_s, _ = timer.time_once_s(arm.step)
        if i == 0:
            result["baseline_first_call_s"] = first_s
        warm.append(warm_up(arm, timer, spec, floor_s=0.0))
    result["baseline_warmup"] = warm


def timed_reps(
    spec: TrialSpec, timer: StepTimer, steps: list, result: dict[str, Any], speedup_of
) -> list:
    """Paired reps of every arm, the order rotating (A B, B A, ...) so drift hits every arm
    alike; each arm's steps per rep calibrated on that arm. They stop early once ``speedup_of``'s
    interval (over the samples so far) is as narrow as spec.stop_halfwidth asks
    (measure.stopping). Records the host's load and any recompilation during the reps."""
    before_reps = dynamo_counters()  # after every arm's own warm-up (a baseline may compile)
    load_before = host_load.snapshot()
    # Each arm its own steps per rep, so every arm's rep lasts about rep_ms. Calibrated on the
    # variant alone, an eager baseline nine times slower ran nine times as long: on an H200,
    # GPT-2 small inference at bf16 (reduce-overhead 2.9 ms a step against eager's 27.9 ms),
    # the two eager instances took about 95% of a trial's 17.7 s of timed reps, all of it
    # while every other trial in flight waited for its turn on the host.
    per_arm = [calibrate_steps(timer, s, spec.rep_ms) for s in steps]
    rule = StopRule(
        max_reps=spec.reps,
        halfwidth=spec.stop_halfwidth,
        min_reps=min(spec.min_reps, spec.reps),
        arms=len(steps),
    )
    reason: list[str] = []
    started = time.perf_counter()

    def known(samples: list[list[float]]) -> bool:
        done = len(samples[0])
        late = spec.max_measure_s is not None and time.perf_counter() - started > spec.max_measure_s
        why = rule.decide(done, out_of_time=late)
        if why is None and rule.may_check(done):
            speedup = speedup_of(samples)
            why = rule.decide(done, speedup.median, speedup.ci95)
        if why is not None:
            reason.append(why)
        return why is not None

    samples = time_round_robin(timer, steps, spec.reps, per_arm, until=known)
    result["steps_per_rep"] = per_arm[0]
    result["steps_per_rep_by_arm"] = per_arm
    result["reps"] = len(samples[0])
    result.update(rule.record(len(samples[0]), reason[0] if reason else "max_reps"))
    host_load.record(result, load_before, spec.device)
    result["dynamo_after_measure"] = dynamo_counters()
    if result["dynamo_after_measure"]["recompiles"] > before_reps["recompiles"]:
        result["notes"].append("recompiled during the timed reps: steady state was not reached")
    return samples


def measure_single(
    spec: TrialSpec, variant: Variant, baseline: Variant, timer: StepTimer, result, phases
) -> tuple[Arm, list, list[Arm]]:
    """One variant instance against the baseline (two instances bracketing it when eager)."""
    # 1. The variant alone: first call (compilation included), warm-up, memory. A bracketed
    # baseline's first instance is built before it (not yet run).
    early = build_arm(spec, baseline) if bracketed(spec, baseline) else None
    arm, first_outputs = variant_alone(spec, variant, timer, result, phases)
    result["dynamo"] = dynamo_counters()

    # 2. The baseline, warmed the same way.
    phases("baseline")
    bases = [early] if early is not None else []
    bases.append(build_arm(spec, baseline))
    warm_baseline(bases, timer, spec, result)

    # 3. Paired reps.
    phases("measure")
    samples = timed_reps(
        spec,
        timer,
        [arm.step] + [b.step for b in bases],
        result,
        lambda s: paired_speedup(mean_per_rep(s[1:]), s[0]),
    )
    var_ms, base_ms = samples[0], mean_per_rep(samples[1:])
    result["steady_ms"] = summarize(var_ms).to_dict()
    result["baseline_ms"] = summarize(base_ms).to_dict()
    result["speedup"] = paired_speedup(base_ms, var_ms).to_dict()
    if len(bases) > 1:
        result["baseline_instances"] = baseline_instances(samples[1], samples[2], result["notes"])
    return arm, first_outputs, bases


def measure_replicated(
    spec: TrialSpec, variant: Variant, baseline: Variant, timer: StepTimer, result, phases
) -> tuple[Arm, list, list[Arm]]:
    """k variant and k baseline instances (runner.protocol.replicas): built B V V B ..., the first
    variant instance timed alone as usual (first call, warm-up, memory), then every other
    instance's first call and warm-up, then reps over all 2k arms; the speedup's interval is
    taken over the k pairs. Returns the first variant arm and every other arm."""
    order = build_order(spec.replicas)
    arms: dict[str, list[Arm]] = {"B": [], "V": []}
    first_outputs: list = []
    for kind in order:
        if kind == "V" and not arms["V"]:
            arm, first_outputs = variant_alone(spec, variant, timer, result, phases)
            result["dynamo"] = dynamo_counters()
        else:
            phases("build")
            arm = build_arm(spec, baseline if kind == "B" else variant)
        arms[kind].append(arm)
    phases("baseline")
    warm_baseline(arms["B"] + arms["V"][1:], timer, spec, result)
    phases("measure")
    k = spec.replicas
    samples = timed_reps(
        spec,
        timer,
        [a.step for a in arms["V"] + arms["B"]],
        result,
        lambda s: replicated_speedup(s[k:], s[:k]),
    )
    var, base = samples[:k], samples[k:]
    result["steady_ms"] = summarize(mean_per_rep(var)).to_dict()
    result["baseline_ms"] = summarize(mean_per_rep(base)).to_dict()
    speedup = replicated_speedup(base, var)
    result["speedup"] = speedup.to_dict()
    result["replicas"] = replicas_record(order, base, var, speedup)
    return arms["V"][0], first_outputs, arms["B"] + arms["V"][1:]


def baseline_kernels(spec: TrialSpec, baseline: Variant, arm: Arm, store: FixedStore) -> Any:
    """The baseline's kernels per step: the same arm in every trial of a workload, so counted
    once, a fixed cost in ``store``, where there is a device to count on (a GPT-2 trial's
    `kernels` phase, both counts, took 0.2-0.3 s on an H100 host alone and 0.8-1.0 s beside
    seven other trials; resnet50 training's 1.0-2.1 s)."""

    def count() -> Any:
        return kernels_per_step(arm.step, 3, spec.device)

    if not counts_kernels(spec.device):
        return count()
    return store.get_or_compute("baseline_kernels", {"baseline": baseline.spec}, count)


def fixed_store(
    fixed_dir: Path | None, spec: TrialSpec, result: dict[str, Any], arm: Arm, env: dict
) -> FixedStore:
    """Where this trial finds and leaves its workload's fixed costs (runner.store.fixed);
    ``env``: the settings the trial started with."""
    if fixed_dir is None:
        return FixedStore(None, None)
    gpu = result["environment"].get("gpu") or {}
    inputs = arm.workload.example_inputs
    return FixedStore(fixed_dir, workload_key(spec, gpu.get("name"), inputs, env))


def measure_trial(
    spec: TrialSpec, result: dict[str, Any], phases, fixed_dir: Path | None = None
) -> None:
    """``fixed_dir``: the run directory's store of fixed costs (runner.store.fixed); None
    computes them all in this trial."""
    import torch

    # The settings as launched: a compile writes variables of its own into the process
    # (Inductor's default cache directory, the path of its bundled ptxas), which must not key
    # the store apart. On an H200 host a reduce-overhead trial's key differed from its
    # neighbours' (a variable so written is the likeliest difference) and it computed GPT-2's
    # 1.6 GB fp64 reference again (commit dc32300).
    launch_env = settings_env()
    variant = parse_variant(spec.variant)
    baseline = parse_variant(spec.baseline)
    result["variant"] = variant.spec
    result["baseline"] = baseline.spec
    result["changes_numerics"] = variant.changes_numerics
    torch.backends.cudnn.benchmark = spec.cudnn_benchmark
    result["settings"] = {
        "seed": spec.seed,
        "threads": torch.get_num_threads(),
        "cudnn_benchmark": spec.cudnn_benchmark,
        "tf32": {"variant": variant.precision == "tf32", "baseline": baseline.precision == "tf32"},
        "precision": {"variant": variant.precision, "baseline": baseline.precision},
    }
    # Its own phase: a trial's "start" took 10-14 s on a busy H200 host (commit 65f0de3), and the
    # environment (CUDA initialisation, nvidia-smi) is the suspect.
    phases("environment")
    result["environment"] = collect_environment(spec.device)
    phases("setup")
    for v in (variant, baseline):
        reason = v.backend.unsupported_reason(spec.device) or v.backend.step_unsupported_reason(
            spec.step
        )
        if reason:
            result["status"], result["reason"] = "unsupported", reason
            return
    timer = StepTimer(spec.device)
    protocol = variant.backend.protocol
    if protocol is not None:
        protocol(spec, variant, baseline, result, phases)
        return

    nice = compile_pool.nice_steps()
    if nice and (variant.backend.compiles_in_pool or baseline.backend.compiles_in_pool):
        # Before any build, so that this trial's compile workers yield to its neighbours'
        # builds, warm-ups and checks (compile_pool.py).
        result["compile_pool"] = compile_pool.start_lowered(nice)
    measure = measure_replicated if spec.replicas > 1 else measure_single
    arm, first_outputs, bases = measure(spec, variant, baseline, timer, result, phases)
    result["notes"].extend(host_load.unsteady_notes(result))
    facts = model_facts(arm.workload) if variant.backend.name == "eager" else None
    if facts is not None:
        # Read here, from the build the trial made anyway, for the tune's plan.
        result["model_facts"] = facts
    dropout = spec.step == "train" and active_dropout(arm.model)
    store = fixed_store(fixed_dir, spec, result, arm, launch_env)
    if store.dir is not None:
        # Trials of one workload share a store only under one key: its digest shows a split.
        result["fixed_store"] = store.dir.name

    # 4. Kernels per step (profiler; CUDA only).
    if spec.count_kernels:
        phases("kernels")
        result["kernels_per_step"] = kernels_per_step(arm.step, 3, spec.device)
        result["baseline_kernels_per_step"] = baseline_kernels(spec, baseline, bases[0], store)
        if result["kernels_per_step"] is None:
            result["notes"].append("kernels per step are counted on CUDA devices only")
    del bases, arm
    if spec.device.startswith("cuda"):
        torch.cuda.empty_cache()

    # 5. FLOPs of the math (counted on eager, the same for every variant) and % of peak.
    flops_and_peak(spec, variant, result, phases, store)
    result["fixed_costs"] = store.record()

    # 6. Correctness against eager at the same precision and an fp64 reference. A trial stopped
    # during it (its second compile can be the slowest phase) still reports what it measured.
    phases.save_partial(result)
    report = (
        check_correctness(spec, variant, first_outputs, dropout, phases, store)
        if spec.check_accuracy
        else None
    )
    result["fixed_costs"] = store.record()
    if apply_correctness(result, report, spec.extra.get("unchecked_because", "--no-check")):
        result["status"] = "ok"
        # 7. A tune's baseline trial: the fixed costs of the precisions and layouts the search
        # will measure at, paid here once instead of by each of its trials.
        if facts is not None and spec.extra.get(PREPAY) and store.shared:
            pay_ahead(spec, variant, dropout, store, facts["convolutional"], result, phases)
    result["notes"].extend(store.notes)


def pay_ahead(
    spec: TrialSpec,
    own: Variant,
    dropout: bool,
    store: FixedStore,
    convolutional: bool,
    result: dict[str, Any],
    phases,
) -> None:
    """references.prepay in its own phase (`fixed_costs`), recorded in ``fixed_costs.paid_ahead``;
    a failure there is a note (each trial then computes its own), never the baseline's status."""
    phases("fixed_costs")
    try:
        paid = prepay(spec, own, dropout, store, convolutional)
    except Exception as exc:  # noqa: BLE001  (the baseline stands; its neighbours pay their own)
        result["notes"].append(
            f"the fixed costs of the search's precisions were not computed ahead "
            f"({type(exc).__name__}: {exc}); each trial computes its own"
        )
        return
    result["fixed_costs"]["paid_ahead"] = paid
