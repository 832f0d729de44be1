"""Probe: the 32768-element bf16 softmax rows through the Hopper tensor-copy engine (TMA).

    PYTHONPATH=src python3 benchmarks/tma_rows_probe.py --out DIR

What session 18 asked (issue 6): the bf16 forward at 4096 x 32768 is the table's last kernel-side
failure (softmax 88-89% of the copy, masked 75-76%); every launch of kiln's own kernels measured
in sessions 10-17 sits there. This kernel is not kiln's: a persistent program per SM takes rows in
turn, each row viewed as an [R, C] tile of x and loaded by one tensor descriptor (the copy engine
moves it to shared memory, no thread issues its loads and no registers hold its addresses), with
Triton's pipeliner keeping STAGES rows in flight; the store goes through pointers or through a
second descriptor. The masked form loads its bool [1, 1, Q, K] mask by a third descriptor (as
uint8), optionally heads innermost so that a query's mask row serves all heads while in L2.
Each arm is checked against torch and timed with triton.testing.do_bench (median, L2 flushed)
beside kiln's default launch and a device copy of the same tensor, in one process. Results:
DIR/tma_rows_probe.json with the environment; a table last.
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

LOG2E = 1.4426950408889634


@triton.jit
def _rows_tma(
    x_desc, y_desc, y_ptr, m_desc, M, N, H, Q, scale,
    R: tl.constexpr, C: tl.constexpr, STAGES: tl.constexpr, TMA_STORE: tl.constexpr,
    MASKED: tl.constexpr, HEADS_INNER: tl.constexpr,
):  # fmt: skip
    offs = tl.arange(0, R)[:, None] * C + tl.arange(0, C)[None, :]
    for i in tl.range(tl.program_id(0), M, tl.num_programs(0), num_stages=STAGES):
        if HEADS_INNER:
            q = i // H
            r = (i % H) * Q + q
        else:
            r = i
            q = i % Q
        z = x_desc.load([r * R, 0]).to(tl.float32) * scale
        if MASKED:
            keep = m_desc.load([q * R, 0]) != 0
            z = tl.where(keep, z, float("-inf"))
        m = tl.max(tl.max(z, 1), 0)
        m = tl.where(m == float("-inf"), 0.0, m)
        e = tl.exp2(z - m)
        s = tl.sum(tl.sum(e, 1), 0)
        inv = tl.where(s > 0, 1.0 / s, 0.0)
        y = (e * inv).to(y_ptr.dtype.element_ty)
        if TMA_STORE:
            y_desc.store([r * R, 0], y)
        else:
            tl.store(y_ptr + r.to(tl.int64) * N + offs, y)


def launch(x, mask, scale, *, r, warps, stages, tma_store, heads_inner, heads, programs_per_sm):
    from triton.tools.tensor_descriptor import TensorDescriptor

    m, n = x.shape[0] * x.shape[1] * x.shape[2], x.shape[-1]
    c = n // r
    y = torch.empty_like(x)
    xd = TensorDescriptor.from_tensor(x.view(m * r, c), [r, c])
    yd = TensorDescriptor.from_tensor(y.view(m * r, c), [r, c])
    q = x.shape[2]
    md = xd
    if mask is not None:
        md = TensorDescriptor.from_tensor(mask.view(torch.uint8).view(q * r, c), [r, c])
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    grid = (min(m, sms * programs_per_sm),)
    _rows_tma[grid](
        xd, yd, y, md, m, n, heads, q, scale * LOG2E,
        R=r, C=c, STAGES=stages, TMA_STORE=tma_store, MASKED=mask is not None,
        HEADS_INNER=heads_inner, num_warps=warps,
    )  # fmt: skip
    return y


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=32768)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="few arms (a CPU smoke run)")
    args = p.parse_args()
    from torchkiln.kernels import functional as F
    from torchkiln.measure.environment import collect

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    h, q, n = args.heads, args.rows // args.heads, args.cols
    x = torch.randn((1, h, q, n), generator=gen, device=dev).to(torch.bfloat16)
    mask = torch.rand((1, 1, q, n), generator=gen, device=dev) < 0.9
    scale = 0.125
    bench = triton.testing.do_bench if dev == "cuda" else (lambda fn: (fn(), 0.0)[1])
    results: list[dict] = []
    t0 = time.time()

    def record(kind, name, fn, ref, nbytes, copy_ms):
        # The masked arms' bytes include the mask. session18/tma/ was written before this
        # counting: there the masked arms' figure is the copy's time over theirs, 3% under it.
        results.append({"kind": kind, "arm": name,
                        **time_arm(fn, ref, nbytes, copy_bytes, copy_ms, bench)})  # fmt: skip
        r = results[-1]
        shown = f"{r['pct_of_copy']:5.1f}%" if r["pct_of_copy"] else r["status"]
        print(f"[{time.time() - t0:6.1f}s] {kind:7s} {name:34s} {shown}", flush=True)

    src = x.clone()
    dst = torch.empty_like(x)
    copy_ms = bench(lambda: dst.copy_(src)) if dev == "cuda" else 1.0
    print(f"copy bf16 {args.rows}x{n}: {copy_ms * 1e3:.1f} us", flush=True)
    ref_plain = torch.softmax(x.float(), -1)
    z = (x.float() * scale).masked_fill(~mask, float("-inf"))
    ref_masked = torch.softmax(z, -1).nan_to_num(0.0)
    nb = copy_bytes = 2 * x.numel() * 2
    record("softmax", "kiln default", lambda: F.softmax(x), ref_plain, nb, copy_ms)
    record("masked", "kiln default", lambda: F.masked_softmax(x, mask, scale), ref_masked,
           nb + mask.numel(), copy_ms)  # fmt: skip
    plain_arms = [(128, w, s, t, 1) for w in (8, 16, 32) for s in (2, 3) for t in (False, True)]
    plain_arms += [(64, 16, 3, False, 1), (256, 16, 3, False, 1), (128, 16, 1, False, 2)]
    masked_arms = [(128, w, s, t, hi) for w in (16, 32) for s in (1, 2) for t in (False, True)
                   for hi in (False, True)]  # fmt: skip
    if args.quick:
        plain_arms, masked_arms = plain_arms[:2], masked_arms[:2]
    for r, w, s, t, pps in plain_arms:
        name = f"tma {r}x{n // r} w{w} s{s} {'tma-store' if t else 'ptr-store'} {pps}/SM"
        fn = lambda r=r, w=w, s=s, t=t, pps=pps: launch(  # noqa: E731
            x, None, 1.0, r=r, warps=w, stages=s, tma_store=t,
            heads_inner=False, heads=h, programs_per_sm=pps)  # fmt: skip
        record("softmax", name, fn, ref_plain, nb, copy_ms)
    for r, w, s, t, hi in masked_arms:
        store = "tma-store" if t else "ptr-store"
        name = f"tma {r}x{n // r} w{w} s{s} {store}{' heads-in' if hi else ''}"
        fn = lambda r=r, w=w, s=s, t=t, hi=hi: launch(  # noqa: E731
            x, mask, scale, r=r, warps=w, stages=s, tma_store=t, heads_inner=hi, heads=h,
            programs_per_sm=1)  # fmt: skip
        record("masked", name, fn, ref_masked, nb + mask.numel(), copy_ms)
    out = {"schema": "kiln.tma_rows_probe/1", "environment": collect(dev),
           "config": vars(args) | {"out": str(args.out)}, "copy_ms": copy_ms,
           "results": results}  # fmt: skip
    (args.out / "tma_rows_probe.json").write_text(json.dumps(out, indent=1, default=str))
    print("\n| kind | arm | % of copy |\n| --- | --- | --- |")
    for row in results:
        pct = f"{row['pct_of_copy']:.1f}" if row["pct_of_copy"] else row["status"]
        print(f"| {row['kind']} | {row['arm']} | {pct} |")


if __name__ == "__main__":
    main()
