"""Run one trial in a fresh process with a timeout; never let it take the caller down."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchkiln.runner.autotune_log import autotune_rounds, describe
from torchkiln.runner.host_lock import HOST_LOCK_ENV
from torchkiln.runner.trial import TrialSpec, base_result
from torchkiln.runner.worker import partial_path

STDERR_TAIL_CHARS = 4000


def tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    if not path.exists():
        return ""
    data = path.read_bytes()[-chars:]
    return data.decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    """Inductor compiles in worker subprocesses: end the whole process group, politely first."""
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _spawn(
    mode: str,
    spec: TrialSpec,
    trial_dir: Path,
    timeout_s: float,
    env: dict[str, str],
    on_phase: Callable[[str], None] | None,
) -> tuple[dict[str, Any] | None, int | None, str, bool]:
    trial_dir.mkdir(parents=True, exist_ok=True)
    spec_path = trial_dir / f"{mode}-spec.json"
    result_path = trial_dir / f"{mode}-result.json"
    phase_path = trial_dir / f"{mode}-phase.txt"
    for p in (result_path, phase_path, partial_path(result_path)):
        p.unlink(missing_ok=True)
    spec_path.write_text(spec.to_json())
    cmd = [sys.executable, "-m", "torchkiln.runner.worker", mode]
    cmd += [str(spec_path), str(result_path), str(phase_path)]
    with (
        open(trial_dir / f"{mode}-stdout.txt", "wb") as out,
        open(trial_dir / f"{mode}-stderr.txt", "wb") as err,
    ):
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        last_phase = ""
        timed_out = False
        while True:
            try:
                proc.wait(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                pass
            if phase_path.exists():
                phase = phase_path.read_text().strip()
                if phase and phase != last_phase:
                    last_phase = phase
                    if on_phase:
                        on_phase(phase)
            if time.monotonic() > deadline:
                timed_out = True
                _kill_group(proc)
                break
    if not timed_out:
        # The trial itself is done; compile workers it left behind must not outlive it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    phase = phase_path.read_text().strip() if phase_path.exists() else last_phase
    result = None
    if result_path.exists():
        result = json.loads(result_path.read_text())
        # Whole results make the partial one redundant (it is read only after a timeout/crash).
        partial_path(result_path).unlink(missing_ok=True)
    return result, proc.returncode, phase or "start", timed_out


def trial_env(trial_dir: Path, cache_dir: str | None) -> tuple[dict[str, str], Path | None]:
    """Compile caches are explicit: a fresh one per trial (cold compile), or the one given."""
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    fresh = None
    if cache_dir:
        root = Path(cache_dir)
    else:
        fresh = root = trial_dir / "compile-cache"
    env["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    env["TRITON_CACHE_DIR"] = str(root / "triton")
    return env, fresh


def run_trial(
    spec: TrialSpec,
    trial_dir: Path,
    *,
    timeout_s: float,
    cache_dir: str | None = None,
    on_phase: Callable[[str], None] | None = None,
    gpu: int | None = None,
    host_lock: str | None = None,
) -> dict[str, Any]:
    """``gpu`` pins the trial to one device (CUDA_VISIBLE_DEVICES), for one trial per GPU;
    ``host_lock`` is the pool's lock file, on which the trial takes turns with the others
    (host_lock.py)."""
    env, fresh_cache = trial_env(trial_dir, cache_dir)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    env.pop(HOST_LOCK_ENV, None)  # only the pool's own trials take turns, not a nested run's
    if host_lock:
        env[HOST_LOCK_ENV] = host_lock
    t0 = time.perf_counter()
    result, code, phase, timed_out = _spawn("trial", spec, trial_dir, timeout_s, env, on_phase)
    stderr = tail(trial_dir / "trial-stderr.txt")
    if fresh_cache is not None:
        shutil.rmtree(fresh_cache, ignore_errors=True)
    rounds = autotune_rounds(trial_dir / "trial-stderr.txt")
    if timed_out:
        why = f"no result after {timeout_s:.0f} s (during {phase})"
        if rounds:
            why += f"; by then {describe(rounds)}"
        result = _kept_measurement(trial_dir, _failure(spec, "timeout", why))
    elif result is None:
        if code is not None and code < 0:
            why = f"killed by {signal.Signals(-code).name} during {phase}"
            if -code == signal.SIGKILL:
                why += " (possibly the host's out-of-memory killer)"
        else:
            why = f"exited with code {code} during {phase} without writing a result"
        result = _kept_measurement(trial_dir, _failure(spec, "crashed", why))
    if rounds:
        result["autotune"] = rounds
    result["phase"] = result.get("phase") or phase
    result["compile_cache"] = cache_dir or "fresh per trial"
    if gpu is not None:
        result["gpu_index"] = gpu
    result["process_wall_s"] = time.perf_counter() - t0
    if result["status"] != "ok" or stderr:
        result["stderr_tail"] = stderr
    return result


def _failure(spec: TrialSpec, status: str, reason: str) -> dict[str, Any]:
    return base_result(spec, status, reason)


def _kept_measurement(trial_dir: Path, failure: dict[str, Any]) -> dict[str, Any]:
    """A trial that timed out or crashed after its timing keeps the step times it measured
    (what the worker saved before its correctness check), with the failure's status and reason:
    never a pick (only `ok` trials are), but a comparison can still read it."""
    path = partial_path(trial_dir / "trial-result.json")
    if not path.exists():
        return failure
    try:
        measured = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # a file cut mid-write by the kill
        failure.setdefault("notes", []).append(f"its partial measurement was unreadable: {exc}")
        return failure
    notes = [*measured.get("notes", []), *failure.get("notes", [])]
    notes.append(
        f"{failure['status']} after its step times were measured: they are kept; its "
        "correctness was not checked"
    )
    return {
        **measured,
        "status": failure["status"],
        "reason": failure["reason"],
        "notes": notes,
        "correctness": None,
        "measured_before_failure": True,
    }


def preflight(spec: TrialSpec, work_dir: Path, timeout_s: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    result, code, phase, timed_out = _spawn("preflight", spec, work_dir, timeout_s, env, None)
    if timed_out:
        return {
            "ok": False,
            "kind": "timeout",
            "message": f"loading the workload took over {timeout_s:.0f} s",
        }
    if result is None:
        return {
            "ok": False,
            "kind": "crashed",
            "message": f"loading the workload crashed (exit {code}): "
            + tail(work_dir / "preflight-stderr.txt", 1500),
        }
    return result
