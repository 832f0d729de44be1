"""GPU evidence for `kiln tune`: resnet50 and bert-base, infer and train, bf16 allowed.

    PYTHONPATH=src python3 benchmarks/bench_tune.py --out benchmarks/results/tune/h200

For each (workload, step) one `kiln tune` run (its report and trials under OUT/<workload>-<step>),
then the four plain `torch.compile` modes (default, reduce-overhead, max-autotune-no-cudagraphs,
max-autotune; nothing else changed) at the pick's precision, each timed against the pick in one
process, paired rep by rep (OUT/<workload>-<step>-plain). The summary row: the pick, its paired
speedup over eager, each plain mode's time over the pick's with its interval, the best plain
mode, plain modes that failed and why, and the tune's wall time (the plain comparison is not
part of it). With --plain-fp32-modes, the same against plain modes at fp32 (nothing at all
changed), reported beside the strict reading, never instead of it. --plain-modes narrows the
plain comparison (e.g. to reduce-overhead, the best plain mode in every H200 run so far) when a
GPU's time has no room for all four. --pick SPEC skips the tune and times the plain modes against
SPEC (an earlier tune's pick), for plain modes that did not fit beside a tune in one run; the row
then has no tune wall time. --plain-no-check skips the plain trials' correctness check (a plain
mode is the bar, not the candidate: a faster wrong one would only make the bar higher), and
--plain-cache-dir shares one compile cache between them (their compile time is not what is
compared; max-autotune's second mode then reuses the first's kernel choices).
Goals: at least 1.2x over the best plain mode on the training steps,
never slower than it (the interval's upper end at or above 1), and each tune within its
15-minute budget. OUT/bench_tune.json is rewritten after every tune.
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

from torchkiln.api import bench  # noqa: E402
from torchkiln.tune import tune  # noqa: E402
from torchkiln.tune.select import passed  # noqa: E402
from torchkiln.variants import parse_variant  # noqa: E402

PLAIN_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
GOAL_TRAIN_OVER_PLAIN = 1.2


def plain_specs(precision: str, modes: tuple[str, ...] = PLAIN_MODES) -> list[str]:
    """Plain torch.compile modes at one precision: nothing else changed."""
    suffix = "" if precision == "fp32" else f"+{precision}"
    return [("inductor" if m == "default" else f"inductor:mode={m}") + suffix for m in modes]


def pick_over_plain(plain_doc: dict[str, Any]) -> dict[str, Any]:
    """Each plain mode timed against the pick (the bench's baseline), paired rep by rep:
    plain ms / pick ms with its interval. Correct, ok trials count, and so do trials stopped in
    their correctness check after their timing (kept by the runner, marked), and so do trials
    run without the check (--plain-no-check, marked): a plain mode is the bar the pick must
    clear, so one more competitor makes the comparison stricter."""
    rows, missing = {}, {}
    for t in plain_doc["trials"]:
        kept = bool(t.get("measured_before_failure") and t.get("speedup"))
        unchecked = t["status"] == "ok" and t.get("correctness") is None and t.get("speedup")
        if not passed(t) and not kept and not unchecked:
            missing[t["variant"]] = f"{t['status']}: {t.get('reason')}"
            continue
        sp = t["speedup"]  # pick ms / plain ms
        lo, hi = sp["ci95"]
        rows[t["variant"]] = {"ratio": 1 / sp["median"], "ci95": [1 / hi, 1 / lo]}
        if kept:
            rows[t["variant"]]["correctness"] = (
                f"not checked: {t['status']} after its timing ({t.get('reason')})"
            )
        elif unchecked:
            rows[t["variant"]]["correctness"] = "not checked (--plain-no-check)"
    best = min(rows, key=lambda v: rows[v]["ratio"]) if rows else None
    return {"pick_over_plain": rows, "not_measured": missing, "best_plain": best,
            "pick_over_best_plain": rows[best] if best else None}  # fmt: skip


def summarize_tune(
    doc: dict[str, Any], budget_s: float, plain: dict | None, plain_fp32: dict | None = None
) -> dict[str, Any]:
    trials = {t["variant"]: t for t in doc["trials"]}
    pick_spec = (doc.get("selection") or {}).get("best")
    wall_s = doc.get("wall_s")  # None: --pick, no tune ran
    row: dict[str, Any] = {
        "workload": doc["workload"],
        "step": doc["step"],
        "pick": pick_spec,
        "pick_speedup_vs_eager": (trials.get(pick_spec) or {}).get("speedup"),
        "wall_s": wall_s,
        "budget_s": budget_s,
        "within_budget": None if wall_s is None else wall_s <= budget_s,
        "skipped": doc["stages"].get("search", {}).get("skipped", {}),
        "plain": plain,
    }
    best = (plain or {}).get("pick_over_best_plain")
    row["goal_never_slower"] = None if best is None else best["ci95"][1] >= 1.0
    if doc["step"] == "train":
        row["goal_train_1_2x"] = None if best is None else best["ratio"] >= GOAL_TRAIN_OVER_PLAIN
    if plain_fp32 is not None:
        # The other reading of "plain torch.compile": the mode and nothing else, so fp32 even
        # where the pick found an allowed 16-bit precision correct. Reported beside the
        # strict reading above (the plain modes at the pick's precision), never instead of it.
        row["plain_fp32"] = plain_fp32
        best32 = plain_fp32.get("pick_over_best_plain")
        row["fp32_reading"] = None if best32 is None else {
            "never_slower": best32["ci95"][1] >= 1.0,
            # The verdicts are over the modes measured; those that were not are named here.
            "unmeasured_modes": sorted(plain_fp32.get("not_measured") or {}),
            **({"train_1_2x": best32["ratio"] >= GOAL_TRAIN_OVER_PLAIN}
               if doc["step"] == "train" else {}),
        }  # fmt: skip
    return row


def against_pick(
    args: argparse.Namespace, workload: str, step: str, pick: str, variants: list[str], out: Path
) -> dict[str, Any]:
    """Each plain variant timed against the pick in one process, paired rep by rep; with
    --summarize, what such a run left in `out` (no trial runs)."""
    if args.summarize:
        return left_in(out, variants)
    print(f"== {', '.join(variants)} vs the pick {pick}", flush=True)
    doc = bench(
        workload,
        variants,
        step=step,
        device=args.device,
        preset=args.preset,
        baseline=pick,
        out=out,
        timeout_s=args.plain_timeout,
        cache_dir=args.plain_cache_dir,
        spec_overrides={"check_accuracy": False} if args.plain_no_check else None,
    )
    return {**pick_over_plain(doc), "environment": doc.get("environment")}


def left_in(run: Path, variants: list[str]) -> dict[str, Any]:
    """The comparison from a run directory whose run was stopped before its end (a time
    limit): its finished trials, and each variant without a result named as not measured. A
    trial that wrote its own file after its launcher was gone is not one of them: nothing
    stopped it from timing beside whatever ran next on the device."""
    trials, missing, env = [], {}, None
    for path in sorted(run.glob("trials/*/result.json")):
        t = json.loads(path.read_text())
        trials.append(t)
        env = env or t.get("environment")
    out = pick_over_plain({"trials": trials})
    done = {t["variant"] for t in trials}
    for v in variants:
        if v not in done:
            missing[v] = "no result: the run was stopped before this trial ended"
    out["not_measured"] = {**out["not_measured"], **missing}
    return {**out, "environment": env, "summarized_from": str(run)}


def given_pick(workload: str, step: str, pick: str) -> dict[str, Any]:
    """The summary's view of a tune that did not run here: --pick names its choice."""
    return {"workload": workload, "step": step, "trials": [], "selection": {"best": pick},
            "wall_s": None, "stages": {}, "pick_from": "--pick (no tune ran)"}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/tune/h200")
    ap.add_argument("--workloads", default="resnet50,bert-base")
    ap.add_argument("--steps", default="infer,train")
    ap.add_argument("--budget", default="15m")
    ap.add_argument("--allow-precision", default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--plain-timeout", type=float, default=600.0, help="seconds per plain trial")
    ap.add_argument(
        "--plain-modes",
        default=",".join(PLAIN_MODES),
        help="the plain modes timed against the pick at its precision (comma-separated)",
    )
    ap.add_argument(
        "--plain-fp32-modes",
        default="",
        help="also time these plain modes at fp32 against a 16-bit pick (comma-separated, e.g. "
        "default,reduce-overhead): the reading of 'plain torch.compile' with nothing else changed",
    )
    ap.add_argument(
        "--pick",
        default="",
        help="skip the tune: time the plain modes against this spec (an earlier tune's pick); "
        "one workload and one step",
    )
    ap.add_argument(
        "--plain-no-check",
        action="store_true",
        help="skip the plain trials' correctness check (they are the bar, not candidates)",
    )
    ap.add_argument(
        "--plain-cache-dir",
        default=None,
        help="one compile cache shared by the plain trials (default: a fresh one each)",
    )
    ap.add_argument(
        "--summarize",
        action="store_true",
        help="with --pick: run nothing, write bench_tune.json from the plain runs already in "
        "--out (a run stopped by a time limit leaves no summary of its own)",
    )
    args = ap.parse_args(argv)
    if args.summarize and not args.pick:
        ap.error("--summarize needs --pick")
    if args.pick:
        parse_variant(args.pick)  # a bad spec fails here, not after the first trial
        if "," in args.workloads or "," in args.steps:
            ap.error("--pick: give one --workloads and one --steps")
    plain_modes = tuple(m for m in args.plain_modes.split(",") if m)
    unknown = sorted(set(plain_modes) - set(PLAIN_MODES))
    if unknown:
        ap.error(f"--plain-modes: unknown {unknown}; known: {', '.join(PLAIN_MODES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from torchkiln.tune.api import parse_budget

    budget_s = parse_budget(args.budget)
    rows, env = [], None
    for workload in args.workloads.split(","):
        for step in args.steps.split(","):
            if args.pick:
                doc = given_pick(workload, step, args.pick)
            else:
                print(f"== tune {workload} {step} (budget {args.budget})", flush=True)
                doc = tune(
                    workload,
                    step=step,
                    device=args.device,
                    budget=args.budget,
                    allow_precision=[p for p in args.allow_precision.split(",") if p],
                    preset=args.preset,
                    out=out / f"{workload}-{step}",
                ).doc
            env = env or doc.get("environment")
            pick = (doc.get("selection") or {}).get("best")
            plain = plain_fp32 = None

            if pick:
                # The four plain modes at the pick's precision, each paired against the pick.
                precision = parse_variant(pick).precision
                variants = [v for v in plain_specs(precision, plain_modes) if v != pick]
                if variants:
                    plain = against_pick(
                        args, workload, step, pick, variants, out / f"{workload}-{step}-plain"
                    )
                fp32_modes = tuple(m for m in args.plain_fp32_modes.split(",") if m)
                if fp32_modes and precision != "fp32":
                    plain_fp32 = against_pick(
                        args, workload, step, pick, plain_specs("fp32", fp32_modes),
                        out / f"{workload}-{step}-plain-fp32",
                    )  # fmt: skip
            for compared in (plain, plain_fp32):  # --pick: no tune document to take it from
                bench_env = (compared or {}).pop("environment", None)
                env = env or bench_env
            rows.append(summarize_tune(doc, budget_s, plain, plain_fp32))
            (out / "bench_tune.json").write_text(
                json.dumps(
                    {
                        "schema": "kiln.bench_tune/1",
                        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        "command": " ".join([sys.executable, *sys.argv]),
                        "environment": env,
                        "rows": rows,
                    },
                    indent=2,
                    default=str,
                )
            )
    for r in rows:
        plain = r.get("plain") or {}
        best = plain.get("pick_over_best_plain") or {}
        sp = (r["pick_speedup_vs_eager"] or {}).get("median")
        over = "-" if not best else f"{best['ratio']:.2f}x"
        print(
            f"{r['workload']:<10} {r['step']:<5} pick {r['pick']}: "
            f"{'-' if sp is None else f'{sp:.2f}x'} eager, "
            f"{over} the best plain mode "
            f"({plain.get('best_plain')}), "
            + ("no tune (--pick)" if r["wall_s"] is None
               else f"tune wall {r['wall_s']:.0f} s of {r['budget_s']:.0f}")
        )  # fmt: skip
        best32 = (r.get("plain_fp32") or {}).get("pick_over_best_plain")
        if best32:
            print(f"{'':<16} {best32['ratio']:.2f}x the best plain mode at fp32")
    return 0


if __name__ == "__main__":
    sys.exit(main())
