"""Probe: the 32768-element bf16 softmax rows held as bf16, two or three programs an SM.

    PYTHONPATH=src python3 benchmarks/rows_recompute_probe.py --out DIR
    PYTHONPATH=src python3 benchmarks/rows_recompute_probe.py --out DIR --hints   # .cs stores

What session 20 asked (issue 6): the bf16 forward at 4096 x 32768, with and without a bool mask,
runs at 88-91% of the copy in kiln's persistent rows kernel (`_softmax.ROWS_LOOP`,
`ROWS_HEADS_2BYTE`): one 32-warp program an SM holding its row in registers as fp32 (32 a thread,
half the register file) while Triton's pipeliner copies the next rows into shared memory, so one
row an SM is reduced at a time and every barrier of its two reductions stalls the whole SM. The
arms here hold the row as packed bf16 (half the registers) and compute each element's exp2
twice (once for the sum, once for the output, which folds the division into the exponent:
exp2(x * c - (max * c + log2(sum)))), so that two programs of 16 warps at 64 registers, or of
32 warps at 32, share an SM, each a row in registers and one in flight into shared memory (64 KB
each at 2 stages). Each bf16 -> fp32 widening is written in a different PTX idiom (WIDE_*), so
that neither LLVM nor ptxas merges the three and keeps the fp32 row alive across the
reductions (with one idiom ptxas held 128 registers at 16 warps, sm_90). Each arm is checked
against torch and timed with triton.testing.do_bench (median, L2 flushed) beside kiln's
default launch and a device copy, in one process. Results: DIR/rows_recompute_probe.json with
the environment; a table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from probe_arms import time_arm  # noqa: E402
from torchkiln.kernels._softmax import _finite, _heads_inner_row  # noqa: E402

# bf16 pairs -> fp32, three ways (see the docstring): byte permutes moving each half into a
# zeroed word's high half; a shift and a mask; cvt.f32.bf16 on each half.
WIDE_PRMT = tl.constexpr("{ prmt.b32 $0, $2, 0, 0x1044; prmt.b32 $1, $2, 0, 0x3244; }")
WIDE_SHIFT = tl.constexpr("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xFFFF0000; }")
WIDE_CVT = tl.constexpr(
    "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.bf16 $0, lo; cvt.f32.bf16 $1, hi; }"
)


@triton.jit
def _wide(x, ASM: tl.constexpr):
    return tl.inline_asm_elementwise(
        ASM, "=r,=r,r", [x], dtype=tl.float32, is_pure=False, pack=2
    )  # fmt: skip


@triton.jit
def _masked_bf16(x, keep):
    # bf16 x where the int8 `keep` is nonzero, else -inf, staying packed: four elements at once,
    # keep's four bytes in one register (torch's bools are 0 or 1, so * 255 makes each byte a
    # full byte mask without carries), spread to two 16-bit lane masks each, and merged with
    # -inf's bits in one LOP3 a pair (x & m | 0xFF80FF80 & ~m).
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 t, m01, m23;
        mul.lo.u32 t, $4, 255;
        prmt.b32 m01, t, 0, 0x1100;
        prmt.b32 m23, t, 0, 0x3322;
        lop3.b32 $0, $2, m01, 0xFF80FF80, 0xE2;
        lop3.b32 $1, $3, m23, 0xFF80FF80, 0xE2;
        }
        """,
        "=r,=r,r,r,r", [x, keep], dtype=tl.bfloat16, is_pure=True, pack=4,
    )  # fmt: skip


@triton.jit
def _rows_held_bf16(
    x_ptr, y_ptr, m_ptr, M, N, Q, smq, scale,
    BLOCK_N: tl.constexpr, STAGES: tl.constexpr, MASKED: tl.constexpr, HEADS: tl.constexpr,
    HINTS: tl.constexpr = 0,
):  # fmt: skip
    # Rows pid, pid + G, ... each [BLOCK_N / 8, 8] with N == BLOCK_N (kiln's words layout; a
    # masked row reads its bool mask as 64-bit words, heads innermost); scale > 0.
    c = tl.cast(scale, tl.float32) * 1.4426950408889634
    G: tl.constexpr = BLOCK_N // 8
    g = tl.arange(0, G)
    k = tl.arange(0, 8)[None, :]
    cols = g[:, None] * 8 + k
    for r in tl.range(tl.program_id(0), M, tl.num_programs(0), num_stages=STAGES):
        if MASKED:
            row, m_off = _heads_inner_row(r, Q, 0, 0, smq, HEADS)
            row = row.to(tl.int64)
            w = tl.load((m_ptr + m_off).to(tl.pointer_type(tl.int64), bitcast=True) + g)
            x = tl.load(x_ptr + row * N + cols)
            # -inf where masked, still bf16: the mask is then dead, and exp2 of -inf is 0.
            x = _masked_bf16(x, (w[:, None] >> (8 * k)).to(tl.int8))
        else:
            row = r + tl.full([], 0, tl.int64)
            x = tl.load(x_ptr + row * N + cols)
        mx = _finite(tl.max(tl.max(_wide(x, WIDE_PRMT), 1), 0))
        mc = mx * c
        s = tl.sum(tl.sum(tl.exp2(_wide(x, WIDE_SHIFT) * c - mc), 1), 0)
        if MASKED:  # a row with nothing to attend to gives zeros
            t = tl.where(s > 0.0, mc + tl.log2(s), float("inf"))
        else:
            t = mc + tl.log2(s)
        y = tl.exp2(_wide(x, WIDE_CVT) * c - t)
        if HINTS == 1:  # streaming stores (st.global.cs): y is not read again
            tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty), cache_modifier=".cs")
        else:
            tl.store(y_ptr + row * N + cols, y.to(y_ptr.dtype.element_ty))


def launch(x, mask, scale, warps, stages, per_sm, maxnreg, heads, hints=0):
    """softmax(scale * x), masked where `mask` [1, 1, Q, N] is given, over rows of x."""
    y = torch.empty_like(x)
    n, q = x.shape[-1], x.shape[-2]
    grid = (per_sm * torch.cuda.get_device_properties(x.device).multi_processor_count,)
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    _rows_held_bf16[grid](
        x, y, mask if mask is not None else x, x.numel() // n, n, q,
        mask.stride(-2) if mask is not None else 0, scale, BLOCK_N=n, STAGES=stages,
        MASKED=mask is not None, HEADS=heads, HINTS=hints, num_warps=warps, **extra,
    )  # fmt: skip
    return y


# (warps, programs an SM, stages, maxnreg): two resident programs an SM (8 warps spilled at
# three or four: 13-342 stores a thread, sm_90), and one at kiln's own launch shapes.
ARMS = ((16, 2, 2, 64, 0), (32, 2, 2, 32, 0), (16, 2, 2, None, 0), (32, 1, 3, None, 0),
        (16, 1, 3, None, 0))  # fmt: skip
# --hints: kiln's launch shapes with streaming stores (HINTS 1). x's loads keep the default
# policy: Triton 3.6's pipeliner makes them cp.async, which carries no eviction hint (an
# evict_first load compiled to the same PTX, sm_90).
HINT_ARMS = ((32, 1, 3, None, 0), (32, 1, 3, None, 1), (16, 1, 3, None, 0), (16, 1, 3, None, 1))


def measure(
    n: int, rows: int, heads: int, results: list[dict], t0: float, arms: tuple = ARMS
) -> None:
    """Every arm at rows x n, without and with a mask, beside kiln's default launch."""
    from torchkiln.kernels import functional as F

    gen = torch.Generator(device="cuda").manual_seed(n)
    bench = triton.testing.do_bench
    q = rows // heads
    x = torch.randn((1, heads, q, n), generator=gen, device="cuda").to(torch.bfloat16)
    mask = torch.rand((1, 1, q, n), generator=gen, device="cuda") < 0.9
    mask[0, 0, 3] = False  # a fully masked row: zeros
    dst = torch.empty_like(x)
    copy_ms = bench(lambda: dst.copy_(x))
    copy_bytes = 2 * x.numel() * 2
    for masked in (False, True):
        scale = 0.125 if masked else 1.0
        z = x.float() * scale
        if masked:
            ref = torch.softmax(z.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
            kiln = lambda sc=scale: F.masked_softmax(x, mask, sc)  # noqa: E731
        else:
            ref = torch.softmax(z, -1)
            kiln = lambda: F.softmax(x)  # noqa: E731
        nbytes = copy_bytes + (mask.numel() if masked else 0)
        kind = "masked" if masked else "softmax"
        named = [("kiln default", kiln)]
        for warps, per_sm, stages, maxnreg, hints in arms:
            named.append((
                f"held w{warps} {per_sm}/SM s{stages} r{maxnreg or '-'}"
                + (f" hints{hints}" if hints else ""),
                lambda w=warps, s=stages, pps=per_sm, mr=maxnreg, mk=masked, sc=scale, h=hints:
                    launch(x, mask if mk else None, sc, w, s, pps, mr, heads, h),
            ))  # fmt: skip
        named.append(("kiln default (again)", kiln))
        for name, fn in named:
            r = time_arm(fn, ref, nbytes, copy_bytes, copy_ms, bench)
            results.append({"kernel": kind, "cols": n, "arm": name, **r})
            shown = f"{r['pct_of_copy']:5.1f}%" if r["pct_of_copy"] else r["status"]
            print(f"[{time.time() - t0:6.1f}s] {kind} {n} {name:32s} {shown}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, nargs="+", default=[32768])
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--hints", action="store_true", help="the L2-hint arms (HINT_ARMS) instead")
    args = p.parse_args()
    from torchkiln.measure.environment import collect

    if not torch.cuda.is_available():
        print("rows_recompute_probe: needs a CUDA GPU", file=sys.stderr)
        raise SystemExit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    t0 = time.time()
    for n in args.cols:
        measure(n, args.rows, args.heads, results, t0, HINT_ARMS if args.hints else ARMS)
    doc = {"schema": "kiln.rows_recompute_probe/1", "environment": collect("cuda"),
           "rows": args.rows, "results": results}  # fmt: skip
    (args.out / "rows_recompute_probe.json").write_text(json.dumps(doc, indent=2, default=str))
    print(f"\nbf16 {args.rows} rows, % of the copy (masked: a bool [1, 1, Q, K] mask)")
    for r in results:
        shown = f"{r['pct_of_copy']:5.1f}" if r["pct_of_copy"] else r["status"]
        err = f"{r['max_error']:.1e}" if r["max_error"] is not None else "-"
        print(f"  {r['kernel']:8s} {r['cols']:6d} {r['arm']:32s} {shown}  err {err}")


if __name__ == "__main__":
    main()
