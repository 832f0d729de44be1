"""Plain-PyTorch fp64 references for kiln's kernels, and the tolerances they are held to.

Kept in the tests, apart from the package's own CPU implementations, so neither is checked
against itself.

Tolerances. The kernels (and the CPU implementations) read the low-precision input, compute in
fp32 and round once to the output dtype. Against an fp64 reference computed from the *same*
rounded inputs, the error is that final rounding (at most the unit roundoff u, half an ulp at
1.0: 2^-8 relative for bf16, 2^-11 for fp16, 2^-24 for fp32) plus fp32 arithmetic error (exp,
the row sum, the division: a few fp32 ulps, ~1e-6 relative at these row lengths). So:

- fp32: rtol 1e-5 (~80 fp32 ulps, room for the sum of up to ~1000 terms), atol 1e-6.
- bf16: rtol 2^-7 = one bf16 ulp at 1.0 (twice the rounding bound: room for the fp32 error).
- fp16: rtol 2^-10 = one fp16 ulp at 1.0; atol 6e-8 = one fp16 subnormal step, because softmax
  probabilities below 6.1e-5 are subnormal in fp16 and there only absolute precision exists.

Triton's interpreter (3.6-3.8) casts fp32 to bf16 by truncation, not round-to-nearest as the GPU
does (`cast_impl` passes no rounding mode), so interpreted bf16 results may be off by a full ulp:
`interpreter=True` allows 1.5 bf16 ulps: the full ulp a truncation can cost, plus the fp32
error of the value it truncates.

Two computations lose more than a few ulps in fp32, and get an absolute allowance (`atol=`):
- GELU as 0.5*z*(1 + erf(z/sqrt2)) (the same formula torch uses) cancels for negative z: an
  absolute error ~|z|*2^-24, below GELU_ATOL = 2^-20 for |z| < 16; times |scale * dy| in dx.
- The bias gradient sums M rows in fp32: up to M * 2^-24 * max|dz| (`sum_atol`).

Gradients taken end to end through a low-precision forward see one more rounding, of the saved
softmax output y: |y_hat - y| <= u*y + e/2 (u = unit roundoff, e = the dtype's subnormal step,
which matters for fp16 where small probabilities are subnormal). Through dx = y*(dy - sum(dy*y)),
with |sum(dy*y)| <= max|dy| and sum(y) = 1 over a row of N, that moves dx by at most
max|dy| * (3*u*y + e + y*N*e/2); `assert_grad_close` adds this bound per element.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

RTOL_ATOL = {
    torch.float32: (1e-5, 1e-6),
    torch.bfloat16: (2.0**-7, 1e-6),
    torch.float16: (2.0**-10, 6e-8),
}
# Unit roundoff (half an ulp at 1.0) and spacing of the subnormals of each dtype.
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
SUBNORMAL_STEP = {torch.float32: 2.0**-149, torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24}

GELU_ATOL = 2.0**-20


def sum_atol(terms: torch.Tensor, rows: int) -> float:
    """Worst-case fp32 rounding of a sum of `rows` terms of at most max|terms| each."""
    return rows * 2.0**-24 * terms.abs().max().item()


SHAPES = [(1, 1), (37, 781), (3, 5, 7, 129)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def assert_close(
    got: torch.Tensor,
    ref: torch.Tensor,
    dtype: torch.dtype,
    what: str,
    interpreter: bool = False,
    atol: float = 0.0,
) -> None:
    """`got` (any dtype) against an fp64 `ref`, with the tolerance of `dtype` explained above;
    `atol` raises the absolute allowance for the computations listed there."""
    rtol, dtype_atol = RTOL_ATOL[dtype]
    atol = max(atol, dtype_atol)
    if interpreter and dtype == torch.bfloat16:
        rtol = 1.5 * 2.0**-7
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    torch.testing.assert_close(
        got.double(), ref, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}"
    )


def assert_grad_close(
    got: torch.Tensor, ref: torch.Tensor, y: torch.Tensor, dy: torch.Tensor, dtype, what: str
) -> None:
    """A softmax input gradient taken through a rounded forward output (see module docstring)."""
    rtol, atol = RTOL_ATOL[dtype]
    u, e, n = UNIT_ROUNDOFF[dtype], SUBNORMAL_STEP[dtype], y.shape[-1]
    y = y.abs()
    bound = rtol * ref.abs() + atol + dy.abs().max() * (3 * u * y + e + y * n * e / 2)
    err = (got.double() - ref).abs()
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"{what}: error reaches {worst:.2f}x the bound"


def softmax_ref(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x.double(), dim=-1)


def softmax_backward_ref(y: torch.Tensor, dy: torch.Tensor, scale: float) -> torch.Tensor:
    y, dy = y.double(), dy.double()
    return scale * y * (dy - (y * dy).sum(-1, keepdim=True))


def masked_softmax_ref(
    scores: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Rows where nothing may be attended to are all zeros (not the NaN softmax gives)."""
    z = scores.double() * scale
    if mask is not None:
        if mask.dtype == torch.bool:
            z = z.masked_fill(~mask, float("-inf"))
        else:
            z = z + mask.double()
    z, _ = torch.broadcast_tensors(z, scores.double())
    out = torch.zeros_like(z)
    live = ~torch.isneginf(z).all(dim=-1)
    out[live] = torch.softmax(z[live], dim=-1)
    return out


def bias_act_ref(x: torch.Tensor, bias: torch.Tensor, act: str, scale: float) -> torch.Tensor:
    z = x.double() + bias.double()
    return (torch.relu(z) if act == "relu" else F.gelu(z)) * scale


def bias_act_backward_ref(
    x: torch.Tensor, bias: torch.Tensor, dy: torch.Tensor, act: str, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    xd = x.double().requires_grad_()
    bd = bias.double().requires_grad_()
    y = bias_act_ref(xd, bd, act, scale)
    dx, db = torch.autograd.grad(y, (xd, bd), dy.double())
    return dx, db


def make_mask(kind: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor | None:
    """Masks that broadcast to `shape` [B, H, Q, K] the ways attention uses them, each with at
    least one fully masked row so the zeros-not-NaN rule is exercised."""
    b, h, q, k = shape
    if kind == "none":
        return None
    if kind == "bool_padding":  # [B, 1, 1, K]: keys past each sequence's length
        lengths = torch.randint(1, k + 1, (b,), generator=gen)
        mask = (torch.arange(k)[None, :] < lengths[:, None]).reshape(b, 1, 1, k)
        mask[0] = False  # batch 0 attends to nothing
        return mask
    if kind == "bool_per_query":  # [B, 1, Q, K], shared by the heads
        mask = torch.rand(b, 1, q, k, generator=gen) > 0.3
        mask[-1, 0, q // 2] = False
        return mask
    if kind == "additive_causal":  # [Q, K] additive 0 / -inf, broadcast over batch and heads
        future = torch.ones(q, k, dtype=torch.bool).triu(1)
        mask = torch.zeros(q, k).masked_fill(future, float("-inf"))
        mask[0, :] = float("-inf")
        return mask
    if kind == "additive_full":  # [B, H, Q, K] float bias (e.g. relative positions)
        mask = torch.randn(b, h, q, k, generator=gen)
        mask[0, 0, 0, :] = float("-inf")
        return mask
    raise ValueError(f"unknown mask kind {kind!r}")


MASK_KINDS = ["none", "bool_padding", "bool_per_query", "additive_causal", "additive_full"]


OPCHECK_CASES = [
    "softmax",
    "softmax_backward",
    "masked_softmax-none",
    "masked_softmax-bool",
    "masked_softmax-additive",
    "bias_act_scale",
    "bias_act_scale_backward",
]


def opcheck_case(name: str, device: str) -> tuple:
    """(op, args) for torch.library.opcheck; inputs that need a gradient require one, so the
    autograd registration is checked too. Built on demand: collection must not touch CUDA."""
    from torchkiln.kernels import ops

    gen = torch.Generator().manual_seed(0)

    def randn(*shape, dtype=torch.float32, grad=False):
        x = torch.randn(shape, generator=gen).to(dtype).to(device)
        return x.requires_grad_(grad)

    x, b = randn(3, 5, 7, grad=True), randn(7, grad=True)
    s = randn(2, 3, 4, 6, dtype=torch.bfloat16, grad=True)
    cases = {
        "softmax": (ops.softmax, (x,)),
        "softmax_backward": (ops.softmax_backward, (x.detach().softmax(-1), randn(3, 5, 7), 0.5)),
        "masked_softmax-none": (ops.masked_softmax, (s, None, 0.5)),
        "masked_softmax-bool": (ops.masked_softmax, (s, randn(2, 1, 4, 6) > 0, 0.5)),
        "masked_softmax-additive": (ops.masked_softmax, (s, randn(1, 1, 4, 6), 0.5)),
        "bias_act_scale": (ops.bias_act_scale, (x, b, "gelu", 0.5)),
        "bias_act_scale_backward": (
            ops.bias_act_scale_backward,
            (x.detach(), b.detach(), randn(3, 5, 7), "relu", 0.5),
        ),
    }
    return cases[name]
