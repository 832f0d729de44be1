"""Instructions per element of kiln's element-wise kernels, from their SASS (no GPU needed).

    python3 benchmarks/kernel_sass.py --out benchmarks/results/kernels/sass

A kernel whose every element costs the same straight-line code is issue-bound when its instructions
per element times the element rate exceed what the SMs can issue: on an H200, 132 SMs x 4 schedulers
x ~1.98 GHz x 32 lanes is ~3.3e13 thread-instructions a second, and a bf16 element moved at the ~3.9
TB/s copy ceiling (2 bytes in, 2 out) arrives at ~9.8e11 a second, so ~34 instructions per element
is the most a bf16 kernel can spend and still keep up with memory, fewer in practice. On an H200
(kiln 550ec6a) the bf16 bias_act_scale forward with tl.erf's GELU (41.5 instructions per element
here) ran at 62% of the copy ceiling, the erfc polynomial of then (40.0) at 73% and relu (10.5) at
94%: a rough guide, not a model (the instruction mix counts too).

For each configuration it compiles the kernel for sm_90 with Triton's own compiler (its
front end, LLVM and the bundled ptxas all run on the CPU), disassembles the cubin with the
bundled cuobjdump, and counts the instructions of the whole (loop-free) kernel over the
elements one thread handles, with the integer arguments specialised as at the bench's launch
(compile_sm90). It also counts the softmax forward at 12672 columns (the single block padded to
16384, which fp32 and the masked forward run there; padded rows take
_softmax._softmax_fwd_pieces where pieces_config says; an earlier count of a kernel holding the
row as power-of-two pieces, 21.7 against 25.9 at bf16, ran slower on the H200 (8c6d424) and was
removed). Writes
DIR/kernel_sass.json with the environment and prints a table last. Needs the `triton` extra.
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
ROWS = 4096  # as bench_kernels.py
ROW_ARGS = {"M": "i32", "N": "i32"}


def compile_sm90(
    kernel: Any, signature: dict, constexprs: dict, num_warps: int, ints: dict | None = None
) -> Any:
    """The kernel compiled for sm_90 as Triton's JIT would compile it at a launch with the
    integer arguments `ints`: an int equal to 1 becomes a constant, a multiple of 16 and every
    pointer (torch's allocations are 16-byte aligned) get tt.divisibility = 16, which is what
    lets loads vectorise (Triton 3.8's `native_specialize_impl` returns ('constexpr', 1) for
    1 and 'D' for multiples of 16). Without them the counts here were ~1.8x the launched
    kernel's for the masked softmax."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # Constexprs not given take their defaults, as at a launch that leaves them out.
    defaults = {p.name: p.default for p in kernel.params if p.is_constexpr and p.has_default}
    signature = dict(signature)
    constexprs = {**{k: v for k, v in defaults.items() if k not in signature}, **constexprs}
    divisible = []
    for name, value in (ints or {}).items():
        if value == 1:
            signature.pop(name)
            constexprs[name] = 1
        elif value % 16 == 0:
            divisible.append(name)
    divisible += [name for name, ty in signature.items() if ty.startswith("*")]
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    types = {**signature, **{name: "constexpr" for name in constexprs}}
    source = ASTSource(kernel, {k: types[k] for k in kernel.arg_names}, constexprs, attrs)
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


def count(
    label: str, variant: str, dtype: str, cols: int, per_thread: float, kernel: Any,
    sig: dict, consts: dict, warps: int, ints: dict,
) -> dict[str, Any]:  # fmt: skip
    """One row of the table: the kernel's SASS counted over the values one thread handles."""
    ops = sass_counts(compile_sm90(kernel, sig, consts, warps, ints))
    total = sum(ops.values())
    return {"kernel": label, "variant": variant, "dtype": dtype, "cols": cols,
            "values_per_thread": per_thread, "instructions": total,
            "per_element": total / per_thread, "top": dict(ops.most_common(8))}  # fmt: skip


def bias_act_rows(cols: int) -> list[dict[str, Any]]:
    """The forward, then the backward. The backward loops over row blocks: its whole static code
    over one tile's values (the loop's body once, plus the bias-sum epilogue), an upper bound
    per element. It moves 6 bytes per bf16 element (x and dy in, dx out), so ~51 instructions
    keep up with memory."""
    from torchkiln.kernels import _bias_act as ba

    names = {0: "relu", 1: "gelu tl.erf", ba.GELU_POLY: "gelu erfc polynomial",
             ba.GELU_POLY_FAST: "gelu polynomial, approx rcp+exp2"}  # fmt: skip
    directions = (
        ("bias_act_scale fwd", ba._bias_act_fwd, ba.FWD_TILE, ("x", "b", "y"), {}),
        ("bias_act_scale bwd", ba._bias_act_bwd, ba.BWD_TILE, ("x", "b", "dy", "dx"),
         {"db_partial_ptr": "*fp32"}),
    )  # fmt: skip
    rows = []
    for label, kernel, tile, tensors, extra in directions:
        block_m, block_n, warps = ba.tile_config(cols, tile)
        per_thread = block_m * block_n / (32 * warps)
        ints = {"M": ROWS, "N": cols}
        if label.endswith("bwd"):
            ints["rows_per_prog"] = 64
        for dtype in ("bf16", "fp32"):
            sig = {**{f"{t}_ptr": f"*{dtype}" for t in tensors}, **extra, **ROW_ARGS,
                   **({"rows_per_prog": "i32"} if "rows_per_prog" in ints else {}),
                   "scale": "fp32"}  # fmt: skip
            for code, name in names.items():
                consts = {"ACT": code, "BLOCK_M": block_m, "BLOCK_N": block_n}
                if label.endswith("bwd"):
                    consts["PREFETCH"] = False  # the default launch
                rows.append(count(label, name, dtype, cols, per_thread, kernel, sig, consts,
                                  warps, ints))  # fmt: skip
    return rows


def softmax_rows(cols: int) -> list[dict[str, Any]]:
    """The single-block forward (padded to a power of two), plain and masked, and the pieces
    kernel where it runs: instructions per element of the row, padding included in the cost."""
    from torchkiln.kernels import _softmax as ks

    mask_args = {"H": "i32", "Q": "i32", "smb": "i32", "smh": "i32", "smq": "i32",
                 "smk": "i32", "scale": "fp32"}  # fmt: skip
    rows = []
    for dtype in ("bf16", "fp32"):
        itemsize = 2 if dtype == "bf16" else 4
        for kind in (ks.MASK_NONE, ks.MASK_BOOL):
            sig = {"x_ptr": f"*{dtype}", "y_ptr": f"*{dtype}",
                   "m_ptr": "*i1" if kind == ks.MASK_BOOL else f"*{dtype}", **ROW_ARGS,
                   **mask_args}  # fmt: skip
            common = {"MASK_KIND": kind, "SAFE": kind != ks.MASK_NONE}
            block_m, block_n, warps = ks.forward_config(cols, kind != ks.MASK_NONE, itemsize)
            variants = [
                (f"single block {block_n} w{warps}", ks._softmax_fwd_block,
                 {**common, "BLOCK_M": block_m, "BLOCK_N": block_n}, warps, block_m),
            ]  # fmt: skip
            # The bench's attention shape: [1, 8, 512, N] scores, a [1, 1, 512, N] bool mask.
            heads, q = 8, ROWS // 8
            # The pieces kernel where pieces_config takes these rows (the bench's
            # mask is shared by the heads).
            pieces = ks.pieces_config(cols, kind, itemsize, shared=True)
            if pieces is not None:
                piece, count_, tail, w, inner, vec = pieces
                consts = {**common, "PIECE": piece, "PIECES": count_, "TAIL": tail,
                          "HEADS_INNER": heads if inner else 0,
                          "MASK_VEC": 16 // itemsize if vec and kind else 0}  # fmt: skip
                name = f"pieces {count_}x{piece}+{tail} w{w}{' heads-inner' if inner else ''}"
                variants.append((name, ks._softmax_fwd_pieces, consts, w, 1))
            ints = {"M": ROWS, "N": cols, "H": heads, "Q": q}
            if kind == ks.MASK_BOOL:
                ints |= {"smb": q * cols, "smh": 0, "smq": cols, "smk": 1}
            else:
                ints |= {"smb": 0, "smh": 0, "smq": 0, "smk": 0}
            label = "masked_softmax fwd" if kind else "softmax fwd"
            # As the launcher sets them for this mask (the query index alone: one division)
            # and the bench's positive scales.
            addressing = [ints[k] for k in ("M", "H", "Q", "smb", "smh", "smq")]
            for _, _, consts, _, _ in variants:
                consts["MASK_DIMS"] = ks.mask_dims(kind, *addressing)
                consts["POS_SCALE"] = True
            for name, kernel, consts, w, rows_per_program in variants:
                per_thread = rows_per_program * cols / (32 * w)
                rows.append(count(label, name, dtype, cols, per_thread, kernel, sig, consts, w,
                                  ints))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for kernel_sass.json")
    p.add_argument("--cols", type=int, default=16384, help="bias_act_scale's row length")
    p.add_argument("--softmax-cols", type=int, default=12672, help="the softmax row length")
    args = p.parse_args(argv)

    from torchkiln.errors import require
    from torchkiln.measure.environment import collect

    require("triton", "triton", "benchmarks/kernel_sass.py")
    rows = bias_act_rows(args.cols) + softmax_rows(args.softmax_cols)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"schema": "kiln.kernel_sass/1", "environment": collect("cpu"), "target": "sm_90",
           "rows": rows}  # fmt: skip
    (out / "kernel_sass.json").write_text(json.dumps(doc, indent=2, default=str))
    for r in rows:
        print(f"{r['kernel']:20s} {r['dtype']:5s} {r['variant']:34s} {r['cols']:6d} "
              f"{r['per_element']:5.1f} instructions per element")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
