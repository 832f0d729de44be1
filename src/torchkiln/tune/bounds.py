"""Candidates the device's arithmetic rules out before they are measured.

A step cannot run faster than its FLOPs at the device's peak rate for the candidate's
precision. When that floor is well above the fastest step already measured (a correct,
allowed variant), the candidate cannot win, and the search does not spend its budget on it.
The FLOPs are the workload's, counted on the eager baseline (matmuls, convolutions and attention
only, so the true work is larger and the floor lower than the truth); the peak is the datasheet's
dense rate (measure.flops.PEAK_TFLOPS, KILN_PEAK_TFLOPS). Without both, nothing is ruled out.

On an H200, GPT-2 small inference at 8 x 512 is 1.09 TFLOP a step: at fp32 (66.9 TFLOP/s, TF32
off as kiln's fp32 arm runs) no step can take under 16.3 ms, while reduce-overhead at bf16 ran
2.9 ms. A tune with bf16 allowed planned six compiled fp32 candidates (two of them autotuned,
estimated at 200 and 218 s); compiled fp32 measured 25.5 ms."""

from __future__ import annotations

from typing import Any

from torchkiln.measure.flops import peak_tflops
from torchkiln.tune.select import candidates_pool, step_s
from torchkiln.variants import parse_variant

# The floor is a lower bound on a correct step of the same work: the count leaves elementwise
# work out and no step beats the datasheet's dense peak (the H200 reached 80% of its bf16 peak on
# an 8192^3 product). It fails only where a compile drops counted work eager ran (dead code), and
# the mark is itself a measurement; the margin covers both. At 1.5 the rule flipped between two
# 8-minute resnet50 training tunes on one H100 (tune8-resnet50-results.json in tune_speed/h100 at
# commits 9fa5167 and 02a725f): an fp32 floor of 11.62 ms against a fastest bf16 step of 7.67 ms
# (1.52x: six candidates ruled out) and 8.20 ms (1.42x: none, and four fp32 compiles stopped at
# their caps). At 1.2 both tunes rule them out.
MARGIN = 1.2


def floor_ms(flops: float, peak: float) -> float:
    """Milliseconds a step of ``flops`` takes at ``peak`` TFLOP/s."""
    return flops / (peak * 1e12) * 1e3


def ruled_out(
    spec: str,
    results: list[dict[str, Any]],
    eager: dict[str, Any],
    allow_precision: set[str] | frozenset[str] = frozenset(),
) -> str | None:
    """Why ``spec`` cannot beat the fastest step measured so far, or None."""
    flops = eager.get("flops_per_step")
    gpu = ((eager.get("environment") or {}).get("gpu") or {}).get("name")
    if not flops or not gpu:
        return None
    precision = parse_variant(spec).precision
    peak, source = peak_tflops(gpu, precision)
    if not peak:
        return None
    # The mark: the fastest step of a correct, allowed variant (eager's own included), on the
    # eager trial's clock (select.step_s: paired ratios, not medians of different processes).
    pool, _ = candidates_pool(results, allow_precision)
    fastest = min(pool, key=lambda r: step_s(r, eager), default=None)
    if fastest is None:
        return None
    floor, step = floor_ms(flops, peak), step_s(fastest, eager) * 1e3
    if floor <= MARGIN * step:
        return None
    return (
        f"cannot win: at {precision} a step needs at least {floor:.2f} ms ({flops / 1e9:.0f} "
        f"GFLOP at {peak:g} TFLOP/s, {source}), over {MARGIN:g}x the {step:.2f} ms of "
        f"{fastest['variant']}"
    )
