"""Kernels under trial, timed by kernel_configs.py before any goes into torchkiln.kernels.

Session 12, for the next lease: the masked softmax forward with the mask read once per query
for several heads (`_masked_fwd_heads`). The bench's mask is [1, 1, Q, K], broadcast over the
heads, and the single-block kernel loads its row once per (head, query) row: 16 times at 16
heads. On the H200 the masked forward trails the plain one by about the mask's share of the
bytes loaded (session 12, 4096 x 12672: fp32 87% of the copy ceiling against 95%, where the
mask adds 1/8 to what is read; bf16 69% against 82%, where it adds 1/4), while the mask is not
being reread from DRAM (the streaming arms changed nothing), so what it costs is the loads
themselves. Here a program loads its query's mask row once, keeps it in registers, and goes
through HEADS heads of that query, the next head's scores loaded while this one is reduced
(Triton's pipeliner, STAGES > 1). Unmeasured so far: compiled for sm_90 without spills (fp32
32768 spills 8 bytes) and checked under TRITON_INTERPRET=1 against the tests' reference in
session 12 (a throwaway script: bool and additive masks, a fully masked row, 1, 2 and 5 heads
a program over 5 heads); kernel_configs.py checks every arm against torch before timing it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from torchkiln.kernels._softmax import _normalise


@triton.jit
def _masked_fwd_heads(
    x_ptr, y_ptr, m_ptr, M, N, H, Q, smb, smh, smq, smk, scale,
    MASK_KIND: tl.constexpr, SAFE: tl.constexpr, BLOCK_N: tl.constexpr, HEADS: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    # Rows are [batch, heads, q] flattened, as the library's kernels take them; the mask must
    # not vary over the heads (smh unused: the caller checks it is broadcast). One program per
    # (batch, query, group of HEADS heads).
    scale = tl.cast(scale, tl.float32)
    groups = tl.cdiv(H, HEADS)
    pid = tl.program_id(0)
    bq = pid // groups
    h0 = (pid % groups) * HEADS
    b = bq // Q + tl.full([], 0, tl.int64)
    q = bq % Q + tl.full([], 0, tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    m_ptrs = m_ptr + b * smb + q * smq + cols * smk
    if MASK_KIND == 1:
        keep = (tl.load(m_ptrs, mask=col_ok, other=1) != 0) & col_ok
    else:
        add = tl.where(col_ok, tl.load(m_ptrs, mask=col_ok, other=0.0).to(tl.float32), -1e30)
    for h in tl.range(h0, tl.minimum(h0 + HEADS, H), num_stages=STAGES):
        row = (b * H + h) * Q + q
        z = tl.load(x_ptr + row * N + cols, mask=col_ok, other=0.0).to(tl.float32) * scale
        if MASK_KIND == 1:
            z = tl.where(keep, z, float("-inf"))
        else:
            z = tl.where(col_ok, z + add, float("-inf"))
        y = _normalise(z, SAFE, 0).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + row * N + cols, y, mask=col_ok)


def masked_heads_grid(batch: int, queries: int, heads: int, per_program: int) -> int:
    """Programs of `_masked_fwd_heads`: one per (batch, query, group of per_program heads)."""
    return batch * queries * triton.cdiv(heads, per_program)
