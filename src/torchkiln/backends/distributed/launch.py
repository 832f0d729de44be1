"""Run one distributed training trial through torchrun and merge its ranks into one result.

``torch.distributed.run`` starts ``nproc`` copies of ``torchkiln.backends.distributed.worker``; each
rank writes ``rank<R>.json`` (its step times, memory, losses, communication share, or its
error). torchrun ends the other ranks as soon as one fails; if ranks hang, the trial's timeout
kills the whole process group. Either way the result says which rank failed and why."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from torchkiln.runner.launch import spawn
from torchkiln.runner.launch.trial_process import _failure, tail, trial_env
from torchkiln.runner.protocol.trial import TrialSpec


def torchrun_command(spec_path: Path, rank_dir: Path, nproc: int) -> list[str]:
    # --standalone picks a free rendezvous port, so trials running side by side cannot collide;
    # no restarts: a failed rank is a result, not something to retry behind the user's back.
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "--monitor-interval=0.5",
        "-m",
        "torchkiln.backends.distributed.worker",
        str(spec_path),
        str(rank_dir),
    ]


def run_dist_trial(
    spec: TrialSpec,
    trial_dir: Path,
    *,
    nproc: int,
    strategy: str,
    timeout_s: float,
    cache_dir: str | None = None,
    gpu: int | None = None,
    single_process: bool = True,
) -> dict[str, Any]:
    """``gpu`` pins a one-rank trial to one device (the pool executor); wider trials use every
    visible GPU, one per rank. ``single_process`` also times the variant unwrapped in one
    process on rank 0 (the scaling reference; one more compile)."""
    trial_dir = Path(trial_dir)
    rank_dir = trial_dir / "ranks"
    shutil.rmtree(rank_dir, ignore_errors=True)
    rank_dir.mkdir(parents=True)
    dist_info = {
        "nproc": nproc,
        "strategy": strategy,
        "timeout_s": timeout_s,
        "single_process": single_process,
    }
    spec = replace(spec, extra={**spec.extra, "dist": dist_info})
    spec_path = trial_dir / "dist-spec.json"
    spec_path.write_text(spec.to_json())
    env, cache = trial_env(trial_dir, cache_dir)
    if gpu is not None and nproc == 1:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    if spec.device == "cpu" and "OMP_NUM_THREADS" not in env:
        # torchrun would set 1; ranks share the cores instead (the CPU reference uses them all).
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    t0 = time.perf_counter()
    with (
        open(trial_dir / "torchrun-stdout.txt", "wb") as out,
        open(trial_dir / "torchrun-stderr.txt", "wb") as err,
    ):
        proc = spawn.start(
            torchrun_command(spec_path, rank_dir, nproc), env=env, stdout=out, stderr=err
        )
        # A Ctrl-C or a stop: torchrun's session is out of its reach.
        with spawn.ended_on_error(proc):
            timed_out = not spawn.wait_unless_stopped(proc, timeout_s)
        if timed_out:
            spawn.end_group(proc)
    if not timed_out:
        spawn.kill_group(proc)  # compile workers of any rank must not outlive the trial
    cache.remove()
    result = merge_ranks(
        spec,
        rank_dir,
        nproc,
        proc.returncode,
        timed_out,
        timeout_s,
        root_cause(tail(trial_dir / "torchrun-stderr.txt", 20000)),
    )
    result["dist"] = {**dist_info, **result.get("dist", {})}
    result["compile_cache"] = cache_dir or "fresh per trial"
    result["process_wall_s"] = time.perf_counter() - t0
    if result["status"] != "ok":
        result["stderr_tail"] = tail(trial_dir / "torchrun-stderr.txt")
    return result


_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)


def root_cause(torchrun_stderr: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first failure torchrun observed, from its summary."""
    m = _ROOT_CAUSE.search(torchrun_stderr)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _read_ranks(rank_dir: Path, nproc: int) -> tuple[dict[int, dict], dict[int, str]]:
    ranks, phases = {}, {}
    for r in range(nproc):
        path = rank_dir / f"rank{r}.json"
        if path.exists():
            ranks[r] = json.loads(path.read_text())
        phase = rank_dir / f"rank{r}-phase.txt"
        phases[r] = phase.read_text().strip() if phase.exists() else "start"
    return ranks, phases


def merge_ranks(
    spec: TrialSpec,
    rank_dir: Path,
    nproc: int,
    code: int | None,
    timed_out: bool,
    timeout_s: float,
    cause: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """One trial result from the ranks' files: rank 0's figures, every rank's own, and the
    failing rank's status and error. ``cause`` is torchrun's root cause (rank, exit code):
    a rank killed by a signal writes no file, and its peers' errors are only consequences."""
    ranks, phases = _read_ranks(rank_dir, nproc)
    where = ", ".join(f"rank {r}: {p}" for r, p in phases.items())
    failed = sorted(r for r, d in ranks.items() if d.get("status") != "ok")
    if cause is not None and cause[0] not in ranks and not timed_out:
        rank, code = cause
        result = _failure(
            spec,
            "crashed",
            f"rank {rank}: {_exit_text(code)} during {phases.get(rank, 'start')} "
            f"without writing a result",
        )
        result["failed_rank"] = rank
        result["phase"] = phases.get(rank, "start")
    elif failed:
        # The first rank to fail is the cause; ranks that failed later were waiting on it.
        first = min(failed, key=lambda r: ranks[r].get("failed_at", float("inf")))
        bad = ranks[first]
        result = _failure(spec, bad["status"], f"rank {first}: {bad['reason']}")
        result["failed_rank"] = first
        result["traceback"] = bad.get("traceback")
        result["phase"] = bad.get("phase")
    elif timed_out:
        result = _failure(spec, "timeout", f"no result after {timeout_s:.0f} s ({where})")
        result["phase"] = phases.get(0, "start")
    elif len(ranks) < nproc:
        missing = [r for r in range(nproc) if r not in ranks]
        how = f"torchrun {_exit_text(code)}" if code is not None else "torchrun did not end"
        result = _failure(spec, "crashed", f"{how}; ranks {missing} wrote no result ({where})")
        result["phase"] = phases.get(missing[0] if missing else 0, "start")
    else:
        result = dict(ranks[0].get("trial") or {})
        result.update({k: v for k, v in _failure(spec, "ok", "").items() if k not in result})
        result["status"], result["reason"] = "ok", None
        if code != 0:
            result["notes"] = [
                *result.get("notes", []),
                f"torchrun {_exit_text(code)} after "
                "every rank wrote its result (teardown); the figures stand",
            ]
        losses = result.get("losses") or {}
        if losses:
            result["correctness"] = {
                "passed": bool(losses["match"]),
                "worst_error_over_threshold": losses["max_rel_diff"] / losses["rtol"],
                "note": "the first losses of every rank agree (losses.vs_single_process "
                "compares one plain process too, for information)",
            }
        if losses and not losses.get("match"):
            result["status"] = "accuracy_fail"
            result["reason"] = (
                f"losses differ across ranks by {losses['max_rel_diff']:.3g} "
                f"(relative; allowed {losses['rtol']:g})"
            )
    result["ranks"] = [
        ranks.get(r, {"rank": r, "status": "no result", "phase": phases[r]}) for r in range(nproc)
    ]
    for r in result["ranks"]:
        r.pop("trial", None)
    return result


def dist_summary_lines(doc: dict[str, Any]) -> list[str]:
    """For `kiln bench --dist`: the figures the bench table has no columns for."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f}%"

    d = doc["dist"]
    lines = [
        f"\n{d['strategy']} on {d['nproc']} rank(s): per-rank median step ms, throughput, "
        "scaling efficiency vs one process, exposed communication"
    ]
    for t in doc["trials"]:
        per_rank = " ".join(
            f"{r['steady_ms']['median']:.2f}" if r.get("steady_ms") else r.get("status", "?")
            for r in t.get("ranks", [])
        )
        tput = t.get("throughput_samples_s")
        lines.append(
            f"  {t['variant']:<40} {t['status']:<10} ranks [{per_rank}]  "
            f"{'-' if tput is None else f'{tput:.1f}'} samples/s  "
            f"eff {pct(t.get('scaling_efficiency'))}  exposed comm "
            f"{pct(t.get('exposed_comm_share'))}" + (f"  {t['reason']}" if t.get("reason") else "")
        )
    return lines
