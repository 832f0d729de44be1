"""Where one eager kernel call's time goes (issue 6): the host's launch path, layer by layer,
against the kernel's own device time.

    PYTHONPATH=src python3 benchmarks/kernel_host_path.py --out benchmarks/results/kernels-h200

Session 6 measured kiln's forward softmax at 50-60 us of host time per call against 10 us for
torch.softmax, and found short rows launch-bound (fp32 4096 x 2048 at 52% of the copy ceiling;
94% in session 2). This script splits that time for one shape per dtype:

- host us per call, back-to-back calls with no synchronisation, median of several rounds, for
  torch.softmax, torch.empty_like (the output allocation), kiln's functional API, the op body
  (device guard and launcher), the launcher, kiln's experimental fast launch (KILN_FAST_LAUNCH:
  the compiled kernel kept and launched directly), the bare `kernel[grid](...)` launch into a
  preallocated output, and the compiled kernel's own launcher where this Triton exposes it
  (`JITFunction.warmup` returning a CompiledKernel; each way of calling it is tried and checked
  against torch.softmax, and one that fails is reported with its error);
- device us per call: 20 calls captured in a CUDA graph and replayed, so no host time is in it,
  with and without the output allocation.

Writes DIR/kernel_host_path.json (environment included) and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CALLS, ROUNDS = 200, 7
GRAPH_CALLS, GRAPH_REPLAYS = 20, 50


def host_us(fn: Any) -> float:
    """Median over ROUNDS of one call's host time, CALLS calls back to back, no sync inside."""
    import torch

    rounds = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        rounds.append((time.perf_counter() - t0) / CALLS * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def device_us(fn: Any) -> float:
    """One call's device time: GRAPH_CALLS calls captured in a CUDA graph, replayed."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(GRAPH_REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (GRAPH_REPLAYS * GRAPH_CALLS)


def _attempt(name: str, fn: Any, ref: Any, out: Any, rows: list[dict]) -> None:
    """Time `fn` if it runs and writes the right softmax into `out`; otherwise say why not."""
    import torch

    try:
        out.zero_()
        fn()
        torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item()
        if not err <= 3e-2:
            rows.append({"layer": name, "status": f"wrong result (max error {err:.3g})"})
            return
        rows.append({"layer": name, "status": "ok", "host_us": host_us(fn)})
    except Exception as exc:  # noqa: BLE001  (a layer this Triton lacks is a reported status)
        rows.append({"layer": name, "status": f"{type(exc).__name__}: {exc}"[:300]})


def measure(dtype_name: str, rows_n: int, cols: int) -> dict[str, Any]:
    import torch
    import triton

    from torchkiln.kernels import _fast_launch, functional, ops
    from torchkiln.kernels import _softmax as ks
    from torchkiln.kernels._launch import direct_launches

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    x = torch.randn(rows_n, cols, device="cuda", dtype=dtype)
    ref = torch.softmax(x.float(), dim=-1).to(dtype)
    y = torch.empty_like(x)
    block_m, block_n, warps = ks.block_config(cols)
    grid = (triton.cdiv(rows_n, block_m),)
    args = (x, y, x, rows_n, cols, 1, 1, 0, 0, 0, 0, 1.0)
    consts = dict(MASK_KIND=ks.MASK_NONE, SAFE=False, BLOCK_M=block_m, BLOCK_N=block_n)

    def bare() -> None:
        ks._softmax_fwd_block[grid](*args, **consts, num_warps=warps)

    def via_launcher() -> None:
        with direct_launches():
            ks.softmax_forward(x)

    def via_op_body() -> None:
        with direct_launches():
            ops._softmax(x)

    def fast_launch() -> None:
        with _fast_launch.fast_launch(True):
            functional.softmax(x)

    fast_launch()  # the first call keeps the compiled kernel; later ones launch it directly
    layers: list[dict] = []
    for name, fn in (
        ("torch.softmax", lambda: torch.softmax(x, dim=-1)),
        ("torch.empty_like", lambda: torch.empty_like(x)),
        ("kiln functional.softmax", lambda: functional.softmax(x)),
        ("kiln functional.softmax, fast launch", fast_launch),
        ("op body (direct)", via_op_body),
        ("launcher (direct)", via_launcher),
    ):
        layers.append({"layer": name, "status": "ok", "host_us": host_us(fn)})
    with _fast_launch.fast_launch(True):
        got = functional.softmax(x)
    fast_row = next(r for r in layers if r["layer"].endswith("fast launch"))
    fast_row["max_error"] = (got.float() - ref.float()).abs().max().item()
    if not fast_row["max_error"] <= 3e-2:
        fast_row["status"] = f"wrong result (max error {fast_row['max_error']:.3g})"
    _attempt("bare kernel[grid](...)", bare, ref, y, layers)

    device = {
        "kernel into a preallocated output": device_us(bare),
        "kiln functional.softmax": device_us(lambda: functional.softmax(x)),
        "kiln, fast launch": device_us(fast_launch),
        "torch.softmax": device_us(lambda: torch.softmax(x, dim=-1)),
        "copy": device_us(lambda: y.copy_(x)),
    }
    # The compiled kernel's own launcher: what Inductor's generated code calls, skipping the
    # JIT's argument binding, specialisation and cache lookup. Last: a call with the wrong
    # arguments could leave the CUDA context unusable for what follows.
    try:
        compiled = ks._softmax_fwd_block.warmup(*args, **consts, num_warps=warps, grid=grid)
    except Exception as exc:  # noqa: BLE001  (reported: this Triton may lack warmup(grid=))
        layers.append({"layer": "compiled kernel", "status": f"warmup: {type(exc).__name__}: "
                       f"{exc}"[:300]})  # fmt: skip
    else:
        # A CompiledKernel's launcher indexes all three grid dimensions (session 7: a 1-tuple
        # raised IndexError on Triton 3.6).
        grid3 = (*grid, 1, 1)[:3]
        with_consts = (*args, ks.MASK_NONE, False, block_m, block_n)
        _attempt("compiled[grid](args)", lambda: compiled[grid3](*args), ref, y, layers)
        _attempt("compiled[grid](args + constexprs)", lambda: compiled[grid3](*with_consts), ref,
                 y, layers)  # fmt: skip

    nbytes = 2 * x.numel() * x.element_size()
    return {
        "dtype": dtype_name,
        "rows": rows_n,
        "cols": cols,
        "bytes": nbytes,
        "block": {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": warps},
        "host": layers,
        "device_us": device,
        "device_gbps": {k: nbytes / (v * 1e-6) / 1e9 for k, v in device.items()},
    }


def _fast_launch_broken() -> str | None:
    from torchkiln.kernels._fast_launch import fast_launch_broken

    return fast_launch_broken()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for kernel_host_path.json")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, nargs="+", default=[2048, 32768])
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    args = p.parse_args(argv)

    import torch

    from torchkiln.measure.environment import collect

    if not torch.cuda.is_available():
        print("kernel_host_path: needs a CUDA GPU", file=sys.stderr)
        return 2
    results = [measure(d, args.rows, c) for d in args.dtypes for c in args.cols]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"schema": "kiln.kernel_host_path/1", "environment": collect("cuda"), "results": results,
           "fast_launch_broken": _fast_launch_broken()}  # fmt: skip
    (out / "kernel_host_path.json").write_text(json.dumps(doc, indent=2, default=str))
    for r in results:
        print(f"\nsoftmax fwd {r['dtype']} {r['rows']}x{r['cols']}  block {r['block']}")
        for layer in r["host"]:
            us = f"{layer['host_us']:7.1f} us host" if "host_us" in layer else ""
            us += "" if layer["status"] == "ok" else f" {layer['status']}"
            print(f"  {layer['layer']:36s} {us}")
        for name, us in r["device_us"].items():
            print(f"  device {name:29s} {us:7.1f} us  {r['device_gbps'][name]:6.0f} GB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
