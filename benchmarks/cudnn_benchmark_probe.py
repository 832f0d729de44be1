"""Does cuDNN's algorithm search (`torch.backends.cudnn.benchmark`) pay on resnet50?

    python3 benchmarks/cudnn_benchmark_probe.py --out DIR [--arms eager,reduce-overhead]

kiln's trials run with `cudnn.benchmark` off (TrialSpec.cudnn_benchmark), and `kiln tune` never
turns it on: its convolutions take cuDNN's heuristic choice. This probe times resnet50 (32 x 224,
bf16 autocast, channels_last; the tune's pick for it on the H200) in plain PyTorch, no kiln
code, for inference and for a training step (SGD, momentum 0.9), eager and compiled, each arm
with the search off and on, every arm in its own process (cuDNN's algorithm cache is per
process). Each: 10 warm-up steps, then 7 reps of 20 steps between CUDA events; the median, min and
max ms a step, and the benchmark-on arm's speedup over the off arm of the same mode and step.
Results: DIR/cudnn_benchmark_probe.json with the environment; a table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH, SIZE = 32, 224


def arm(mode: str, step: str, benchmark: bool) -> dict:
    import torch
    import torchvision

    torch.backends.cudnn.benchmark = benchmark
    torch.manual_seed(0)
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    x = torch.randn(BATCH, 3, SIZE, SIZE, device="cuda").to(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (BATCH,), device="cuda")
    fwd = model if mode == "eager" else torch.compile(model, mode=mode)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if step == "infer":
        model.eval()

        def run() -> None:
            with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
                fwd(x)
    else:
        model.train()

        def run() -> None:
            with torch.autocast("cuda", torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(fwd(x), target)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    t0 = time.perf_counter()
    for _ in range(10):
        torch.compiler.cudagraph_mark_step_begin()
        run()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    per_step = []
    for _ in range(7):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            torch.compiler.cudagraph_mark_step_begin()
            run()
        end.record()
        torch.cuda.synchronize()
        per_step.append(start.elapsed_time(end) / 20)
    return {"mode": mode, "step": step, "benchmark": benchmark, "warmup_s": warm_s,
            "ms": statistics.median(per_step), "min": min(per_step), "max": max(per_step),
            "reps": per_step}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path)
    p.add_argument("--arms", default="eager,reduce-overhead", help="modes, comma-separated")
    p.add_argument("--steps", default="infer,train")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds an arm may take")
    p.add_argument("--one", help=argparse.SUPPRESS)  # mode:step:0|1, run in this process
    args = p.parse_args()
    if args.one:
        mode, step, bench = args.one.split(":")
        print(json.dumps(arm(mode, step, bench == "1")))
        return
    sys.path.insert(0, str(ROOT / "src"))
    from torchkiln.measure.environment import collect

    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    path = args.out / "cudnn_benchmark_probe.json"
    out = {"schema": "kiln.cudnn_benchmark_probe/1", "environment": collect("cuda"),
           "config": {"batch": BATCH, "size": SIZE, "arms": args.arms, "steps": args.steps},
           "results": rows}  # fmt: skip
    # Modes outermost: the eager arms (seconds) before the compiled ones (minutes).
    for mode in args.arms.split(","):
        for step in args.steps.split(","):
            for bench in (False, True):
                one = f"{mode}:{step}:{int(bench)}"
                try:
                    proc = subprocess.run(
                        [sys.executable, __file__, "--one", one], capture_output=True,
                        text=True, timeout=args.timeout,
                    )  # fmt: skip
                except subprocess.TimeoutExpired:
                    rows.append({"mode": mode, "step": step, "benchmark": bench,
                                 "status": f"timeout after {args.timeout:.0f} s"})  # fmt: skip
                    print(f"{one}: timeout", flush=True)
                    path.write_text(json.dumps(out, indent=1, default=str))
                    continue
                if proc.returncode != 0:
                    why = f"exit {proc.returncode}: {proc.stderr[-400:]}"
                    rows.append({"mode": mode, "step": step, "benchmark": bench, "status": why})
                    print(f"{one}: {why}", flush=True)
                    path.write_text(json.dumps(out, indent=1, default=str))
                    continue
                row = json.loads(proc.stdout.strip().splitlines()[-1]) | {"status": "ok"}
                rows.append(row)
                print(f"{one}: {row['ms']:.3f} ms [{row['min']:.3f}, {row['max']:.3f}], "
                      f"warm-up {row['warmup_s']:.0f} s", flush=True)  # fmt: skip
                # Written after every arm: a cut run keeps what it measured.
                path.write_text(json.dumps(out, indent=1, default=str))
    print("\n| step | mode | off ms | on ms | on speedup |\n| --- | --- | --- | --- | --- |")
    for step in args.steps.split(","):
        for mode in args.arms.split(","):
            pair = {r["benchmark"]: r for r in rows if (r["mode"], r["step"]) == (mode, step)}
            off, on = pair.get(False, {}).get("ms"), pair.get(True, {}).get("ms")
            ratio = f"{off / on:.3f}x" if off and on else "-"
            fmt = lambda v: f"{v:.3f}" if v else "failed"  # noqa: E731
            print(f"| {step} | {mode} | {fmt(off)} | {fmt(on)} | {ratio} |")


if __name__ == "__main__":
    main()
