"""Probe: the masked bf16 rows of 32768 with their bool mask copied as 64-bit words.

    PYTHONPATH=src python3 benchmarks/mask_words_probe.py --out DIR

What session 19 asked (issue 6): the masked bf16 forward at 4096 x 32768 runs at 78% of the copy
in kiln's persistent rows kernel heads innermost (`_softmax.ROWS_HEADS_2BYTE`), where the same
kernel without a mask runs at ~90%. Nsight Compute had both stalled mostly on the shared-memory
queue (MIO); the mask adds, a thread a row, four 8-byte cp.async copies (x's layout gives a
thread 8 columns, 8 mask bytes) and four 8-byte shared loads, and each mask byte is extracted
and compared. The "words" arms hold a row as [BLOCK_N / 8, 8], so each group of 8 columns is one
64-bit word of the mask, loaded as words: the mask's copies are 16 bytes, like x's, and each byte
is tested in place (a shift and a mask by a constant an element, which ptxas makes one LOP3 with
a predicate). This probe wrote that kernel first; since kiln a695108 it is kiln's
`_softmax_fwd_rows_words`, which the "words" arms now launch. The "bool" arms run this probe's
kernel: the same layout and row order reading the mask's bytes. Each arm is checked against
torch and timed with triton.testing.do_bench (median, L2 flushed) beside kiln's default launch
(since a695108 the words kernel itself) and a device copy, in one process. Results:
DIR/mask_words_probe.json with the environment; a table last.
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
from torchkiln.kernels import _softmax as ks  # noqa: E402
from torchkiln.kernels._softmax import (  # noqa: E402
    _exp_factor,
    _finite,
    _heads_inner_row,
    _inverse,
)


@triton.jit
def _rows_bytes(
    x_ptr, y_ptr, m_ptr, M, N, Q, smb, smh, smq, scale,
    BLOCK_N: tl.constexpr, STAGES: tl.constexpr, HEADS: tl.constexpr,
):  # fmt: skip
    # The words kernel's layout with the mask read as bytes (the probe's "bool" arms; the
    # "words" arms run kiln's _softmax_fwd_rows_words, which this probe wrote first): rows pid,
    # pid + G, ... heads innermost, each [BLOCK_N / 8, 8] with N == BLOCK_N; a positive scale
    # rides in exp2's argument, as kiln's POS_SCALE.
    c = _exp_factor(scale, True)
    G: tl.constexpr = BLOCK_N // 8
    g = tl.arange(0, G)
    k = tl.arange(0, 8)[None, :]
    cols = g[:, None] * 8 + k
    for r in tl.range(tl.program_id(0), M, tl.num_programs(0), num_stages=STAGES):
        row, m_off = _heads_inner_row(r, Q, smb, smh, smq, HEADS)
        row = row.to(tl.int64)
        z = tl.load(x_ptr + row * N + cols).to(tl.float32)
        z = tl.where(tl.load(m_ptr + m_off + cols) != 0, z, float("-inf"))
        mx = _finite(tl.max(tl.max(z, 1), 0))
        e = tl.exp2(z * c - mx * c)
        inv = _inverse(tl.sum(tl.sum(e, 1), 0), True)
        tl.store(y_ptr + row * N + cols, (e * inv).to(y_ptr.dtype.element_ty))


def launch(x, mask, scale, mode, warps, stages, per_sm, heads):
    """softmax(scale * x masked) over rows of x [1, H, Q, N] and a bool mask [1, 1, Q, N]: mode
    1 kiln's words kernel, 0 this probe's kernel reading the mask's bytes."""
    y = torch.empty_like(x)
    n = x.shape[-1]
    q = x.shape[-2]
    grid = (per_sm * torch.cuda.get_device_properties(x.device).multi_processor_count,)
    if mode == 1:
        ks._softmax_fwd_rows_words[grid](
            x, y, mask, x.numel() // n, n, heads, q, 0, 0, mask.stride(-2), 1, scale, SAFE=True,
            BLOCK_N=n, STAGES=stages, MASK_DIMS=4, POS_SCALE=scale > 0, HEADS_INNER=heads,
            num_warps=warps,
        )  # fmt: skip
        return y
    _rows_bytes[grid](
        x, y, mask, x.numel() // n, n, q, 0, 0, mask.stride(-2), scale,
        BLOCK_N=n, STAGES=stages, HEADS=heads, num_warps=warps,
    )  # fmt: skip
    return y


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=32768)
    p.add_argument("--heads", type=int, default=8)
    args = p.parse_args()
    from torchkiln.kernels import functional as F
    from torchkiln.measure.environment import collect

    if not torch.cuda.is_available():
        print("mask_words_probe: needs a CUDA GPU", file=sys.stderr)
        raise SystemExit(2)
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    h, q, n = args.heads, args.rows // args.heads, args.cols
    x = torch.randn((1, h, q, n), generator=gen, device="cuda").to(torch.bfloat16)
    mask = torch.rand((1, 1, q, n), generator=gen, device="cuda") < 0.9
    mask[0, 0, 3] = False  # a fully masked row: zeros
    scale = 0.125
    ref = torch.softmax((x.float() * scale).masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    dst = torch.empty_like(x)
    bench = triton.testing.do_bench
    copy_ms = bench(lambda: dst.copy_(x))
    copy_bytes = 2 * x.numel() * 2
    nbytes = copy_bytes + mask.numel()
    results: list[dict] = []
    t0 = time.time()

    def record(name, fn):
        results.append({"arm": name, **time_arm(fn, ref, nbytes, copy_bytes, copy_ms, bench)})
        r = results[-1]
        shown = f"{r['pct_of_copy']:5.1f}%" if r["pct_of_copy"] else r["status"]
        print(f"[{time.time() - t0:6.1f}s] {name:40s} {shown}", flush=True)

    record("kiln default", lambda: F.masked_softmax(x, mask, scale))
    for mode in (1, 0):
        for warps, per_sm, stages in ((32, 1, 3), (16, 1, 3), (16, 2, 3), (32, 1, 2)):
            name = f"{'words' if mode else 'bool'} w{warps} {per_sm}/SM s{stages}"
            record(name, lambda m=mode, w=warps, s=stages, pps=per_sm: launch(
                x, mask, scale, m, w, s, pps, h))  # fmt: skip
    record("kiln default (again)", lambda: F.masked_softmax(x, mask, scale))
    doc = {"schema": "kiln.mask_words_probe/1", "environment": collect("cuda"), "rows": args.rows,
           "cols": n, "heads": h, "copy_ms": copy_ms, "results": results}  # fmt: skip
    (args.out / "mask_words_probe.json").write_text(json.dumps(doc, indent=2, default=str))
    print(
        f"\nbf16 {args.rows} x {n}, bool [1, 1, Q, K] mask, % of the copy ({copy_ms * 1e3:.1f} us)"
    )
    for r in results:
        shown = f"{r['pct_of_copy']:5.1f}" if r["pct_of_copy"] else r["status"]
        print(f"  {r['arm']:40s} {shown}")


if __name__ == "__main__":
    main()
