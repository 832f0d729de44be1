"""Where bias_act_scale's backward spends its fixed time (issue 6's ">= 1.3x torch.compile" cases).

    PYTHONPATH=src python3 benchmarks/bias_act_bwd_probe.py --out DIR

Session 18's table (kiln 3b24829) read the GELU backward's device time at 4096 rows x 2048 / 4096
/ 8192 / 16384 / 32768: bf16 43 / 57 / 77 / 124 / 228 us, fp32 53 / 70 / 116 / 214 / 412: a line
of ~4 TB/s plus 16-20 us at every size, more at the short rows. kiln's backward was then three
launches (the kernel writing dx and per-program partial bias sums, `torch.sum` over them, and for
2-byte dtypes a cast); since 7cc807a it is two, the second this probe's candidate below
(`_bias_act.bias_grad`). This times each part alone with triton.testing.do_bench (median, L2
flushed), the whole call, the kernel and the call under other program counts (`--repeat`
measures every case again after all the others), and one candidate for the last two launches:
a Triton column sum that casts as it stores (one launch instead of two; kiln's
`_bias_act.bias_grad` since, which this times at several tiles). Results:
DIR/bias_act_bwd_probe.json with the environment; a table last.
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


def measure(name: str, dtype: torch.dtype, cols: int, sms: int) -> dict:
    """One dtype and row length: each part's do_bench median in us."""
    from torchkiln.kernels._bias_act import backward_launch, bias_act_backward, bias_grad
    from torchkiln.kernels._launch import direct_launches

    bench = triton.testing.do_bench
    gen = torch.Generator(device="cuda").manual_seed(cols)
    x, dy = (torch.randn(4096, cols, generator=gen, device="cuda").to(dtype) for _ in "ab")
    bias = torch.randn(cols, generator=gen, device="cuda").to(dtype)
    with direct_launches():
        _, db_ref = bias_act_backward(x, bias, dy, "gelu", 0.5)
        _, partial = backward_launch(x, bias, dy, "gelu", 0.5)
    row: dict = {"dtype": name, "cols": cols, "partial_rows": partial.shape[0], "us": {}}

    def timed(label: str, fn) -> None:
        row["us"][label] = bench(fn) * 1e3

    dst = torch.empty_like(x)
    timed("copy x", lambda: dst.copy_(x))
    with direct_launches():
        timed("whole call", lambda: bias_act_backward(x, bias, dy, "gelu", 0.5))
        timed("kernel", lambda: backward_launch(x, bias, dy, "gelu", 0.5))
        for target in (2 * sms, 4 * sms, 2048):
            timed(
                f"kernel, {target} programs target",
                lambda t=target: backward_launch(x, bias, dy, "gelu", 0.5, target_programs=t),
            )
            timed(
                f"whole call, {target} programs target",
                lambda t=target: bias_act_backward(x, bias, dy, "gelu", 0.5, target_programs=t),
            )
    timed("torch.sum", lambda: partial.sum(0))
    s = partial.sum(0)
    if dtype != torch.float32:
        timed("cast", lambda: s.to(dtype))
    timed("torch.sum + cast", lambda: partial.sum(0).to(dtype))

    def col_sum(bg: int, bn: int) -> torch.Tensor:
        with direct_launches():
            return bias_grad(partial, dtype, (bg, bn))

    for bg, bn in ((64, 32), (32, 64), (16, 128), (128, 16)):
        got = col_sum(bg, bn).float()
        row[f"col_sum {bg}x{bn} max_error"] = (
            (got - db_ref.float()).abs().max() / db_ref.float().abs().max()
        ).item()
        timed(f"col_sum {bg}x{bn}", lambda bg=bg, bn=bn: col_sum(bg, bn))
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cols", type=int, nargs="*", default=[2048, 4096, 8192, 32768])
    p.add_argument("--repeat", type=int, default=1, help="measure every case this many times")
    args = p.parse_args()
    from torchkiln.measure.environment import collect

    args.out.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows: list[dict] = []
    t0 = time.time()
    cases = [(n, d, c) for n, d in (("bf16", torch.bfloat16), ("fp32", torch.float32))
             for c in args.cols]  # fmt: skip
    for rep in range(args.repeat):
        for name, dtype, cols in cases:
            row = measure(name, dtype, cols, sms) | {"repeat": rep}
            rows.append(row)
            line = ", ".join(f"{k} {v:.1f}" for k, v in row["us"].items())
            print(f"[{time.time() - t0:5.1f}s] {name} 4096x{cols} ({row['partial_rows']} partial "
                  f"rows): {line}", flush=True)  # fmt: skip
            out = {"schema": "kiln.bias_act_bwd_probe/1", "environment": collect("cuda"),
                   "results": rows}  # fmt: skip
            (args.out / "bias_act_bwd_probe.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
