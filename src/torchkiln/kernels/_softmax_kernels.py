"""Row softmax in Triton, layer 1: the private @triton.jit kernels and their helpers.

One forward kernel family serves `softmax` and `masked_softmax` (scale and mask are fused into the
load; with no mask and scale 1.0 they cost nothing). One backward family serves both, since the
gradient of softmax(scale * x + mask) with respect to x is scale * y * (dy - sum(dy * y)).
Everything is computed in fp32 and rounded once, on store, to the input dtype.

Which kernel and configuration a call takes is _softmax_policy's; the launchers are _softmax's.
The kernels stay in one module and use only literals for their constants and defaults:
torch.compile copies a kernel's source, with the jit functions it calls, into a module of its
own that has none of this module's other names (decisions.md#kernel-literal-defaults).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _finite(v):
    # exp(z - max) with max == -inf would be exp(nan); a row with no finite score uses 0 instead,
    # which makes every exp() of it exactly 0.
    return tl.where(v == float("-inf"), 0.0, v)


@triton.jit
def _inverse(denom, SAFE: tl.constexpr):
    if SAFE:
        # masked_softmax: a row with nothing to attend to gives zeros, not 0/0.
        inv = tl.where(denom > 0.0, 1.0 / tl.where(denom > 0.0, denom, 1.0), 0.0)
    else:
        # softmax: same NaN as torch.softmax for a row of -inf.
        inv = 1.0 / denom
    return inv


@triton.jit
def _mask_row_offset(row, H, Q, smb, smh, smq, DIMS: tl.constexpr):
    # Rows are flattened [batch, heads, q]; the mask is addressed through its (broadcast) strides,
    # so a [B, 1, 1, K] padding mask is read once per batch from L2 instead of being expanded.
    # DIMS (mask_dims: 1 batch, 2 heads, 4 queries, 8 flat; literals, since Inductor copies
    # this source and globals would not follow) says which the mask varies along, so only the
    # divisions that matter are made: each is ~35 instructions a thread, ~1.4 an element of a
    # 12672-element bf16 row (sm_90 SASS); the bench's [1, 1, Q, K] mask needs one of three.
    if DIMS == 8:
        off = row * smq
    else:
        bh = row // Q  # batch * H + head
        off = row * 0
        if DIMS % 8 >= 4:
            off += (row - bh * Q) * smq
        if DIMS % 4 >= 2:
            if DIMS % 2 == 1:
                b = bh // H
                off += b * smb + (bh - b * H) * smh
            else:
                off += bh * smh  # one batch (mask_dims): bh is the head
        elif DIMS % 2 == 1:
            off += (row // (H * Q)) * smb
    return off


@triton.jit
def _heads_inner_row(pid, Q, smb, smh, smq, HEADS: tl.constexpr):
    # Program `pid`'s row when rows are taken heads innermost (HEADS_INNER: one row a program,
    # so the programs in flight read each mask row for every head within a short time, while it
    # is in L2), and its mask row's offset. HEADS is a constexpr: the division by it is a
    # multiply; one division by Q a program, as the default order's.
    bq = pid // HEADS  # batch * Q + query
    head = pid - bq * HEADS
    b = bq // Q
    q = bq - b * Q
    row = (b * HEADS + head) * Q + q
    return row, b.to(tl.int64) * smb + head.to(tl.int64) * smh + q.to(tl.int64) * smq


@triton.jit
def _load_x(x_ptrs, inb, EVICT: tl.constexpr, NEG_INF_PAD: tl.constexpr = False):
    # EVICT: 0 the default policy, 1 keep in L2 (evict_last), 2 stream (evict_first).
    # NEG_INF_PAD: -inf where out of bounds (_scores), else 0.
    other = float("-inf") if NEG_INF_PAD else 0.0
    if EVICT == 1:
        x = tl.load(x_ptrs, mask=inb, other=other, eviction_policy="evict_last")
    elif EVICT == 2:
        x = tl.load(x_ptrs, mask=inb, other=other, eviction_policy="evict_first")
    else:
        x = tl.load(x_ptrs, mask=inb, other=other)
    return x


@triton.jit
def _x_factor(scale, POS_SCALE: tl.constexpr):
    # The forward works in base 2: exp(t) = exp2(t * log2(e)). tl.exp lowers to ex2.approx of
    # x * log2(e) with a denormal fix-up around it (a compare and two multiplies), tl.exp2 to a
    # bare ex2.approx.ftz: 20.7 against 25.9 instructions per element for the bf16 forward at
    # 4096 x 12672 (sm_90 SASS, benchmarks/kernel_sass.py). Results below 2**-126 of the row's
    # largest become 0 (ftz). With a positive scale (POS_SCALE, the launcher's test) the scores
    # stay unscaled, x + mask / scale, and scale * log2(e) rides in exp2's argument as one FFMA,
    # z * c - max * c (_exp2_shifted): one multiply an element fewer, 19.4 against 20.7; a zero,
    # negative or NaN scale scales up front, scale * log2(e) * x + log2(e) * mask. The cast:
    # Inductor passes Python floats as fp64 (seen on an H200).
    if POS_SCALE:
        f = 1.0
    else:
        f = tl.cast(scale, tl.float32) * 1.4426950408889634
    return f


@triton.jit
def _mask_factor(scale, POS_SCALE: tl.constexpr):
    # What an additive mask is multiplied by (_x_factor).
    if POS_SCALE:
        f = 1.0 / tl.cast(scale, tl.float32)
    else:
        f = 1.4426950408889634
    return f


@triton.jit
def _exp_factor(scale, POS_SCALE: tl.constexpr):
    # What exp2's argument is multiplied by (_x_factor).
    if POS_SCALE:
        f = tl.cast(scale, tl.float32) * 1.4426950408889634
    else:
        f = 1.0
    return f


@triton.jit
def _exp2_shifted(z, m, c, POS_SCALE: tl.constexpr):
    # exp(scale * x + mask - the same at the row's max) from the scores z and their max m
    # (_x_factor): with POS_SCALE one FFMA and the exp2 an element.
    if POS_SCALE:
        e = tl.exp2(z * c - m * c)
    else:
        e = tl.exp2(z - m)
    return e


@triton.jit
def _kept_or_neg_inf(keep, z):
    # where(keep != 0, z, -inf) for int8 `keep` in PTX, four elements at once: their bytes come
    # packed in one register and each is tested where it lies (and + setp, which ptxas makes one
    # LOP3 writing a predicate), where the compare of Triton's i1 load first extracts each byte
    # (PRMT, then ISETP). MASK_BOOL_PTX; NVIDIA GPUs only.
    return tl.inline_asm_elementwise(
        """
        {
        .reg .pred p0, p1, p2, p3;
        .reg .b32 t0, t1, t2, t3;
        and.b32 t0, $4, 0x000000FF;
        and.b32 t1, $4, 0x0000FF00;
        and.b32 t2, $4, 0x00FF0000;
        and.b32 t3, $4, 0xFF000000;
        setp.ne.b32 p0, t0, 0;
        setp.ne.b32 p1, t1, 0;
        setp.ne.b32 p2, t2, 0;
        setp.ne.b32 p3, t3, 0;
        selp.f32 $0, $5, 0fFF800000, p0;
        selp.f32 $1, $6, 0fFF800000, p1;
        selp.f32 $2, $7, 0fFF800000, p2;
        selp.f32 $3, $8, 0fFF800000, p3;
        }
        """,
        "=r,=r,=r,=r,r,r,r,r,r",
        [keep, z],
        dtype=tl.float32,
        is_pure=True,
        pack=4,
    )


@triton.jit
def _scores(
    x_ptrs, m_ptrs, inb, col_ok, xf, mf,
    MASK_KIND: tl.constexpr, POS_SCALE: tl.constexpr, EVICT: tl.constexpr = 0,
):  # fmt: skip
    # x * xf + mask * mf in fp32 (_x_factor, _mask_factor); -inf past the row's end and where a
    # bool mask is False. A bool mask loads False past the row's end, which stands in for the
    # column test. Without one, with POS_SCALE, x is not multiplied, so it loads as -inf out of
    # bounds and no column select is needed (bf16 softmax at 12672: 18.7 against 19.4
    # instructions per element; the bool-masked forward lost 0.3 that way and keeps its
    # loads). Padding rows of the last block (past M) are never stored; where they load -inf
    # their sums are 0 and, without SAFE, their inverse inf (NaN, unstored).
    if MASK_KIND == 1 or MASK_KIND == 3:
        z = _load_x(x_ptrs, inb, EVICT).to(tl.float32)
        if not POS_SCALE:
            z = z * xf
        if MASK_KIND == 3:  # MASK_BOOL_PTX (a literal: Inductor copies this source)
            keep = tl.load(m_ptrs.to(tl.pointer_type(tl.int8), bitcast=True), mask=inb, other=0)
            return _kept_or_neg_inf(keep, z)
        keep = tl.load(m_ptrs, mask=inb, other=0) != 0
        return tl.where(keep, z, float("-inf"))
    if POS_SCALE:
        z = _load_x(x_ptrs, inb, EVICT, True).to(tl.float32)
    else:
        z = _load_x(x_ptrs, inb, EVICT).to(tl.float32) * xf
    if MASK_KIND == 2:
        z = z + tl.load(m_ptrs, mask=inb, other=0.0).to(tl.float32) * mf
    if not POS_SCALE:
        z = tl.where(col_ok, z, float("-inf"))
    return z


@triton.jit
def _normalise(z, c, SAFE: tl.constexpr, AXIS: tl.constexpr, POS_SCALE: tl.constexpr):
    # softmax of the scores along AXIS, held whole (single-block and rows kernels).
    row_max = _finite(tl.max(z, axis=AXIS, keep_dims=True))
    e = _exp2_shifted(z, row_max, c, POS_SCALE)
    return e * _inverse(tl.sum(e, axis=AXIS, keep_dims=True), SAFE)


# Addressing: a 64-bit base pointer per row plus 32-bit column offsets. Building a 64-bit offset
# per element instead costs two registers each; at 32768 fp32 per row and 32 warps that spilled
# ~500 bytes per thread (ptxas -v, sm_90) where this layout spills none.


@triton.jit
def _softmax_fwd_block(
    x_ptr, y_ptr, m_ptr, M, N, H, Q, smb, smh, smq, smk, scale,
    MASK_KIND: tl.constexpr, SAFE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK_DIMS: tl.constexpr = 7, POS_SCALE: tl.constexpr = False, HEADS_INNER: tl.constexpr = 0,
    MASK_VEC: tl.constexpr = 0, EVEN: tl.constexpr = False,
):  # fmt: skip
    xf, mf = _x_factor(scale, POS_SCALE), _mask_factor(scale, POS_SCALE)
    c = _exp_factor(scale, POS_SCALE)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols[None, :] < N
    if MASK_VEC > 0:
        # Its own range: tl.max_contiguous sets an attribute on the op that makes the range, so
        # x's offsets (cols) keep theirs.
        m_cols = tl.max_contiguous(tl.arange(0, BLOCK_N), MASK_VEC)
    else:
        m_cols = cols
    if HEADS_INNER > 0:
        # heads_inner_order: one row a program (BLOCK_M == 1), heads innermost; HEADS_INNER
        # is H.
        row, m_off = _heads_inner_row(tl.program_id(0), Q, smb, smh, smq, HEADS_INNER)
        rows = row + tl.arange(0, BLOCK_M)
        m_ptrs = (m_ptr + m_off + tl.zeros([BLOCK_M], tl.int64))[:, None]
    else:
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        m_off = _mask_row_offset(rows.to(tl.int64), H, Q, smb, smh, smq, MASK_DIMS)
        m_ptrs = (m_ptr + m_off)[:, None]
    if EVEN:
        # N == BLOCK_N and M a multiple of BLOCK_M (the launcher's test): nothing to predicate.
        inb = tl.full([BLOCK_M, BLOCK_N], 1, tl.int1)
        col_ok = inb
    else:
        inb = (rows[:, None] < M) & col_ok
    row_start = (rows.to(tl.int64) * N)[:, None]
    # A bool mask loads 16 bytes a thread, more columns than x's 16-byte loads hold: Triton
    # then loads x in the mask's layout, two 16-byte loads a thread 32 bytes apart (Nsight
    # Compute: 29-31% of the sectors excess) and converts the output through shared memory
    # before the store. MASK_VEC gives the mask's offsets x's width (tl.max_contiguous), which
    # removes both; with predicates ptxas then issues 5 of the 8 load pairs before computing on
    # them (bf16 at 4096 x 16384: 113 us against 75), without them (EVEN) all up front
    # (decisions.md#softmax-even).
    m_ptrs = m_ptrs + m_cols[None, :] * smk
    z = _scores(
        x_ptr + row_start + cols[None, :], m_ptrs, inb, col_ok, xf, mf, MASK_KIND, POS_SCALE
    )
    y = _normalise(z, c, SAFE, 1, POS_SCALE).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row_start + cols[None, :], y, mask=inb)


@triton.jit
def _softmax_fwd_pieces(
    x_ptr, y_ptr, m_ptr, M, N, H, Q, smb, smh, smq, smk, scale,
    MASK_KIND: tl.constexpr, SAFE: tl.constexpr, PIECE: tl.constexpr, PIECES: tl.constexpr,
    TAIL: tl.constexpr, MASK_DIMS: tl.constexpr = 7, POS_SCALE: tl.constexpr = False,
    HEADS_INNER: tl.constexpr = 0, MASK_VEC: tl.constexpr = 0,
):  # fmt: skip
    # One row a program, held as PIECES (1-3) full pieces of PIECE elements, loaded without
    # predicates, and a predicated tail of TAIL, so a padded row wastes at most its tail's
    # padding (12672 = 3 x 4096 + 384 in 12800 lanes, against the single block's 16384) and
    # most of its loads carry no predicate (which is what makes ptxas hold loads back:
    # _softmax_fwd_block's note). Where it runs and why: decisions.md#softmax-pieces.
    # HEADS_INNER and MASK_VEC as in _softmax_fwd_block. The pieces must lie within the row
    # (PIECES * PIECE <= N).
    xf, mf = _x_factor(scale, POS_SCALE), _mask_factor(scale, POS_SCALE)
    c = _exp_factor(scale, POS_SCALE)
    pid = tl.program_id(0)
    if HEADS_INNER > 0:
        row, m_off = _heads_inner_row(pid, Q, smb, smh, smq, HEADS_INNER)
        row = row.to(tl.int64)
    else:
        row = pid + tl.full([], 0, tl.int64)
        m_off = _mask_row_offset(row, H, Q, smb, smh, smq, MASK_DIMS)
    x_row, y_row, m_row = x_ptr + row * N, y_ptr + row * N, m_ptr + m_off
    p = tl.arange(0, PIECE)
    mp = tl.max_contiguous(tl.arange(0, PIECE), MASK_VEC) if MASK_VEC > 0 else p
    full = tl.full([PIECE], 1, tl.int1)
    z0 = _scores(x_row + p, m_row + mp * smk, full, full, xf, mf, MASK_KIND, POS_SCALE)
    zm = z0
    if PIECES > 1:
        z1 = _scores(x_row + PIECE + p, m_row + (PIECE + mp) * smk, full, full, xf, mf,
                     MASK_KIND, POS_SCALE)  # fmt: skip
        zm = tl.maximum(zm, z1)
    if PIECES > 2:
        z2 = _scores(x_row + 2 * PIECE + p, m_row + (2 * PIECE + mp) * smk, full, full, xf, mf,
                     MASK_KIND, POS_SCALE)  # fmt: skip
        zm = tl.maximum(zm, z2)
    t = PIECES * PIECE + tl.arange(0, TAIL)
    tin = t < N
    zt = _scores(x_row + t, m_row + t * smk, tin, tin, xf, mf, MASK_KIND, POS_SCALE)
    # The full pieces combined element by element first: two block reductions a statistic.
    mx = _finite(tl.maximum(tl.max(zm, axis=0), tl.max(zt, axis=0)))
    e0 = _exp2_shifted(z0, mx, c, POS_SCALE)
    es = e0
    if PIECES > 1:
        e1 = _exp2_shifted(z1, mx, c, POS_SCALE)
        es = es + e1
    if PIECES > 2:
        e2 = _exp2_shifted(z2, mx, c, POS_SCALE)
        es = es + e2
    et = _exp2_shifted(zt, mx, c, POS_SCALE)
    inv = _inverse(tl.sum(es, axis=0) + tl.sum(et, axis=0), SAFE)
    ty = y_ptr.dtype.element_ty
    tl.store(y_row + p, (e0 * inv).to(ty))
    if PIECES > 1:
        tl.store(y_row + PIECE + p, (e1 * inv).to(ty))
    if PIECES > 2:
        tl.store(y_row + 2 * PIECE + p, (e2 * inv).to(ty))
    tl.store(y_row + t, (et * inv).to(ty), mask=tin)


@triton.jit
def _taken_row(r, H, Q, smb, smh, smq, DIMS: tl.constexpr, HEADS_INNER: tl.constexpr):
    # The persistent kernels' r-th row (int64) and its mask row's offset: in order, or heads
    # innermost as the block's HEADS_INNER (the rows in flight together, one a program, are a
    # few queries' heads, so each mask row is read once from DRAM, not once a head).
    if HEADS_INNER > 0:
        row, m_off = _heads_inner_row(r, Q, smb, smh, smq, HEADS_INNER)
        row = row.to(tl.int64)
    else:
        row = r + tl.full([], 0, tl.int64)  # int64 addressing (the interpreter gives an int)
        m_off = _mask_row_offset(row, H, Q, smb, smh, smq, DIMS)
    return row, m_off


@triton.jit
def _softmax_fwd_rows(
    x_ptr, y_ptr, m_ptr, M, N, H, Q, smb, smh, smq, smk, scale,
    MASK_KIND: tl.constexpr, SAFE: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
    MASK_DIMS: tl.constexpr = 7, POS_SCALE: tl.constexpr = False, MASK_VEC: tl.constexpr = 0,
    EVEN: tl.constexpr = False, HEADS_INNER: tl.constexpr = 0,
):  # fmt: skip
    # The single block made persistent: a grid of a few programs per SM, each taking rows
    # pid, pid + G, ... and, with STAGES > 1, Triton's software pipeliner loading the next rows
    # (cp.async, into shared memory) while this one is reduced and stored. The one-row block
    # has nothing in flight while it reduces, and a 32768-element row takes one 32-warp
    # program, alone on its SM. Where it is used and why: decisions.md#softmax-rows-32768.
    xf, mf = _x_factor(scale, POS_SCALE), _mask_factor(scale, POS_SCALE)
    c = _exp_factor(scale, POS_SCALE)
    cols = tl.arange(0, BLOCK_N)
    # EVEN and MASK_VEC as in _softmax_fwd_block; by default only heads innermost
    # (decisions.md#softmax-rows-heads-32768).
    col_ok = tl.full([BLOCK_N], 1, tl.int1) if EVEN else cols < N
    m_cols = tl.max_contiguous(tl.arange(0, BLOCK_N), MASK_VEC) if MASK_VEC > 0 else cols
    for r in tl.range(tl.program_id(0), M, tl.num_programs(0), num_stages=STAGES):
        row, m_off = _taken_row(r, H, Q, smb, smh, smq, MASK_DIMS, HEADS_INNER)
        m_row = m_ptr + m_off
        m_ptrs = m_row + m_cols * smk
        z = _scores(x_ptr + row * N + cols, m_ptrs, col_ok, col_ok, xf, mf, MASK_KIND, POS_SCALE)
        y = _normalise(z, c, SAFE, 0, POS_SCALE).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + row * N + cols, y, mask=col_ok)


@triton.jit
def _softmax_fwd_rows_words(
    x_ptr, y_ptr, m_ptr, M, N, H, Q, smb, smh, smq, smk, scale,
    SAFE: tl.constexpr, BLOCK_N: tl.constexpr, STAGES: tl.constexpr,
    MASK_DIMS: tl.constexpr = 7, POS_SCALE: tl.constexpr = False, HEADS_INNER: tl.constexpr = 0,
):  # fmt: skip
    # _softmax_fwd_rows with a bool mask read as 64-bit words: each row is held as
    # [BLOCK_N / 8, 8], so a group of 8 columns (16 bytes of bf16 scores) has its 8 mask bytes
    # in one word, copied into shared memory 16 bytes a thread like x (the bool mask at x's
    # width is 8-byte copies), and each byte is tested where it lies (a shift and a mask by
    # a constant an element: one LOP3 writing a predicate, sm_90 SASS). Rows fill the block
    # (N == BLOCK_N), the mask is contiguous along K (smk == 1 is not read) and every mask row
    # starts on 8 bytes (words_mask). Where it runs and why: ROWS_HEADS_2BYTE.
    xf = _x_factor(scale, POS_SCALE)
    c = _exp_factor(scale, POS_SCALE)
    G: tl.constexpr = BLOCK_N // 8
    g = tl.arange(0, G)
    k = tl.arange(0, 8)[None, :]
    cols = g[:, None] * 8 + k
    for r in tl.range(tl.program_id(0), M, tl.num_programs(0), num_stages=STAGES):
        row, m_off = _taken_row(r, H, Q, smb, smh, smq, MASK_DIMS, HEADS_INNER)
        z = tl.load(x_ptr + row * N + cols).to(tl.float32)
        if not POS_SCALE:
            z = z * xf
        words = (m_ptr + m_off).to(tl.pointer_type(tl.int64), bitcast=True)
        w = tl.load(words + g)
        z = tl.where(((w[:, None] >> (8 * k)) & 0xFF) != 0, z, float("-inf"))
        row_max = _finite(tl.max(tl.max(z, axis=1), axis=0))
        e = _exp2_shifted(z, row_max, c, POS_SCALE)
        inv = _inverse(tl.sum(tl.sum(e, axis=1), axis=0), SAFE)
        tl.store(y_ptr + row * N + cols, (e * inv).to(y_ptr.dtype.element_ty))


@triton.jit
def _softmax_fwd_loop(
    x_ptr, y_ptr, m_ptr, M, N, H, Q, smb, smh, smq, smk, scale,
    MASK_KIND: tl.constexpr, SAFE: tl.constexpr, BLOCK_N: tl.constexpr,
    L2_HINTS: tl.constexpr = False, CHUNK_STATS: tl.constexpr = False,
    MASK_DIMS: tl.constexpr = 7, POS_SCALE: tl.constexpr = False,
):  # fmt: skip
    xf, mf = _x_factor(scale, POS_SCALE), _mask_factor(scale, POS_SCALE)
    c = _exp_factor(scale, POS_SCALE)
    # Rows pid, pid + G, ... for a grid of G programs: one row each when G == M. A smaller grid
    # keeps fewer rows in flight, so a row's second read may come from L2 (softmax_forward's
    # `loop_programs`; no faster on an H200: decisions.md#softmax-long-rows). L2_HINTS keeps
    # the first pass's reads in L2 (evict_last) and streams the second pass's reads and the stores
    # (evict_first, .cs) so the output does not push the input out: the default, with
    # CHUNK_STATS, for rows over 16384 elements without a mask (LONG_ROW_LOOP). Taking the
    # second pass from the row's end instead (where the first pass's latest reads are) measured
    # slower (decisions.md#softmax-long-rows).
    for r in range(tl.program_id(0), M, tl.num_programs(0)):
        row = r + tl.full([], 0, tl.int64)  # int64 addressing (the interpreter gives an int)
        x_row = x_ptr + row * N
        y_row = y_ptr + row * N
        m_row = m_ptr + _mask_row_offset(row, H, Q, smb, smh, smq, MASK_DIMS)
        # One pass to find max and sum, a second to write. The online statistics are kept per
        # lane (a running max and a sum rescaled to it, reduced once at the end: two exps per
        # element) or, with CHUNK_STATS, per chunk (the chunk's max and sum reduced across the
        # block, then folded into two scalars: one exp per element, two block reductions per
        # chunk, and two fewer registers per element a thread holds): the faster form on an
        # H200 (decisions.md#softmax-long-rows).
        if CHUNK_STATS:
            row_max = tl.full([], float("-inf"), tl.float32)
            row_sum = tl.zeros([], tl.float32)
            for start in range(0, N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                inb = cols < N
                z = _scores(x_row + cols, m_row + cols * smk, inb, inb, xf, mf, MASK_KIND,
                            POS_SCALE, 1 if L2_HINTS else 0)  # fmt: skip
                new_max = tl.maximum(row_max, tl.max(z, axis=0))
                safe_max = _finite(new_max)
                row_sum = row_sum * _exp2_shifted(row_max, safe_max, c, POS_SCALE) + tl.sum(
                    _exp2_shifted(z, safe_max, c, POS_SCALE)
                )
                row_max = new_max
            row_max = _finite(row_max)
            inv = _inverse(row_sum, SAFE)
        else:
            run_max = tl.full([BLOCK_N], float("-inf"), tl.float32)
            run_sum = tl.zeros([BLOCK_N], tl.float32)
            for start in range(0, N, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                inb = cols < N
                z = _scores(x_row + cols, m_row + cols * smk, inb, inb, xf, mf, MASK_KIND,
                            POS_SCALE, 1 if L2_HINTS else 0)  # fmt: skip
                new_max = tl.maximum(run_max, z)
                safe_max = _finite(new_max)
                run_sum = run_sum * _exp2_shifted(run_max, safe_max, c, POS_SCALE) + _exp2_shifted(
                    z, safe_max, c, POS_SCALE
                )
                run_max = new_max
            row_max = _finite(tl.max(run_max, axis=0))
            inv = _inverse(
                tl.sum(run_sum * _exp2_shifted(run_max, row_max, c, POS_SCALE), axis=0), SAFE
            )
        chunks = tl.cdiv(N, BLOCK_N)
        for i in range(0, chunks):
            start = i * BLOCK_N
            cols = start + tl.arange(0, BLOCK_N)
            inb = cols < N
            z = _scores(x_row + cols, m_row + cols * smk, inb, inb, xf, mf, MASK_KIND,
                        POS_SCALE, 2 if L2_HINTS else 0)  # fmt: skip
            y = (_exp2_shifted(z, row_max, c, POS_SCALE) * inv).to(y_ptr.dtype.element_ty)
            if L2_HINTS:
                tl.store(y_row + cols, y, mask=inb, cache_modifier=".cs")
            else:
                tl.store(y_row + cols, y, mask=inb)


@triton.jit
def _softmax_bwd_block(
    y_ptr, dy_ptr, dx_ptr, M, N, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    scale = tl.cast(scale, tl.float32)  # Inductor passes Python floats as fp64 (seen on an H200)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)[None, :]
    inb = (rows[:, None] < M) & (cols < N)
    row_start = (rows.to(tl.int64) * N)[:, None]
    y = tl.load(y_ptr + row_start + cols, mask=inb, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row_start + cols, mask=inb, other=0.0).to(tl.float32)
    dot = tl.sum(y * dy, axis=1)
    dx = y * (dy - dot[:, None]) * scale
    tl.store(dx_ptr + row_start + cols, dx.to(dx_ptr.dtype.element_ty), mask=inb)


@triton.jit
def _softmax_bwd_loop(y_ptr, dy_ptr, dx_ptr, M, N, scale, BLOCK_N: tl.constexpr):
    scale = tl.cast(scale, tl.float32)  # Inductor passes Python floats as fp64 (seen on an H200)
    row_start = tl.program_id(0).to(tl.int64) * N
    y_row, dy_row, dx_row = y_ptr + row_start, dy_ptr + row_start, dx_ptr + row_start
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        inb = cols < N
        y = tl.load(y_row + cols, mask=inb, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols, mask=inb, other=0.0).to(tl.float32)
        acc += y * dy
    dot = tl.sum(acc, axis=0)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        inb = cols < N
        y = tl.load(y_row + cols, mask=inb, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols, mask=inb, other=0.0).to(tl.float32)
        dx = y * (dy - dot) * scale
        tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=inb)
