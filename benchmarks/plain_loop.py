"""A plain, hand-written CUDA-events timing loop, independent of kiln's own code: the check of
the instrument. Build the model directly, warm up 10 steps, then 5 reps of 50 steps between
CUDA events; median ms per step, and the first call's seconds (a compile, for a compiled
mode). Run as a script it prints one JSON line. DEVICE `cpu` times with perf_counter instead
(how the CPU checks of the scripts that call it run); PRESET `tiny` shrinks gpt2 as kiln's
tiny preset does.

    python3 benchmarks/plain_loop.py WORKLOAD STEP PRECISION MODE [DEVICE [PRESET]]
    python3 benchmarks/plain_loop.py resnet50 infer bf16 eager
    python3 benchmarks/plain_loop.py gpt2 infer bf16 max-autotune
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def build(workload: str, step: str, device: str = "cuda", preset: str = "full"):
    torch.manual_seed(0)
    if workload == "simple":
        model = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(True),
            nn.Conv2d(64, 128, 3, padding=1, bias=False),
            nn.BatchNorm2d(128),
            nn.ReLU(True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(128, 10),
        )
        x = {"x": torch.randn(32, 3, 224, 224)}
        y = torch.randint(0, 10, (32,))
        fwd = lambda m, inp: m(inp["x"])
    elif workload == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None)
        x = {"x": torch.randn(32, 3, 224, 224)}
        y = torch.randint(0, 1000, (32,))
        fwd = lambda m, inp: m(inp["x"])
    elif workload == "bert-base":
        import transformers

        cfg = transformers.BertConfig()
        model = transformers.BertForSequenceClassification(cfg)
        x = {
            "input_ids": torch.randint(0, cfg.vocab_size, (16, 128)),
            "attention_mask": torch.ones(16, 128, dtype=torch.long),
        }
        y = torch.randint(0, 2, (16,))
        fwd = lambda m, inp: m(**inp).logits
    elif workload == "gpt2":
        import transformers

        # GPT-2 small over whole sequences, as kiln's gpt2 workload: no key/value cache.
        if preset == "tiny":
            cfg = transformers.GPT2Config(
                n_layer=2,
                n_head=2,
                n_embd=64,
                vocab_size=512,
                n_positions=256,
                bos_token_id=511,
                eos_token_id=511,
            )
            batch, seq = 2, 32
        else:
            cfg, (batch, seq) = transformers.GPT2Config(), (8, 512)
        cfg.use_cache = False
        model = transformers.GPT2LMHeadModel(cfg)
        x = {"input_ids": torch.randint(0, cfg.vocab_size, (batch, seq))}
        y = torch.randint(0, cfg.vocab_size, (batch * seq,))
        fwd = lambda m, inp: m(**inp).logits.reshape(-1, cfg.vocab_size)
    else:
        raise SystemExit(f"unknown workload {workload}")
    model = model.to(device)
    x = {k: v.to(device) for k, v in x.items()}
    return model, x, y.to(device), fwd


def make_step(
    workload: str, step: str, precision: str, mode: str, device: str = "cuda", preset: str = "full"
):
    """One plain step of the configuration (CUDA-graph step marking included), TF32 off."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, x, y, fwd = build(workload, step, device, preset)
    kind = torch.device(device).type
    run = (
        model if mode == "eager" else torch.compile(model, mode=None if mode == "default" else mode)
    )
    ctx = (
        (lambda: torch.autocast(kind, dtype=torch.bfloat16))
        if precision == "bf16"
        else (lambda: torch.autocast(kind, enabled=False))
    )
    if step == "infer":
        model.eval()

        def one():
            with torch.no_grad(), ctx():
                return fwd(run, x)
    else:
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def one():
            with ctx():
                loss = F.cross_entropy(fwd(run, x).float(), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
    if mark is None or mode == "eager":
        return one

    def marked():
        mark()
        return one()

    return marked


def time_rep(fn, steps: int) -> float:
    """ms per step over `steps` back-to-back calls between two CUDA events (no sync before)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def time_rep_cpu(fn, steps: int) -> float:
    """ms per step over `steps` back-to-back calls, by the host's clock (the CPU check)."""
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) * 1e3 / steps


def sched_ns() -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable but waiting for one) of this thread, from the scheduler's
    schedstat; None off Linux. Beside the reps it says whether the loop's thread had a CPU to
    itself, as kiln's trials record for theirs."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            run_ns, wait_ns = f.read().split()[:2]
        return int(run_ns), int(wait_ns)
    except (OSError, ValueError):
        return None


def current_cpu() -> int | None:
    """The CPU this thread last ran on (/proc's stat, field 39); None off Linux."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def main(
    workload: str, step: str, precision: str, mode: str, device: str = "cuda", preset: str = "full"
) -> dict:
    one = make_step(workload, step, precision, mode, device, preset)
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    start = time.perf_counter()
    one()  # the first call: the compile, for a compiled mode
    sync()
    first_call_s = time.perf_counter() - start
    for _ in range(9):
        one()
    sync()
    sched, wall = sched_ns(), time.perf_counter()
    reps = [(time_rep if cuda else time_rep_cpu)(one, 50) for _ in range(5)]
    wall, after = time.perf_counter() - wall, sched_ns()
    thread = None
    if sched and after:
        thread = {
            "wall_s": wall,
            "cpu_s": (after[0] - sched[0]) / 1e9,
            "runqueue_wait_s": (after[1] - sched[1]) / 1e9,
            "cpu": current_cpu(),
        }
    return {
        "workload": workload,
        "step": step,
        "precision": precision,
        "mode": mode,
        "device": device,
        "preset": preset,
        "first_call_s": first_call_s,
        "median_ms": statistics.median(reps),
        "reps_ms": reps,
        "timing_thread": thread,
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:7])))
