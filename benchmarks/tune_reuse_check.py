"""`kiln tune` stopped and started again in its default directory, on the GPU.

    PYTHONPATH=src python3 benchmarks/tune_reuse_check.py --out benchmarks/results/tune/h200

Every tune of one workload and step writes to one default directory (kiln-runs/tune-simple-infer
here), so a second tune there finds the first one's trials. Four runs of `kiln tune simple` in a
scratch directory, typed as a user would:

  A  --device cpu --preset tiny --budget 60s      a CPU tune
  B  --device cuda --budget 2m                    stopped with a Ctrl-C (SIGINT) while its first
                                                  search trial compiles
  C  the same command as B                        continues where B stopped
  D  the same command again                       goes on from C (a 2-minute budget does not
                                                  reach every candidate, so D may measure more)

What must hold (each a check in OUT/tune_reuse.json; the script exits 1 when one fails): A's
CPU trials are never taken for the GPU's (B measures its own eager baseline, saying why A's was
not reused); B exits 130 with its eager baseline saved, the trial it stopped unrecorded and no
trial process left running; C reuses exactly B's baseline and measures the rest, every trial
on cuda; D measures none of C's trials again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from torchkiln.measure.environment import collect  # noqa: E402

RUN_DIR = Path("kiln-runs") / "tune-simple-infer"  # `kiln tune simple`'s default --out
GPU_ARGS = ("--device", "cuda", "--budget", "2m")
CPU_ARGS = ("--device", "cpu", "--preset", "tiny", "--budget", "60s")


def trial_files(cwd: Path) -> dict[str, dict[str, Any]]:
    """Every trial result in the run directory, by id (each written as its trial ends)."""
    found = {}
    for path in sorted((cwd / RUN_DIR / "trials").glob("*/result.json")):
        found[path.parent.name] = json.loads(path.read_text())
    return found


def search_trial_compiling(cwd: Path, t0: float) -> str | None:
    """The id of a search trial of this run (not the eager baseline) in its first call."""
    for phase in (cwd / RUN_DIR / "trials").glob("*/trial-phase.txt"):
        trial = phase.parent
        fresh = phase.stat().st_mtime >= t0 and not trial.name.startswith("00-")
        if fresh and phase.read_text().startswith("first_call"):
            return trial.name
    return None


def trial_processes() -> list[str]:
    """Command lines of kiln trial processes still running (none may outlive a Ctrl-C)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while being read
            continue
        if "torchkiln.runner.protocol.worker" in args:
            found.append(args.strip())
    return found


def tune(cwd: Path, args: tuple[str, ...], interrupt: bool = False) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torchkiln.cli", "tune", "simple", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
    log = cwd / f"run-{time.monotonic_ns()}.log"
    t0, wall0 = time.time(), time.monotonic()
    interrupted_at, stopped, left_running = None, None, None
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if interrupt and interrupted_at is None:
                stopped = search_trial_compiling(cwd, t0)
                if stopped:
                    proc.send_signal(signal.SIGINT)
                    interrupted_at = time.monotonic() - wall0
            time.sleep(0.2)
    if interrupt:
        time.sleep(2.0)  # a trial ends itself within half a second of its launcher (orphan.py)
        left_running = trial_processes()
    text = log.read_text()
    doc_path = cwd / RUN_DIR / "results.json"
    doc = json.loads(doc_path.read_text()) if proc.returncode == 0 else None
    return {
        "argv": ["kiln", "tune", "simple", *args],
        "rc": proc.returncode,
        "wall_s": round(time.monotonic() - wall0, 1),
        "interrupted_at_s": None if interrupted_at is None else round(interrupted_at, 1),
        "stopped_trial": stopped,
        "trial_processes_after": left_running,
        "console_tail": text[-4000:],
        "doc": doc,
        "trials_on_disk": trial_files(cwd),
    }


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "id": t["id"],
            "variant": t["variant"],
            "status": t["status"],
            "device": t.get("device"),
            "reused": bool(t.get("reused")),
            "steady_ms": (t.get("steady_ms") or {}).get("median")
            if isinstance(t.get("steady_ms"), dict)
            else t.get("steady_ms"),
            "notes": [n for n in t.get("notes", []) if "reused" in n],
        }
        for t in doc["trials"] + doc.get("head_to_head_trials", [])
    ]


def judge(a: dict, b: dict, c: dict, d: dict) -> dict[str, bool]:
    b_done = {i: t for i, t in b["trials_on_disk"].items() if t.get("device") == "cuda"}
    c_rows, d_rows = rows(c["doc"] or {"trials": []}), rows(d["doc"] or {"trials": []})
    c_ids = {r["id"] for r in c_rows}
    c_reused = {r["id"] for r in c_rows if r["reused"]}
    b_notes = " ".join(n for t in b_done.values() for n in t.get("notes", []))
    return {
        "A (cpu) finished": a["rc"] == 0 and bool(a["trials_on_disk"]),
        "B stopped by the Ctrl-C with exit 130": b["rc"] == 130
        and b["interrupted_at_s"] is not None,
        # Its eager baseline, and any search trial that ended before the Ctrl-C.
        "B saved what it finished, on cuda": "00-eager" in b_done
        and b["stopped_trial"] not in b_done,
        "B says why A's baseline was not reused": "device 'cpu' -> 'cuda'" in b_notes,
        "B left the stopped trial unrecorded": bool(b["stopped_trial"])
        and b["stopped_trial"] not in b["trials_on_disk"],
        "B left no trial process running": b["trial_processes_after"] == [],
        "C finished": c["rc"] == 0,
        "C ran every trial on cuda": bool(c_rows) and all(r["device"] == "cuda" for r in c_rows),
        "C reused exactly what B finished": c_reused == set(b_done),
        "C measured the stopped trial": b["stopped_trial"] in c_ids - c_reused,
        "D finished": d["rc"] == 0,
        "D measured none of C's trials again": bool(d_rows)
        and all(r["reused"] for r in d_rows if r["id"] in c_ids),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kiln-reuse-") as scratch:
        cwd = Path(scratch)
        runs = {"A": tune(cwd, CPU_ARGS)}
        runs["B"] = tune(cwd, GPU_ARGS, interrupt=True)
        runs["C"] = tune(cwd, GPU_ARGS)
        runs["D"] = tune(cwd, GPU_ARGS)
        checks = judge(runs["A"], runs["B"], runs["C"], runs["D"])
        if runs["D"]["doc"]:
            (args.out / "results-D.json").write_text(json.dumps(runs["D"]["doc"], indent=2))
    summary = {
        "schema": "torchkiln.bench.tune_reuse/1",
        "environment": collect("cuda"),
        "checks": checks,
        "runs": {
            name: {
                **{k: v for k, v in r.items() if k not in ("doc", "trials_on_disk")},
                "trials": rows(r["doc"]) if r["doc"] else None,
                "on_disk": {
                    i: {"variant": t["variant"], "device": t.get("device"), "status": t["status"]}
                    for i, t in r["trials_on_disk"].items()
                },
                "pick": (r["doc"] or {}).get("selection", {}).get("best"),
            }
            for name, r in runs.items()
        },
    }
    (args.out / "tune_reuse.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"{'run':4} {'rc':>4} {'wall s':>7} {'trials':>6} {'reused':>6}  pick")
    for name, r in runs.items():
        t = rows(r["doc"]) if r["doc"] else []
        pick = (r["doc"] or {}).get("selection", {}).get("best")
        n_reused = sum(x["reused"] for x in t)
        print(f"{name:4} {r['rc']:>4} {r['wall_s']:>7.1f} {len(t):>6} {n_reused:>6}  {pick}")
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
