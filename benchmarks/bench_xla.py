"""XLA (torchax + jax.jit) against eager and Inductor on one GPU: resnet50 and bert-base, infer
and train, bf16, each trial in its own process; prints and writes the comparison table.

    PYTHONPATH=src python3 benchmarks/bench_xla.py --out benchmarks/results/xla/h200

Needs jax with its CUDA plugin, torchax and optax in the trial environment (the xla extra);
torchvision and transformers for the workloads. Every arm is bf16 (autocast), the baseline is
eager+bf16, so speedups are within one precision. Inductor trials skip the correctness check
(bench_zoo.py covers it) to keep the whole matrix within ~8 minutes on one H200; the xla trials
are checked against eager+bf16 and fp64 (outputs; loss and first updates for train).

Results: OUT/trials.json (every trial, as kiln writes them, with their environment) and
OUT/comparison.md (the table), rewritten after each trial so a stopped run keeps what it did.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from torchkiln.api import run_trials  # noqa: E402
from torchkiln.runner.protocol.trial import TrialSpec  # noqa: E402
from torchkiln.variants import split_variants  # noqa: E402

VARIANTS = ("xla+bf16", "inductor+bf16", "inductor:mode=reduce-overhead+bf16")
BASELINE = "eager+bf16"
# Fewer, shorter reps than the default: 10 x 50 ms still gives a CI of about +-1% on the H200.
MEASURE = {"reps": 10, "rep_ms": 50.0, "warmup_s": 1.0, "warmup_steps": 5}


def _ms(t: dict[str, Any], key: str) -> str:
    s = t.get(key) or {}
    if s.get("median") is None:
        return "-"
    lo, hi = s.get("ci95") or (None, None)
    ci = f" [{lo:.2f}, {hi:.2f}]" if lo is not None else ""
    return f"{s['median']:.2f}{ci}"


def _speedup(t: dict[str, Any]) -> str:
    s = t.get("speedup") or {}
    if s.get("median") is None:
        return "-"
    mark = "" if s.get("significant") else " (n.s.)"
    return f"{s['median']:.2f}x{mark}"


def _num(x: Any, fmt: str) -> str:
    return format(x, fmt) if isinstance(x, (int, float)) else "-"


def _gib(n: Any) -> str:
    return f"{n / 2**30:.2f}" if isinstance(n, (int, float)) else "-"


def _memory(t: dict[str, Any]) -> str:
    mem = t.get("memory") or {}
    if "xla" in t.get("variant", ""):
        # JAX allocates outside torch's caching allocator: its own peak is the comparable one.
        return f"{_gib(mem.get('jax_peak_bytes_in_use'))} (JAX peak)"
    return f"{_gib(mem.get('peak_reserved_bytes'))} (torch reserved)"


def _correct(t: dict[str, Any]) -> str:
    c = t.get("correctness")
    if not c:
        return "not checked"
    worst = c.get("worst_error_over_threshold")
    verdict = "pass" if c.get("passed") else "FAIL"
    return f"{verdict} ({worst:.2g} of allowed)" if worst is not None else verdict


def comparison_table(trials: list[dict[str, Any]]) -> str:
    """Inductor vs XLA, side by side per workload and step: step time, compile (first call)
    time, speedup over eager, memory, correctness, and what could not run (coverage)."""
    lines = [
        "| workload | step | variant | status | step ms [95% CI] | eager ms | speedup | "
        "first call s | eager first call s | peak GiB | correctness |",
        "|--|--|--|--|--|--|--|--|--|--|--|",
    ]
    notes = []
    for t in trials:
        cells = [
            t["workload"],
            t["step"],
            f"`{t['variant']}`",
            t["status"],
            _ms(t, "steady_ms"),
            _ms(t, "baseline_ms"),
            _speedup(t),
            _num(t.get("first_call_s"), ".1f"),
            _num(t.get("baseline_first_call_s"), ".2f"),
            _memory(t),
            _correct(t),
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if t["status"] != "ok":
            notes.append(f"- {t['workload']} {t['step']} `{t['variant']}`: {t.get('reason')}")
        shapes = (t.get("xla") or {}).get("shape_recompiles")
        if shapes:
            per = ", ".join(
                f"{r['shapes']}: {r['first_call_s']:.1f} s"
                if "first_call_s" in r
                else f"{r['shapes']}: unsupported"
                for r in shapes
            )
            notes.append(f"- {t['workload']} {t['step']} xla recompiles per new shape: {per}")
    if notes:
        lines += ["", "Coverage and recompilation:", *notes]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "xla-h200"))
    ap.add_argument("--workloads", default="resnet50,bert-base")
    ap.add_argument("--steps", default="infer,train")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="full", help="`tiny` for a quick CPU smoke run")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    specs = []
    for workload in args.workloads.split(","):
        for step in args.steps.split(","):
            for variant in split_variants(args.variants):
                specs.append(
                    TrialSpec(
                        workload=workload,
                        variant=variant,
                        baseline=BASELINE,
                        step=step,
                        device=args.device,
                        preset=args.preset,
                        check_accuracy=variant.startswith("xla"),
                        index=len(specs),
                        **MEASURE,
                    )
                )
    done: list[dict[str, Any]] = []

    def on_result(spec: TrialSpec, result: dict[str, Any]) -> None:
        done.append(result)
        ms = (result.get("steady_ms") or {}).get("median")
        print(
            f"[{time.strftime('%H:%M:%S')}] {spec.workload} {spec.step} {spec.variant}: "
            f"{result['status']} first_call={result.get('first_call_s')} ms={ms} "
            f"{result.get('reason') or ''}",
            flush=True,
        )
        (out / "trials.json").write_text(json.dumps(done, indent=2, default=str))
        (out / "comparison.md").write_text(comparison_table(done))

    t0 = time.perf_counter()
    run_trials(specs, out / "run", timeout_s=args.timeout_s, on_result=on_result)
    print(f"\n{len(done)} trials in {time.perf_counter() - t0:.0f} s\n")
    print(comparison_table(done))


if __name__ == "__main__":
    main()
