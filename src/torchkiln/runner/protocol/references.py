"""What a trial's outputs are judged against and what its step is counted as: the first call's
outputs (capture), the references of the correctness check (fp64 eager's outputs, eager's error
at the variant's precision and layout), the check itself, and the FLOP count. The references and
the count are the workload's fixed costs (runner.store.fixed): the same for every variant that
shares a precision and layout, computed by the first trial of a run directory that needs them,
or ahead by the tune's baseline trial (prepay)."""

from __future__ import annotations

from typing import Any

from torchkiln.measure import correctness as corr
from torchkiln.measure.flops import count_flops, peak_tflops
from torchkiln.measure.timer import StepTimer
from torchkiln.runner.protocol.executable import Arm, build_arm
from torchkiln.runner.protocol.trial import PREPAY, TrialSpec
from torchkiln.runner.store.fixed import FixedStore
from torchkiln.variants import Variant, parse_variant


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
    # Kept on the host so the snapshot does not inflate the device memory being measured, and in
    # the parameters' own dtype: capture widens it (exactly) in its subtraction. Widening here
    # as well cost resnet50's 25.6M parameters a second pass in the trial's build (0.12 s of
    # its 0.13 s snapshot on a 2-core CPU host).
    return {
        n: p.detach().to("cpu", copy=True)
        for n, p in arm.model.named_parameters()
        if p.requires_grad
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
    return references(spec, variant, dropout, store)


def references(
    spec: TrialSpec, variant: Variant, dropout: bool, store: FixedStore | None = None
) -> list:
    """reference_tensors' values, with no phase of their own."""
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


def flops(spec: TrialSpec, variant: Variant, store: FixedStore | None = None) -> int:
    """The FLOP count at the variant's precision and layout, from ``store`` where it has it."""
    ref = reference_variant(variant)
    store = store or FixedStore(None, None)  # no store: counted here
    return store.get_or_compute(
        "flops",
        {"precision": ref.precision, "channels_last": ref.channels_last},
        lambda: count_reference_flops(spec, variant),
    )


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
    result["flops_per_step"] = flops(spec, variant, store)
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


def prepay(
    spec: TrialSpec, own: Variant, dropout: bool, store: FixedStore, convolutional: bool
) -> list[list[Any]]:
    """Compute and store the FLOP count and the correctness references of every pair in
    ``spec.extra[PREPAY]`` but ``own``'s (a channels-last pair only for a convolutional model,
    the only kind the tune plans channels-last for); what was paid, as [precision,
    channels_last] pairs. Nothing without a shared store: a value kept nowhere helps no trial."""
    if not store.shared:
        return []
    eager = parse_variant("eager").backend
    done = []
    for precision, channels_last in spec.extra.get(PREPAY) or []:
        if (precision, channels_last) == (own.precision, own.channels_last):
            continue
        if channels_last and not convolutional:
            continue
        ref = Variant(backend=eager, precision=precision, channels_last=bool(channels_last))
        flops(spec, ref, store)
        if spec.check_accuracy:
            references(spec, ref, dropout, store)
        done.append([precision, bool(channels_last)])
    return done
