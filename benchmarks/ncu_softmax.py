"""Launches kiln's softmax forwards for Nsight Compute to profile (issue 6): why does the masked
forward stop at 85-88% of the copy at 12672-16384 columns where the unmasked one reaches 93-98%?

    ncu --clock-control none --kernel-name regex:_softmax_fwd --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
        python3 benchmarks/ncu_softmax.py --cols 16384 --dtype bf16

Plain softmax, then the masked one with the bench's [1, 1, Q, K] bool mask, each launched
`--calls` times (3) through the functional API as users call it: --launch-skip 2 --launch-count
2 profiles the third plain launch and the first masked one. Needs a CUDA GPU.
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
    args = parser.parse_args(argv)

    import torch

    from torchkiln.kernels import functional as F
    from torchkiln.kernels._cases import ATTN_SCALE, HEADS

    if not torch.cuda.is_available():
        print("ncu_softmax: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    q = args.rows // HEADS
    x = torch.randn((1, HEADS, q, args.cols), device="cuda").to(dtype)
    mask = torch.rand((1, 1, q, args.cols), device="cuda") < 0.9
    for kind, call in (
        ("plain", lambda: F.softmax(x)),
        ("masked", lambda: F.masked_softmax(x, mask, ATTN_SCALE)),
    ):
        for i in range(args.calls):
            call()
            print(f"launch: {kind} #{i + 1}", flush=True)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
