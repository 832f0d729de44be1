"""What DDP's wrapper costs on one GPU, and how it scales over the GPUs of one host.

    PYTHONPATH=src python3 benchmarks/bench_dist.py --out benchmarks/results/dist/h200

For each workload (default: simple, full preset) and variant (eager, inductor), one training
trial through torchrun with ``--dist ddp --nproc 1``. Inside that trial, rank 0 also times the
same variant with no wrapper in the same process after the DDP arm is freed, so the overhead
is a ratio of two steady states on the same GPU, minutes apart at most:
``overhead = DDP step / plain step - 1`` (with the plain run's and DDP run's 95% intervals).
A second, ordinary ``kiln bench`` trial (its own process, no torchrun) gives the plain step
time across processes as a cross-check.

Writes bench_dist.json (rows + environment + the run directories) into --out and prints a
table. About 3 minutes on one H200 with `simple` (two inductor compiles per trial). Add
``--workloads simple,resnet50`` for resnet50 (needs torchvision; ~2 more minutes).

Scaling (several GPUs of one host): ``--nprocs 2`` (or ``2,4,8``) runs, instead of the overhead
pair, one DDP trial per process count; inside each, rank 0 times one plain process as the
reference, so the weak-scaling efficiency (one process's step time over the N-rank step time)
is a ratio measured minutes apart on the same machine. Writes bench_dist_scaling.json:

    PYTHONPATH=src python3 benchmarks/bench_dist.py --out benchmarks/results/dist/h200x2 \
        --workloads resnet50,bert-base --variants eager+bf16,inductor+bf16 --nprocs 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from torchkiln.api import bench
from torchkiln.variants import split_variants

SCHEMA = "kiln.bench_dist/1"


def _ms(summary: dict | None) -> str:
    if not summary:
        return "-"
    lo, hi = summary["ci95"]
    return f"{summary['median']:.2f} [{lo:.2f}, {hi:.2f}]"


def rows_for(workload: str, ddp: dict[str, Any], plain: dict[str, Any]) -> list[dict]:
    plain_by_variant = {t["variant"]: t for t in plain["trials"]}
    rows = []
    for t in ddp["trials"]:
        p = plain_by_variant.get(t["variant"], {})
        single = (t.get("single_process") or {}).get("steady_ms")
        ddp_ms = t.get("steady_ms") if t["status"] == "ok" else None
        row = {
            "workload": workload,
            "variant": t["variant"],
            "status": t["status"],
            "reason": t.get("reason"),
            "ddp1_ms": ddp_ms,
            "plain_same_process_ms": single,
            "plain_own_process_ms": p.get("steady_ms") if p.get("status") == "ok" else None,
            "overhead_same_process": None,
            "overhead_own_process": None,
            "exposed_comm_share": t.get("exposed_comm_share"),
            "first_call_s": {"ddp1": t.get("first_call_s"), "plain": p.get("first_call_s")},
            "memory": {"ddp1": t.get("memory"), "plain": p.get("memory")},
        }
        if ddp_ms and single:
            row["overhead_same_process"] = ddp_ms["median"] / single["median"] - 1
        if ddp_ms and row["plain_own_process_ms"]:
            row["overhead_own_process"] = (
                ddp_ms["median"] / row["plain_own_process_ms"]["median"] - 1
            )
        rows.append(row)
    return rows


def scaling_rows(
    workload: str, nproc: int, doc: dict[str, Any], own: dict[str, Any] | None = None
) -> list[dict]:
    """``own``: the same variants as ordinary trials, each in its own process: a second
    one-process reference, since the in-process one read slower than eager for compiled
    `simple` on the H200 (results/dist/h200/bench_dist.json, kiln 07be054)."""
    own_by_variant = {t["variant"]: t for t in (own or {}).get("trials", [])}
    rows = []
    for t in doc["trials"]:
        ok = t["status"] == "ok"
        single = (t.get("single_process") or {}).get("steady_ms")
        o = own_by_variant.get(t["variant"], {})
        own_ms = o.get("steady_ms") if o.get("status") == "ok" else None
        step_ms = t.get("steady_ms") if ok else None
        rows.append(
            {
                "workload": workload,
                "variant": t["variant"],
                "nproc": nproc,
                "status": t["status"],
                "reason": t.get("reason"),
                "step_ms": t.get("steady_ms") if ok else None,
                "one_process_ms": single,
                "throughput_samples_s": t.get("throughput_samples_s") if ok else None,
                "scaling_efficiency": t.get("scaling_efficiency") if ok else None,
                "scaling_efficiency_ci95": t.get("scaling_efficiency_ci95") if ok else None,
                "one_process_own_ms": own_ms,
                "scaling_efficiency_own_process": (
                    own_ms["median"] / step_ms["median"] if own_ms and step_ms else None
                ),
                "speedup_vs_eager_ddp": t.get("speedup") if ok else None,
                "exposed_comm_share": t.get("exposed_comm_share"),
                "losses_match": (t.get("losses") or {}).get("match"),
                "first_call_s": t.get("first_call_s"),
                "memory": t.get("memory"),
            }
        )
    return rows


def run_scaling(args: argparse.Namespace, out: Path, variants: list[str], overrides: dict) -> int:
    t0 = time.time()
    rows, runs, env = [], {}, None
    path = out / "bench_dist_scaling.json"
    common = dict(
        step="train",
        device=args.device,
        preset=args.preset,
        timeout_s=args.timeout,
        spec_overrides=overrides,
    )
    for workload in args.workloads.split(","):
        own = bench(workload, variants, out=out / f"{workload}-one-process", **common)
        runs[f"{workload}-one-process"] = own["run_dir"]
        for nproc in (int(n) for n in args.nprocs.split(",")):
            doc = bench(
                workload,
                variants,
                out=out / f"{workload}-{args.dist}{nproc}",
                dist=args.dist,
                nproc=nproc,
                **common,
            )
            env = env or doc.get("environment")
            runs[f"{workload}-{nproc}"] = doc["run_dir"]
            rows += scaling_rows(workload, nproc, doc, own)
            # Rewritten after every run so a stopped sweep keeps what it measured.
            path.write_text(
                json.dumps(
                    {
                        "schema": SCHEMA + "-scaling",
                        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                        "command": " ".join([sys.executable, *sys.argv]),
                        "dist": args.dist,
                        "wall_s": time.time() - t0,
                        "environment": env,
                        "rows": rows,
                        "runs": runs,
                    },
                    indent=2,
                    default=str,
                )
            )
    print(
        f"{'workload':<10} {'variant':<16} {'N':>2} {'step ms (N ranks)':<24} "
        f"{'1 process ms':<24} {'efficiency':>16} {'vs own proc':>11} {'samples/s':>10} "
        f"{'exposed comm':>12}"
    )
    for r in rows:
        eff, ci = r["scaling_efficiency"], r["scaling_efficiency_ci95"]
        eff_s = f"{100 * eff:.0f}% [{100 * ci[0]:.0f},{100 * ci[1]:.0f}]" if eff and ci else "-"
        comm = r["exposed_comm_share"]
        tput = r["throughput_samples_s"]
        own_eff = r["scaling_efficiency_own_process"]
        own_s = "-" if own_eff is None else f"{100 * own_eff:.0f}%"
        print(
            f"{r['workload']:<10} {r['variant']:<16} {r['nproc']:>2} {_ms(r['step_ms']):<24} "
            f"{_ms(r['one_process_ms']):<24} {eff_s:>16} "
            f"{own_s:>11} "
            f"{'-' if tput is None else f'{tput:.0f}':>10} "
            f"{'-' if comm is None else f'{100 * comm:.1f}%':>12}"
            + (f"  {r['status']}: {r['reason']}" if r["status"] != "ok" else "")
        )
    print(f"wrote {path} in {time.time() - t0:.0f} s")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/dist/h200")
    ap.add_argument("--workloads", default="simple")
    ap.add_argument("--variants", default="eager,inductor")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per trial")
    ap.add_argument("--nprocs", default=None, help="scaling sweep, e.g. 2 or 2,4,8 (see above)")
    ap.add_argument("--dist", default="ddp", choices=["ddp", "fsdp"], help="with --nprocs")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = split_variants(args.variants)
    overrides = {"reps": args.reps, "check_accuracy": False}
    if args.nprocs:
        return run_scaling(args, out, variants, overrides)
    t0 = time.time()
    rows, runs, env = [], {}, None
    for workload in args.workloads.split(","):
        common = dict(step="train", device=args.device, preset=args.preset, timeout_s=args.timeout)
        ddp = bench(
            workload,
            variants,
            out=out / f"{workload}-ddp1",
            spec_overrides=overrides,
            dist="ddp",
            nproc=1,
            **common,
        )
        plain = bench(
            workload, variants, out=out / f"{workload}-plain", spec_overrides=overrides, **common
        )
        env = env or ddp.get("environment") or plain.get("environment")
        runs[workload] = {"ddp1": ddp["run_dir"], "plain": plain["run_dir"]}
        rows += rows_for(workload, ddp, plain)
    doc = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([sys.executable, *sys.argv]),
        "wall_s": time.time() - t0,
        "environment": env,
        "rows": rows,
        "runs": runs,
    }
    (out / "bench_dist.json").write_text(json.dumps(doc, indent=2, default=str))
    print(
        f"{'workload':<10} {'variant':<12} {'DDP nproc=1 ms':<24} {'plain (same proc) ms':<24} "
        f"{'overhead':>9} {'plain (own proc) ms':<24} {'overhead':>9}"
    )
    for r in rows:
        same, own = r["overhead_same_process"], r["overhead_own_process"]
        print(
            f"{r['workload']:<10} {r['variant']:<12} {_ms(r['ddp1_ms']):<24} "
            f"{_ms(r['plain_same_process_ms']):<24} "
            f"{'-' if same is None else f'{100 * same:+.1f}%':>9} "
            f"{_ms(r['plain_own_process_ms']):<24} "
            f"{'-' if own is None else f'{100 * own:+.1f}%':>9}"
            + (f"  {r['status']}: {r['reason']}" if r["status"] != "ok" else "")
        )
    print(f"wrote {out / 'bench_dist.json'} in {doc['wall_s']:.0f} s")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
