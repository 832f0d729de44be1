"""GPU evidence for graph-break remedies: `kiln tune` (remedies as candidates, --fix code) on
each zoo model with breaks, against the best plain `torch.compile` mode on the unmodified model.

    PYTHONPATH=src python3 benchmarks/bench_repair.py --out benchmarks/results/repair/h200

For each model: one `kiln tune --allow-precision bf16` run (OUT/<model>/), and the plain modes
(--plain-modes of default, reduce-overhead, max-autotune-no-cudagraphs, max-autotune, at the
pick's precision, the model as written): by default the ones the tune itself measured (its
primaries are the plain default and reduce-overhead modes), each against the pick through their
paired speedups over eager; with --paired, each timed against the pick in one process, rep by
rep (OUT/<model>-plain/, as benchmarks/bench_tune.py does), a trial per mode per model. The
pick's fixes.patch is then applied to a pristine copy of the model's files and `kiln explain`
re-run on it: 0 breaks wherever the rewrite left no break alone. OUT/bench_repair.json holds
the environment, every row and every patch. Goals: the picks' geometric mean over the best
plain mode at least 2x (over the models with breaks), and no pick slower than the best plain
mode (the interval's upper end >= 1).
--total-budget stops starting models once spent, so a GPU run stays within its time; the
models not run are named in the JSON and the table. --resume keeps the rows already in
OUT/bench_repair.json and runs the rest, so one run can be split over several GPU sessions.
The default total (8m30s, 60 s per model) fits eight models at about a minute each (each tune's
stages plus its primaries and their remedied twins); --paired adds a trial per plain mode.
--jobs N runs the models in N processes at once that take turns on the host (KILN_HOST_TURNS):
their compiles overlap, while no process times its reps, or runs its profile or explain, during
another's timed reps.
--plain-only runs no tune: the plain modes the kept tunes did not measure (the autotuned two)
are timed against each pick, paired in one process, and merged with the ones the tune measured;
a stopped --plain-only run's finished parts are picked up by the next. --resume --redo MODEL
tunes a kept model again. The committed results:
    --jobs 4 --budget 4m, then --resume --redo zoo-smooth-net --budget 5m, then
    --plain-only --plain-modes default,reduce-overhead,max-autotune-no-cudagraphs,max-autotune
    --jobs 4 --plain-timeout 150 (each command is in bench_repair.json).
CPU check of the script itself: --device cpu --preset tiny --budget 2m.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_tune import PLAIN_MODES, pick_over_plain, plain_specs  # noqa: E402
from torchkiln.api import bench  # noqa: E402
from torchkiln.errors import KilnUserError  # noqa: E402
from torchkiln.repair.arm import PLAN_KEY  # noqa: E402
from torchkiln.runner.launch.host_lock import HOST_TURNS_ENV, TURNSTILE_SUFFIX  # noqa: E402
from torchkiln.tune import tune  # noqa: E402
from torchkiln.tune.api import parse_budget  # noqa: E402
from torchkiln.variants import parse_variant  # noqa: E402
from torchkiln.workloads.real import ZOO  # noqa: E402

GOAL_GEOMEAN = 2.0


def plain_variants(args: argparse.Namespace, pick: str, modes: tuple[str, ...]) -> list[str]:
    """The plain modes at the pick's precision, and at every allowed precision when the pick is
    eager (an eager fp32 pick still faces the plain bf16 modes)."""
    precision = parse_variant(pick).precision
    precisions = [precision]
    if parse_variant(pick).name == "eager":
        precisions += [p for p in args.allow_precision.split(",") if p and p != precision]
    return [v for p in precisions for v in plain_specs(p, modes) if v != pick]


def plain_against_pick(
    args: argparse.Namespace,
    model: str,
    pick: str,
    plan: str | None,
    out: Path,
    variants: list[str] | None = None,
) -> dict[str, Any]:
    """The plain modes on the unmodified model (``variants``, else all --plain-modes), each
    timed against the (remedied) pick in one process, rep by rep."""
    if variants is None:
        variants = plain_variants(args, pick, tuple(m for m in args.plain_modes.split(",") if m))
    if not variants:
        return {"pick_over_plain": {}, "not_measured": {}, "best_plain": None}
    overrides: dict[str, Any] = {"check_accuracy": False}  # the bar, not a candidate
    if plan:
        overrides["extra"] = {PLAN_KEY: plan}  # the pick's arm is built from its repair plan
    doc = bench(
        model,
        variants,
        device=args.device,
        preset=args.preset,
        baseline=pick,
        out=out,
        timeout_s=args.plain_timeout,
        spec_overrides=overrides,
    )
    return {**pick_over_plain(doc), "environment": doc.get("environment")}


def _is_plain(spec: str, mode: str, precision: str) -> bool:
    """torch.compile in ``mode`` over the unmodified model at ``precision``, nothing else."""
    v = parse_variant(spec)
    b = v.backend
    return (
        v.name == "inductor"
        and not v.fixes
        and not v.channels_last
        and v.precision == precision
        and b.mode == mode
        and b.scope == "model"
        and not b.freezing
    )


def plain_from_tune(
    doc: dict[str, Any], pick: str, modes: tuple[str, ...], precisions: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The plain modes the tune itself measured on the unmodified model, at the pick's precision
    or any the tune was allowed (an eager fp32 pick still faces the plain bf16 modes), against
    the pick: both paired with the eager runs of their own trials, so the ratio is pick speedup
    over plain speedup, its interval the widest the two allow."""
    allowed = dict.fromkeys([parse_variant(pick).precision, *precisions])
    p = next(t for t in doc["trials"] if t["variant"] == pick)["speedup"]
    rows, missing = {}, {}
    for mode in modes:
        for precision in allowed:
            t = next((t for t in doc["trials"] if _is_plain(t["variant"], mode, precision)), None)
            if t is None or t.get("status") != "ok" or not t.get("speedup"):
                why = (
                    "not measured by the tune" if t is None else f"{t['status']}: {t.get('reason')}"
                )
                missing[f"{mode}@{precision}"] = why
                continue
            q = t["speedup"]
            rows[t["variant"]] = {
                "ratio": p["median"] / q["median"],
                "ci95": [p["ci95"][0] / q["ci95"][1], p["ci95"][1] / q["ci95"][0]],
            }
    best = min(rows, key=lambda v: rows[v]["ratio"]) if rows else None
    return {
        "pick_over_plain": rows,
        "not_measured": missing,
        "best_plain": best,
        "pick_over_best_plain": rows[best] if best else None,
        "from": "the tune's own trials",
    }


def rejudge(args: argparse.Namespace, rows: list[dict[str, Any]], out: Path) -> None:
    """Each row's plain comparison again, from OUT/<model>/results.json (the tune's results,
    kept beside bench_repair.json): a change of the comparison without a GPU run."""
    modes = tuple(m for m in args.plain_modes.split(",") if m)
    precisions = tuple(p for p in args.allow_precision.split(",") if p)
    for row in rows:
        path = out / row["model"] / "results.json"
        if not row.get("pick") or not path.exists() or args.paired:
            continue
        doc = json.loads(path.read_text())
        row["plain"] = plain_from_tune(doc, row["pick"], modes, precisions)
        finish_row(row)


def merge_plain(from_tune: dict[str, Any], paired: dict[str, Any]) -> dict[str, Any]:
    """One comparison from two sources: the plain modes the tune measured (through paired
    speedups over eager) and the ones timed against the pick in one process; each row says
    which, and the best plain mode is the fastest of them all."""
    rows: dict[str, Any] = {}
    for source, part in (("the tune's own trials", from_tune), ("paired against the pick", paired)):
        rows |= {v: {**r, "from": source} for v, r in part["pick_over_plain"].items()}
    best = min(rows, key=lambda v: rows[v]["ratio"]) if rows else None
    return {
        "pick_over_plain": rows,
        "not_measured": {**from_tune["not_measured"], **paired["not_measured"]},
        "best_plain": best,
        "pick_over_best_plain": rows[best] if best else None,
        "from": "the tune's own trials and paired trials against the pick",
    }


def rebuild_plan(args: argparse.Namespace, model: str, pick: str, out: Path) -> str:
    """The repair plan a remedied pick is built from, made again on this machine (the tune's
    plan.json and copies stay where the tune ran): explain's breaks, then the same rewrites."""
    from torchkiln.diagnose.explain import explain
    from torchkiln.repair.plan import build_plan

    report = explain(
        model, preset=args.preset, variant="inductor", recompiles=False, device=args.device
    )
    plan = build_plan(model, report.get("breaks") or [], out / "repair", "code")
    fix = parse_variant(pick).fixes
    if not all(f in plan["fixes"] for f in fix):
        raise RuntimeError(
            f"{model}: the rebuilt plan offers {plan['fixes']}, not the pick's {fix}"
        )
    return plan["path"]


def add_plain_paired(args: argparse.Namespace, row: dict[str, Any], out: Path) -> dict[str, Any]:
    """A kept row with the --plain-modes the tune did not measure (the autotuned ones) timed
    against its pick, merged with the ones it did: the tune is not run again."""
    model, pick = row["model"], row["pick"]
    doc = json.loads((out / model / "results.json").read_text())
    wanted = tuple(m for m in args.plain_modes.split(",") if m)
    precisions = tuple(p for p in args.allow_precision.split(",") if p)
    from_tune = plain_from_tune(doc, pick, wanted, precisions)
    # every plain mode the tune did not measure (the autotuned ones; one it skipped for time)
    rest = [
        v
        for v in plain_variants(args, pick, wanted)
        if f"{parse_variant(v).backend.mode}@{parse_variant(v).precision}"
        in from_tune["not_measured"]
    ]
    for v in rest:
        from_tune["not_measured"].pop(
            f"{parse_variant(v).backend.mode}@{parse_variant(v).precision}"
        )
    print(f"== {model}: {', '.join(rest)} against the pick {pick}", flush=True)
    plan = (
        rebuild_plan(args, model, pick, out / f"{model}-plain")
        if parse_variant(pick).fixes
        else None
    )
    paired = plain_against_pick(args, model, pick, plan, out / f"{model}-plain", rest)
    paired.pop("environment", None)
    row = {**row, "plain": merge_plain(from_tune, paired)}
    finish_row(row)
    return row


def finish_row(row: dict[str, Any]) -> None:
    best = (row.get("plain") or {}).get("pick_over_best_plain")
    row["over_best_plain"] = best
    row["never_slower"] = None if best is None else best["ci95"][1] >= 1.0


def reverify(doc: dict[str, Any], args: argparse.Namespace, out: Path) -> dict[str, Any] | None:
    """Apply the pick's fixes.patch to a pristine copy of the model's files, explain it again."""
    from torchkiln.diagnose.explain import explain

    fixes = (doc.get("recommendation") or {}).get("fixes") or {}
    code = fixes.get("code")
    if not code:
        return None
    plan = json.loads(Path(doc["stages"]["repair"]["plan"]).read_text())
    src = plan["source"]
    copy_root, diff_root = Path(src["copy_root"]), Path(src["diff_root"])
    with tempfile.TemporaryDirectory(prefix="kiln-reverify-") as tmp:
        tree = Path(tmp)
        rel = copy_root.relative_to(diff_root)
        shutil.copytree(
            copy_root, tree / rel, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True
        )
        patch = out / "fixes.patch"
        applied = subprocess.run(
            ["patch", "-p1", "-i", str(patch)], cwd=tree, capture_output=True, text=True
        )
        if applied.returncode != 0:
            return {"applied": False, "error": (applied.stdout + applied.stderr)[-2000:]}
        entry = tree / rel / Path(src["entry"]).name
        report = explain(
            f"{entry}:{src['factory']}", preset=args.preset, device=args.device, recompiles=False
        )
    breaks = len(report.get("breaks") or [])
    claims_zero = not plan["skipped"] and not fixes["config"]["remedies"]
    return {
        "applied": True,
        "explain_status": report.get("status"),
        "breaks_after_patch": breaks,
        "claims_zero": claims_zero,
        "verified": (breaks == 0) if claims_zero else None,
    }


def run_model(args: argparse.Namespace, model: str, out: Path) -> dict[str, Any]:
    print(f"== tune {model} (budget {args.budget})", flush=True)
    try:
        doc = tune(
            model,
            device=args.device,
            budget=args.budget,
            allow_precision=[p for p in args.allow_precision.split(",") if p],
            preset=args.preset,
            out=out / model,
            fix="code",
        ).doc
    except KilnUserError as e:  # the tune refused the model: a row with the reason, no pick
        print(f"   {model}: {e}", flush=True)
        return {"model": model, "pick": None, "status": "error", "reason": str(e)}
    pick = (doc.get("selection") or {}).get("best")
    trials = {t["variant"]: t for t in doc["trials"]}
    stage = doc["stages"].get("repair") or {}
    row: dict[str, Any] = {
        "model": model,
        "pick": pick,
        "pick_speedup_vs_eager": (trials.get(pick) or {}).get("speedup"),
        "breaks": doc["stages"].get("graph_breaks", {}).get("breaks"),
        "remedies": stage.get("fixes"),
        "tune_wall_s": doc.get("wall_s"),
        "fixes": (doc.get("recommendation") or {}).get("fixes"),
        "break_costs": stage.get("break_costs"),
    }
    row["environment"] = doc.get("environment")
    if pick:
        modes = tuple(m for m in args.plain_modes.split(",") if m)
        if args.paired:
            print(f"== plain modes vs the pick {pick}", flush=True)
            plan = stage.get("plan") if parse_variant(pick).fixes else None
            row["plain"] = plain_against_pick(args, model, pick, plan, out / f"{model}-plain")
            row["plain"].pop("environment", None)
        else:
            precisions = tuple(p for p in args.allow_precision.split(",") if p)
            row["plain"] = plain_from_tune(doc, pick, modes, precisions)
        row["reverify"] = reverify(doc, args, out / model)
    finish_row(row)
    return row


def judge(rows: list[dict[str, Any]]) -> dict[str, Any]:
    broken = [r for r in rows if r.get("breaks") and r.get("over_best_plain")]
    ratios = [r["over_best_plain"]["ratio"] for r in broken]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    slower = [r["model"] for r in rows if r.get("never_slower") is False]
    unverified = [r["model"] for r in rows if (r.get("reverify") or {}).get("verified") is False]
    return {
        "geomean_over_best_plain": geomean,
        "goal_geomean_2x": None if geomean is None else geomean >= GOAL_GEOMEAN,
        "slower_than_best_plain": slower,
        "goal_never_slower": not slower,
        "patches_not_verified": unverified,
    }


def write_doc(
    out: Path,
    part: int | None,
    rows: list[dict[str, Any]],
    not_run: list[str],
    commands: list[str],
    env: dict[str, Any] | None,
    t0: float,
) -> None:
    doc = {
        "schema": "kiln.bench_repair/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": commands[-1],
        "commands": commands,
        "environment": env,
        "rows": rows,
        "not_run": not_run,
        "goals": judge(rows),
        "wall_s": time.monotonic() - t0,
    }
    name = "bench_repair.json" if part is None else f"bench_repair.part-{part}.json"
    (out / name).write_text(json.dumps(doc, indent=2, default=str))


def run_parts(
    args: argparse.Namespace,
    argv: list[str],
    models: list[str],
    out: Path,
    env: dict[str, Any] | None,
) -> tuple[list[dict[str, Any]], list[str], dict[str, Any] | None]:
    """Models in ``args.jobs`` processes at once, taking turns on the host (KILN_HOST_TURNS):
    their compiles overlap, and no process times its reps while another is busy."""
    groups = [models[k :: args.jobs] for k in range(args.jobs)]
    groups = [g for g in groups if g]
    turns = out / "host-turns.lock"
    child_env = {**os.environ, HOST_TURNS_ENV: str(turns)}
    base = [a for a in argv_without(argv, {"--models", "--jobs", "--part"}) if a != "--resume"]
    procs = []
    for k, group in enumerate(groups):
        cmd = [sys.executable, __file__, *base, "--models", ",".join(group), "--part", str(k)]
        print(f"== part {k}: {', '.join(group)}", flush=True)
        procs.append(subprocess.Popen(cmd, env=child_env))
    codes = [p.wait() for p in procs]
    rows: list[dict[str, Any]] = []
    not_run: list[str] = []
    for k, (group, code) in enumerate(zip(groups, codes, strict=True)):
        path = out / f"bench_repair.part-{k}.json"
        if not path.exists():
            print(f"part {k} left no results (exit {code})", flush=True)
            not_run += group
            continue
        part = json.loads(path.read_text())
        rows += part["rows"]
        not_run += part["not_run"]
        not_run += [m for m in group if m not in {r["model"] for r in part["rows"]}]
        env = env or part.get("environment")
        path.unlink()
    for p in (turns, Path(str(turns) + TURNSTILE_SUFFIX)):
        p.unlink(missing_ok=True)
    return rows, sorted(set(not_run)), env


def argv_without(argv: list[str], options: set[str]) -> list[str]:
    """``argv`` without the given options and their values (as ``--opt v`` or ``--opt=v``)."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in options:
            skip = True
            continue
        if a.split("=", 1)[0] in options:
            continue
        kept.append(a)
    return kept


def print_table(rows: list[dict[str, Any]], not_run: list[str], total_budget: str) -> None:
    goals = judge(rows)
    print()
    print(f"{'model':<20} {'breaks':>6} {'pick':<60} {'vs best plain':>14}  patch")
    for r in rows:
        best = r.get("over_best_plain")
        over = "-" if not best else f"{best['ratio']:.2f}x {'' if r['never_slower'] else 'SLOWER'}"
        ver = r.get("reverify") or {}
        patch = "-" if not ver else f"{ver.get('breaks_after_patch')} breaks after"
        if r.get("status") == "error":
            print(f"{r['model']:<20} {'':>6} error: {r['reason'][:120]}")
            continue
        print(f"{r['model']:<20} {r.get('breaks')!s:>6} {r['pick']!s:<60} {over:>14}  {patch}")
    for m in not_run:
        print(f"{m:<20} not run: --total-budget {total_budget} spent")
    g = goals["geomean_over_best_plain"]
    print(
        f"geomean over the best plain mode: {'-' if g is None else f'{g:.2f}x'} "
        f"(goal >= {GOAL_GEOMEAN}x: {goals['goal_geomean_2x']}); no pick slower: "
        f"{goals['goal_never_slower']}; patches not verified: {goals['patches_not_verified']}"
    )


def recovered_parts(out: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Rows a stopped --plain-only run's parts had finished (OUT/bench_repair.part-K.json, each
    written after every model), so a rerun measures only what is missing; the files are
    folded into bench_repair.json (plain_only). Also the parts' own commands."""
    rows: dict[str, dict[str, Any]] = {}
    commands: list[str] = []
    for path in sorted(out.glob("bench_repair.part-*.json")):
        part = json.loads(path.read_text())
        if part.get("command") and part["command"] not in commands:
            commands.append(part["command"])
        for r in part.get("rows", []):
            if r.get("pick") and not r.get("plain_paired_not_run"):
                rows[r["model"]] = r
    if rows:
        print(f"recovered from a stopped run's parts: {', '.join(sorted(rows))}", flush=True)
    return rows, commands


def plain_only(
    args: argparse.Namespace,
    argv: list[str],
    models: list[str],
    out: Path,
    kept: Path,
    command: str,
    t0: float,
) -> int:
    """--plain-only: the kept rows, each with the plain modes its tune did not measure timed
    against its pick; a row whose plain trials were not run keeps its earlier comparison and
    says why."""
    earlier = json.loads(kept.read_text())
    env = earlier.get("environment")
    commands = (earlier.get("commands") or [earlier.get("command")]) + [command]
    by_model = {r["model"]: r for r in earlier["rows"]}
    recovered, their_commands = recovered_parts(out) if args.part is None else ({}, [])
    if recovered:
        # folded into bench_repair.json before anything runs: this run's parts reuse the names
        by_model |= recovered
        commands[-1:-1] = their_commands
        order = {m: i for i, m in enumerate(ZOO)}
        merged = sorted(by_model.values(), key=lambda r: order.get(r["model"], len(order)))
        write_doc(out, None, merged, earlier.get("not_run", []), commands[:-1], env, t0)
        for path in out.glob("bench_repair.part-*.json"):
            path.unlink()
    todo = [m for m in models if (by_model.get(m) or {}).get("pick") and m not in recovered]
    rows: list[dict[str, Any]] = []
    if args.jobs > 1 and args.part is None and todo:
        part_rows, missed, _ = run_parts(args, argv, todo, out, env)
        rows += part_rows
        for m in missed:
            rows.append({**by_model[m], "plain_paired_not_run": "its part left no row"})
    else:
        for m in todo:
            if time.monotonic() - t0 > parse_budget(args.total_budget):
                rows.append({**by_model[m], "plain_paired_not_run": "--total-budget spent"})
            else:
                rows.append(add_plain_paired(args, by_model[m], out))
            write_doc(out, args.part, rows, [], commands, env, t0)
    if args.part is not None:
        write_doc(out, args.part, rows, [], commands, env, t0)
        return 0
    done = {r["model"] for r in rows}
    rows += [r for m, r in by_model.items() if m not in done]
    order = {m: i for i, m in enumerate(ZOO)}
    rows.sort(key=lambda r: order.get(r["model"], len(order)))
    t0 -= earlier.get("wall_s") or 0.0  # the tunes' wall time is part of the run's
    write_doc(out, None, rows, earlier.get("not_run", []), commands, env, t0)
    print_table(rows, earlier.get("not_run", []), args.total_budget)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/repair/h200")
    ap.add_argument("--models", default=",".join(ZOO), help="zoo models (comma-separated)")
    ap.add_argument("--budget", default="60s", help="each model's tune budget")
    ap.add_argument("--total-budget", default="8m30s", help="no model is started after this")
    ap.add_argument("--allow-precision", default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="full")
    ap.add_argument(
        "--plain-modes",
        default="default,reduce-overhead",
        help=f"plain modes compared (of {','.join(PLAIN_MODES)}); the autotuned two compile for "
        "minutes each and do not fit the total budget beside eight tunes: add them for a longer "
        "run",
    )
    ap.add_argument("--plain-timeout", type=float, default=120.0, help="seconds per plain trial")
    ap.add_argument(
        "--paired",
        action="store_true",
        help="time each plain mode against the pick in one process (bench_tune's way; a trial "
        "per mode per model) instead of reading the plain modes the tune measured",
    )
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows of OUT/bench_repair.json and run only the models it has no pick "
        "for: a run split over several GPU sessions (each under its own time limit) judges "
        "the goals over every model",
    )
    ap.add_argument(
        "--redo",
        default="",
        help="with --resume: tune these models again (comma-separated) even though a row is kept",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="models run in this many processes at once, taking turns on the host "
        "(KILN_HOST_TURNS): compiles overlap, timed reps never overlap another's work",
    )
    ap.add_argument(
        "--rejudge",
        action="store_true",
        help="run nothing: recompute each row's plain comparison and the goals from "
        "OUT/<model>/results.json and rewrite OUT/bench_repair.json",
    )
    ap.add_argument(
        "--plain-only",
        action="store_true",
        help="run no tune: time the --plain-modes the tunes did not measure (the autotuned "
        "ones) against each kept row's pick, paired in one process, and judge the goals over "
        "all four modes; rewrites OUT/bench_repair.json",
    )
    ap.add_argument("--part", type=int, default=None, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(ZOO))
    if unknown:
        ap.error(f"--models: unknown {unknown}; known: {', '.join(ZOO)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    total = parse_budget(args.total_budget)
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    commands: list[str] = []
    not_run: list[str] = []
    env = None
    kept = out / "bench_repair.json"
    if args.resume and kept.exists():
        earlier = json.loads(kept.read_text())
        rows = [r for r in earlier.get("rows", []) if r.get("pick")]
        commands = earlier.get("commands") or [earlier.get("command")]
        env = earlier.get("environment")
        redo = {m for m in args.redo.split(",") if m}
        rows = [r for r in rows if r["model"] not in redo]
        done = {r["model"] for r in rows}
        print(f"kept from {kept}: {', '.join(sorted(done)) or 'nothing'}", flush=True)
        models = [m for m in models if m not in done]
    commands.append(" ".join([sys.executable, __file__, *argv]))
    if args.rejudge:
        earlier = json.loads(kept.read_text())
        rows, not_run, env = earlier["rows"], earlier.get("not_run", []), earlier.get("environment")
        commands = (earlier.get("commands") or [earlier.get("command")]) + commands[-1:]
        rejudge(args, rows, out)
        models = []
        t0 -= earlier.get("wall_s") or 0.0  # the run's own wall time, not this rewrite's
    if args.plain_only:
        return plain_only(args, argv, models, out, kept, commands[-1], t0)
    if args.jobs > 1 and args.part is None and models:
        part_rows, not_run, env = run_parts(args, argv, models, out, env)
        rows += part_rows
    else:
        for model in models:
            if time.monotonic() - t0 > total:
                not_run.append(model)
                continue
            rows.append(run_model(args, model, out))
            env = env or rows[-1].get("environment")
            write_doc(out, args.part, rows, not_run, commands, env, t0)
    write_doc(out, args.part, rows, not_run, commands, env, t0)
    if args.part is None:
        print_table(rows, not_run, args.total_budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
