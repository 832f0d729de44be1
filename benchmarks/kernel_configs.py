"""Which launch configuration each long-row softmax case should use, measured.

    PYTHONPATH=src python3 benchmarks/kernel_configs.py --out benchmarks/results/kernels/h200

The bandwidth table at kiln 51e19d0 (H200) left the forward softmax below 90% of the copy ceiling
where rows are long: 4096 x 32768 at 71% (fp32) and 63% (bf16) with one 32-warp program per row, and
the masked forward at 61-70% for 12672 and 16384 columns. This script times, for those shapes, the
single-block kernel at several warp counts and the looped kernel at several chunk lengths and warp
counts (one program per row, or a few programs per SM taking rows in turn), each launched bare into
a preallocated output, checked against torch.softmax, and timed with `triton.testing.do_bench`
(median, L2 flushed) beside `dst.copy_(src)` in the same run. It also times bias_act_scale's forward
with relu and with gelu at one size: if gelu is slower than relu at the same bytes, the erf GELU is
compute-bound there and no launch choice fixes it (H200 at 51e19d0: bf16 gelu 62% of the copy
ceiling, relu 94%). Both GELU kernels are timed, tl.erf and the erfc polynomial the 2-byte dtypes
now take, with their max error against torch's fp32 gelu.

The looped kernel's L2 experiments (cache hints; the second pass reversed) and a kernel
holding a row that is not a power of two as power-of-two pieces, measured on an H200 (results
committed in 8c6d424): the hints took fp32 4096 x 32768 from 71%
to 80% of the copy ceiling and became that case's default; the reversed pass (70%) and the
pieces kernel (below the single block in all 8 cases at 12672) were removed. The hinted arms
stay, so the choice can be re-checked on another GPU: the looped kernel with per-chunk
statistics and a register cap (CHUNK_STATS_ARMS; results committed in 94c62e6), and, with
--bias-act-bwd, bias_act_scale's backward launches (BIAS_BWD_ARMS; prefetching the default
since that run).

The persistent rows kernel (ROWS_PIPELINED: a few programs an SM taking rows
in turn, Triton's pipeliner loading the next row while one reduces), the default for rows of
16385-32768 where it won (_softmax.ROWS_LOOP; results committed in cadbc2e).

Results are written after every case (a cut run keeps what it measured), to
DIR/kernel_configs.json with the environment; a table is printed last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

ROWS = 4096
# Longest rows first: they are the cases the table failed worst, so a cut run keeps them.
COLS = (32768, 16384, 12672)
BLOCK_WARPS = (4, 8, 16, 32)
# The single block under a register cap (ptxas .maxnreg), so two
# programs share an SM where one did: (warps, maxnreg). Uncapped, the masked bf16 block at 16384
# took 98 registers at 16 warps and the plain one 40-56 at 32 (one program per SM); capped at 64
# / 32 they compile without spilling (ptxas, sm_90; the masked fp32 one spills 4-16 bytes).
BLOCK_CAPPED = ((16, 64), (32, 32))
# Two rows per program in the single block, (rows, warps). bf16 softmax at 4096 x
# 12672 read 83% of the copy ceiling against fp32's 95% (H200, 94c62e6): a 16384-element block at
# 32 warps holds 16 values a thread, 32 bytes of bf16 (64 of fp32) in flight, and 23% of the
# lanes are past a 12672-element row. Two rows a program double the bytes each thread loads.
# Measured (H200, kiln 63b304d; results committed in c137b97): lost in all eight
# cases, bf16 12672 66% against the one-row block's 81%, fp32 16384 86% against 94%, masked
# bf16 16384 55% against 78%. Kept as arms so another GPU can re-check; not a default.
ROW_PAIRS = ((2, 32), (2, 16))
# The single block made persistent (_softmax_fwd_rows): a few programs per SM take
# rows in turn, and with STAGES > 1 Triton's pipeliner loads the next row (cp.async into shared
# memory) while this one is reduced and stored, so loads stay in flight through the reductions.
# (warps, programs per SM, stages); STAGES 1 is the same loop without the pipeliner.
# Measured on the H200 (results committed in cadbc2e), % of the copy
# ceiling: the persistent loop won at 32768 (bf16 softmax 89% at w16 2/SM s3 against the
# chunk-statistics loop's 80% at 94c62e6; masked fp32 83% and bf16 66% at w32 1/SM s1 against
# the block's 77% and 62%) and lost or tied below 32768 (masked bf16 12672: 42-68% against the
# block's 69%). Those became the defaults for rows of 16385-32768 (_softmax.ROWS_LOOP).
# Also tried then and dropped: mask columns written in runs of one 16-byte load of x
# (`(c // v) * v + c % v`), so that a bool mask's loads took x's layout and the row was no longer
# converted through shared memory before the store (TTGIR, sm_90). It removed the conversion and
# lost 29 of 40 block comparisons (10 masked cases x 4 warp counts; the best block arm of every
# case kept the old addressing; masked fp32 16384 w16: 68% against 84%): its mask loads took 4
# bytes a thread (fp32) where the converted layout's took 16.
# The same run measured the masked block and rows kernels streaming (scores evict-first,
# output .cs, the mask kept in L2 with evict_last), in case the bench's [1, 1, Q, K] mask, read
# once per head, was pushed out of L2 between heads by the scores' stream
# (stream arms): 23 of 26 arms lost or tied, 3 gained about a
# point (bf16 32768; masked bf16 12672 w16 69% either way, fp32 16384 w16 82% against 84%),
# so the mask is not being reread from DRAM; the variant was removed.
# 4-stage pipelines: the bf16 softmax at 32768 ran 67-71% at 2 stages and
# 89-90% at 3, so does a deeper one keep more in flight? No (H200, results in 127f407):
# bf16 softmax 32768 89-90% at 4 stages against 90% at 3; bf16 12672 80-90% against 89%; fp32
# and masked fp32 at 32768 fail to launch from 3 stages (shared memory); masked bf16 32768 did
# not launch at 4 (73% at w16 2/SM s3, the default w32 1/SM s1 70%).
ROWS_PIPELINED = (
    (8, 2, 2), (8, 4, 2), (16, 1, 1), (16, 1, 2), (16, 2, 2), (16, 2, 3),
    (32, 1, 1), (32, 1, 2), (32, 1, 3), (32, 2, 2), (16, 1, 4), (16, 2, 4), (32, 1, 4),
)  # fmt: skip
# A masked forward that loaded its query's mask row once for several heads
# (the bench's 16 heads share a [1, 1, Q, K] mask), the next head's scores pipelined in
# (H200, results in 6c82b99): it won by 2-3 points at 32768 only (masked fp32 86% against
# the rows kernel's 83%, bf16 69% against 67%) and lost or tied at 4096-16384 (masked bf16
# 12672: 47% against the block's 70%). Not worth a third forward kernel; removed.
LOOP_CONFIGS = ((2048, 4), (4096, 8), (4096, 16), (8192, 8), (8192, 16))
# The looped kernel with fewer programs than rows, each taking rows in turn: so many programs per
# SM, (chunk, warps). One program per row put ~8 rows per SM in flight (1056 x 128 KB at fp32
# 32768, far past the 50 MB L2), so the second read of a row went to DRAM: three passes' traffic
# for two, and 58-69% of the copy (H200, 51e19d0).
PERSISTENT = ((1, 8192, 16), (2, 8192, 16), (2, 4096, 8), (4, 4096, 8))
# None of those reached the single block's 71% at fp32 32768 (65-68%; H200, 550ec6a). The looped
# kernel with L2 hints (_softmax_fwd_loop's L2_HINTS), one program per row or 1-2 per SM:
# (programs per SM or None for one per row, chunk, warps): 80% / 58% / 79% there (8c6d424).
L2_HINTED = ((None, 8192, 16), (1, 8192, 16), (2, 8192, 16))
# The hinted loop with per-chunk statistics (CHUNK_STATS: one exp
# per element, two scalars instead of a running max and sum per lane) and a register cap
# (ptxas .maxnreg) so that more programs share an SM: the per-lane 8192/w16 loop took 112
# registers a thread (ptxas, sm_90), one program per SM; at 32 registers two 32-warp programs
# fit, and only the per-chunk form compiles there without spilling at 16384-element chunks
# with Triton 3.8 (with 3.6: 80 bytes spilled against the per-lane form's 372;
# tests/kernels/test_kernels_compile.py). (chunk, warps, maxnreg or None, chunk statistics).
# Measured on the H200 (results in 94c62e6): per-chunk
# statistics took 4096 x 32768 to 97% of the copy ceiling at fp32 (16384/w32, capped or not) and
# 80% at bf16 (8192/w16), the defaults since (LONG_ROW_LOOP); the masked rows stayed with the
# block. Prefetching the next chunk (two in flight a program) lost in every case (fp32 32768:
# 60-88% against 90-97% without) and was removed.
CHUNK_STATS_ARMS = (
    (16384, 32, 32, True), (8192, 32, 32, True), (8192, 16, 64, True), (4096, 8, 64, True),
    (8192, 16, None, True), (16384, 32, None, True), (8192, 16, 64, False),
)  # fmt: skip
TOL = {"fp32": 1e-4, "bf16": 3e-2}
# bias_act_scale's backward, below torch.compile at bf16 4096 at 8c6d424 (0.90x; 52% of the copy
# ceiling): its loop waited out a DRAM round trip per row block at 54 registers and 8 warps (4
# programs an SM, ptxas sm_90). Measured (H200, 94c62e6): PREFETCH (the next block's loads issued
# first) under a 64-register cap won all four cases (bf16 4096 / 12672: 50 / 63% -> 54 / 76%; fp32
# 73 / 79% -> 78 / 89%) and became the default; 16 warps lost, 2048 programs lost, 512 won three of
# four. The default grid is now 4 programs an SM (528 on the H200; _bias_act.PROGRAMS_PER_SM,
# measured at 0a553c1), so "(default)" below is that one. (name, keywords).
PLAIN_LOOP = {"prefetch": False, "maxnreg": None}
BIAS_BWD_ARMS = (
    ("2x1024/w8", PLAIN_LOOP),
    ("2x1024/w8 prefetch", {"prefetch": True, "maxnreg": None}),
    ("2x1024/w8 prefetch r64 (default)", {}),
    ("2x1024/w16", {**PLAIN_LOOP, "tile": (2, 1024, 16)}),
    ("2x1024/w16 prefetch", {"tile": (2, 1024, 16), "maxnreg": None}),
    ("2x1024/w16 prefetch r40", {"tile": (2, 1024, 16), "maxnreg": 40}),
    ("2x1024/w8 2048 programs", {**PLAIN_LOOP, "target_programs": 2048}),
    ("2x1024/w8 prefetch r64 512 programs", {"target_programs": 512}),
)  # fmt: skip
BIAS_BWD_COLS = (4096, 12672)
# The bias_act_scale forward's tiles, (BLOCK_M, BLOCK_N, warps); tile_config's is 4 x 1024 at 8
# warps from 1024 columns on. The bf16 GELU forward ran at 88% of the copy at 12672 against 90-91%
# at 8192, 16384 and 32768: 12672 columns take 13 tiles of 1024, the last 38% full (95% of the lanes
# busy, in an issue-bound kernel), where 512-column tiles leave 1% idle. The others trade rows for
# warps or values a thread. Measured (H200, 127f407): 2 x 1024 at 4 warps won every bf16 case
# (2048-16384: 95 / 88 / 91 / 94% against 91 / 86 / 86 / 91%), 512-column tiles none (12672: 84%);
# fp32 kept 4 x 1024 (92-94%). _bias_act.forward_tile since.
BIAS_FWD_TILES = ((4, 1024, 8), (8, 512, 8), (2, 1024, 4), (4, 1024, 4), (8, 1024, 8), (2, 2048, 8))


def _bench(fn: Any) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=40, quantiles=[0.5, 0.2])[0])


def _inputs(dtype: Any, cols: int, kind: str) -> dict[str, Any]:
    import torch

    from torchkiln.kernels import _softmax as ks
    from torchkiln.kernels._cases import ATTN_SCALE, HEADS

    gen = torch.Generator(device="cuda").manual_seed(cols)
    q = ROWS // HEADS
    x = torch.randn((1, HEADS, q, cols), generator=gen, device="cuda").to(dtype)
    if kind == "none":
        ref = torch.softmax(x.float(), -1)
        common = (x, None, ROWS, cols, 1, 1, 0, 0, 0, 0, 1.0)
        return {"x": x, "ref": ref, "common": common, "mask_kind": ks.MASK_NONE, "safe": False,
                "mask_bytes": 0}  # fmt: skip
    mask = torch.rand((1, 1, q, cols), generator=gen, device="cuda") < 0.9
    z = (x.float() * ATTN_SCALE).masked_fill(~mask, float("-inf"))
    ref = torch.softmax(z, -1)
    m4 = mask.expand(x.shape)
    common = (x, m4, ROWS, cols, HEADS, q, *m4.stride(), ATTN_SCALE)
    return {"x": x, "ref": ref, "common": common, "mask_kind": ks.MASK_BOOL, "safe": True,
            "mask_bytes": mask.numel()}  # fmt: skip


# The masked forward written in Gluon (Triton's layout-explicit dialect) with
# one layout from loads to store: compiled as the JIT specialises it, kiln's masked forward loads
# the bool mask 16 bytes a thread, the scores follow that layout, and the output is converted
# through shared memory to 8 (bf16) or 4 (fp32) values a thread before the store
# (`ttg.convert_layout`, TTGIR, Triton 3.6 and 3.8; the unmasked forward has none). Without the
# conversion (b90889a, H200, results in 127f407) it lost in every case: its best arm
# (values a thread, warps) against kiln's best block, bf16 8192 97% / 97%, 12672 78% / 85%,
# 16384 85% / 86%, 32768 58% / 69%; fp32 12672-16384 70-71% / 88%. Removing the conversion
# alone does not lift the masked forward (the Gluon kernel also differs in its int64 row
# arithmetic and its reductions' code, so this does not prove the conversion free); removed.


# Nsight Compute on the masked bf16 forward at 4096 x 16384 (H200, 127f407) put 294 MB through DRAM
# against the unmasked forward's 245, for 277 MB and 268 MB of compulsory traffic: the [1, 1, Q, K]
# mask (8.4 MB) seems read from DRAM for most of its 8 heads after all, a head's rows being Q = 512
# rows (~16 MB of scores and output) apart in the default order. The block kernel's HEADS_INNER
# takes the rows heads innermost, so each mask row is read by all its heads' programs at about the
# same time. Measured (H200, ec37f21): it won every masked fp32 case (8192-32768: 87-95% against
# 80-92%) and no bf16 one, and is the masked fp32 forward's default since
# (_softmax.heads_inner_order). (warps, maxnreg or None).
HEADS_INNER_ARMS = ((4, None), (8, None), (16, None), (32, None), (16, 64))


def _heads_inner_arms(args: tuple, kw: dict, block_n: int) -> list[tuple[str, Any]]:
    from torchkiln.kernels import _softmax as ks
    from torchkiln.kernels._cases import HEADS

    arms = []
    for warps, maxnreg in HEADS_INNER_ARMS:
        if block_n // (32 * warps) < 1 or block_n // (32 * warps) > 64:
            continue
        cap = {} if maxnreg is None else {"maxnreg": maxnreg}

        def heads_inner(w: int = warps, k: dict = cap) -> None:
            ks._softmax_fwd_block[(ROWS,)](*args, **kw, BLOCK_M=1, BLOCK_N=block_n,
                                          HEADS_INNER=HEADS, num_warps=w, **k)  # fmt: skip

        arms.append((f"block w{warps}{f' r{maxnreg}' if maxnreg else ''} heads-inner", heads_inner))
    return arms


def _launch_args(case: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The forward kernels' leading arguments (the output allocated into case["y"]) and the
    constexprs every arm shares, as softmax_forward sets them."""
    import torch

    from torchkiln.kernels import _softmax as ks

    x, m4, *rest = case["common"]
    y = torch.empty_like(x)
    case["y"] = y
    m_arg = x if m4 is None else m4
    args = (x, y, m_arg, *rest)
    # MASK_DIMS and POS_SCALE as the launcher sets them (softmax_forward): the bench's
    # [1, 1, Q, K] mask needs the query index alone, and its scales are positive.
    dims = ks.mask_dims(case["mask_kind"], rest[0], *rest[2:7])
    kind = case.get("kernel_kind", case["mask_kind"])  # MASK_BOOL_PTX where --mask-ptx
    kw = {"MASK_KIND": kind, "SAFE": case["safe"], "MASK_DIMS": dims,
          "POS_SCALE": rest[-1] > 0}  # fmt: skip
    return args, kw


# The mask's load widths (MASK_VEC) of --even-arms' vec variants; empty: x's 16-byte width.
MASK_VECS: list[int] = []
# --mask-ptx: every bool-masked arm also with MASK_BOOL_PTX.
MASK_PTX: list[bool] = []


def _even_arms(
    case: dict[str, Any],
    cols: int,
    warps_list: tuple[int, ...] = (),
    rows_list: tuple[tuple[int, ...], ...] = (),
    heads_warps: tuple[int, ...] = (),
    pieces: tuple[tuple[int, int], ...] = (),
) -> list[tuple[str, Any]]:
    """The single-block forward as the launcher configures it (forward_config's
    warps, forward_maxnreg's cap, heads_inner_order's row order), plain, with EVEN (no
    predicates: the row fills its block), with MASK_VEC (a bool mask at x's load width: no
    layout conversion, but ptxas then held back 3 of 8 load pairs where the loads were
    predicated), and with both; ROWS_LOOP's rows kernel beside them where it is the default.
    `warps_list` adds the same variants at other warps (uncapped), `rows_list` the persistent
    rows kernel at these (warps, programs an SM, stages), plain and with EVEN and MASK_VEC.
    `heads_warps`: the block heads innermost at these warps, whatever the policy says
    (the run committed in ec37f21 had the bf16 one at 16 warps with MASK_VEC at 90% of the copy at
    16384 against 85-87% as configured, once), with the same variants. `pieces`:
    (piece, warps) of _softmax_fwd_pieces for padded rows."""
    import torch

    from torchkiln.kernels import _softmax as ks
    from torchkiln.kernels._cases import HEADS

    args, kw = _launch_args(case)
    x = args[0]
    itemsize, masked = x.element_size(), case["mask_kind"] != ks.MASK_NONE
    block_m, block_n, warps = ks.forward_config(cols, masked, itemsize)
    if block_m != 1 or block_n > ks.MAX_BLOCK_N:
        return []
    cap = ks.forward_maxnreg(cols, masked, itemsize)
    heads = HEADS if ks.heads_inner_order(cols, kw["MASK_DIMS"], itemsize, HEADS) else 0
    fixed = {**kw, "BLOCK_M": 1, "BLOCK_N": block_n, "HEADS_INNER": heads, "num_warps": warps,
             **({} if cap is None else {"maxnreg": cap})}  # fmt: skip
    variants = [("", {})]
    if cols == block_n:
        variants.append((" even", {"EVEN": True}))
    # `MASK_VECS` (--mask-vec): other widths than x's 16-byte load.
    for width in MASK_VECS or (16 // itemsize,) if masked else ():
        vec, name = {"MASK_VEC": width}, " vec" if width == 16 // itemsize else f" vec{width}"
        variants.append((name, vec))
        if cols == block_n:
            variants.append((f"{name} even", {**vec, "EVEN": True}))
    inner = " heads-inner" if heads else ""
    configs = [(f"block w{warps}{'' if cap is None else f' r{cap}'}{inner}", fixed)]
    for w in warps_list:
        if w != warps and 1 <= block_n // (32 * w) <= 64:
            other = {k: v for k, v in fixed.items() if k != "maxnreg"}
            configs.append((f"block w{w}{inner}", {**other, "num_warps": w}))
    for w in heads_warps if masked and not heads else ():
        if 1 <= block_n // (32 * w) <= 64:
            other = {k: v for k, v in fixed.items() if k != "maxnreg"}
            configs.append((f"block w{w} heads-inner", {**other, "num_warps": w,
                                                        "HEADS_INNER": HEADS}))  # fmt: skip
    arms = []
    for name, launch in configs:
        for suffix, extra in variants:

            def block(f: dict = launch, k: dict = extra) -> None:
                ks._softmax_fwd_block[(ROWS,)](*args, **f, **k)

            arms.append((name + suffix, block))
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    for rows_warps, per_sm, stages, *inner_flag in rows_list:
        # MASK_VEC with predicates too (rows that do not fill the block). A fourth field of 1 takes
        # the rows heads innermost (the rows kernel's HEADS_INNER).
        rows_heads = HEADS if masked and inner_flag and inner_flag[0] else 0
        for suffix, extra in variants:

            def rows_variant(w: int = rows_warps, g: int = min(ROWS, per_sm * sms),
                             st: int = stages, k: dict = extra,
                             h: int = rows_heads) -> None:  # fmt: skip
                launch = ks._softmax_fwd_rows[(g,)]
                launch(*args, **kw, BLOCK_N=block_n, STAGES=st, num_warps=w, HEADS_INNER=h, **k)

            name = f"rows w{rows_warps} {per_sm}/SM s{stages}{' heads-inner' if rows_heads else ''}"
            arms.append((name + suffix, rows_variant))
        if case["mask_kind"] == ks.MASK_BOOL and cols == block_n and not case.get("kernel_kind"):
            # The same rows reading the mask as 64-bit words
            # (_softmax_fwd_rows_words; the bench's mask is contiguous along K, rows 8-byte
            # aligned).
            words_kw = {k: v for k, v in kw.items() if k != "MASK_KIND"}

            def rows_words(w: int = rows_warps, g: int = min(ROWS, per_sm * sms),
                           st: int = stages, h: int = rows_heads,
                           k: dict = words_kw) -> None:  # fmt: skip
                launch = ks._softmax_fwd_rows_words[(g,)]
                launch(*args, **k, BLOCK_N=block_n, STAGES=st, num_warps=w, HEADS_INNER=h)

            name = f"rows w{rows_warps} {per_sm}/SM s{stages}{' heads-inner' if rows_heads else ''}"
            arms.append((name + " words", rows_words))
    for piece, piece_warps in pieces:
        # The row as full pieces without predicates and a predicated tail
        # (_softmax_fwd_pieces), in the default order and heads innermost, with and without
        # MASK_VEC.
        full = cols // piece
        if not 1 <= full <= 3 or cols == full * piece:
            continue
        tail = ks.next_power_of_2(cols - full * piece)
        orders = [("", 0)] + ([(" heads-inner", HEADS)] if masked else [])
        vecs = [("", 0)] + ([(" vec", 16 // itemsize)] if masked else [])
        for (o_name, h), (v_name, v) in ((o, v) for o in orders for v in vecs):

            def pieces_arm(pc: int = piece, f: int = full, t: int = tail, w: int = piece_warps,
                           h: int = h, v: int = v) -> None:  # fmt: skip
                ks._softmax_fwd_pieces[(ROWS,)](*args, **kw, PIECE=pc, PIECES=f, TAIL=t,
                                                HEADS_INNER=h, MASK_VEC=v, num_warps=w)  # fmt: skip

            name = f"pieces {full}x{piece}+{tail} w{piece_warps}{o_name}{v_name}"
            arms.append((name, pieces_arm))
    rows = ks.rows_loop(cols, masked, itemsize)
    if rows is not None:
        rows_warps, per_sm, stages = rows
        grid = per_sm * torch.cuda.get_device_properties(x.device).multi_processor_count

        def rows_kernel() -> None:
            launch = ks._softmax_fwd_rows[(min(ROWS, grid),)]
            launch(*args, **kw, BLOCK_N=block_n, STAGES=stages, num_warps=rows_warps)

        arms.append((f"rows w{rows_warps} {per_sm}/SM s{stages} (ROWS_LOOP)", rows_kernel))
    rows = ks.rows_heads_inner(cols, case["mask_kind"], itemsize) if heads else None
    if rows is not None:
        # The launcher's choice there: the rows read as 64-bit words (since
        # a695108; the bench's mask allows it, words_mask).
        rows_warps, per_sm, stages = rows
        grid = per_sm * torch.cuda.get_device_properties(x.device).multi_processor_count
        words_kw = {k: v for k, v in kw.items() if k != "MASK_KIND"}

        def rows_heads() -> None:
            launch = ks._softmax_fwd_rows_words[(min(ROWS, grid),)]
            launch(*args, **words_kw, BLOCK_N=block_n, STAGES=stages, num_warps=rows_warps,
                   HEADS_INNER=heads)  # fmt: skip

        name = f"rows w{rows_warps} {per_sm}/SM s{stages} heads-inner words (ROWS_HEADS_2BYTE)"
        arms.append((name, rows_heads))
    return arms


def _arms(
    case: dict[str, Any], cols: int, loops: bool = True, measured: bool = True
) -> list[tuple[str, Any]]:
    import torch

    from torchkiln.kernels import _softmax as ks
    from torchkiln.kernels._launch import cdiv, next_power_of_2

    args, kw = _launch_args(case)
    x = args[0]
    arms = []
    block_n = next_power_of_2(cols)
    for warps in BLOCK_WARPS:
        # Fewer elements than threads; past the cap the single block is never used.
        if block_n // (32 * warps) < 1 or block_n > ks.MAX_BLOCK_N:
            continue

        def block(w: int = warps, bn: int = block_n) -> None:
            ks._softmax_fwd_block[(cdiv(ROWS, 1),)](*args, **kw, BLOCK_M=1, BLOCK_N=bn,
                                                   num_warps=w)  # fmt: skip

        arms.append((f"block w{warps}", block))
    for warps, maxnreg in BLOCK_CAPPED:
        if block_n // (32 * warps) < 1 or block_n > 16384:  # 32768: spills 108-584 bytes
            continue

        def capped_block(w: int = warps, r: int = maxnreg, bn: int = block_n) -> None:
            ks._softmax_fwd_block[(ROWS,)](*args, **kw, BLOCK_M=1, BLOCK_N=bn, num_warps=w,
                                          maxnreg=r)  # fmt: skip

        arms.append((f"block w{warps} r{maxnreg}", capped_block))
    if case["mask_kind"] != ks.MASK_NONE and block_n <= ks.MAX_BLOCK_N:
        arms += _heads_inner_arms(args, kw, block_n)
    for rows, warps in ROW_PAIRS if measured else ():
        if block_n // (32 * warps) < 1 or block_n > 16384:
            continue

        def pair(r: int = rows, w: int = warps, bn: int = block_n) -> None:
            ks._softmax_fwd_block[(cdiv(ROWS, r),)](*args, **kw, BLOCK_M=r, BLOCK_N=bn,
                                                   num_warps=w)  # fmt: skip

        arms.append((f"block {rows} rows w{warps}", pair))
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    for warps, per_sm, stages in ROWS_PIPELINED:
        # At most 64 values a thread: more spills (ptxas, sm_90).
        if not 1 <= block_n // (32 * warps) <= 64 or block_n > ks.MAX_BLOCK_N:
            continue

        def rows_pipelined(w: int = warps, g: int = min(ROWS, per_sm * sms), s: int = stages,
                           bn: int = block_n) -> None:  # fmt: skip
            ks._softmax_fwd_rows[(g,)](*args, **kw, BLOCK_N=bn, STAGES=s, num_warps=w)

        arms.append((f"rows w{warps} {per_sm}/SM s{stages}", rows_pipelined))
    for chunk, warps in LOOP_CONFIGS if loops and measured else ():

        def loop(c: int = chunk, w: int = warps) -> None:
            ks._softmax_fwd_loop[(ROWS,)](*args, **kw, BLOCK_N=c, num_warps=w)

        arms.append((f"loop {chunk}/w{warps}", loop))
    for per_sm, chunk, warps in PERSISTENT if loops and measured else ():

        def persistent(c: int = chunk, w: int = warps, g: int = per_sm * sms) -> None:
            ks._softmax_fwd_loop[(min(ROWS, g),)](*args, **kw, BLOCK_N=c, num_warps=w)

        arms.append((f"loop {chunk}/w{warps} {per_sm}/SM", persistent))
    for per_sm, chunk, warps in L2_HINTED if loops else ():
        grid = ROWS if per_sm is None else min(ROWS, per_sm * sms)

        def hinted(c: int = chunk, w: int = warps, g: int = grid) -> None:
            ks._softmax_fwd_loop[(g,)](*args, **kw, BLOCK_N=c, L2_HINTS=True, num_warps=w)

        where = "" if per_sm is None else f" {per_sm}/SM"
        arms.append((f"loop {chunk}/w{warps}{where} hints", hinted))
    for chunk, warps, maxnreg, stats in CHUNK_STATS_ARMS if loops else ():
        cap = {} if maxnreg is None else {"maxnreg": maxnreg}

        def capped(c: int = chunk, w: int = warps, k: dict = cap, s: bool = stats) -> None:
            ks._softmax_fwd_loop[(ROWS,)](*args, **kw, BLOCK_N=c, L2_HINTS=True, CHUNK_STATS=s,
                                          num_warps=w, **k)  # fmt: skip

        what = "chunk-stats" if stats else "lane-stats"
        regs = "" if maxnreg is None else f" r{maxnreg}"
        arms.append((f"loop {chunk}/w{warps}{regs} hints {what}", capped))
    return arms


def measure_softmax(
    dtype_name: str,
    cols: int,
    kind: str,
    loops: bool = True,
    measured: bool = True,
    even_arms: bool = False,
    even_warps: tuple[int, ...] = (),
    even_rows: tuple[tuple[int, ...], ...] = (),
    even_heads: tuple[int, ...] = (),
    pieces: tuple[tuple[int, int], ...] = (),
) -> dict[str, Any]:
    import torch

    from torchkiln.kernels import _softmax as ks

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    case = _inputs(dtype, cols, kind)
    x = case["x"]
    nbytes = 2 * x.numel() * x.element_size() + case["mask_bytes"]
    dst = torch.empty_like(x)
    copy_ms = _bench(lambda: dst.copy_(x))
    copy_gbps = 2 * x.numel() * x.element_size() / (copy_ms * 1e-3) / 1e9
    out: dict[str, Any] = {"kernel": "softmax" if kind == "none" else "masked_softmax",
                           "dtype": dtype_name, "rows": ROWS, "cols": cols, "bytes": nbytes,
                           "copy_gbps": copy_gbps, "arms": {}}  # fmt: skip
    cases = [("", case)]
    if MASK_PTX and case["mask_kind"] == ks.MASK_BOOL:
        # Every arm again with the bool mask applied in PTX (MASK_BOOL_PTX), on a
        # copy of the case with its own output.
        cases.append((" ptx", {**case, "kernel_kind": ks.MASK_BOOL_PTX}))
    arms = []
    for suffix, c in cases:
        if even_arms:
            built = _even_arms(c, cols, even_warps, even_rows, even_heads, pieces)
        else:
            built = _arms(c, cols, loops, measured)
        arms += [(name + suffix, fn, c) for name, fn in built]
    for name, fn, c in arms:

        def error(f: Any = fn, c: dict = c) -> float:
            c["y"].zero_()
            f()
            return (c["y"].float() - c["ref"]).abs().max().item()

        out["arms"][name] = _time_arm(fn, error, TOL[dtype_name], nbytes, copy_gbps)
    return out


def _time_arm(fn: Any, error: Any, tol: float, nbytes: int, copy_gbps: float) -> dict[str, Any]:
    """One arm: `error()` runs it once and returns its error against the reference; within
    `tol` it is timed. A launch that fails to compile or run is reported, not raised."""
    try:
        err = error()
        if not err <= tol:
            return {"status": f"wrong result (max error {err:.3g})"}
        ms = _bench(fn)
    except Exception as exc:  # noqa: BLE001  (a config that fails to compile is reported)
        return {"status": f"{type(exc).__name__}: {exc}"[:300]}
    gbps = nbytes / (ms * 1e-3) / 1e9
    return {"status": "ok", "ms": ms, "gbps": gbps, "of_copy": gbps / copy_gbps, "error": err}


def measure_bias_act(dtype_name: str, cols: int) -> dict[str, Any]:
    import torch

    from torchkiln.kernels import functional as F
    from torchkiln.kernels._bias_act import (
        ACT_CODES,
        GELU_POLY,
        GELU_POLY_FAST,
        bias_act_forward,
    )
    from torchkiln.kernels._launch import direct_launches

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    x = torch.randn(ROWS, cols, device="cuda").to(dtype)
    bias = torch.randn(cols, device="cuda").to(dtype)
    dst = torch.empty_like(x)
    copy_ms = _bench(lambda: dst.copy_(x))
    nbytes = 2 * x.numel() * x.element_size() + bias.numel() * bias.element_size()
    out: dict[str, Any] = {"kernel": "bias_act_scale", "dtype": dtype_name, "rows": ROWS,
                           "cols": cols, "bytes": nbytes,
                           "copy_gbps": 2 * x.numel() * x.element_size() / (copy_ms * 1e-3) / 1e9,
                           "arms": {}}  # fmt: skip
    arms = {act: lambda a=act: F.bias_act_scale(x, bias, a, 0.5) for act in ("relu", "gelu")}

    # The two GELU kernels side by side (the functional API picks by dtype: act_code).
    # Launched bare (direct_launches): outside it the launch goes through wrap_triton's
    # higher-order op and the host path, not the kernel, is timed (as a first try at 550ec6a was).
    def bare(code: int) -> Any:
        with direct_launches():
            return bias_act_forward(x, bias, "gelu", 0.5, code=code)

    for name, code in (
        ("gelu tl.erf", ACT_CODES["gelu"]),
        ("gelu erfc polynomial", GELU_POLY),
        ("gelu polynomial, approx rcp+exp2", GELU_POLY_FAST),
    ):
        arms[name] = lambda c=code: bare(c)
    ref = torch.nn.functional.gelu(x.float() + bias.float()) * 0.5
    for name, fn in arms.items():
        ms = _bench(fn)
        gbps = nbytes / (ms * 1e-3) / 1e9
        arm = {"status": "ok", "ms": ms, "gbps": gbps, "of_copy": gbps / out["copy_gbps"]}
        if name != "relu":
            arm["max_abs_error"] = (fn().float() - ref).abs().max().item()
        out["arms"][name] = arm
    return out


def measure_bias_act_bwd(dtype_name: str, cols: int) -> dict[str, Any]:
    """bias_act_scale's GELU backward under each BIAS_BWD_ARMS launch, checked against torch's
    fp32 GELU gradient."""
    import torch

    from torchkiln.kernels._bias_act import bias_act_backward
    from torchkiln.kernels._launch import direct_launches

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    gen = torch.Generator(device="cuda").manual_seed(cols)
    x, dy = (torch.randn(ROWS, cols, generator=gen, device="cuda").to(dtype) for _ in range(2))
    bias = torch.randn(cols, generator=gen, device="cuda").to(dtype)
    z = (x.float() + bias.float()).requires_grad_()
    (torch.nn.functional.gelu(z) * 0.5).backward(dy.float())
    dx_ref = z.grad
    db_ref = dx_ref.sum(0)
    dst = torch.empty_like(x)
    copy_ms = _bench(lambda: dst.copy_(x))
    nbytes = 3 * x.numel() * x.element_size() + 2 * bias.numel() * bias.element_size()
    out: dict[str, Any] = {"kernel": "bias_act_scale bwd", "dtype": dtype_name, "rows": ROWS,
                           "cols": cols, "bytes": nbytes,
                           "copy_gbps": 2 * x.numel() * x.element_size() / (copy_ms * 1e-3) / 1e9,
                           "arms": {}}  # fmt: skip
    for name, kw in BIAS_BWD_ARMS:

        def run(k: dict = kw) -> Any:
            with direct_launches():
                return bias_act_backward(x, bias, dy, "gelu", 0.5, **k)

        def error(f: Any = run) -> float:  # relative to the largest reference value
            dx, db = f()
            err_dx = (dx.float() - dx_ref).abs().max() / dx_ref.abs().max()
            return max(
                err_dx.item(), ((db.float() - db_ref).abs().max() / db_ref.abs().max()).item()
            )

        out["arms"][name] = _time_arm(run, error, TOL[dtype_name], nbytes, out["copy_gbps"])
    return out


def measure_bias_act_tiles(dtype_name: str, cols: int) -> dict[str, Any]:
    """bias_act_scale's GELU forward under each BIAS_FWD_TILES tile, launched bare and checked
    against torch's fp32 GELU, at 4096 x `cols`."""
    import torch

    from torchkiln.kernels._bias_act import bias_act_forward, forward_tile
    from torchkiln.kernels._launch import direct_launches

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    x = torch.randn(ROWS, cols, device="cuda").to(dtype)
    bias = torch.randn(cols, device="cuda").to(dtype)
    dst = torch.empty_like(x)
    copy_gbps = 2 * x.numel() * x.element_size() / (_bench(lambda: dst.copy_(x)) * 1e-3) / 1e9
    nbytes = 2 * x.numel() * x.element_size() + bias.numel() * bias.element_size()
    out: dict[str, Any] = {"kernel": "bias_act_scale fwd tiles", "dtype": dtype_name,
                           "rows": ROWS, "cols": cols, "bytes": nbytes, "copy_gbps": copy_gbps,
                           "default": list(forward_tile(cols, x.element_size())),
                           "arms": {}}  # fmt: skip
    ref = torch.nn.functional.gelu(x.float() + bias.float()) * 0.5
    scale = ref.abs().max().item()
    for tile in BIAS_FWD_TILES:

        def run(t: tuple = tile) -> Any:
            with direct_launches():
                return bias_act_forward(x, bias, "gelu", 0.5, tile=t)

        def error(f: Any = run) -> float:  # relative to the largest reference value
            return (f().float() - ref).abs().max().item() / scale

        name = "{}x{}/w{}".format(*tile)
        out["arms"][name] = _time_arm(run, error, TOL[dtype_name], nbytes, copy_gbps)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for kernel_configs.json")
    p.add_argument("--budget-s", type=float, default=600.0, help="stop starting cases after this")
    p.add_argument("--cols", type=int, nargs="+", default=list(COLS), help="row lengths")
    p.add_argument("--no-loop", action="store_true", help="time the single-block kernel only")
    p.add_argument("--no-bias-act", action="store_true", help="skip the relu/gelu comparison")
    p.add_argument("--bias-act-only", action="store_true", help="only the relu/gelu comparison")
    p.add_argument(
        "--bias-act-bwd",
        action="store_true",
        help="bias_act_scale's backward launches (BIAS_BWD_ARMS), before the rows",
    )
    p.add_argument("--bias-act-tiles", type=int, nargs="*", metavar="COLS",
                   help="bias_act_scale's forward under each BIAS_FWD_TILES tile at these row "
                        "lengths, before the rows")  # fmt: skip
    p.add_argument("--skip-measured", action="store_true",
                   help="leave out the arms measured below the defaults on the H200 "
                        "(LOOP_CONFIGS, PERSISTENT, ROW_PAIRS)")  # fmt: skip
    p.add_argument("--even-arms", action="store_true",
                   help="the single block as the launcher configures it, with and without EVEN "
                        "and MASK_VEC, instead of the other arms")  # fmt: skip
    p.add_argument("--even-warps", type=int, nargs="*", default=[],
                   help="with --even-arms: the same variants at these warps too")  # fmt: skip
    p.add_argument("--even-rows", nargs="*", default=[], metavar="W:P:S[:H]",
                   help="with --even-arms: the rows kernel at warps:programs an SM:stages "
                        "(H 1: heads innermost where masked), plain, EVEN, MASK_VEC, "
                        "both, and with a bool mask over rows that fill the block the words "
                        "kernel (_softmax_fwd_rows_words)")  # fmt: skip
    p.add_argument("--pieces", nargs="*", default=[], metavar="P:W",
                   help="with --even-arms: padded rows as full pieces of P elements and a tail, "
                   "at W warps")  # fmt: skip
    p.add_argument("--even-heads", type=int, nargs="*", default=[], metavar="W",
                   help="with --even-arms: the masked block heads innermost at these warps, "
                        "with the same variants")  # fmt: skip
    p.add_argument("--mask-vec", type=int, nargs="*", default=[], metavar="N",
                   help="with --even-arms: the mask's vec variants at these widths (elements a "
                        "thread loads at once) instead of x's 16-byte width")  # fmt: skip
    p.add_argument("--mask-ptx", action="store_true",
                   help="every bool-masked arm again with the mask applied in PTX "
                        "(MASK_BOOL_PTX)")  # fmt: skip
    p.add_argument(
        "--kinds",
        nargs="+",
        choices=["none", "bool"],
        default=["none", "bool"],
        help="softmax without a mask, with the bench's bool mask, or both",
    )
    p.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    args = p.parse_args(argv)

    import torch

    from torchkiln.measure.environment import collect

    if not torch.cuda.is_available():
        print("kernel_configs: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"schema": "kiln.kernel_configs/1", "environment": collect("cuda"),
                           "results": [], "cut": []}  # fmt: skip
    jobs: list[tuple[str, Any]] = [
        (f"bias_act_scale {d} 4096x16384", lambda d=d: measure_bias_act(d, 16384))
        for d in ("bf16", "fp32")
        if not args.no_bias_act
    ]
    jobs += [
        (f"bias_act_scale bwd {d} 4096x{c}", lambda d=d, c=c: measure_bias_act_bwd(d, c))
        for c in BIAS_BWD_COLS
        for d in ("bf16", "fp32")
        if args.bias_act_bwd
    ]
    jobs += [
        (f"bias_act_scale fwd tiles {d} 4096x{c}", lambda d=d, c=c: measure_bias_act_tiles(d, c))
        for c in args.bias_act_tiles or ()
        for d in ("bf16", "fp32")
    ]
    loops, measured = not args.no_loop, not args.skip_measured
    MASK_VECS[:] = args.mask_vec
    MASK_PTX[:] = [True] if args.mask_ptx else []
    rows = tuple(tuple(int(v) for v in spec.split(":")) for spec in args.even_rows)
    pieces = tuple(tuple(int(v) for v in spec.split(":")) for spec in args.pieces)
    for cols in [] if args.bias_act_only else args.cols:
        for kind in args.kinds:
            for d in args.dtypes:
                job = lambda d=d, c=cols, k=kind: measure_softmax(  # noqa: E731
                    d,
                    c,
                    k,
                    loops,
                    measured,
                    args.even_arms,
                    tuple(args.even_warps),
                    rows,
                    tuple(args.even_heads),
                    pieces,
                )
                jobs.append((f"{kind} {d} {cols}", job))
    start = time.monotonic()
    for name, job in jobs:
        if time.monotonic() - start > args.budget_s:
            doc["cut"].append(name)
            continue
        doc["results"].append(job())
        print(f"[{time.monotonic() - start:6.1f}s] {name}", flush=True)
        (out / "kernel_configs.json").write_text(json.dumps(doc, indent=2, default=str))
    (out / "kernel_configs.json").write_text(json.dumps(doc, indent=2, default=str))
    for r in doc["results"]:
        cells = "  ".join(
            f"{k} {a['gbps']:.0f} ({a['of_copy']:.0%})" if a["status"] == "ok" else f"{k} FAIL"
            for k, a in r["arms"].items()
        )
        print(f"{r['kernel']:14s} {r['dtype']} {r['cols']:5d} copy {r['copy_gbps']:.0f}: {cells}")
    if doc["cut"]:
        print(f"cut by --budget-s: {', '.join(doc['cut'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
