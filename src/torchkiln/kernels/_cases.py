"""What `kiln kernels bench` and benchmarks/bench_kernels.py measure: for each kernel and direction,
the kiln call, the same expression in eager PyTorch (also compiled with torch.compile), the fp32
reference all three are checked against, and the bytes the operation must move.

Bytes are the operation's compulsory traffic, the same for every implementation, so GB/s ratios are
time ratios. With M rows of N elements of s bytes:
  softmax         fwd  read x, write y                                2*M*N*s
                  bwd  read y and dy, write dx                        3*M*N*s
  masked_softmax  fwd  read scores, write y, read the mask once at    2*M*N*s + mask.numel()*mask_s
                       its own (unbroadcast) size
                  bwd  read y and dy, write dscores (no mask needed)  3*M*N*s
  bias_act_scale  fwd  read x and bias, write y                       2*M*N*s + N*s
                  bwd  read x, bias and dy, write dx and dbias        3*M*N*s + 2*N*s
Reading an input twice (the looped softmax's second pass, a broadcast mask per head) is the
implementation's cost and is not counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from torchkiln.kernels.bench_names import DTYPE_NAMES, KERNELS

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))
# Attention shape for masked_softmax: the M rows are [1, HEADS, M // HEADS] queries, with a bool
# [1, 1, Q, K] mask shared by the heads (a padding/causal mask), scale 1/sqrt(64).
HEADS, ATTN_SCALE = 8, 0.125
BIAS_ACT, BIAS_SCALE = "gelu", 0.5
# Normalised max error (max|got - ref| / max|ref|) an implementation may show and still count as
# computing the expression: a few ulps of each dtype, since eager rounds every intermediate.
CHECK_TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 4e-3}


@dataclass
class Case:
    """One (kernel, direction, dtype, M, N) with its three implementations, all on `device`."""

    kernel: str
    direction: str
    dtype: torch.dtype
    rows: int
    cols: int
    bytes: int
    kiln: Callable[[], Any]
    eager: Callable[..., Any]  # also what torch.compile compiles
    args: tuple  # eager(*args) is the expression
    reference: Any  # the expression on the inputs upcast to fp32
    device: str
    # Other kiln implementations of the same case, measured beside `kiln` (e.g. the looped
    # softmax where the single-block kernel is the default), named as the arms they become.
    alternatives: dict[str, Callable[[], Any]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        dt = next(k for k, v in DTYPES.items() if v == self.dtype)
        return f"{self.kernel} {self.direction} {dt} {self.rows}x{self.cols}"


def _masked_expr(scores: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    # How it is written in eager PyTorch: every step materialises a tensor. nan_to_num turns the
    # 0/0 of a fully masked row into the zeros kiln gives.
    z = (scores * scale).masked_fill(~mask, float("-inf"))
    return torch.softmax(z, dim=-1).nan_to_num(0.0)


def _softmax_bwd_expr(y: torch.Tensor, dy: torch.Tensor, scale: float) -> torch.Tensor:
    # The kernel autograd runs for softmax's backward; Inductor decomposes the same op.
    return torch._softmax_backward_data(dy, y, -1, y.dtype) * scale


def _bias_act_expr(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x + bias) * BIAS_SCALE


def _bias_act_bwd_expr(x: torch.Tensor, bias: torch.Tensor, dy: torch.Tensor):
    # What autograd runs for gelu(x + bias) * scale: mul's, gelu's and add's backward.
    dz = torch.ops.aten.gelu_backward(dy * BIAS_SCALE, x + bias)
    return dz, dz.sum(0)


def _upcast(arg: Any) -> Any:
    is_float = isinstance(arg, torch.Tensor) and arg.is_floating_point()
    return arg.float() if is_float else arg


# From this row length on, the looped online-softmax kernel is measured beside the single-block
# one (kiln's default up to _softmax.MAX_BLOCK_N): at 32768 the single block reached 64-77% of
# the copy ceiling on an H200 (commit 65f0de3), one row per SM for want of registers.
LOOP_ARM_MIN_N = 8192


def build(
    kernel: str, direction: str, dtype: torch.dtype, rows: int, cols: int, device: str = "cuda"
) -> Case:
    """Inputs and the three implementations of one case (seeded, so every run measures the same),
    and on a GPU, for the softmax kernels' long rows, the looped kernel as an alternative."""
    built = _build(kernel, direction, dtype, rows, cols, device)
    if device == "cuda" and kernel != "bias_act_scale" and cols >= LOOP_ARM_MIN_N:
        built.alternatives["kiln_loop"] = _looped(kernel, direction, built)
    return built


def _looped(kernel: str, direction: str, case: Case) -> Callable[[], Any]:
    """The same case through the looped kernels (max_block_n below the row length)."""
    from torchkiln.kernels import _softmax as ks
    from torchkiln.kernels._launch import direct_launches

    loop = ks.LOOP_BLOCK_N
    if direction == "bwd":
        y, dy, scale = case.args

        def bwd() -> Any:
            with direct_launches():
                return ks.softmax_backward(y, dy, scale, max_block_n=loop)

        return bwd
    if kernel == "softmax":
        (x,) = case.args

        def fwd() -> Any:
            with direct_launches():
                return ks.softmax_forward(x, max_block_n=loop)

        return fwd
    scores, mask, scale = case.args

    def masked() -> Any:
        with direct_launches():
            return ks.softmax_forward(scores, mask, scale, safe=True, max_block_n=loop)

    return masked


def _build(
    kernel: str, direction: str, dtype: torch.dtype, rows: int, cols: int, device: str
) -> Case:
    from torchkiln.kernels import functional as F
    from torchkiln.kernels import ops

    gen = torch.Generator(device=device).manual_seed(rows * 100003 + cols)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    def case(nbytes: int, kiln: Callable[[], Any], eager: Callable[..., Any], *args: Any) -> Case:
        reference = eager(*map(_upcast, args))  # the same expression on fp32 inputs
        return Case(
            kernel, direction, dtype, rows, cols, nbytes, kiln, eager, args, reference, device
        )

    s = torch.empty((), dtype=dtype).element_size()
    mn = rows * cols
    if kernel == "softmax":
        x = randn(rows, cols)
        if direction == "fwd":
            return case(2 * mn * s, lambda: F.softmax(x), lambda x: torch.softmax(x, -1), x)
        y, dy = torch.softmax(x, -1), randn(rows, cols)
        kiln = lambda: ops.autograd_softmax_backward(y, dy, 1.0)  # as autograd calls it
        return case(3 * mn * s, kiln, _softmax_bwd_expr, y, dy, 1.0)
    if kernel == "masked_softmax":
        heads = HEADS if rows % HEADS == 0 else 1
        shape = (1, heads, rows // heads, cols)
        scores = randn(*shape)
        mask = torch.rand((1, 1, rows // heads, cols), generator=gen, device=device) < 0.9
        if direction == "fwd":
            kiln = lambda: F.masked_softmax(scores, mask, ATTN_SCALE)
            return case(2 * mn * s + mask.numel(), kiln, _masked_expr, scores, mask, ATTN_SCALE)
        y, dy = _masked_expr(scores, mask, ATTN_SCALE), randn(*shape)
        kiln = lambda: ops.autograd_softmax_backward(y, dy, ATTN_SCALE)
        return case(3 * mn * s, kiln, _softmax_bwd_expr, y, dy, ATTN_SCALE)
    if kernel == "bias_act_scale":
        x, bias = randn(rows, cols), randn(cols)
        if direction == "fwd":
            kiln = lambda: F.bias_act_scale(x, bias, BIAS_ACT, BIAS_SCALE)
            return case(2 * mn * s + cols * s, kiln, _bias_act_expr, x, bias)
        dy = randn(rows, cols)
        kiln = lambda: ops.autograd_bias_act_backward(x, bias, dy, BIAS_ACT, BIAS_SCALE)
        return case(3 * mn * s + 2 * cols * s, kiln, _bias_act_bwd_expr, x, bias, dy)
    raise ValueError(f"kernel={kernel!r}; choose from {list(KERNELS)}")


def max_error(got: Any, ref: Any) -> float:
    """Worst normalised error, max|got - ref| / max|ref|, over a result or a tuple of them."""
    if isinstance(ref, tuple):
        return max(max_error(g, r) for g, r in zip(got, ref, strict=True))
    scale = ref.abs().max().item() or 1.0
    err = (got.float() - ref).abs().max().item()
    return err / scale if math.isfinite(err) else math.inf
