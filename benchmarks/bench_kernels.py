"""kiln's Triton kernels: GB/s against eager, torch.compile, copy.

    PYTHONPATH=src python3 benchmarks/bench_kernels.py --out benchmarks/results/kernels/h200

For softmax, masked_softmax and bias_act_scale, forward and backward, fp32 and bf16, on 4096 x N
rows (N = 256 ... 32768 and 12672): GB/s from triton.testing.do_bench medians, with the bytes each
operation must read and write (formulas in src/torchkiln/kernels/_cases.py), against eager PyTorch
and torch.compile of the same expression, and a device-to-device copy measured in the same run.
Every implementation is checked against an fp32 reference before it is timed.

Writes bench_kernels.json (results + environment) and bench_kernels.png into --out, checks the
goals, and prints a short table last. Sized to finish within ~6 minutes on one H200: do_bench
reps are short, and torch.compile arms (one compile per shape) stop starting after --budget-s,
goal-relevant shapes first, so a slow compiler costs compile numbers, never kiln's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from torchkiln.kernels.bench import KERNELS, format_table, sweep  # noqa: E402

ROWS = 4096
COLS = [256, 512, 1024, 2048, 4096, 8192, 12672, 16384, 32768]
# The kernels' goals.
COPY_GOAL, COPY_GOAL_MIN_N = 0.90, 2048  # forward >= 90% of the copy ceiling for N >= 2048
COMPILE_GOAL, COMPILE_GOAL_MIN_N = 1.3, 4096  # >= 1.3x torch.compile for N >= 4096
SCHEMA = "kiln.bench_kernels/1"


def _gbps(result: dict, arm: str) -> float | None:
    return result["arms"].get(arm, {}).get("gbps")


def check_goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One verdict per (goal, kernel, direction, dtype): the worst ratio over the sizes it covers.

    A size whose numbers are missing (arm failed, wrong, or skipped for time) fails the goal: an
    unmeasured point is not a met one. For the torch.compile goal, sizes where the target is
    above the copy ceiling measured in the same run (`target x compile > copy`: no kernel moving
    the same bytes can reach it) are listed in `beyond_copy_n`; the verdict stays strict.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in doc["results"]:
        groups.setdefault((r["kernel"], r["direction"], r["dtype"]), []).append(r)
    verdicts = []
    for (kernel, direction, dtype), rs in groups.items():
        goals = [("copy", COPY_GOAL, COPY_GOAL_MIN_N)] if direction == "fwd" else []
        goals.append(("compile", COMPILE_GOAL, COMPILE_GOAL_MIN_N))
        for versus, target, min_n in goals:
            ratios, missing, launch_bound, beyond, device = {}, [], [], [], {}
            for r in rs:
                if r["cols"] < min_n:
                    continue
                kiln_arm = r["arms"].get("kiln") or {}
                if kiln_arm.get("launch_bound"):
                    launch_bound.append(r["cols"])
                copy_gbps = doc["copy"][r["copy"]].get("gbps")
                if versus == "copy" and kiln_arm.get("device_gbps") and copy_gbps:
                    device[r["cols"]] = kiln_arm["device_gbps"] / copy_gbps
                kiln = _gbps(r, "kiln")
                copy = doc["copy"][r["copy"]].get("gbps")
                other = copy if versus == "copy" else _gbps(r, versus)
                if kiln is None or other is None:
                    missing.append(r["cols"])
                else:
                    ratios[r["cols"]] = kiln / other
                    if versus != "copy" and copy is not None and target * other > copy:
                        beyond.append(r["cols"])
            worst_n = min(ratios, key=ratios.get) if ratios else None
            verdicts.append({
                "goal": f"kiln >= {target:g}x {versus} for N >= {min_n}",
                "versus": versus, "target": target,
                "kernel": kernel, "direction": direction, "dtype": dtype,
                "worst_ratio": ratios.get(worst_n), "worst_at_n": worst_n,
                "ratios": ratios, "missing_n": missing,
                # Sizes where kiln's do_bench time was its host launch path, not its kernel.
                "kiln_launch_bound_n": launch_bound,
                # Where the host took at least half the measured time (kernels.bench.
                # HOST_AFFECTED), the kernel alone: its device time with the launch hidden
                # (kernels.bench._device_time), against the copy ceiling. Not the verdict.
                "kiln_device_ratios": device,
                # Sizes where the target exceeds the copy ceiling (H200 at 51e19d0: 29 of 60 cases).
                "beyond_copy_n": beyond,
                "passed": bool(ratios) and not missing and min(ratios.values()) >= target,
            })  # fmt: skip
    return verdicts


def tally(verdicts: list[dict[str, Any]]) -> str:
    """The goals counted cell by cell (kernel, direction, dtype, N), as the notes and
    docs/kernels.md quote them. Against the copy: the cells at the target as measured, and as
    decided by their kernels (a host-affected cell, `kiln_device_ratios`, counts where its
    kernel alone reaches the target), and each cell that fails. Against torch.compile: met,
    target above the copy ceiling (`beyond_copy_n`: no kernel moving the same bytes reaches
    it), open (each named), unmeasured."""
    lines = []
    for goal in dict.fromkeys(v["goal"] for v in verdicts):
        vs = [v for v in verdicts if v["goal"] == goal]
        target = vs[0]["target"]
        cells = [(v, n, r) for v in vs for n, r in sorted(v["ratios"].items())]
        unmeasured = [f"{v['kernel']} {v['direction']} {v['dtype']} {n}" for v in vs
                      for n in v["missing_n"]]  # fmt: skip
        total = len(cells) + len(unmeasured)

        def cell(v: dict, n: int, r: float) -> str:
            return f"{v['kernel']} {v['direction']} {v['dtype']} {n} {r:.3f}x"

        if vs[0]["versus"] == "copy":
            below = [(v, n, r, v["kiln_device_ratios"].get(n)) for v, n, r in cells if r < target]
            decided = len(cells) - sum((alone or 0.0) < target for *_, alone in below)
            text = (f"{goal}: {len(cells) - len(below)} of {total} cells as measured, {decided} "
                    f"decided by their kernels")  # fmt: skip
            if below:
                text += "; below as measured: " + ", ".join(
                    cell(v, n, r) + (f" (kernel alone {alone:.3f}x)" if alone else "")
                    for v, n, r, alone in below
                )
        else:
            met = [c for c in cells if c[2] >= target]
            beyond = [c for c in cells if c[2] < target and c[1] in c[0]["beyond_copy_n"]]
            open_ = [c for c in cells if c[2] < target and c[1] not in c[0]["beyond_copy_n"]]
            text = (f"{goal}: {total} cells, met {len(met)}, target above the copy "
                    f"{len(beyond)}, open {len(open_)}")  # fmt: skip
            if open_:
                text += ": " + ", ".join(cell(*c) for c in open_)
        if unmeasured:
            text += f"; unmeasured {len(unmeasured)}: " + ", ".join(unmeasured)
        lines.append(text)
    return "\n".join(lines)


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on the GPU machine
    import matplotlib.pyplot as plt

    kernels = list(dict.fromkeys(r["kernel"] for r in doc["results"]))
    fig, axes = plt.subplots(len(kernels), 2, figsize=(12, 3.6 * len(kernels)), squeeze=False)
    colors = {"kiln": "tab:red", "eager": "tab:blue", "compile": "tab:green", "copy": "0.4"}
    styles = {"fp32": "-", "bf16": "--", "fp16": ":"}
    for row, kernel in enumerate(kernels):
        for col, direction in enumerate(("fwd", "bwd")):
            ax = axes[row][col]
            for dtype, style in styles.items():
                rs = [
                    r
                    for r in doc["results"]
                    if (r["kernel"], r["direction"], r["dtype"]) == (kernel, direction, dtype)
                ]
                if not rs:
                    continue
                ns = [r["cols"] for r in rs]
                for arm, color in colors.items():
                    ys = [
                        doc["copy"][r["copy"]].get("gbps") if arm == "copy" else _gbps(r, arm)
                        for r in rs
                    ]
                    ys = [float("nan") if y is None else y for y in ys]
                    ax.plot(ns, ys, style, color=color, marker="o", ms=3, label=f"{arm} {dtype}")
            ax.set_xscale("log", base=2)
            rows = next(r["rows"] for r in doc["results"] if r["kernel"] == kernel)
            ax.set_title(f"{kernel} {direction}, {rows} rows")
            ax.set_xlabel("N (row length)")
            ax.set_ylabel("GB/s")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
    gpu = (doc["environment"].get("gpu") or {}).get("name", "?")
    fig.suptitle(f"kiln kernels vs eager, torch.compile and copy on {gpu}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _ns(ns: list[int]) -> str:
    return ", ".join(str(n) for n in sorted(ns))


def summary(doc: dict[str, Any]) -> str:
    """The short table printed last: GB/s at N = 12672 (the reference size, else the
    largest measured) and each goal's verdict with its worst ratio."""
    verdicts = {(v["kernel"], v["direction"], v["dtype"], v["goal"]): v for v in doc["goals"]}
    sizes = {r["cols"] for r in doc["results"]}
    n_shown = 12672 if 12672 in sizes else max(sizes)
    head = ["kernel", "dir", "dtype", f"kiln@{n_shown}", "eager", "compile", "copy", "goals"]
    lines = [head]
    for r in doc["results"]:
        if r["cols"] != n_shown:
            continue
        key = (r["kernel"], r["direction"], r["dtype"])
        parts = []
        for (k, d, t, goal), v in verdicts.items():
            if (k, d, t) == key:
                # Three decimals: at two, 0.899 printed as a failing "0.90x".
                worst = (
                    "n/a" if v["worst_ratio"] is None
                    else f"{v['worst_ratio']:.3f}x at N = {v['worst_at_n']}"
                )  # fmt: skip
                tag = "PASS" if v["passed"] else "FAIL"
                beyond = v.get("beyond_copy_n") or []
                note = f"; above the copy ceiling at N = {_ns(beyond)}" if beyond else ""
                device = v.get("kiln_device_ratios") or {}
                if device:
                    n_dev = min(device, key=device.get)
                    note += (f"; host-affected sizes, the kernel alone: worst {device[n_dev]:.3f}x"
                             f" at N = {n_dev}")  # fmt: skip
                parts.append(f"{tag} {goal.split(' for ')[0]} (worst {worst}{note})")
        cells = [_gbps(r, a) for a in ("kiln", "eager", "compile")]
        cells.append(doc["copy"][r["copy"]].get("gbps"))
        lines.append([*key, *("-" if c is None else f"{c:.0f}" for c in cells), "; ".join(parts)])
    widths = [max(len(row[i]) for row in lines) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in lines
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="folder for bench_kernels.json and .png")
    parser.add_argument("--judge", metavar="JSON",
                        help="no measuring: judge a saved bench_kernels.json against the goals "
                        "as this script now does, and print the summary")  # fmt: skip
    parser.add_argument("--kernel", nargs="+", choices=KERNELS, default=list(KERNELS))
    parser.add_argument("--dtype", nargs="+", choices=["fp32", "bf16", "fp16"],
                        default=["fp32", "bf16"])  # fmt: skip
    parser.add_argument("--cols", nargs="+", type=int, default=COLS)
    parser.add_argument("--warmup-ms", type=float, default=5.0)
    parser.add_argument("--rep-ms", type=float, default=25.0)
    parser.add_argument("--budget-s", type=float, default=240.0,
                        help="start no torch.compile arm after this many seconds")  # fmt: skip
    args = parser.parse_args(argv)
    if args.judge:
        saved = json.loads(Path(args.judge).read_text())
        saved["goals"] = check_goals(saved)
        print(summary(saved))
        print(tally(saved["goals"]))
        return 0
    if not args.out:
        parser.error("--out is required unless --judge is given")

    import torch

    if not torch.cuda.is_available():
        print("bench_kernels.py measures GPU bandwidth; no CUDA device here.", file=sys.stderr)
        return 2
    from torchkiln.measure.environment import collect

    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def log(line: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {line}", file=sys.stderr, flush=True)

    doc = sweep(args.kernel, ("fwd", "bwd"), args.dtype, ROWS, args.cols,
                warmup_ms=args.warmup_ms, rep_ms=args.rep_ms,
                compile_deadline=start + args.budget_s, log=log)  # fmt: skip
    doc = {
        "schema": SCHEMA,
        "environment": collect("cuda"),
        "config": {"rows": ROWS, "cols": args.cols, "dtypes": args.dtype,
                   "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms,
                   "timer": "triton.testing.do_bench median (L2 flushed between runs)",
                   "compile": "torch.compile(fullgraph=True, dynamic=False), fresh per shape"},
        **doc,
    }  # fmt: skip
    doc["goals"] = check_goals(doc)
    doc["elapsed_s"] = time.monotonic() - start
    (out / "bench_kernels.json").write_text(json.dumps(doc, indent=2) + "\n")
    try:
        plot(doc, out / "bench_kernels.png")
    except ImportError as exc:
        log(f"no plot: {exc}")
    print(format_table(doc))
    print(f"\nwrote {out / 'bench_kernels.json'} and .png in {doc['elapsed_s']:.0f} s\n")
    print(summary(doc))
    print(tally(doc["goals"]))
    wrong = [
        f"{r['kernel']} {r['direction']} {r['dtype']} N={r['cols']}: {r['arms']['kiln']['status']}"
        for r in doc["results"]
        if r["arms"]["kiln"].get("status") != "ok"
    ]
    for line in wrong:
        print(f"kiln arm not ok: {line}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
