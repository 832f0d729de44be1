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

from torchkiln.measure import correctness as corr
from torchkiln.measure import host_load
from torchkiln.measure.environment import collect as collect_environment
from torchkiln.measure.flops import count_flops, peak_tflops
from torchkiln.measure.kernels import kernels_per_step
from torchkiln.measure.memory import MemoryTracker
from torchkiln.measure.stats import paired_speedup, summarize
from torchkiln.measure.stopping import StopRule
from torchkiln.measure.timer import StepTimer, calibrate_steps, time_round_robin
from torchkiln.runner.protocol.executable import Arm, build_arm
from torchkiln.runner.protocol.replicas import build_order, replicas_record, replicated_speedup
from torchkiln.runner.protocol.settings import active_dropout
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.runner.store.fixed import FixedStore, workload_key
from torchkiln.variants import Variant, parse_variant
from torchkiln.variants.regions import model_facts


def warm_up(arm: Arm, timer: StepTimer, spec: TrialSpec) -> dict[str, Any]:
    """Run steps until at least `warmup_steps` and `warmup_s` have passed (CUDA-graph recording
    happens on the 2nd-3rd call, so a single warm-up step would not be enough)."""
    t0 = time.perf_counter()
    steps = 0
    times = []
    while steps < spec.warmup_steps or time.perf_counter() - t0 < spec.warmup_s:
        times.append(timer.time(arm.step, 1))
        steps += 1
        if steps >= 10_000:
            break
    return {"steps": steps, "seconds": time.perf_counter() - t0, "last_ms": times[-3:]}


def capture(arm: Arm, timer: StepTimer, params_before: dict | None) -> tuple[float, list]:
    """Time the first call and keep what the correctness check compares: the outputs for
    inference; for training the loss and each parameter's first update (SGD: -lr * grad)."""
    seconds, out = timer.time_once_s(arm.step)
    tensors = corr.detach_to_cpu(out)
    if params_before is not None:
        tensors = [("loss", tensors[0][1])] + [
            (f"update.{name}", p.detach().to("cpu").double() - params_before[name])
            for name, p in arm.model.named_parameters()
            if name in params_before
        ]
    return seconds, tensors


def snapshot(arm: Arm) -> dict | None:
    if arm.workload.step != "train":
        return None
    # Kept on the host so the snapshot does not inflate the device memory being measured.
    return {
        n: p.detach().to("cpu", copy=True).double()
        for n, p in arm.model.named_parameters()
        if p.requires_grad
    }


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


def reference_variant(variant: Variant) -> Variant:
    """Eager at the variant's own precision and layout: what the error is judged against."""
    return Variant(
        backend=parse_variant("eager").backend,
        precision=variant.precision,
        channels_last=variant.channels_last,
    )


def reference_tensors(
    spec: TrialSpec, variant: Variant, dropout: bool, phases, store: FixedStore | None = None
) -> list:
    """What the variant's first call is judged against: eager's error at its precision and
    layout (per tensor, against fp64), then the fp64 outputs; each the same for every variant
    of the workload that shares them: computed once per run directory (runner.store.fixed).
    Eager's error is kept rather than its outputs: a trial then loads one set of outputs, not
    two (GPT-2 small's logits at 8 x 512 are 1.6 GB in fp64; loading and comparing two such
    sets took 4-9 s of a trial's correctness check on an H200 host)."""
    phases("correctness")
    timer = StepTimer(spec.device)

    def first_call(ref_variant: Variant, fp64: bool) -> list:
        arm = build_arm(spec, ref_variant, fp64=fp64, no_dropout=dropout)
        _, tensors = capture(arm, timer, snapshot(arm))
        return tensors

    store = store or FixedStore(None, None)  # no store: computed here
    fp64 = store.get_or_compute(
        "fp64_reference", {"no_dropout": dropout}, lambda: first_call(parse_variant("eager"), True)
    )
    ref = reference_variant(variant)
    eager_errors = store.get_or_compute(
        "eager_error",
        {"precision": ref.precision, "channels_last": ref.channels_last, "no_dropout": dropout},
        lambda: corr.errors_against(first_call(ref, False), fp64),
    )
    return [eager_errors, fp64]


def no_dropout_first(spec: TrialSpec, variant: Variant, phases) -> list:
    """Dropout masks differ between eager and compiled RNG, so the check uses a second
    instance with p=0 (its compile is not timed)."""
    phases("correctness_compile")
    arm = build_arm(spec, variant, no_dropout=True)
    _, first = capture(arm, StepTimer(spec.device), snapshot(arm))
    del arm
    return first


DROPOUT_NOTE = "dropout set to p=0 for the check (a second instance, compiled apart)"


def judge(variant: Variant, first: list, refs: list, note: str) -> dict[str, Any]:
    multiplier, floor = corr.TOLERANCES[variant.precision]
    report = corr.compare(
        first, None, refs[1], multiplier=multiplier, relative_floor=floor, eager_errors=refs[0]
    )
    report.note = note
    return report.to_dict()


def check_correctness(
    spec: TrialSpec, variant: Variant, first: list, dropout: bool, phases, store: FixedStore
) -> dict[str, Any]:
    if dropout:
        first = no_dropout_first(spec, variant, phases)
    refs = reference_tensors(spec, variant, dropout, phases, store)
    return judge(variant, first, refs, DROPOUT_NOTE if dropout else "")


def apply_correctness(
    result: dict[str, Any], report: dict[str, Any] | None, why_unchecked: str = "--no-check"
) -> bool:
    """Record the check; False (and status accuracy_fail with the reason) when it failed."""
    if report is None:
        result["correctness"] = None
        result["notes"].append(f"correctness check skipped ({why_unchecked})")
        return True
    result["correctness"] = report
    if report["passed"]:
        return True
    result["status"] = "accuracy_fail"
    worst = report["worst_error_over_threshold"]
    shown = f"error {worst:.3g}x the allowed threshold" if worst else None
    result["reason"] = shown or report["note"] or "outputs differ"
    return False


def count_reference_flops(spec: TrialSpec, variant: Variant) -> int:
    flop_arm = build_arm(spec, reference_variant(variant))
    flop_arm.step()  # a first step outside the counter: lazy init must not be counted
    return count_flops(flop_arm.step)


def flops_and_peak(
    spec: TrialSpec,
    variant: Variant,
    result: dict[str, Any],
    phases,
    store: FixedStore | None = None,
) -> None:
    """FLOPs of the math (counted on eager at the variant's precision and layout, the same for
    every variant that shares them: counted once per run directory) and % of peak; the
    achieved rate needs result["steady_ms"]."""
    phases("flops")
    ref = reference_variant(variant)
    store = store or FixedStore(None, None)  # no store: counted here
    result["flops_per_step"] = store.get_or_compute(
        "flops",
        {"precision": ref.precision, "channels_last": ref.channels_last},
        lambda: count_reference_flops(spec, variant),
    )
    gpu = result["environment"].get("gpu") or {}
    peak, source = peak_tflops(gpu.get("name"), variant.precision)
    result["peak_tflops"] = peak
    result["peak_source"] = source
    achieved_tflops(result)


def achieved_tflops(result: dict[str, Any]) -> None:
    flops, peak = result.get("flops_per_step"), result.get("peak_tflops")
    steady = result.get("steady_ms")
    achieved = flops / (steady["median"] * 1e-3) / 1e12 if flops and steady else None
    result["achieved_tflops"] = achieved
    result["pct_of_peak"] = 100.0 * achieved / peak if achieved and peak else None


def variant_alone(
    spec: TrialSpec, variant: Variant, timer: StepTimer, result: dict[str, Any], phases
) -> tuple[Arm, list]:
    """Build the variant, time its first call (compilation included), warm it up; records
    first_call_s, warmup and memory. Returns the arm and the first call's outputs."""
    phases("build")
    with MemoryTracker(spec.device) as mem:
        arm = build_arm(spec, variant)
        before = snapshot(arm)
        phases("first_call")
        result["first_call_s"], first_outputs = capture(arm, timer, before)
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


def warm_baseline(arm: Arm, timer: StepTimer, spec: TrialSpec) -> float:
    """A further arm's first call (seconds) and warm-up, as the variant's."""
    first_s, _ = timer.time_once_s(arm.step)
    warm_up(arm, timer, spec)
    return first_s


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
    result["baseline_first_call_s"] = warm_baseline(bases[0], timer, spec)
    for base in bases[1:]:
        warm_baseline(base, timer, spec)

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
    result["baseline_first_call_s"] = warm_baseline(arms["B"][0], timer, spec)
    for arm in arms["B"][1:] + arms["V"][1:]:
        warm_baseline(arm, timer, spec)
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


def fixed_store(
    fixed_dir: Path | None, spec: TrialSpec, result: dict[str, Any], arm: Arm
) -> FixedStore:
    """Where this trial finds and leaves its workload's fixed costs (runner.store.fixed)."""
    if fixed_dir is None:
        return FixedStore(None, None)
    gpu = result["environment"].get("gpu") or {}
    return FixedStore(fixed_dir, workload_key(spec, gpu.get("name"), arm.workload.example_inputs))


def measure_trial(
    spec: TrialSpec, result: dict[str, Any], phases, fixed_dir: Path | None = None
) -> None:
    """``fixed_dir``: the run directory's store of fixed costs (runner.store.fixed); None
    computes them all in this trial."""
    import torch

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

    measure = measure_replicated if spec.replicas > 1 else measure_single
    arm, first_outputs, bases = measure(spec, variant, baseline, timer, result, phases)
    if variant.backend.name == "eager":
        # Read here, from the build the trial made anyway, for the tune's plan.
        result["model_facts"] = model_facts(arm.workload)
    dropout = spec.step == "train" and active_dropout(arm.model)
    store = fixed_store(fixed_dir, spec, result, arm)

    # 4. Kernels per step (profiler; CUDA only).
    if spec.count_kernels:
        phases("kernels")
        result["kernels_per_step"] = kernels_per_step(arm.step, 3, spec.device)
        result["baseline_kernels_per_step"] = kernels_per_step(bases[0].step, 3, spec.device)
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
    result["notes"].extend(store.notes)
    if apply_correctness(result, report, spec.extra.get("unchecked_because", "--no-check")):
        result["status"] = "ok"
