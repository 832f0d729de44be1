"""Correctness against a higher-precision reference.

The rule follows PyTorch's own benchmark harness: a variant's error against an fp64 reference
may be at most ``MULTIPLIER`` times the error that eager PyTorch itself makes at the same
precision (so bf16 is judged against eager bf16, not against fp32), plus a small floor relative
to the reference's scale so exact-zero eager errors do not demand bit equality."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# (multiplier, floor relative to the RMS of the fp64 reference) by the variant's precision.
# fp32/tf32: 2x eager's own error, as PyTorch's benchmark harness does; the 1e-4 floor admits
# fp32 reassociation (errors ~1e-6 of the scale) but not TF32 (~3e-4) or bf16 (~1e-2) against an
# fp32 eager reference. bf16/fp16: 3x plus a 1e-3 floor, because a compiler legitimately moves
# the points where values are rounded to 16 bits; measured on an H200 (torch 2.11): resnet50
# inference in bf16, Inductor's logits were 2.1x as far from fp64 as eager bf16's (RMSE 0.281 vs
# 0.134 on logits of RMS 25, i.e. 1.1% relative), which a 2x rule would wrongly call a failure.
# A 5% perturbation of the outputs still fails by a wide margin (tests/test_runner.py).
TOLERANCES = {
    "fp32": (2.0, 1e-4),
    "tf32": (2.0, 1e-4),
    "bf16": (3.0, 1e-3),
    "fp16": (3.0, 1e-3),
}
MULTIPLIER, RELATIVE_FLOOR = TOLERANCES["fp32"]


def flatten_tensors(obj: Any, prefix: str = "out") -> list[tuple[str, Any]]:
    """Tensors in nested tuples/lists/dicts (Hugging Face ModelOutput is a dict), with names."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    if isinstance(obj, dict):
        out = []
        for k, v in obj.items():
            out += flatten_tensors(v, f"{prefix}.{k}")
        return out
    if isinstance(obj, (tuple, list)):
        out = []
        for i, v in enumerate(obj):
            out += flatten_tensors(v, f"{prefix}[{i}]")
        return out
    return []


def detach_to_cpu(obj: Any) -> list[tuple[str, Any]]:
    """The tensors of ``obj``, flat, as CPU copies in their own dtype: every comparison widens
    to fp64 as it reads them (exactly, from any float dtype). A bf16 output so crosses to the
    host at a quarter of fp64's bytes (GPT-2 small's logits at 8 x 512: 0.4 GB, not 1.6 GB)."""
    return [(name, _cpu(t)) for name, t in flatten_tensors(obj)]


def _cpu(t: Any) -> Any:
    out = t.detach().to("cpu")
    return out.clone() if out.data_ptr() == t.data_ptr() else out  # a copy, made once


def rmse(a: Any, b: Any) -> float:
    import torch

    if a.shape != b.shape:
        return math.inf
    if not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else math.inf
    if not a.numel():
        return math.inf  # the mean of nothing: no error measured
    # A norm rather than (a - b).pow(2).mean(): one temporary, not three (a correctness check
    # of GPT-2 small's fp64 logits at 8 x 512 took 7.8 s that way on a 2-core CPU host, 0.7 s
    # with norms).
    if torch.float64 not in (a.dtype, b.dtype):
        a = a.double()
    # In fp64 by type promotion: the narrower side is widened (exactly) element by element.
    diff = _norm(a - b) / math.sqrt(a.numel())
    return diff if math.isfinite(diff) else math.inf


def _norm(t: Any) -> float:
    """sqrt(sum(t ** 2)) in fp64."""
    import torch

    return float(torch.linalg.vector_norm(t, dtype=torch.float64))


@dataclass
class TensorCheck:
    name: str
    variant_rmse: float
    eager_rmse: float
    threshold: float
    passed: bool

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "variant_rmse": _finite(self.variant_rmse),
            "eager_rmse": _finite(self.eager_rmse),
            "threshold": _finite(self.threshold),
            "passed": self.passed,
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass
class CorrectnessReport:
    passed: bool
    checks: list[TensorCheck] = field(default_factory=list)
    rule: str = ""
    note: str = ""

    @property
    def worst_ratio(self) -> float | None:
        ratios = [c.variant_rmse / c.threshold for c in self.checks if c.threshold > 0]
        return max(ratios) if ratios else None

    def to_dict(self) -> dict:
        worst = self.worst_ratio
        return {
            "passed": self.passed,
            "rule": self.rule,
            "note": self.note,
            "worst_error_over_threshold": _finite(worst) if worst is not None else None,
            "checks": [c.to_dict() for c in self.checks],
        }


def _group(name: str) -> str:
    """Tensors of one kind share a scale: every parameter update, every output, the loss."""
    return name.split(".")[0].split("[")[0]


def _rms(tensors: list[tuple[str, Any]]) -> tuple[list[float], dict[str, float]]:
    """Each tensor's RMS (0 for one not floating, NaN for an empty one, as the mean of nothing
    is) and each group's, from one pass over each tensor."""
    sums: dict[str, list[float]] = {}
    own = []
    for name, t in tensors:
        if not (t.is_floating_point() and t.numel()):
            own.append(0.0 if not t.is_floating_point() else math.nan)
            continue
        sq = _norm(t) ** 2
        own.append(math.sqrt(sq / t.numel()))
        acc = sums.setdefault(_group(name), [0.0, 0.0])
        acc[0] += sq
        acc[1] += t.numel()
    return own, {g: math.sqrt(sq / n) for g, (sq, n) in sums.items() if n}


def errors_against(tensors: list[tuple[str, Any]], fp64: list[tuple[str, Any]]) -> list[float]:
    """The rmse of each tensor against its fp64 counterpart, in order (inf for every tensor when
    the structures differ): eager's error, which a tune computes once per workload and
    precision (runner.store.fixed) instead of loading eager's outputs in every trial."""
    if len(tensors) != len(fp64):
        return [math.inf] * len(fp64)
    return [rmse(t, r) for (_, t), (_, r) in zip(tensors, fp64, strict=True)]


def compare(
    variant: list[tuple[str, Any]],
    eager_same_precision: list[tuple[str, Any]] | None,
    fp64: list[tuple[str, Any]],
    *,
    multiplier: float = MULTIPLIER,
    relative_floor: float = RELATIVE_FLOOR,
    eager_errors: list[float] | None = None,
) -> CorrectnessReport:
    """Each list holds (name, cpu tensor) in the same order, as from ``detach_to_cpu``;
    ``eager_errors`` (errors_against of eager's outputs) may stand for eager's tensors.

    The floor's scale is the larger of the tensor's own RMS and the RMS of its group (all
    parameter updates, say): a tensor whose exact value is ~0, such as the update of an
    attention key bias (softmax ignores a constant shift of the keys, so its gradient is
    exactly zero), would otherwise be held to a zero tolerance and fail on rounding noise
    alone (bert-base train: 2e-8 for XLA against 6e-9 for eager)."""
    rule = (
        f"rmse(variant, fp64) <= {multiplier} * rmse(eager at the same precision, fp64)"
        f" + {relative_floor} * max(rms(fp64 tensor), rms(fp64 tensors of its group))"
    )
    if eager_errors is None:
        eager_errors = errors_against(eager_same_precision or [], fp64)
    if not (len(variant) == len(eager_errors) == len(fp64)):
        return CorrectnessReport(
            False, [], rule, f"output structure differs: {len(variant)} tensors vs {len(fp64)}"
        )
    own_scale, group_scale = _rms(fp64)
    checks = []
    for (name, v), e_err, (_, r), scale in zip(variant, eager_errors, fp64, own_scale, strict=True):
        v_err = rmse(v, r)
        scale = max(scale, group_scale.get(_group(name), 0.0))
        threshold = multiplier * e_err + relative_floor * scale
        passed = math.isfinite(v_err) and v_err <= threshold
        checks.append(TensorCheck(name, v_err, e_err, threshold, passed))
    return CorrectnessReport(all(c.passed for c in checks), checks, rule)
