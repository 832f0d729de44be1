"""An experimental forward softmax for rows whose length is not a power of two.

The single-block kernel pads a row to the next power of two: at 12,672 columns (the issue's
headline size) a 16,384-wide block, so 23% of its lanes load nothing yet still run the exp, the
reductions and the mask's select. On the H200 (session 8) that kernel reached 95% of the copy
ceiling in fp32 there but 82% in bf16 (compute per byte doubles) and 68-74% masked. This kernel
holds the row as up to three power-of-two pieces instead (12,672 -> 8,192 + 4,096 + 512:
12,800 lanes, 1% padding), one program per row, all in registers: one read, one write.

Not used by the functional API until measured faster: benchmarks/kernel_configs.py times it
beside the single block (`pieces` arms).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchkiln.kernels._launch import launchable, next_power_of_2
from torchkiln.kernels._softmax import (
    _finite,
    _inverse,
    _mask_row_offset,
    _scores,
    forward_args,
)

# Pieces narrower than this are not worth a separate tensor: the last piece is rounded up to it.
MIN_PIECE = 256


def pieces(n_cols: int) -> tuple[int, int, int]:
    """Up to three powers of two covering `n_cols` (0 for an absent piece): its two highest
    binary digits, then what is left rounded up to a power of two of at least MIN_PIECE, so no
    fourth is needed (12672 -> 8192, 4096, 512; a power of two -> itself alone)."""
    out = []
    left = n_cols
    for _ in range(2):
        if left <= 0:
            break
        top = 1 << (left.bit_length() - 1)
        out.append(top)
        left -= top
    if left > 0:
        out.append(max(MIN_PIECE, next_power_of_2(left)))
    return tuple(out + [0] * (3 - len(out)))  # type: ignore[return-value]


@triton.jit
def _softmax_fwd_pieces(
    x_ptr, y_ptr, m_ptr, M, N, H, Q, smb, smh, smq, smk, scale,
    MASK_KIND: tl.constexpr, SAFE: tl.constexpr,
    P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr,
):  # fmt: skip
    scale = tl.cast(scale, tl.float32)  # Inductor passes Python floats as fp64 (H200 run)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * N
    y_row = y_ptr + row * N
    m_row = m_ptr + _mask_row_offset(row, H, Q, smb, smh, smq)
    # Piece k covers columns [start_k, start_k + P_k); only the last one can pass the row's end.
    c0 = tl.arange(0, P0)
    ok0 = c0 < N
    z0 = _scores(x_row + c0, m_row + c0 * smk, ok0, ok0, scale, MASK_KIND)
    row_max = tl.max(z0, axis=0)
    if P1 > 0:
        c1 = P0 + tl.arange(0, P1)
        ok1 = c1 < N
        z1 = _scores(x_row + c1, m_row + c1 * smk, ok1, ok1, scale, MASK_KIND)
        row_max = tl.maximum(row_max, tl.max(z1, axis=0))
    if P2 > 0:
        c2 = P0 + P1 + tl.arange(0, P2)
        ok2 = c2 < N
        z2 = _scores(x_row + c2, m_row + c2 * smk, ok2, ok2, scale, MASK_KIND)
        row_max = tl.maximum(row_max, tl.max(z2, axis=0))
    row_max = _finite(row_max)
    e0 = tl.exp(z0 - row_max)
    denom = tl.sum(e0, axis=0)
    if P1 > 0:
        e1 = tl.exp(z1 - row_max)
        denom += tl.sum(e1, axis=0)
    if P2 > 0:
        e2 = tl.exp(z2 - row_max)
        denom += tl.sum(e2, axis=0)
    inv = _inverse(denom, SAFE)
    tl.store(y_row + c0, (e0 * inv).to(y_ptr.dtype.element_ty), mask=ok0)
    if P1 > 0:
        tl.store(y_row + c1, (e1 * inv).to(y_ptr.dtype.element_ty), mask=ok1)
    if P2 > 0:
        tl.store(y_row + c2, (e2 * inv).to(y_ptr.dtype.element_ty), mask=ok2)


def softmax_forward_pieces(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float = 1.0,
    safe: bool = False,
    num_warps: int | None = None,
) -> torch.Tensor:
    """softmax(scale * x + mask) over the last dim, as `_softmax.softmax_forward` (same mask
    convention), one program per row holding it as power-of-two pieces. `num_warps` defaults
    to at least 16 values per thread over the padded row, 4 to 32 warps (12672: 16 warps, 25
    values; at 32 warps the SASS counted 31.7 instructions per bf16 element against 21.7,
    benchmarks/kernel_sass.py)."""
    y, kind, common = forward_args(x, mask, scale)
    if x.numel() == 0:
        return y
    p0, p1, p2 = pieces(x.shape[-1])
    warps = num_warps or min(32, max(4, next_power_of_2((p0 + p1 + p2) // 512 + 1) // 2))
    launchable(_softmax_fwd_pieces)[(common[3],)](
        *common, MASK_KIND=kind, SAFE=safe, P0=p0, P1=p1, P2=p2, num_warps=warps,
    )  # fmt: skip
    return y
