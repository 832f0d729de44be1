"""An experiment for kernel_configs.py (issue 6), not a kiln kernel: the masked softmax forward
written in Gluon, Triton's layout-explicit dialect, so that one layout holds the row from the
loads to the store.

Why: compiled as Triton's JIT specialises it (kernel_sass.compile_sm90), kiln's masked forward
loads the bool mask 16 bytes a thread, Triton's layout passes then load the scores in that
layout too (16 values a thread), and convert the output through shared memory to 8 (bf16) or 4
(fp32) values a thread before the store (`ttg.convert_layout`, TTGIR, Triton 3.6 and 3.8); the
unmasked forward has no conversion. Session 12 removed the conversion by loading the mask at the
scores' width (4-8 bytes a thread) and lost. Here every tensor keeps VEC values a thread: the
mask's loads stay 16 bytes wide and the store needs no conversion (two or four 16-byte stores a
thread). Rows are [B, H, Q, K] scores with a [1, 1, Q, K] bool mask (the bench's), one row a
program, a positive scale; a row with nothing to attend to gives zeros.
"""

from __future__ import annotations

from typing import Any

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

LOG2E = 1.4426950408889634


@gluon.jit
def _masked_softmax_fwd_gluon(
    x_ptr, y_ptr, m_ptr, N, Q, smq, c,
    BLOCK_N: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
):  # fmt: skip
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    row = gl.program_id(0).to(gl.int64)
    cols = gl.arange(0, BLOCK_N, layout=layout)
    ok = cols < N
    keep = gl.load(m_ptr + (row % Q) * smq + cols, mask=ok, other=0)
    x = gl.load(x_ptr + row * N + cols, mask=ok, other=0.0).to(gl.float32)
    z = gl.where(keep != 0, x, float("-inf"))
    mx = gl.max(z, axis=0)
    safe_mx = gl.where(mx == float("-inf"), 0.0, mx)
    p = gl.exp2(z * c - safe_mx * c)
    s = gl.sum(p, axis=0)
    inv = gl.where(s > 0.0, 1.0 / s, 0.0)
    gl.store(y_ptr + row * N + cols, (p * inv).to(y_ptr.dtype.element_ty), mask=ok)


def masked_forward(scores: Any, mask: Any, scale: float, vec: int, warps: int, y: Any) -> Any:
    """softmax(scale * scores masked by `mask`) into `y`; scores [B, H, Q, K] contiguous, mask
    [1, 1, Q, K] bool contiguous, scale > 0."""
    n = scores.shape[-1]
    rows = scores.numel() // n
    block_n = 1 << (n - 1).bit_length()
    _masked_softmax_fwd_gluon[(rows,)](
        scores, y, mask, n, scores.shape[-2], mask.stride(-2), scale * LOG2E,
        BLOCK_N=block_n, VEC=vec, WARPS=warps, num_warps=warps,
    )  # fmt: skip
    return y
