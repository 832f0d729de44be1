"""A trial whose variant breaks PyTorch in its own process: every torch-side step first, then
the variant, then the comparison.

Importing torchax renames PyTorch's PrivateUse1 backend to `jax`. From then on, on torch 2.11
with CUDA, every CUDA backward pass in the process raises "PyTorch is not linked with support
for jax devices" (seen on the H200, 2026-11-29: the eager baseline of an xla training trial);
inference kept working, and on the CPU both did. So an `xla` trial cannot interleave its
baseline with the variant: it times the baseline, counts FLOPs and computes the correctness
references before the variant's first import of torchax, then builds and times the xla arm.
The speedup is a ratio of medians with an unpaired interval (`speedup.paired` is false).
"""

from __future__ import annotations

from typing import Any

from torchkiln.measure import host_load
from torchkiln.measure.kernels import kernels_per_step
from torchkiln.measure.stats import summarize, unpaired_speedup
from torchkiln.measure.timer import StepTimer, calibrate_steps
from torchkiln.runner.protocol.executable import build_arm
from torchkiln.runner.protocol.measure_trial import variant_alone, warm_up
from torchkiln.runner.protocol.references import (
    DROPOUT_NOTE,
    achieved_tflops,
    apply_correctness,
    flops_and_peak,
    judge,
    no_dropout_first,
    reference_tensors,
)
from torchkiln.runner.protocol.settings import active_dropout
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.variants import Variant

NOTE = (
    "baseline timed before the variant, not interleaved: importing torchax breaks PyTorch's "
    "CUDA autograd in its process, so the speedup is a ratio of medians (unpaired interval)"
)


def timed_reps(arm: Any, timer: StepTimer, spec: TrialSpec) -> tuple[int, list[float]]:
    steps = calibrate_steps(timer, arm.step, spec.rep_ms)
    return steps, [timer.time(arm.step, steps) for _ in range(spec.reps)]


def measure_baseline_first(
    spec: TrialSpec, variant: Variant, baseline: Variant, result: dict[str, Any], phases
) -> None:
    import torch

    timer = StepTimer(spec.device)
    result["notes"].append(NOTE)

    # 1. Everything that runs through PyTorch: the baseline's timing, FLOPs, the references.
    phases("baseline")
    base = build_arm(spec, baseline)
    dropout = spec.step == "train" and active_dropout(base.model)
    result["baseline_first_call_s"], _ = timer.time_once_s(base.step)
    warm_up(base, timer, spec)
    phases("measure_baseline")
    load_before = host_load.snapshot()
    _, base_ms = timed_reps(base, timer, spec)
    if spec.count_kernels:
        phases("kernels")
        result["baseline_kernels_per_step"] = kernels_per_step(base.step, 3, spec.device)
    del base
    if spec.device.startswith("cuda"):
        torch.cuda.empty_cache()
    flops_and_peak(spec, variant, result, phases)
    refs = reference_tensors(spec, variant, dropout, phases) if spec.check_accuracy else None

    # 2. The variant alone: first call (compilation included), warm-up, memory, reps.
    arm, first_outputs = variant_alone(spec, variant, timer, result, phases)
    phases("measure")
    steps, var_ms = timed_reps(arm, timer, spec)
    result["steps_per_rep"] = steps
    result["reps"] = spec.reps
    result["steady_ms"] = summarize(var_ms).to_dict()
    result["baseline_ms"] = summarize(base_ms).to_dict()
    result["speedup"] = unpaired_speedup(base_ms, var_ms).to_dict()
    host_load.record(result, load_before, spec.device)  # spans both arms' reps (unpaired)
    achieved_tflops(result)
    # JAX allocates outside torch's allocator, so its own peak is reported; and each new input
    # shape is an XLA recompile, timed per shape.
    report = getattr(arm, "report", None)
    if report is not None:
        result["xla"] = report()
        result["memory"]["jax_peak_bytes_in_use"] = result["xla"]["jax_peak_bytes_in_use"]
        result["notes"].extend(result["xla"]["notes"])
    if spec.count_kernels:
        result["kernels_per_step"] = None
        result["notes"].append("kernels per step are not counted for xla (outside torch)")
    del arm

    # 3. Correctness of the variant's first call against the references taken in step 1.
    check = None
    if refs is not None:
        first = no_dropout_first(spec, variant, phases) if dropout else first_outputs
        check = judge(variant, first, refs, DROPOUT_NOTE if dropout else "")
    if apply_correctness(result, check, spec.extra.get("unchecked_because", "--no-check")):
        result["status"] = "ok"


def measure_xla_trial(
    spec: TrialSpec, variant: Variant, baseline: Variant, result: dict[str, Any], phases
) -> None:
    """The xla backend's protocol (Backend.protocol): the baseline first, then the variant."""
    measure_baseline_first(spec, variant, baseline, result, phases)
    if spec.replicas > 1:
        result["notes"].append("replicas apply to in-process arms; an xla trial has one each")
