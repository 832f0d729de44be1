"""Where bert-base's reduce-overhead + bf16 training step spends its time, and what beats it.

Issue 5 asks for a training pick 1.2x faster than the best plain torch.compile mode; on the H200
that mode is reduce-overhead + bf16 and every tune tied it. One process, plain PyTorch (no kiln
code in the timed steps), bert-base (16 x 128) with SGD (momentum 0.9), bf16 autocast:
  A  reduce-overhead over the model, the optimizer eager (foreach): the plain mode; and its
     kernels per step by name (torch.profiler, 5 steps)
  B  A with SGD(fused=True)
  C  reduce-overhead over the whole step, optimizer included, after one eager step (so the
     optimizer's state exists before the CUDA graphs are captured: runner/protocol/optim_state.py)
  D  A with torch.compile(optimizer.step) (default mode)
  E  the whole step in default mode, after one eager step
  F  C with Inductor's combo kernels (independent kernels fused side by side: fewer launches
     in a step of ~800 small kernels)
  G  C with Inductor's coordinate-descent tuning of each kernel's launch configuration
  H  C with both
(`--arms A,C,F` runs a subset, in that order; A always runs first, as the reference.)
Each: 8 warm-up steps, then 5 reps of 30 steps between CUDA events; (median, min, max) ms.

    python3 benchmarks/train_step_probe.py --out benchmarks/results/tune-h200/DIR

Session 11 (H200, torch 2.11.0+cu130; `benchmarks/results/tune-h200/session11-train-probe/`):
A 6.09 ms, B 5.78, C 5.68, D 5.74, E 29.4 (host-bound without CUDA graphs); A's kernels: GEMMs
2.1 ms, the foreach optimizer 0.9, attention 0.5, of about 5.7 ms. A second lease, on a slower
host (compiles 1.7x longer), cut at 230 s before E: A 7.67, B 7.59, C 7.27, D 10.86.
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

BATCH, SEQ = 16, 128


def _time_step(fn: Any, reps: int = 5, n: int = 30) -> tuple[float, float, float]:
    import torch

    for _ in range(8):
        torch.compiler.cudagraph_mark_step_begin()
        fn()
    torch.cuda.synchronize()
    per_step = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            torch.compiler.cudagraph_mark_step_begin()
            fn()
        end.record()
        torch.cuda.synchronize()
        per_step.append(start.elapsed_time(end) / n)
    return statistics.median(per_step), min(per_step), max(per_step)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for train_step_probe.json")
    p.add_argument("--arms", default="A,B,C,D,E", help="which arms, by letter (A always runs)")
    args = p.parse_args(argv)

    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile

    from torchkiln.measure.environment import collect

    if not torch.cuda.is_available():
        print("train_step_probe: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    cfg = transformers.BertConfig()
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), device="cuda")
    am = torch.ones(BATCH, SEQ, dtype=torch.long, device="cuda")
    labels = torch.randint(0, 2, (BATCH,), device="cuda")
    doc: dict[str, Any] = {"schema": "kiln.train_step_probe/1", "environment": collect("cuda"),
                           "batch": BATCH, "seq": SEQ, "arms": {}}  # fmt: skip

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (out / "train_step_probe.json").write_text(json.dumps(doc, indent=1))

    def arm(name: str, opt_kw: dict | None = None, scope: str = "model",
            mode: str | None = "reduce-overhead", compile_opt: bool = False,
            inductor: dict | None = None) -> Any:  # fmt: skip
        import torch._inductor.config as inductor_config

        torch._dynamo.reset()
        missing = [k for k in inductor or {} if not hasattr(inductor_config, k)]
        if missing:  # an option this torch lacks is recorded, not silently ignored
            doc["arms"][name] = {"error": f"this torch's Inductor has no {missing}"}
            print(name, doc["arms"][name], flush=True)
            return None
        torch.manual_seed(0)
        model = transformers.BertForSequenceClassification(cfg).to("cuda").train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, **(opt_kw or {}))
        t0 = time.perf_counter()
        run = torch.compile(model, mode=mode, dynamic=False) if scope == "model" else model
        opt_step = torch.compile(opt.step) if compile_opt else opt.step

        def step(m: Any) -> Any:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = m(input_ids=ids, attention_mask=am, labels=labels).loss
            loss.backward()
            opt_step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        if scope == "step":
            step(model)  # eager: the optimizer's state exists before capture
            compiled = torch.compile(step, mode=mode, dynamic=False)

            def fn() -> Any:
                return compiled(model)
        else:

            def fn() -> Any:
                return step(run)

        try:
            # Compilation happens on the first call, so the options cover it; the timed
            # replays run what was compiled under them.
            with inductor_config.patch(inductor or {}):
                fn()
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            doc["arms"][name] = {"ms_median_min_max": _time_step(fn), "first_s": first,
                                 "inductor": inductor or {}}  # fmt: skip
        except Exception as exc:  # noqa: BLE001  (a failing arm is recorded, the rest run)
            doc["arms"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        print(name, doc["arms"][name], flush=True)
        save()  # after every arm: a run cut by its time limit keeps what it measured
        return fn

    plain = arm("A_ro_model_foreach")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            torch.compiler.cudagraph_mark_step_begin()
            plain()
        torch.cuda.synchronize()
    rows = sorted(
        (
            (ev.device_time_total / 5 / 1000, ev.count / 5, ev.key[:90])
            for ev in prof.key_averages()
            if ev.device_time_total > 0 and ev.device_type == torch.autograd.DeviceType.CUDA
        ),
        reverse=True,
    )
    doc["A_kernels"] = {"ms_per_step": sum(r[0] for r in rows), "top": rows[:25]}
    combo, cdt = {"combo_kernels": True}, {"coordinate_descent_tuning": True}
    later = {
        "B": lambda: arm("B_ro_model_fused_sgd", opt_kw={"fused": True}),
        "C": lambda: arm("C_ro_step_eager_first", scope="step"),
        "D": lambda: arm("D_ro_model_compiled_opt", compile_opt=True),
        "E": lambda: arm("E_default_step_eager_first", scope="step", mode=None),
        "F": lambda: arm("F_ro_step_combo_kernels", scope="step", inductor=combo),
        "G": lambda: arm("G_ro_step_coordinate_descent", scope="step", inductor=cdt),
        "H": lambda: arm("H_ro_step_combo_and_cd", scope="step", inductor={**combo, **cdt}),
    }
    for letter in args.arms.split(","):
        if letter != "A":
            later[letter.strip()]()
    save()
    for name, a in doc["arms"].items():
        ms = a.get("ms_median_min_max")
        print(f"{name:28s} {ms[0]:7.3f} ms" if ms else f"{name:28s} {a['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
