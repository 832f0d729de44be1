"""Trial start and setup time, cold (a fresh ``python`` per trial) against warm (forked from
the warm-start server, runner/launch/warm.py), on the CPU.

Runs the same eager trial of the `simple` workload ``--trials`` times each way, alternating,
and reports each trial's ``start_s`` (launch to ready to build its arms) and its whole process
wall time. The warm server's own start (one import of torch per tune) is reported apart: the
first warm trial waits for it. Writes ``--out`` (JSON) and prints a table last.

    PYTHONPATH=src python3 benchmarks/trial_start.py \
        --out benchmarks/results/trial_start/cpu-simple.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from torchkiln.measure.environment import collect
from torchkiln.runner.launch import warm
from torchkiln.runner.launch.trial_process import run_trial
from torchkiln.runner.protocol.trial import TrialSpec

FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 1}


def _summary(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
        "samples": values,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the JSON file to write")
    ap.add_argument("--trials", type=int, default=5, help="trials each way (default 5)")
    ap.add_argument("--workload", default="simple")
    args = ap.parse_args(argv)
    os.environ.pop(warm.WARM_ENV, None)
    spec = TrialSpec(workload=args.workload, variant="eager", device="cpu", preset="tiny", **FAST)
    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="kiln-trial-start-") as tmp, warm.scoped():
        # The server's start, apart from the trials: one import of torch, once per tune or bench.
        t0 = time.perf_counter()
        server = warm._active.get() if warm._active else None
        failure = server.ready() if server else "no scope"
        server_start_s = time.perf_counter() - t0
        if failure:
            raise SystemExit(f"the warm-start server did not start: {failure}")
        for i in range(args.trials):
            for how in ("cold", "warm"):
                if how == "cold":
                    os.environ[warm.WARM_ENV] = "0"
                else:
                    os.environ.pop(warm.WARM_ENV, None)
                r = run_trial(spec, Path(tmp) / f"{how}-{i}", timeout_s=300)
                if r["status"] != "ok" or r["start"] != how:
                    raise SystemExit(f"{how} trial {i}: {r['status']} {r.get('reason')}")
                runs[how].append({"start_s": r["start_s"], "process_wall_s": r["process_wall_s"]})
        os.environ.pop(warm.WARM_ENV, None)
    doc = {
        "schema": "torchkiln.bench_trial_start/1",
        "workload": args.workload,
        "device": "cpu",
        "trials_each": args.trials,
        "server_start_s": server_start_s,
        "cold": {k: _summary([r[k] for r in runs["cold"]]) for k in ("start_s", "process_wall_s")},
        "warm": {k: _summary([r[k] for r in runs["warm"]]) for k in ("start_s", "process_wall_s")},
        "environment": collect("cpu"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, default=str))
    print(f"warm-start server ready in {server_start_s:.2f} s (once per tune or bench)")
    print(f"{'':6} {'start_s (median)':>18} {'process wall_s (median)':>25}")
    for how in ("cold", "warm"):
        s, w = doc[how]["start_s"]["median"], doc[how]["process_wall_s"]["median"]
        print(f"{how:6} {s:18.2f} {w:25.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
