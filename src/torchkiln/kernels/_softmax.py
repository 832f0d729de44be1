"""Row softmax in Triton: layer 1 (private @triton.jit kernels) and layer 2 (launchers).

One forward kernel family serves `softmax` and `masked_softmax` (scale and mask are fused into the
load; with no mask and scale 1.0 they cost nothing). One backward family serves both, since the
gradient of softmax(scale * x + mask) with respect to x is scale * y * (dy - sum(dy * y)).

Everything is computed in fp32 and rounded once, on store, to the input dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from torchkiln.kernels import _launch_cache
from torchkiln.kernels._launch import cdiv, device_info, launchable, next_power_of_2

# A row up to this many elements can be held in registers by one program: one read, one write.
# Longer rows take the looped online-softmax kernel, which reads the row twice (with the L2 hints
# the second read is mostly served from L2: fp32 4096 x 65536 at 74% of the copy ceiling, where
# three DRAM passes would cap it near 67%; session 10). At 32768 elements and 32 warps a
# thread holds 32 values per tensor: the forward fits in 64 registers without spilling (ptxas -v,
# sm_90); the masked forward and the backward spill 16-96 bytes per thread there.
MAX_BLOCK_N = 32768
# Chunk length of the looped kernels where LONG_ROW_LOOP does not apply (the masked forward past
# the cap, the backward): 4096 elements over 8 warps = 16 per thread per step.
LOOP_BLOCK_N = 4096
# Elements one program handles when rows are short: several rows share a program, so a
# 4096 x 256 softmax runs 512 programs of 8 rows rather than 4096 with idle lanes. 2048 below
# 1024 columns: at 16 rows x 256 the masked kernel needed 198 registers (ptxas, sm_90), 80 at 8.
ROW_TILE_SHORT, ROW_TILE = 2048, 4096
# From this block width on (below MAX_BLOCK_N) the masked forward runs 16 warps: block_config.
MASKED_WIDE_BLOCK_N = 16384

MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2
# A bool mask applied in PTX (_kept_or_neg_inf): the kernels' MASK_KIND for a bool mask over
# 2-byte scores on NVIDIA GPUs (kernel_kind). sm_90 SASS, bf16: 1-1.25 instructions an element
# fewer (the rows kernel at 32768, 720 -> 680 a thread a row; the block at 16384, 816 -> 752).
# H200, session 19 (kernel_configs.py --even-arms --mask-ptx, kernels-h200/session19/ptx/, 4096
# rows, % of the copy, each length's default launch without -> with): bf16 2048 101.6 -> 102.6,
# 4096 94.6 -> 97.5, 8192 93.8 -> 96.3, 12672 93.6 -> 94.3, 16384 90.0 -> 92.8, 32768 77.9 ->
# 78.3; fp32 97.9 -> 98.0 at 4096, 93.0 -> 94.2 at 8192, but 95.0 -> 93.8 at 16384 and 92.5 ->
# 91.7 at 32768 (its mask at x's width there, 4 bytes a thread): fp32 keeps the compare.
MASK_BOOL_PTX = 3
# What the mask varies along (mask_dims, _mask_row_offset): bits for batch, heads and queries,
# or MASK_FLAT where its strides are those of a contiguous [B * H * Q] row index.
MASK_ALONG_B, MASK_ALONG_H, MASK_ALONG_Q, MASK_FLAT = 1, 2, 4, 8
# The kernels' MASK_DIMS default is the literal 7 (all three bits): torch.compile inlines a
# kernel's source into a module of its own that has none of this module's names, and a default
# naming one failed every compiled test on the H200 (session 14; test_kernels_compile.py checks
# each default is a literal).

# Rows longer than half the cap (held in a 32768-element block, or past the cap) without a mask
# take the looped kernel with per-chunk statistics and L2 hints, (chunk, warps) by element size.
# H200 (session 10, benchmarks/kernel_configs.py), 4096 x 32768: fp32 97% of the copy ceiling at
# 16384-element chunks and 32 warps (the 32-warp block 70%, session 9's hinted loop with per-lane
# statistics 77%), bf16 80% at 8192 / 16 (block 64%); 4096 x 65536: 74% / 72% against the plain
# per-lane loop's 60% / 51%. A 32-warp block is alone on its SM, so one row is in flight per SM
# and its reductions stall the loads; the per-chunk statistics hold two scalars where the
# per-lane loop held a running max and sum per element. fp16 takes bf16's (same bytes;
# unmeasured). The masked forward keeps the block up to the cap (77% / 62% fp32 / bf16 against
# the loops' best 64% / 50%) and the plain loop past it (56% / 43%; the best arm 57% / 49%).
LONG_ROW_LOOP = {4: (16384, 32), 2: (8192, 16)}
# Rows of 16385-32768 elements (a 32768-element block) that the persistent rows kernel takes,
# (masked, element size) -> (warps, programs per SM, pipeline stages). H200, session 12
# (benchmarks/kernel_configs.py, 4096 x 32768, % of the copy ceiling): bf16 softmax 89% at
# 16 warps, 2 programs an SM, 3 stages (the chunk-statistics loop 80%, the block 64%); masked fp32
# 83% and bf16 66% at 32 warps, one program an SM, no pipelining (the block 77% / 62%). fp32
# without a mask keeps the chunk-statistics loop (97%; rows 92%). fp16 takes bf16's (unmeasured).
# "Programs per SM" is the grid's size, not a residency: a 3-stage 32768-element bf16 program
# takes 128 KB of shared memory (sm_90, test_kernels_compile.py), so of (16, 2, 3)'s two only
# one was resident on an SM at a time, the grid's second half starting as the first ended.
# Since session 18 the bf16 softmax takes one 32-warp program an SM over all its rows (32, 1, 3):
# session 12 had it 2-3 points behind (86-87% against 89%, before session 13's base-2 kernels),
# session 14 level (89-90% both, four runs), session 18 ahead in both of two runs at 32768
# (kernel_configs.py --even-rows, session18/rows/: 3725 / 3727 GB/s against 3642 / 3633, 89.7
# against 87.6% of the copy; 4 stages 3722, (16, 1, 3) 3628).
# A masked fp32 forward whose heads share the mask takes the block heads innermost instead
# (heads_inner_order, EVEN: 93% against 81%, session 15), and the masked 2-byte one the block
# with its mask at x's width (wide_mask_vec: 74% against 70%, session 16), or, where its heads
# share a bool mask and rows are exactly 32768, this kernel heads innermost (ROWS_HEADS_2BYTE).
ROWS_LOOP = {(False, 2): (32, 1, 3), (True, 4): (32, 1, 1)}
# The masked 2-byte forward with a bool mask the heads share, over rows of exactly 32768 elements,
# takes the rows kernel heads innermost, its mask at x's width and no predicates (HEADS_INNER,
# MASK_VEC, EVEN), at (warps, programs an SM, stages). H200, session 19 (kernel_configs.py
# --even-rows 32:1:3:1 ..., kernels-h200/session19/rows-heads/, vec/, final-rows-heads/, ptx/;
# 4096 x 32768 bf16 with the bench's [1, 1, Q, K] mask, % of the copy in five runs): 78.0 / 78.3
# / 78.2 / 78.1 / 77.9 against the block heads innermost with MASK_VEC (what ran: 75-76) and the
# rows kernel in the default order (74).
# Nsight Compute (ncu/): 285 MB read from DRAM heads innermost, the scores' 268 and the mask's 17
# once, as the block heads innermost; 169 us against the unmasked rows kernel's 137, with 34%
# more instructions (70.0 M against 52.0 M, the bool mask's byte extract and compare per element
# and the row's index arithmetic) at the same ~20 cycles a warp between issues, stalled mostly
# on the shared-memory queue (MIO). Padded rows (predicated) ran level with the block (76):
# they keep it.
ROWS_HEADS_2BYTE = (32, 1, 3)
# There, where the mask allows it (words_mask: contiguous along K, every row on 8 bytes), the rows
# kernel reads the mask as 64-bit words (_softmax_fwd_rows_words). H200, session 19
# (benchmarks/mask_words_probe.py, kernels-h200/session19/words/, the same shape, % of the copy):
# 88.3 at (32, 1, 3), 88.5 at (16, 1, 3), 87.6 at (16, 2, 3), against 77.8-77.9 for the same
# kernel reading its bool mask bytes and 78.7 for kiln's launch then (this rows kernel, bool);
# through the API (words-api/, bench_kernels.py) 88.9, where every table before read 75-78;
# session 20's table 89.4 (session20/words-final/). Not taken elsewhere: at 16384 the words
# kernel read 79-85 against the block heads innermost's 90, and at 32768 in the default order
# (a mask row a head) 77 (kernel_configs.py's words arms, session20/words-final/configs.txt).
# Rows of 8193-16383 elements, whose 16384-element block is padded, held as full pieces of
# PIECE_N elements loaded without predicates and a predicated tail (_softmax_fwd_pieces,
# pieces_config): at 12672 three pieces and a 512-element tail, 12800 lanes against the block's
# 16384. H200, session 17 (kernel_configs.py --pieces, session17/pieces/, 4096 rows, % of the
# copy at 10240 / 12672 / 14336, one run, the pieces' arm against what ran before):
# - bf16 without a mask: 16 warps 92 / 97 / 90 against the rows kernel's 88 / 91 / 89 (the
#   rows kernel, ROWS_LOOP_PADDED since session 14, went: sessions 14-16 measured it at
#   87-91%, the block at 74-91%); 8 warps 96 / 95 / 88, 4 warps 86 / 96 / 95. A second run
#   (session17/pieces2/, 10240 and 14336): 16 warps 93 / 89, 8 warps 96 / 87, 4 warps 87 / 95.
#   So two pieces take 8 warps, three with a tail of 2048 or more 4, the rest 16 (12672: 97%,
#   96-98% through the API in two tables).
# - fp32 without a mask: 98 / 98 / 98 against the block's 98 / 98 / 98; the block stays.
# - masked fp32 (bool), heads innermost with MASK_VEC at 4 warps where the heads share the mask:
#   94 / 95 / 94 against the heads-innermost block's 86 / 92 / 92.
# - masked bf16 (bool), 8 warps, heads innermost where the heads share the mask: 94 / 90 / 80
#   against the block's 79 / 84 / 88 (the default order 93 / 88 / 78, MASK_VEC 85 / 91 / 81;
#   pieces2/ at 10240 / 14336: heads innermost 92 / 79, the default order 94 / 77, the block
#   78 / 86): taken where there are two pieces or the tail is at most 512 elements, so not at
#   14336.
# Additive masks and masked fp32 rows whose heads do not share the mask keep the block
# (unmeasured); fp16 takes bf16's.
PIECE_N = 4096
PIECES_2BYTE_MAX_TAIL = 512
# The masked fp32 forward in 16384-element blocks (rows of 8193-16384) at 16 warps and at most 64
# registers a thread, so two programs share an SM (uncapped it took more than 64): H200, session
# 10, 87% of the copy ceiling at 4096 x 12672 and 4096 x 16384 against 73% and 84% uncapped.
# bf16 lost under the cap (65% / 74% against 69% / 77%). ptxas's .maxnreg: NVIDIA only.
MASKED_FP32_WIDE_MAXNREG = 64
# The masked fp32 forward in 8192- to 32768-element blocks takes one row a program, heads
# innermost (the block kernel's HEADS_INNER), where the mask is shared by the heads and differs
# by query ([1, 1, Q, K] or [B, 1, Q, K], a causal mask's shape): each mask row is then read by
# every head while it is in L2. H200, session 15 (kernels-h200/session15/heads; 4096 rows of 8
# heads, % of the copy, the default order's launch against the same launch heads innermost;
# rows of 4097-8191, padded to 8192, unmeasured):
# 8192 92 / 94, 12672 88 / 92, 16384 88 / 91 (16 warps, 64 registers from 16384-element blocks),
# 32768 80 (ROWS_LOOP's rows kernel; the block 82) / 87 at 32 warps. For bf16, Nsight Compute
# put the reads at 16384 at 143 MB of DRAM against the default order's 183 (the unmasked
# forward's 134), yet it ran 4% slower (78.4 us against 75.4), and kernel_configs.py put the
# order 1-10 points behind at 8192-16384 and level at 32768: bf16 and fp16 kept the default
# (session 16 found where they gain with MASK_VEC: HEADS_INNER_2BYTE_*).
HEADS_INNER_MIN_BLOCK_N = 8192
# The masked 2-byte forward in 32768-element blocks (rows of 16385-32768): the 32-warp block with
# MASK_VEC and its predicates, not ROWS_LOOP's rows kernel (wide_mask_vec). H200, bf16 at 4096 x
# 32768 with the bench's [1, 1, Q, K] mask, % of the copy in five runs (kernel_configs.py,
# session15/even, even-warps, even-rows, session16/split-fenced, split): the block with MASK_VEC
# 74 each time, the rows kernel at ROWS_LOOP's (32, 1, 1) 70 each time, the block with both
# MASK_VEC and EVEN 72-73, plain 69. Rows of 16385-32767 (padded) are unmeasured and take the
# same. fp16 takes bf16's (unmeasured).
# HEADS_INNER_2BYTE_*: where the heads share a bool mask, the 2-byte forward goes heads innermost
# with MASK_VEC too, in two places (heads_inner_order). H200, session 16 (kernel_configs.py
# --even-heads, session16/heads-bf16, heads-bf16-again1, -again2; % of the copy, three runs):
# at 16384, 8 warps, EVEN and MASK_VEC, 90 / 91 / 91 against the default order's 86 / 86 / 86
# (heads innermost without MASK_VEC 85, with it but predicated 61; 16 warps 88-89); at 32768,
# 32 warps, MASK_VEC, predicated, 76 / 76 / 75 against wide_mask_vec's default order 74 / 74 /
# 74. At 12672 (padded) every heads-innermost arm lost (at most 80 against 87); 8192 was not
# measured (the default order runs 94-96% there).
HEADS_INNER_2BYTE_EVEN, HEADS_INNER_2BYTE_BLOCK = 16384, MAX_BLOCK_N
# The single block drops its predicates (EVEN) where a row fills it (N == BLOCK_N, one row a
# program), and the heads-innermost masked fp32 forward there loads its bool mask at x's width
# (MASK_VEC: 4 columns a thread, no layout conversion through shared memory). H200, session 15
# (kernels-h200/session15/even/, kernel_configs.py --even-arms, % of the copy at 4096 rows,
# as configured / EVEN / both): masked fp32 32768 87 / 90 / 93 (ROWS_LOOP's rows kernel 81),
# 16384 92 / 92 / 93, 8192 94 / 94 / 94; softmax bf16 4096 95 / 97, 8192 97 / 99, fp32 4096
# 96 / 98; the rest within a point. MASK_VEC with predicates lost everywhere (fp32 16384 77%):
# ptxas then issued 5 of 8 load pairs before computing on them. The masked bf16 forward gained
# nothing from either (16384 85 / 85 / 84) and keeps its mask's own width.


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
    # Inductor passes Python floats as fp64 (H200 run).
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
    # (HEADS_INNER_MIN_BLOCK_N's note has the measurements).
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
    # HEADS_INNER_MIN_BLOCK_N's note). Where it runs and why: PIECE_N. HEADS_INNER and
    # MASK_VEC as in _softmax_fwd_block. The pieces must lie within the row (PIECES * PIECE
    # <= N).
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
    # program, alone on its SM. Where it is used and why: ROWS_LOOP.
    xf, mf = _x_factor(scale, POS_SCALE), _mask_factor(scale, POS_SCALE)
    c = _exp_factor(scale, POS_SCALE)
    cols = tl.arange(0, BLOCK_N)
    # EVEN and MASK_VEC as in _softmax_fwd_block; experimental here (kernel_configs.py's
    # --even-rows, session15/even-rows/: masked bf16 16384 62% -> 83%, still under the block).
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
    # `loop_programs`; it did not help on the H200, sessions 8-9). L2_HINTS keeps the first
    # pass's reads in L2 (evict_last) and streams the second pass's reads and the stores
    # (evict_first, .cs) so the output does not push the input out: the default, with
    # CHUNK_STATS, for rows over 16384 elements without a mask (LONG_ROW_LOOP). Taking the
    # second pass from the row's end instead (where the first pass's latest reads are) measured
    # 70% against the hints' 80% (session 9): removed.
    for r in range(tl.program_id(0), M, tl.num_programs(0)):
        row = r + tl.full([], 0, tl.int64)  # int64 addressing (the interpreter gives an int)
        x_row = x_ptr + row * N
        y_row = y_ptr + row * N
        m_row = m_ptr + _mask_row_offset(row, H, Q, smb, smh, smq, MASK_DIMS)
        # One pass to find max and sum, a second to write. The online statistics are kept per
        # lane (a running max and a sum rescaled to it, reduced once at the end: two exps per
        # element) or, with CHUNK_STATS, per chunk (the chunk's max and sum reduced across the
        # block, then folded into two scalars: one exp per element, two block reductions per
        # chunk, and two fewer registers per element a thread holds). On the H200 at 32768
        # (session 10) the per-chunk form took fp32 from 77% to 97% of the copy ceiling and
        # bf16 from 58% to 80% (LONG_ROW_LOOP); prefetching the next chunk lost everywhere.
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
    scale = tl.cast(scale, tl.float32)  # Inductor passes Python floats as fp64 (H200 run)
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
    scale = tl.cast(scale, tl.float32)  # Inductor passes Python floats as fp64 (H200 run)
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


def block_config(n_cols: int, masked: bool = False) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the single-block kernels for rows of `n_cols` elements.

    16 elements per thread (32 at the 32768 cap): enough independent 16-byte loads in flight to
    cover DRAM latency without spilling; 32 warps is the most a program can have. The masked
    forward holds 32 per thread at 16 warps from 16384-element blocks on: on the H200 (session
    7, benchmarks/kernel_configs.py) 16 warps gave 84% / 78% of the copy ceiling at 4096 x 16384
    fp32 / bf16 against 70% / 69% at 32, and 73% / 67% against 60% / 58% at 12672; at 32768, 32
    warps stayed ahead (77% against 72% fp32).
    """
    block_n = next_power_of_2(n_cols)
    block_m = max(1, (ROW_TILE_SHORT if block_n < 1024 else ROW_TILE) // block_n)
    most = 16 if masked and MASKED_WIDE_BLOCK_N <= block_n < MAX_BLOCK_N else 32
    num_warps = min(most, max(4, block_m * block_n // 512))
    return block_m, block_n, num_warps


def forward_config(n_cols: int, masked: bool, itemsize: int) -> tuple[int, int, int]:
    """block_config for the forward, with 32 values per thread (half the warps) where that
    measured faster on the H200 (session 8, benchmarks/kernel_configs.py, 4096 rows, fraction of
    the copy ceiling at 4 / 8 warps): 2048-element blocks, of every kind and dtype (softmax fp32
    0.97 / 0.96, bf16 0.97 / 0.90; masked fp32 0.96 / 0.96, bf16 0.92 / 0.78), and the 2-byte
    masked forward at 4096 (0.92 / 0.87) and 8192 (8 / 16 warps: 0.90 / 0.82), where the fp32
    masked forward kept 16 per thread (4096: 0.94 / 0.97). Session 14 (after the base-2
    forward) added the 2-byte masked forward in 16384-element blocks at 8 warps, 64 values per
    thread: 0.85 / 0.85 of the copy at 4096 x 12672 / 16384 against 0.74 / 0.83 at 16 warps
    (the fp32 one keeps 16 warps and its register cap: 0.88 / 0.88 against 0.78 / 0.87 at 8)."""
    block_m, block_n, num_warps = block_config(n_cols, masked)
    if block_n == 2048 or (masked and itemsize == 2 and block_n in (4096, 8192, 16384)):
        num_warps = max(4, num_warps // 2)
    return block_m, block_n, num_warps


def long_row_loop(n_cols: int, masked: bool, itemsize: int) -> tuple[int, int] | None:
    """(chunk, warps) of the looped forward with per-chunk statistics and L2 hints where rows of
    `n_cols` take it (LONG_ROW_LOOP: no mask, over 16384 elements), else None."""
    if masked or n_cols <= MAX_BLOCK_N // 2:
        return None
    return LONG_ROW_LOOP.get(itemsize, LONG_ROW_LOOP[2])


def rows_loop(n_cols: int, masked: bool, itemsize: int) -> tuple[int, int, int] | None:
    """(warps, programs per SM, stages) of the persistent rows kernel where rows of `n_cols` take
    it (ROWS_LOOP: rows held in a 32768-element block), else None."""
    if not MAX_BLOCK_N // 2 < n_cols <= MAX_BLOCK_N:
        return None
    return ROWS_LOOP.get((masked, itemsize))


def rows_heads_inner(n_cols: int, kind: int, itemsize: int) -> tuple[int, int, int] | None:
    """(warps, programs per SM, stages) of the rows kernel heads innermost, with MASK_VEC and EVEN,
    where a forward that goes heads innermost (heads_inner_order) takes it instead of the block
    (ROWS_HEADS_2BYTE: a 2-byte one with a bool mask over rows of exactly 32768), else None."""
    if kind == MASK_BOOL and itemsize == 2 and n_cols == MAX_BLOCK_N:
        return ROWS_HEADS_2BYTE
    return None


def kernel_kind(kind: int, x: torch.Tensor) -> int:
    """The kernels' MASK_KIND for a mask of `kind` over `x`: MASK_BOOL_PTX for a bool mask over
    2-byte scores on an NVIDIA GPU (measured faster there; the interpreter and ROCm cannot run
    its PTX), else `kind`."""
    if kind == MASK_BOOL and x.element_size() == 2 and x.is_cuda and torch.version.hip is None:
        return MASK_BOOL_PTX
    return kind


def words_mask(mask: torch.Tensor, strides: tuple[int, ...], n_cols: int) -> bool:
    """Whether a bool `mask`, addressed by `strides` (mask_layout's) over rows of `n_cols`, can
    be read as 64-bit words: contiguous along K and every row starting on 8 bytes. Never for a
    traced mask (torch.compile's fake tensors): the launch chosen there is replayed on whatever
    address the real mask has, and the words kernel needs its 8-byte alignment."""
    from torch._subclasses.fake_tensor import is_fake

    if mask.dtype != torch.bool or strides[3] != 1 or n_cols % 8:
        return False
    if torch.compiler.is_compiling() or is_fake(mask):
        return False
    return mask.data_ptr() % 8 == 0 and all(s % 8 == 0 for s in strides[:3])


def shared_by_heads(dims: int, heads: int) -> bool:
    """Whether a mask (MASK_DIMS `dims`) is shared by several heads and differs by query."""
    shared = dims & MASK_ALONG_Q and not dims & (MASK_ALONG_H | MASK_FLAT)
    return bool(shared) and heads > 1


def pieces_config(
    n_cols: int, kind: int, itemsize: int, shared: bool
) -> tuple[int, int, int, int, bool, bool] | None:
    """(piece, pieces, tail, warps, heads innermost, MASK_VEC) of _softmax_fwd_pieces where rows of
    `n_cols` (8193-16383, padded in a 16384-element block) take it by default, else None; `shared`:
    the heads share a bool mask (shared_by_heads). The note at PIECE_N has the measurements."""
    if not MAX_BLOCK_N // 4 < n_cols < MAX_BLOCK_N // 2:
        return None
    pieces, rest = divmod(n_cols, PIECE_N)
    tail = next_power_of_2(rest)  # 1 where the pieces cover the row: an empty tail
    if kind == MASK_NONE:
        warps = 8 if pieces == 2 else 4 if tail >= 2048 else 16
        return (PIECE_N, pieces, tail, warps, False, False) if itemsize == 2 else None
    if kind != MASK_BOOL:
        return None
    if itemsize == 4:
        return (PIECE_N, pieces, tail, 4, True, True) if shared else None
    if pieces == 2 or tail <= PIECES_2BYTE_MAX_TAIL:
        return (PIECE_N, pieces, tail, 8, shared, False)
    return None


def heads_inner_order(
    n_cols: int, dims: int, itemsize: int, heads: int, kind: int = MASK_BOOL
) -> bool:
    """Whether the single-block forward takes its rows heads innermost by default: several
    heads and a mask (MASK_DIMS `dims`, MASK_KIND `kind`) that differs by query but not by head;
    fp32 in 8192- to 32768-element blocks (HEADS_INNER_MIN_BLOCK_N), 2-byte dtypes with a bool
    mask where a row fills a 16384-element block or in 32768-element blocks
    (HEADS_INNER_2BYTE_EVEN, HEADS_INNER_2BYTE_BLOCK)."""
    block_n = next_power_of_2(n_cols)
    if not shared_by_heads(dims, heads) or not HEADS_INNER_MIN_BLOCK_N <= block_n <= MAX_BLOCK_N:
        return False
    if itemsize == 4:
        return True
    fills = n_cols == HEADS_INNER_2BYTE_EVEN
    return kind == MASK_BOOL and (fills or block_n == HEADS_INNER_2BYTE_BLOCK)


def even_block(n_cols: int, block_m: int, block_n: int) -> bool:
    """Whether the single block runs without predicates (EVEN): one row a program, filling
    the block."""
    return block_m == 1 and n_cols == block_n


def wide_mask_vec(n_cols: int, kind: int, itemsize: int) -> bool:
    """Whether the single-block forward over rows of `n_cols` loads its mask (MASK_KIND `kind`)
    at x's width (MASK_VEC) and keeps its predicates (no EVEN) by default: the 2-byte forward
    with a bool mask in 32768-element blocks (the note after HEADS_INNER_MIN_BLOCK_N's)."""
    return kind == MASK_BOOL and itemsize == 2 and next_power_of_2(n_cols) == MAX_BLOCK_N


def forward_maxnreg(n_cols: int, masked: bool, itemsize: int) -> int | None:
    """ptxas's register cap for the single-block forward over rows of `n_cols`, or None:
    MASKED_FP32_WIDE_MAXNREG for the masked fp32 forward in 16384-element blocks on NVIDIA GPUs."""
    wide = MASKED_WIDE_BLOCK_N == next_power_of_2(n_cols)
    if masked and itemsize == 4 and wide and torch.version.hip is None:
        return MASKED_FP32_WIDE_MAXNREG
    return None


def mask_layout(shape: tuple[int, ...], mask: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    """(H, Q, strides) that address `mask` broadcast over scores of `shape` (1 to 4 dims, read
    as [B, H, Q, K] aligned from the right, as broadcasting aligns them): a mask dimension of
    size 1 gets stride 0. Arithmetic on shapes, so no view is built per call (the masked forward
    built four, and spent 89 us a call on the H200's host against softmax's 28: session 8)."""
    dims = (1, 1, 1, 1, *shape)[-4:]
    mask_dims = (1, 1, 1, 1, *mask.shape)[-4:]
    mask_strides = (0, 0, 0, 0, *mask.stride())[-4:]
    strides = tuple(0 if d == 1 else s for d, s in zip(mask_dims, mask_strides, strict=True))
    return dims[1], dims[2], strides


def mask_dims(kind: int, m: int, h: int, q: int, smb: int, smh: int, smq: int) -> int:
    """The forward's MASK_DIMS: which of batch, heads and queries the mask's address needs (a
    dimension of one, or of stride 0, does not, but the batch index is made wherever there are
    several batches and the head is needed, to take the head apart from it), or MASK_FLAT when
    the strides are a contiguous [B, H, Q] index's (a full mask: the row times smq)."""
    if kind == MASK_NONE:
        return 0
    b = m // (h * q) if h * q else 1
    if smq != 0 and (h == 1 or smh == q * smq) and (b == 1 or smb == h * q * smq):
        return MASK_FLAT
    along_h, along_q = h > 1 and smh != 0, q > 1 and smq != 0
    along_b = b > 1 and (smb != 0 or along_h)
    return along_b * MASK_ALONG_B + along_h * MASK_ALONG_H + along_q * MASK_ALONG_Q


def forward_args(
    x: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, int, tuple]:
    """(y, MASK_KIND, the leading launch arguments: x, y, mask pointer, M, N, H, Q, its four
    strides, scale) of a forward over `x`, y allocated; with no mask, x itself stands in for
    the pointer (never read)."""
    n = x.shape[-1]
    y = torch.empty_like(x)
    if mask is None:
        kind, m_arg, h, q, strides = MASK_NONE, x, 1, 1, (0, 0, 0, 0)
    else:
        kind, m_arg = (MASK_BOOL if mask.dtype == torch.bool else MASK_ADD), mask
        h, q, strides = mask_layout(x.shape, mask)
    m = x.numel() // n if n else 0
    return y, kind, (x, y, m_arg, m, n, h, q, *strides, float(scale))


def softmax_forward(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float = 1.0,
    safe: bool = False,
    max_block_n: int = MAX_BLOCK_N,
    loop_block_n: int = LOOP_BLOCK_N,
    loop_warps: int = 8,
    loop_programs: int | None = None,
    loop_l2_hints: bool = False,
    loop_chunk_stats: bool = False,
    loop_maxnreg: int | None = None,
    rows_config: tuple[int, int, int] | None = None,
    heads_inner: bool | None = None,
    mask_vec: bool | None = None,
    even: bool | None = None,
    pieces: tuple[int, int, int, int, bool, bool] | bool | None = None,
    mask_words: bool | None = None,
) -> torch.Tensor:
    """softmax(scale * x + mask) over the last dim of a contiguous `x`.

    `mask` is None, or a tensor that broadcasts to x read as [B, H, Q, K] (mask_layout), bool
    (True = keep) or floating (added). `safe` gives zeros for rows with no
    finite score. `max_block_n` lets tests reach the looped kernel with short rows; the looped
    kernel's chunk, warps, grid (`loop_programs` programs taking rows in turn; one per row
    when None), its cache hints (`loop_l2_hints`), per-chunk statistics (`loop_chunk_stats`) and
    register cap (`loop_maxnreg`, ptxas's .maxnreg: at 32 registers two 32-warp programs fit an
    SM) are parameters so benchmarks/kernel_configs.py can time them; rows over 16384 elements
    without a mask take the loop with per-chunk statistics and hints (LONG_ROW_LOOP), whatever
    those parameters say, and rows of 16385-32768 the persistent rows kernel where ROWS_LOOP
    has their kind; `rows_config` (warps, programs per SM, stages) sends rows of any length
    there (tests, benchmarks). `heads_inner` True makes a single-block forward over several heads
    take one row a program, heads innermost (the block kernel's HEADS_INNER), False never; None
    leaves it to heads_inner_order (a masked forward whose heads share the mask, where that
    measured faster), which goes before ROWS_LOOP; heads innermost, 2-byte rows of exactly 32768
    with a bool mask take the rows kernel (rows_heads_inner), with MASK_VEC and EVEN unless
    told, and read their mask as 64-bit words where words_mask allows (`mask_words`: True sends
    a bool mask over rows that fill the block to _softmax_fwd_rows_words wherever the rows kernel
    runs, tests; False never). `even` (no predicates; only where rows fill the block and the
    grid) and `mask_vec` (the mask at x's load width) choose the block's (and an explicit rows
    kernel's) EVEN and MASK_VEC; None leaves them to even_block and, for MASK_VEC, to the
    heads-innermost forward with EVEN and to wide_mask_vec (which also turns EVEN off). `pieces`
    (piece, pieces, tail, warps, heads innermost, MASK_VEC) sends rows to _softmax_fwd_pieces
    (tests, benchmarks), False never; None leaves it to pieces_config (padded rows of
    8193-16383), which goes before everything else.
    """
    y, kind, common = forward_args(x, mask, scale)
    if x.numel() == 0:
        return y
    m, n = common[3], common[4]
    dims = mask_dims(kind, m, *common[5:10])  # H, Q and the three row strides
    # Scaling inside exp2's FFMA needs a positive scale (_x_factor).
    pos_scale = common[-1] > 0
    masked, itemsize = kind != MASK_NONE, x.element_size()
    launch_kind = kernel_kind(kind, x)  # the policy below reads `kind`
    explicit = rows_config is not None
    h = common[5]
    if pieces is None and not explicit and max_block_n == MAX_BLOCK_N:
        pieces = pieces_config(n, kind, itemsize, shared_by_heads(dims, h))
    if pieces:
        piece, count, tail, warps, inner, vec = pieces
        inner = inner if heads_inner is None else heads_inner
        launchable(_softmax_fwd_pieces)[(m,)](
            *common, MASK_KIND=launch_kind, SAFE=safe, PIECE=piece, PIECES=count, TAIL=tail,
            MASK_DIMS=dims, POS_SCALE=pos_scale, HEADS_INNER=h if inner and h > 1 else 0,
            MASK_VEC=16 // itemsize if vec and masked else 0, num_warps=warps,
        )  # fmt: skip
        return y
    if heads_inner is None:
        heads_inner = not explicit and heads_inner_order(n, dims, itemsize, h, kind)
    heads = h if heads_inner and h > 1 and n <= max_block_n else 0
    rows_vec, rows_even, rows_words = mask_vec, even, bool(mask_words)
    if not explicit and max_block_n == MAX_BLOCK_N:
        if not heads:
            rows_config = rows_loop(n, masked, itemsize)
        else:
            rows_config = rows_heads_inner(n, kind, itemsize)
            rows_vec = True if mask_vec is None else mask_vec
            rows_even = True if even is None else even
            if mask_words is None and rows_config is not None:
                rows_words = words_mask(mask, common[7:11], n)
    if rows_config is not None:
        sms, major = device_info(x)
        # ROWS_LOOP was measured on an H200 only, and its 3-stage pipeline takes 128 KB of shared
        # memory a program, more than sm_86 / sm_89 GPUs have (100 KB): before Hopper the
        # earlier kernels stay.
        if explicit or major >= 9:
            warps, per_sm, stages = rows_config
            block_n = next_power_of_2(n)
            if rows_words and kind == MASK_BOOL and n == block_n:
                launchable(_softmax_fwd_rows_words)[(per_sm * sms,)](
                    *common, SAFE=safe, BLOCK_N=block_n, STAGES=stages, MASK_DIMS=dims,
                    POS_SCALE=pos_scale, HEADS_INNER=heads, num_warps=warps,
                )  # fmt: skip
                return y
            vec = 16 // itemsize if rows_vec and masked else 0
            # Every program takes rows in turn: a grid larger than the rows adds programs that
            # exit at once.
            launchable(_softmax_fwd_rows)[(per_sm * sms,)](
                *common, MASK_KIND=launch_kind, SAFE=safe, BLOCK_N=block_n, STAGES=stages,
                MASK_DIMS=dims, POS_SCALE=pos_scale, HEADS_INNER=heads if masked else 0,
                MASK_VEC=vec, EVEN=bool(rows_even) and n == block_n, num_warps=warps,
            )  # fmt: skip
            return y
    long_loop = long_row_loop(n, masked, itemsize)
    if long_loop is not None:
        loop_block_n, loop_warps = long_loop
        loop_l2_hints, loop_chunk_stats = True, True
        max_block_n = MAX_BLOCK_N // 2  # into the loop below
    if n <= max_block_n:
        block_m, block_n, num_warps = forward_config(n, masked, itemsize)
        maxnreg = forward_maxnreg(n, masked, itemsize)
        if heads:
            block_m, num_warps = 1, max(1, num_warps // block_m)
        # EVEN and MASK_VEC where the H200 measured them faster (even_block, wide_mask_vec),
        # unless told.
        fits = n == block_n and m % block_m == 0
        wide_vec = wide_mask_vec(n, kind, itemsize)
        if even is None:
            even = even_block(n, block_m, block_n) and not wide_vec
        exact = fits and even
        if mask_vec is None:
            mask_vec = (bool(heads) and exact) or wide_vec
        vec = 16 // itemsize if mask_vec and masked else 0
        launchable(_softmax_fwd_block)[(cdiv(m, block_m),)](
            *common, MASK_KIND=launch_kind, SAFE=safe, BLOCK_M=block_m, BLOCK_N=block_n,
            MASK_DIMS=dims, POS_SCALE=pos_scale, HEADS_INNER=heads, MASK_VEC=vec, EVEN=exact,
            num_warps=num_warps, **({} if maxnreg is None else {"maxnreg": maxnreg}),
        )  # fmt: skip
    else:
        grid = m if loop_programs is None else max(1, min(m, loop_programs))
        cap = {} if loop_maxnreg is None else {"maxnreg": loop_maxnreg}
        launchable(_softmax_fwd_loop)[(grid,)](
            *common, MASK_KIND=launch_kind, SAFE=safe, BLOCK_N=min(loop_block_n, max_block_n),
            L2_HINTS=loop_l2_hints, CHUNK_STATS=loop_chunk_stats, MASK_DIMS=dims,
            POS_SCALE=pos_scale, num_warps=loop_warps, **cap,
        )  # fmt: skip
    return y


# Eager calls' replays (_launch_cache): every forward kernel takes (x, y, mask, M, N, H, Q, four
# mask strides, scale, ...), every backward kernel (y, dy, dx, M, N, scale, ...).
_FORWARD_CACHE = _launch_cache.LaunchCache(slots=(0, 1, 2, 11), outs=1)
_BACKWARD_CACHE = _launch_cache.LaunchCache(slots=(0, 1, 2, 5), outs=2)


def eager_forward(
    x: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0, safe: bool = False
) -> torch.Tensor:
    """softmax_forward, through the launch cache where the call is a direct eager one. The key
    holds what the launch depends on (_launch_cache): x's shape (x is contiguous), dtype,
    device and alignment, the mask's shape, strides, dtype and alignment, the scale's sign."""
    if not _launch_cache.active():
        return softmax_forward(x, mask, scale, safe)
    scale = float(scale)
    if mask is None:
        key = (x.shape, x.dtype, x.device, x.data_ptr() % 16, scale > 0, safe)
        m_arg = x
    else:
        key = (x.shape, x.dtype, x.device, x.data_ptr() % 16, scale > 0, safe,
               mask.shape, mask.stride(), mask.dtype, mask.data_ptr() % 16)  # fmt: skip
        m_arg = mask
    replay = _FORWARD_CACHE.entries.get(key)
    if replay is None:
        return _FORWARD_CACHE.record(key, lambda: softmax_forward(x, mask, scale, safe))
    y = torch.empty_like(x)
    replay((x, y, m_arg, scale))
    return y


def eager_backward(y: torch.Tensor, dy: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """softmax_backward through the launch cache (eager_forward)."""
    if not _launch_cache.active():
        return softmax_backward(y, dy, scale)
    key = (y.shape, y.dtype, y.device, y.data_ptr() % 16, dy.data_ptr() % 16)
    replay = _BACKWARD_CACHE.entries.get(key)
    if replay is None:
        return _BACKWARD_CACHE.record(key, lambda: softmax_backward(y, dy, scale))
    dx = torch.empty_like(y)
    replay((y, dy, dx, float(scale)))
    return dx


def softmax_backward(
    y: torch.Tensor, dy: torch.Tensor, scale: float = 1.0, max_block_n: int = MAX_BLOCK_N
) -> torch.Tensor:
    """scale * y * (dy - sum(dy * y)) row by row; `y` and `dy` contiguous, same shape and dtype."""
    n = y.shape[-1]
    dx = torch.empty_like(y)
    if y.numel() == 0:
        return dx
    m = y.numel() // n
    if n <= max_block_n:
        block_m, block_n, num_warps = block_config(n)
        launchable(_softmax_bwd_block)[(cdiv(m, block_m),)](
            y, dy, dx, m, n, float(scale), BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps
        )
    else:
        launchable(_softmax_bwd_loop)[(m,)](
            y, dy, dx, m, n, float(scale), BLOCK_N=min(LOOP_BLOCK_N, max_block_n), num_warps=8
        )
    return dx
