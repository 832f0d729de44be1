"""Where one eager kernel call's time goes: the host's launch path, layer by layer,
against the kernel's own device time.

    PYTHONPATH=src python3 benchmarks/kernel_host_path.py --out benchmarks/results/kernels/h200

On an H200 (kiln bb4a839) kiln's forward softmax took 50-60 us of host time per call against
10 us for torch.softmax, and short rows were launch-bound (fp32 4096 x 2048 at 52% of the copy
ceiling; 94% at 07be054). This script splits that time for one shape per dtype:

- host us per call, back-to-back calls with no synchronisation, median of several rounds, for
  torch.softmax, torch.empty_like (the output allocation), kiln's functional API, the op body
  (device guard and launcher), the launcher, the bare `kernel[grid](...)` launch into a
  preallocated output, and the compiled kernel's own launcher where this Triton exposes it
  (`JITFunction.warmup` returning a CompiledKernel, launched on the grid padded to three
  dimensions, with and without the constexprs; each way of calling it is tried and checked
  against torch.softmax, and one that fails is reported with its error);
- device us per call: 20 calls captured in a CUDA graph and replayed, so no host time is in it,
  with and without the output allocation.

It also measured kiln's experimental fast launch (KILN_FAST_LAUNCH=1: each compiled kernel kept
under a specialisation key of kiln's own and launched directly), until a run at 51e19d0 showed it
slower and it was removed. On the H200 (torch 2.11, Triton 3.6), softmax forward at 4096 x 2048,
host us per eager call: kiln's functional.softmax 33.3 plain against 44.7 with the fast launch
(bf16: 59.5 against 62.2). The compiled kernel's own launcher is cheaper than the JIT's: 10.0 us
called with every argument including the constexprs, against 17.6 us for the bare
`kernel[grid](...)` (bf16: 14.4 against 29.1); but building the key in Python, in kiln's wrapper,
cost more than the launcher saved.

kiln's launch cache (src/torchkiln/kernels/_launch_cache.py: the op body's
launch recorded per key of the op's inputs, replayed through the compiled launcher), on by
default: every layer is called once before it is timed (the cache's miss), and the functional
calls are also timed with it off ("cache off", KILN_LAUNCH_CACHE=0's path).

Then, per dtype, one eager call of each functional API (softmax, masked_softmax with the bench's
[1, 1, Q, K] bool mask, bias_act_scale with gelu) at 4096 x 2048: its host us with the cache
on and off, in rounds taking turns (paired_host_us; the cache's goal is
judged on the median of the rounds' ratios), and the Python
functions its time goes to (cProfile over PROFILE_CALLS calls, the costliest by own time). In
the bandwidth table at 51e19d0 masked_softmax's forward took 82-99 us of host time per call against
softmax's 29-33, and bf16 bias_act_scale 50-56 us against fp32's 30-33: unexplained, since the
Python around the launch differs by a few views.

Last, masked_softmax's forward layer by layer (masked_ladder; `--masked-only` runs just that),
with the GPU idle and kept busy by a queued sleep kernel.

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
# The launch cache's goal, judged in one run: an eager functional call's host time
# with the cache at most this fraction of the same call's with it off.
CACHE_GOAL = 0.75
GRAPH_CALLS, GRAPH_REPLAYS = 20, 50


# Cycles of torch.cuda._sleep that keep the GPU busy past one round of CALLS calls (~50 ms at
# the H200's ~2 GHz; a round of the slowest layer is ~20 ms).
BUSY_CYCLES = 100_000_000


def host_us(fn: Any, busy: bool = False) -> float:
    """Median over ROUNDS of one call's host time, CALLS calls back to back, no sync inside.
    With `busy` a long sleep kernel is queued first, so every call launches behind queued work
    rather than onto an idle GPU (does the launch cost depend on the GPU's state?)."""
    import torch

    rounds = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()
        if busy:
            torch.cuda._sleep(BUSY_CYCLES)
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        rounds.append((time.perf_counter() - t0) / CALLS * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def host_us_cache_off(fn: Any, busy: bool = False) -> float:
    """host_us with kiln's eager launch cache off (KILN_LAUNCH_CACHE=0): the launcher's policy
    and Triton's JIT launch on every call, as without the cache."""
    from torchkiln.kernels import _launch_cache

    _launch_cache.enabled = False
    try:
        fn()
        return host_us(fn, busy)
    finally:
        _launch_cache.enabled = True


def paired_host_us(fn: Any) -> dict[str, Any]:
    """One call's host time with kiln's launch cache on and off, a round of each in turn
    (which goes first alternating), so that the host's drift over the run moves both alike:
    the medians of each and the median of the rounds' paired ratios (on / off). Measured one
    after the other, the ratio rode on the host: the bias_act fp32 forward read 0.60-0.91 from
    one GPU machine to the next (H200, 4492765)."""
    import torch

    from torchkiln.kernels import _launch_cache

    def one_round(cached: bool) -> float:
        _launch_cache.enabled = cached
        try:
            fn()  # the cache off: the JIT path warmed; on: the replay's key found
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(CALLS):
                fn()
            us = (time.perf_counter() - t0) / CALLS * 1e6
            torch.cuda.synchronize()
            return us
        finally:
            _launch_cache.enabled = True

    on, off = [], []
    for i in range(ROUNDS):
        for cached in (True, False) if i % 2 == 0 else (False, True):
            (on if cached else off).append(one_round(cached))
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    return {"host_us": statistics.median(on), "host_us_cache_off": statistics.median(off),
            "cache_ratio": statistics.median(ratios)}  # fmt: skip


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

    from torchkiln.kernels import _softmax as ks
    from torchkiln.kernels import functional, ops
    from torchkiln.kernels._launch import direct_launches

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    x = torch.randn(rows_n, cols, device="cuda", dtype=dtype)
    ref = torch.softmax(x.float(), dim=-1).to(dtype)
    y = torch.empty_like(x)
    block_m, block_n, warps = ks.forward_config(cols, False, x.element_size())
    grid = (triton.cdiv(rows_n, block_m),)
    args = (x, y, x, rows_n, cols, 1, 1, 0, 0, 0, 0, 1.0)
    # As the launcher launches it (softmax_forward): scale 1.0 is positive.
    consts = dict(MASK_KIND=ks.MASK_NONE, SAFE=False, BLOCK_M=block_m, BLOCK_N=block_n,
                  MASK_DIMS=ks.mask_dims(ks.MASK_NONE, rows_n, 1, 1, 0, 0, 0),
                  POS_SCALE=True)  # fmt: skip

    def bare() -> None:
        ks._softmax_fwd_block[grid](*args, **consts, num_warps=warps)

    def via_launcher() -> None:
        with direct_launches():
            ks.softmax_forward(x)

    def via_op_body() -> None:
        with direct_launches():
            ops._softmax(x)

    layers: list[dict] = []
    for name, fn in (
        ("torch.softmax", lambda: torch.softmax(x, dim=-1)),
        ("torch.empty_like", lambda: torch.empty_like(x)),
        ("kiln functional.softmax", lambda: functional.softmax(x)),
        ("op body (direct)", via_op_body),
        ("launcher (direct)", via_launcher),
    ):
        fn()  # the launch cache's miss (recording) outside the timing
        layers.append({"layer": name, "status": "ok", "host_us": host_us(fn)})
    cache_off = host_us_cache_off(lambda: functional.softmax(x))
    layers.insert(3, {"layer": "kiln functional.softmax, cache off", "status": "ok",
                      "host_us": cache_off})  # fmt: skip
    _attempt("bare kernel[grid](...)", bare, ref, y, layers)

    device = {
        "kernel into a preallocated output": device_us(bare),
        "kiln functional.softmax": device_us(lambda: functional.softmax(x)),
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
        # A CompiledKernel's launcher indexes all three grid dimensions (a 1-tuple
        # raised IndexError on Triton 3.6).
        grid3 = (*grid, 1, 1)[:3]
        # Every constexpr in the kernel's order, defaults where not given (two
        # constexprs added to the kernel once left this call two short, a TypeError on the H200).
        params = ks._softmax_fwd_block.params
        with_consts = (*args, *(consts.get(p.name, p.default) for p in params if p.is_constexpr))
        _attempt("compiled[grid](args)", lambda: compiled[grid3](*args), ref, y, layers)
        _attempt("compiled[grid](args + constexprs)", lambda: compiled[grid3](*with_consts), ref,
                 y, layers)  # fmt: skip
        # What a kiln-side launch cache would cost: a key holding what Triton specialises on
        # (each pointer's dtype and 16-byte alignment, each int's == 1 and % 16, the launch
        # options), a dict lookup, the compiled launcher, measured before building one.
        cache = {}

        def spec(v: Any) -> tuple:
            if isinstance(v, torch.Tensor):
                return (v.dtype, v.data_ptr() % 16 == 0)
            if isinstance(v, int):
                return (v == 1, v % 16 == 0)
            return (type(v),)

        def key_of() -> tuple:
            return (*(spec(a) for a in args), *consts.values(), warps, x.device.index)

        cache[key_of()] = compiled

        def keyed() -> None:
            cache[key_of()][grid3](*with_consts)

        _attempt("kiln key + compiled launcher", keyed, ref, y, layers)

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


def masked_ladder(dtype_name: str, rows_n: int = 4096, cols: int = 2048) -> list[dict]:
    """masked_softmax's forward call, layer by layer, at the bench's attention shape: host us
    per call with the GPU idle and busy. The table at 51e19d0 gave it 82-99 us of host
    time against softmax's 29-33; 550ec6a (before this ladder) removed the four views the op body
    built per call, and the ladder keeps that old path as a layer to compare."""
    import torch
    import triton

    from torchkiln.kernels import _softmax as ks
    from torchkiln.kernels import functional as F
    from torchkiln.kernels import ops
    from torchkiln.kernels._cases import ATTN_SCALE, HEADS
    from torchkiln.kernels._launch import direct_launches

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    shape = (1, HEADS, rows_n // HEADS, cols)
    scores = torch.randn(shape, device="cuda", dtype=dtype)
    mask = torch.rand((1, 1, rows_n // HEADS, cols), device="cuda") < 0.9
    y = torch.empty_like(scores)
    block_m, block_n, warps = ks.forward_config(cols, True, scores.element_size())
    grid = (triton.cdiv(rows_n, block_m),)
    h, q, strides = ks.mask_layout(shape, mask)
    args = (scores, y, mask, rows_n, cols, h, q, *strides, ATTN_SCALE)
    # As the launcher launches it (softmax_forward): its mask's dimensions, a positive scale.
    dims = ks.mask_dims(ks.MASK_BOOL, rows_n, h, q, *strides[:3])
    consts = dict(MASK_KIND=ks.MASK_BOOL, SAFE=True, BLOCK_M=block_m, BLOCK_N=block_n,
                  MASK_DIMS=dims, POS_SCALE=ATTN_SCALE > 0)  # fmt: skip

    def bare() -> None:
        ks._softmax_fwd_block[grid](*args, **consts, num_warps=warps)

    def bare_unmasked() -> None:
        ks._softmax_fwd_block[grid](scores, y, scores, rows_n, cols, 1, 1, 0, 0, 0, 0, 1.0,
                                    MASK_KIND=ks.MASK_NONE, SAFE=False, BLOCK_M=block_m,
                                    BLOCK_N=block_n, POS_SCALE=True, num_warps=warps)  # fmt: skip

    def launcher() -> None:
        with direct_launches():
            ks.softmax_forward(scores, mask, ATTN_SCALE, safe=True)

    def launcher_with_views() -> None:  # the op body before 550ec6a
        s4 = scores.reshape(shape)
        m4 = mask.reshape(mask.shape).expand(s4.shape)
        with direct_launches():
            ks.softmax_forward(s4, m4, ATTN_SCALE, safe=True).view(scores.shape)

    def op_body() -> None:
        with direct_launches():
            ops._masked_softmax(scores, mask, ATTN_SCALE)

    def checks_only() -> None:
        real = ops._masked_softmax
        ops._masked_softmax = lambda s, m, c: s
        try:
            F.masked_softmax(scores, mask, ATTN_SCALE)
        finally:
            ops._masked_softmax = real

    layers = {
        "torch.empty_like(scores)": lambda: torch.empty_like(scores),
        "functional.softmax (4-D, no mask)": lambda: F.softmax(scores),
        "functional.masked_softmax": lambda: F.masked_softmax(scores, mask, ATTN_SCALE),
        "functional.masked_softmax, cache off": lambda: F.masked_softmax(scores, mask, ATTN_SCALE),
        "functional checks only": checks_only,
        "op body (direct)": op_body,
        "launcher, mask as given": launcher,
        "launcher, per-call views": launcher_with_views,
        "bare kernel, masked": bare,
        "bare kernel, no mask": bare_unmasked,
    }
    out = []
    for name, fn in layers.items():
        try:
            fn()
            timed = host_us_cache_off if name.endswith("cache off") else host_us
            row = {"layer": name, "dtype": dtype_name, "status": "ok", "host_us": timed(fn)}
            if name in ("functional.masked_softmax", "bare kernel, masked", "bare kernel, no mask",
                        "functional.masked_softmax, cache off"):  # fmt: skip
                row["host_us_gpu_busy"] = timed(fn, busy=True)
            out.append(row)
        except Exception as exc:  # noqa: BLE001  (reported; the other layers still measured)
            out.append({"layer": name, "dtype": dtype_name, "status": f"{type(exc).__name__}: "
                        f"{exc}"[:300]})  # fmt: skip
    torch.cuda.synchronize()
    return out


PROFILE_CALLS, PROFILE_TOP = 500, 12


def profile_calls(fn: Any) -> list[dict[str, Any]]:
    """The functions one call's host time goes to: cProfile over PROFILE_CALLS calls, the
    PROFILE_TOP costliest by their own time, per call."""
    import cProfile
    import pstats

    import torch

    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(PROFILE_CALLS):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, ncalls, tottime, cumtime, _)
    rows = [
        {"function": f"{Path(f).name}:{line}:{name}", "calls_per_call": nc / PROFILE_CALLS,
         "own_us": tt / PROFILE_CALLS * 1e6, "cumulative_us": ct / PROFILE_CALLS * 1e6}
        for (f, line, name), (_, nc, tt, ct, _) in stats.items()
    ]  # fmt: skip
    return sorted(rows, key=lambda r: -r["own_us"])[:PROFILE_TOP]


def functional_calls(dtype_name: str, rows_n: int = 4096, cols: int = 2048) -> list[dict]:
    """Host us and cProfile of one eager call of each functional API at one shape."""
    import torch

    from torchkiln.kernels import functional as F
    from torchkiln.kernels import ops
    from torchkiln.kernels._cases import ATTN_SCALE, HEADS

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    x = torch.randn(rows_n, cols, device="cuda", dtype=dtype)
    scores = x.view(1, HEADS, rows_n // HEADS, cols)
    mask = torch.rand((1, 1, rows_n // HEADS, cols), device="cuda") < 0.9
    bias = torch.randn(cols, device="cuda", dtype=dtype)
    dy = torch.randn_like(x)
    calls = {
        "softmax": lambda: F.softmax(x),
        "masked_softmax": lambda: F.masked_softmax(scores, mask, ATTN_SCALE),
        "bias_act_scale gelu": lambda: F.bias_act_scale(x, bias, "gelu", 0.5),
        # The backward calls as autograd makes them in eager training.
        "softmax bwd": lambda: ops.autograd_softmax_backward(x, dy, 1.0),
        "bias_act gelu bwd": lambda: ops.autograd_bias_act_backward(x, bias, dy, "gelu", 0.5),
    }
    out = []
    for name, fn in calls.items():
        try:
            fn()
            out.append({"call": name, "dtype": dtype_name, "shape": [rows_n, cols],
                        **paired_host_us(fn), "profile": profile_calls(fn)})  # fmt: skip
        except Exception as exc:  # noqa: BLE001  (reported, the other calls still measured)
            why = f"{type(exc).__name__}: {exc}"
            out.append({"call": name, "dtype": dtype_name, "status": why})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for kernel_host_path.json")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, nargs="+", default=[2048, 32768])
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--masked-only", action="store_true",
                   help="only the masked_softmax ladder (about 10 s)")  # fmt: skip
    args = p.parse_args(argv)

    import torch

    from torchkiln.measure.environment import collect

    if not torch.cuda.is_available():
        print("kernel_host_path: needs a CUDA GPU", file=sys.stderr)
        return 2
    ladder = [row for d in args.dtypes for row in masked_ladder(d)]
    results, calls = [], []
    if not args.masked_only:
        results = [measure(d, args.rows, c) for d in args.dtypes for c in args.cols]
        calls = [c for d in args.dtypes for c in functional_calls(d)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"schema": "kiln.kernel_host_path/4", "environment": collect("cuda"), "results": results,
           "functional_calls": calls, "masked_ladder": ladder}  # fmt: skip
    (out / "kernel_host_path.json").write_text(json.dumps(doc, indent=2, default=str))
    for r in results:
        print(f"\nsoftmax fwd {r['dtype']} {r['rows']}x{r['cols']}  block {r['block']}")
        for layer in r["host"]:
            us = f"{layer['host_us']:7.1f} us host" if "host_us" in layer else ""
            us += "" if layer["status"] == "ok" else f" {layer['status']}"
            print(f"  {layer['layer']:36s} {us}")
        for name, us in r["device_us"].items():
            print(f"  device {name:29s} {us:7.1f} us  {r['device_gbps'][name]:6.0f} GB/s")
    for c in calls:
        if "host_us" not in c:
            print(f"\n{c['call']} {c['dtype']}: {c['status']}")
            continue
        print(
            f"\n{c['call']} {c['dtype']} 4096x2048: {c['host_us']:.1f} us host "
            f"({c['host_us_cache_off']:.1f} with the launch cache off); own us per call:"
        )
        for f in c["profile"][:6]:
            print(f"  {f['own_us']:6.1f}  {f['function']}")
    print("\nmasked_softmax fwd 4096x2048, host us per call (idle GPU | busy GPU)")
    for row in ladder:
        if row["status"] != "ok":
            print(f"  {row['dtype']} {row['layer']:36s} {row['status']}")
            continue
        busy = f" | {row['host_us_gpu_busy']:6.1f}" if "host_us_gpu_busy" in row else ""
        print(f"  {row['dtype']} {row['layer']:36s} {row['host_us']:6.1f}{busy}")
    return 0 if judge_cache(calls) else 1


def judge_cache(calls: list[dict]) -> bool:
    """Print each call's host time with the launch cache over without it, against CACHE_GOAL
    for the forward calls; True when every measured forward call meets it."""
    ok = True
    print(f"\nlaunch cache, host us on / off, the median of paired rounds (goal: <= "
          f"{CACHE_GOAL:.2f})")  # fmt: skip
    for c in calls:
        if "host_us" not in c:
            continue
        # Runs saved before the rounds were paired timed the two apart: the ratio of their medians.
        ratio = c.get("cache_ratio", c["host_us"] / c["host_us_cache_off"])
        if c["call"].endswith("bwd"):
            # No goal: a backward call had no validation to skip, and the bias_act one makes
            # two launches (the kernel, then the partial sums' column sum).
            verdict = "(no goal)"
        else:
            ok &= ratio <= CACHE_GOAL
            verdict = "PASS" if ratio <= CACHE_GOAL else "FAIL"
        print(f"  {c['call']:20s} {c['dtype']} {c['host_us']:6.1f} / "
              f"{c['host_us_cache_off']:6.1f} = {ratio:.2f} {verdict}")  # fmt: skip
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
