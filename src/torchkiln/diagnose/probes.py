"""Doctor probes that must run in a fresh process: a real Triton kernel, a real Inductor compile.

    python -m torchkiln.diagnose.probes triton|inductor

Each prints one JSON line, {"ok": bool, "evidence": str, "error": str | None}. A crash or a hang
is reported by the parent from the exit code or the timeout.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

from torchkiln.runner.launch.orphan import exit_with_launcher

N = 1237  # odd on purpose: exercises the mask on the last block


def _error(exc: BaseException) -> str:
    # The last lines name the real cause (ptxas, a missing header, OpenMP), not the wrapper.
    lines = "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()
    return "\n".join(lines[-6:])


def probe_triton() -> dict[str, Any]:
    start = time.perf_counter()
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _axpy(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, alpha * x + y, mask=mask)

    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interpret else "cuda"
    x = torch.randn(N, device=device)
    y = torch.randn(N, device=device)
    out = torch.empty_like(x)
    _axpy[(triton.cdiv(N, 256),)](x, y, out, N, 2.0, BLOCK=256)
    if device == "cuda":
        torch.cuda.synchronize()
    expected = 2.0 * x + y
    ok = bool(torch.allclose(out, expected, rtol=1e-5, atol=1e-6))
    where = "the Triton interpreter (TRITON_INTERPRET=1)" if interpret else f"{device}"
    took = time.perf_counter() - start
    return {
        "ok": ok,
        "evidence": f"compiled and ran an axpy kernel ({N} elements) on {where} in {took:.1f} s"
        + ("; matches torch" if ok else "; WRONG result vs torch"),
        "error": None if ok else f"max abs error {(out - expected).abs().max().item():.3g}",
    }


def probe_inductor() -> dict[str, Any]:
    start = time.perf_counter()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"

    def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (torch.sin(x) * y + 1.0).sum(dim=-1)

    x = torch.randn(33, 65, device=device)
    y = torch.randn(33, 65, device=device)
    # fullgraph: a graph break here would mean Inductor compiled nothing and still "worked".
    compiled = torch.compile(f, backend="inductor", fullgraph=True)
    out = compiled(x, y)
    if device == "cuda":
        torch.cuda.synchronize()
    ok = bool(torch.allclose(out, f(x, y), rtol=1e-4, atol=1e-4))
    how = "Triton (ptxas)" if device == "cuda" else "the C++ backend"
    took = time.perf_counter() - start
    return {
        "ok": ok,
        "evidence": f"compiled a sin*mul+sum function through {how} on {device} and ran it "
        f"in {took:.1f} s (fresh cache)" + ("; matches eager" if ok else "; WRONG vs eager"),
        "error": None if ok else "compiled output differs from eager beyond 1e-4",
    }


PROBES = {"triton": probe_triton, "inductor": probe_inductor}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in PROBES:
        print(f"usage: python -m torchkiln.diagnose.probes {{{','.join(PROBES)}}}", file=sys.stderr)
        return 2
    try:
        result = PROBES[args[0]]()
    except Exception as exc:  # noqa: BLE001  (the failure is the finding: report it, exit 0)
        result = {"ok": False, "evidence": "", "error": _error(exc)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    exit_with_launcher()  # ends with the kiln that launched it (runner/launch/orphan.py)
    sys.exit(main())
