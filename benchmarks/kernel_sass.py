"""Instructions per element of kiln's element-wise kernels, from their SASS (no GPU needed).

    python3 benchmarks/kernel_sass.py --out benchmarks/results/kernels-sass

A kernel whose every element costs the same straight-line code is issue-bound when its
instructions per element times the element rate exceed what the SMs can issue: on an H200, 132
SMs x 4 schedulers x ~1.98 GHz x 32 lanes is ~3.3e13 thread-instructions a second, and a bf16
element moved at the ~3.9 TB/s copy ceiling (2 bytes in, 2 out) arrives at ~9.8e11 a second,
so ~34 instructions per element is the most a bf16 kernel can spend and still keep up with
memory. In session 8 the bf16 bias_act_scale forward with tl.erf's GELU (48.5 instructions per
element here) ran at 62% of the copy ceiling and relu (17) at 94%, as this bound predicts.

For each configuration it compiles the kernel for sm_90 with Triton's own compiler (its
front end, LLVM and the bundled ptxas all run on the CPU), disassembles the cubin with the
bundled cuobjdump, and counts the instructions of the whole (loop-free) kernel over the
elements one thread handles. Writes DIR/kernel_sass.json with the environment and prints a
table last. Needs the `triton` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SM90 = ("cuda", 90, 32)
ROW_ARGS = {"M": "i32", "N": "i32"}


def compile_sm90(kernel: Any, signature: dict, constexprs: dict, num_warps: int) -> Any:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    types = {**signature, **{name: "constexpr" for name in constexprs}}
    source = ASTSource(kernel, {k: types[k] for k in kernel.arg_names}, constexprs)
    return triton.compile(source, target=GPUTarget(*SM90), options={"num_warps": num_warps})


def sass_counts(compiled: Any) -> Counter:
    """Opcode -> count in the kernel's SASS (cuobjdump -sass on its cubin)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    try:
        out = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                             timeout=120, check=True).stdout  # fmt: skip
    finally:
        os.unlink(f.name)
    ops: Counter = Counter()
    for line in out.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(1)] += 1
    return ops


def bias_act_rows(cols: int) -> list[dict[str, Any]]:
    from torchkiln.kernels import _bias_act as ba

    names = {0: "relu", 1: "gelu tl.erf", ba.GELU_POLY: "gelu erfc polynomial",
             ba.GELU_POLY_FAST: "gelu polynomial, approx rcp+exp2"}  # fmt: skip
    block_m, block_n, warps = ba.tile_config(cols, ba.FWD_TILE)
    per_thread = block_m * block_n / (32 * warps)
    rows = []
    for dtype in ("bf16", "fp32"):
        sig = {"x_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "y_ptr": f"*{dtype}", **ROW_ARGS,
               "scale": "fp32"}  # fmt: skip
        for code, name in names.items():
            consts = {"ACT": code, "BLOCK_M": block_m, "BLOCK_N": block_n}
            ops = sass_counts(compile_sm90(ba._bias_act_fwd, sig, consts, warps))
            total = sum(ops.values())
            rows.append({"kernel": "bias_act_scale fwd", "variant": name, "dtype": dtype,
                         "cols": cols, "values_per_thread": per_thread, "instructions": total,
                         "per_element": total / per_thread,
                         "top": dict(ops.most_common(8))})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for kernel_sass.json")
    p.add_argument("--cols", type=int, default=16384, help="row length of the tile config")
    args = p.parse_args(argv)

    from torchkiln.errors import require
    from torchkiln.measure.environment import collect

    require("triton", "triton", "benchmarks/kernel_sass.py")
    rows = bias_act_rows(args.cols)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"schema": "kiln.kernel_sass/1", "environment": collect("cpu"), "target": "sm_90",
           "rows": rows}  # fmt: skip
    (out / "kernel_sass.json").write_text(json.dumps(doc, indent=2, default=str))
    for r in rows:
        print(f"{r['kernel']:20s} {r['dtype']:5s} {r['variant']:34s} "
              f"{r['per_element']:5.1f} instructions per element")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
