"""Launches kiln's softmax forwards for Nsight Compute to profile: why does the masked
forward stop at 85-88% of the copy at 12672-16384 columns where the unmasked one reaches 93-98%?

    ncu --clock-control none --kernel-name regex:_softmax_fwd --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
        --metrics dram__bytes_read.sum,dram__bytes_write.sum \
        python3 benchmarks/ncu_softmax.py --cols 16384 --dtype bf16

Plain softmax, then the masked one with the bench's [1, 1, Q, K] bool mask, each launched
`--calls` times (3) through the functional API as users call it: --launch-skip 2 --launch-count
2 profiles the third plain launch and the first masked one; `--heads-inner` adds, after them,
the masked forward in the block kernel's other row order (HEADS_INNER off where the default
takes it, as for fp32 from 8192-element blocks, on where it does not), so the two orders sit
side by side (with `--calls 1`, ncu's `--launch-count 3` takes one launch of each: ncu flushes
the caches before each pass). On an H200 (results committed in 127f407, without the
metrics line): the masked bf16 forward at 4096 x 16384 moved 3.83 TB/s through DRAM for 76.9
us, the plain one 3.54 TB/s for 69.1 us; at ec37f21: 183 MB read in
the default order, 143 MB heads innermost (78.4 us against 75.4), 134 MB without a mask. Needs
a CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cols", type=int, default=12672)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--calls", type=int, default=3, help="launches of each kind, in turn")
    parser.add_argument(
        "--heads-inner",
        action="store_true",
        help="then the masked forward in the other row order (HEADS_INNER)",
    )
    parser.add_argument(
        "--rows-kernel",
        metavar="W:P:S",
        help="then the masked forward in the persistent rows kernel at warps:programs an "
        "SM:stages, heads innermost, its mask at x's width, unpredicated where rows fill the "
        "block",
    )
    args = parser.parse_args(argv)

    import torch

    from torchkiln.kernels import _softmax as ks
    from torchkiln.kernels import functional as F
    from torchkiln.kernels._cases import ATTN_SCALE, HEADS
    from torchkiln.kernels._launch import direct_launches

    if not torch.cuda.is_available():
        print("ncu_softmax: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    q = args.rows // HEADS
    x = torch.randn((1, HEADS, q, args.cols), device="cuda").to(dtype)
    mask = torch.rand((1, 1, q, args.cols), device="cuda") < 0.9

    # The order the default does not take: ks.heads_inner_order decides it from the mask's
    # MASK_DIMS (4: the mask differs by query only).
    other = not ks.heads_inner_order(args.cols, ks.MASK_ALONG_Q, x.element_size(), HEADS)

    def heads_inner() -> None:
        with direct_launches():
            ks.softmax_forward(x, mask, ATTN_SCALE, safe=True, heads_inner=other)

    kinds = [
        ("plain", lambda: F.softmax(x)),
        ("masked", lambda: F.masked_softmax(x, mask, ATTN_SCALE)),
    ]
    if args.heads_inner:
        kinds.append((f"masked, heads inner {other}", heads_inner))
    if args.rows_kernel:
        config = tuple(int(v) for v in args.rows_kernel.split(":"))

        def rows_kernel() -> None:
            with direct_launches():
                ks.softmax_forward(x, mask, ATTN_SCALE, safe=True, rows_config=config,
                                   heads_inner=True, mask_vec=True, even=True)  # fmt: skip

        kinds.append((f"masked, rows kernel {args.rows_kernel} heads inner", rows_kernel))
    for kind, call in kinds:
        for i in range(args.calls):
            call()
            print(f"launch: {kind} #{i + 1}", flush=True)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
