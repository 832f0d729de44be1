"""Run one trial in a fresh process with a timeout; never let it take the caller down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchkiln.runner.launch import compile_cache, spawn, warm
from torchkiln.runner.launch.autotune_log import autotune_rounds, describe
from torchkiln.runner.launch.compile_cache import CompileCache
from torchkiln.runner.launch.compile_cache import prepare as prepare_cache
from torchkiln.runner.launch.host_lock import (
    COMPILE_PHASES,
    HOST_LOCK_ENV,
    HOST_TURNS_ENV,
    WAITING_SUFFIX,
    every_compile_pauses,
    host_turns,
    trials_wait_for_compiles,
)
from torchkiln.runner.launch.orphan import TrialsStopped, launcher_env, stopping
from torchkiln.runner.protocol.trial import TrialSpec, base_result
from torchkiln.runner.protocol.worker import LAUNCHED_ENV, partial_path

STDERR_TAIL_CHARS = 4000


def tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    if not path.exists():
        return ""
    data = path.read_bytes()[-chars:]
    return data.decode("utf-8", errors="replace")


# A trial that has written its whole result has nothing left to do, and its exit is not waited
# for: from the written result to the reaped exit (CUDA graphs and the CUDA context freed,
# Inductor's compile workers ended) took 1.2-1.6 s a trial on an H100 host, GPT-2 trials of a
# tune (process_wall_s less wall_s, benchmarks/results/tune_speed/h100), while the tune waited.
# The group is ended at once and reaped in the background.


# A compiling trial whose wall limit (the search's share of the budget) is this near is stopped
# when trials wait for their timed turn behind compiles: all of them would otherwise be stopped
# at that limit with their compiles spent and nothing measured. They need their reps, one trial
# at a time, and their checks: a GPT-2 small trial's reps took 3.2-4.2 s and its checks about
# 1 s on an H100 host (kiln 163c5d8, tune_speed/h100), so 30 s serves about six of them. In one
# such tune on an H100 a max-autotune compile was still running 315 s into the search and six
# compiled trials behind it were stopped with it (tune_speed/h100/nice10).
BLOCKER_MARGIN_S = 30.0


def blocked_waiters(lock: str) -> bool:
    """Trials wait for their timed turn behind a compile that does not pause for them: those
    behind compiles that all pause (compile_pause.py) time their reps at the next pause point,
    so stopping a compile early would buy them nothing."""
    return trials_wait_for_compiles(lock) and not every_compile_pauses(lock)


BLOCKER_NOTE = (
    "stopped {margin:.0f} s before the search's share of the budget ended, while trials that "
    "had compiled waited for their timed turn behind its compile, so that they could take it"
)


@dataclass
class Spawned:
    """What one worker process left: its result (None if it wrote none), exit code, last phase,
    whether a limit stopped it and which ("own": its time limit, host waits not counted; "wall":
    the hard one), and the seconds it reported waiting for its turn on the host."""

    result: dict[str, Any] | None
    code: int | None
    phase: str
    stopped_by: str | None
    host_wait_s: float
    start: warm.Start = warm.Start("cold")
    lost: str | None = None  # why a warm trial's exit code is not its own (its server died)
    for_waiters: bool = False  # stopped early, its compile holding compiled trials' reps back
    # Seconds per phase as polled from here (its waits for the host as `host_wait`): a stopped
    # or crashed worker's own phase record dies with it.
    phase_seen_s: dict[str, float] = field(default_factory=dict)


def _spawn(
    mode: str,
    spec: TrialSpec,
    trial_dir: Path,
    timeout_s: float,
    env: dict[str, str],
    on_phase: Callable[[str], None] | None,
    wall_s: float | None = None,
) -> Spawned:
    """Runs the worker until it exits or a limit passes: `timeout_s` of its own time (its clock
    stops while it reports waiting for the host: host_lock.WAITING_SUFFIX) and, if given,
    `wall_s` of wall time, whatever it waited for (BLOCKER_MARGIN_S less while it compiles
    and trials on its host lock wait for their timed turn)."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    spec_path = trial_dir / f"{mode}-spec.json"
    result_path = trial_dir / f"{mode}-result.json"
    phase_path = trial_dir / f"{mode}-phase.txt"
    for p in (result_path, phase_path, partial_path(result_path)):
        p.unlink(missing_ok=True)
    spec_path.write_text(spec.to_json())
    argv = [mode, str(spec_path), str(result_path), str(phase_path)]
    env = {**env, LAUNCHED_ENV: repr(time.time())}  # the worker's start_s counts from here
    with (
        open(trial_dir / f"{mode}-stdout.txt", "wb") as out,
        open(trial_dir / f"{mode}-stderr.txt", "wb") as err,
    ):
        proc, how = warm.start_worker(argv, env=env, stdout=out, stderr=err)
        # Ctrl-C, a stop (orphan.stop_trials) or an error here: the trial is in its own
        # session, out of the signal's reach, and must not go on running on the device.
        with spawn.ended_on_error(proc):
            lock = env.get(HOST_LOCK_ENV)
            waiters = None if lock is None else (lambda: blocked_waiters(lock))
            seen: dict[str, float] = {}
            *state, for_waiters = _watch(
                proc, timeout_s, wall_s, phase_path, result_path, on_phase, waiters, seen
            )
    done = _after_exit(proc, *state, phase_path, result_path)
    done.start, done.lost, done.phase_seen_s = how, getattr(proc, "lost", None), seen
    done.for_waiters = for_waiters and done.stopped_by == "wall"
    return done


def _watch(
    proc: subprocess.Popen | warm.WarmProcess,
    timeout_s: float,
    wall_s: float | None,
    phase_path: Path,
    result_path: Path,
    on_phase: Callable[[str], None] | None,
    waiters: Callable[[], bool] | None = None,
    seen: dict[str, float] | None = None,
) -> tuple[str, float, str | None, bool]:
    """Polls the worker until it exits, has written its result, or a limit passes: its last
    phase, the seconds it waited for the host, which limit stopped it (None: none), and
    whether the wall limit came BLOCKER_MARGIN_S early because it compiled while ``waiters()``
    said trials waited for their timed turn. ``seen`` gets the seconds polled in each phase."""
    seen = {} if seen is None else seen
    start = last_poll = time.monotonic()
    hard = None if wall_s is None else start + wall_s
    last_phase, waited, stopped_by, for_waiters = "", 0.0, None, False
    while True:
        try:
            proc.wait(timeout=0.25)
            break
        except subprocess.TimeoutExpired:
            pass
        if stopping():
            raise TrialsStopped("the run was interrupted")
        now = time.monotonic()
        key = "host_wait" if last_phase.endswith(WAITING_SUFFIX) else (last_phase or "start")
        seen[key] = seen.get(key, 0.0) + (now - last_poll)
        waited, last_poll = seen.get("host_wait", 0.0), now
        if phase_path.exists():
            phase = phase_path.read_text().strip()
            if phase and phase != last_phase:
                last_phase = phase
                if on_phase:
                    on_phase(phase)
        if result_path.exists():  # written whole (os.replace): only the exit is left
            break
        if now > start + timeout_s + waited:
            stopped_by = "own"
        elif hard is not None and now > hard:
            stopped_by = "wall"
        elif (
            hard is not None
            and waiters is not None
            and now > hard - BLOCKER_MARGIN_S
            and last_phase in COMPILE_PHASES
            and waiters()
        ):
            stopped_by, for_waiters = "wall", True
        if stopped_by:
            # Inductor compiles in worker subprocesses: the whole group, politely first.
            spawn.end_group(proc)
            break
    return last_phase, waited, stopped_by, for_waiters


def _after_exit(
    proc: subprocess.Popen | warm.WarmProcess,
    last_phase: str,
    waited: float,
    stopped_by: str | None,
    phase_path: Path,
    result_path: Path,
) -> Spawned:
    if stopped_by is None:
        # The trial itself is done; compile workers it left behind must not outlive it.
        spawn.kill_group(proc)
        if result_path.exists():
            threading.Thread(target=proc.wait, name="kiln-reap", daemon=True).start()
        else:
            proc.wait()  # its exit code says how it ended
    phase = phase_path.read_text().strip() if phase_path.exists() else last_phase
    result = None
    if result_path.exists():
        # A result written whole before the stop landed is the trial's: it had finished.
        result, stopped_by = json.loads(result_path.read_text()), None
        # Whole results make the partial one redundant (it is read only after a timeout/crash).
        partial_path(result_path).unlink(missing_ok=True)
    return Spawned(result, proc.returncode, phase or "start", stopped_by, waited)


def trial_env(trial_dir: Path, cache_dir: str | None) -> tuple[dict[str, str], CompileCache]:
    """Compile caches are explicit: a fresh, empty one per trial (cold compile), or the one
    given (compile_cache.py); the caller removes a fresh one when the trial ends."""
    env = launcher_env(dict(os.environ))  # the trial ends itself if this process dies
    env["PYTHONUNBUFFERED"] = "1"
    cache = prepare_cache(trial_dir, cache_dir)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache.given / "inductor")
    env["TRITON_CACHE_DIR"] = str(cache.given / "triton")
    return env, cache


def run_trial(
    spec: TrialSpec,
    trial_dir: Path,
    *,
    timeout_s: float,
    cache_dir: str | None = None,
    on_phase: Callable[[str], None] | None = None,
    gpu: int | None = None,
    host_lock: str | None = None,
    wall_s: float | None = None,
    keep_cache: bool = False,
    lend_caches: dict[str, Path] | None = None,
) -> dict[str, Any]:
    """``keep_cache`` leaves a fresh compile cache in the trial directory when the trial ends
    (its caller removes it), for ``lend_caches`` of a later trial: trial id -> a kept cache,
    copied into that trial's fresh cache before it starts (compile_cache.lend).
    ``gpu`` pins the trial to one device (CUDA_VISIBLE_DEVICES), for one trial per GPU;
    ``host_lock`` is the pool's lock file, on which the trial takes turns with the others
    (host_lock.py). ``timeout_s`` is the trial's own time, not counting its waits for the host;
    ``wall_s``, if given, a limit on its wall time that counts them. A stopped trial's result
    has ``stopped_by``: "own" or "wall"."""
    env, cache = trial_env(trial_dir, cache_dir)
    lent = compile_cache.lend(cache, lend_caches) if lend_caches and cache.fresh else None
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    env.pop(HOST_LOCK_ENV, None)  # only the pool's own trials take turns, not a nested run's
    env.pop(HOST_TURNS_ENV, None)
    host_lock = host_lock or host_turns()  # several kiln processes on this host take turns
    if host_lock:
        env[HOST_LOCK_ENV] = host_lock
    t0 = time.perf_counter()
    try:
        run = _spawn("trial", spec, trial_dir, timeout_s, env, on_phase, wall_s)
    finally:
        cache.remove(keep=keep_cache)
    result, code, phase = run.result, run.code, run.phase
    stderr = tail(trial_dir / "trial-stderr.txt")
    rounds = autotune_rounds(trial_dir / "trial-stderr.txt")
    if run.stopped_by:
        after = time.perf_counter() - t0
        phase = phase.removesuffix(WAITING_SUFFIX)
        why = f"no result after {after:.0f} s (during {phase}"
        if run.host_wait_s >= 1.0:
            why += f"; {run.host_wait_s:.0f} s of it waiting for the host"
            why += ", which its own limit does not count" if run.stopped_by == "own" else ""
        why += ")"
        if rounds:
            why += f"; by then {describe(rounds)}"
        if run.for_waiters:
            why += "; " + BLOCKER_NOTE.format(margin=BLOCKER_MARGIN_S)
        result = _kept_measurement(trial_dir, _failure(spec, "timeout", why))
        result["stopped_by"] = run.stopped_by
        if run.for_waiters:
            result["stopped_for_waiters"] = True
    elif result is None:
        if code is not None and code < 0:
            why = f"killed by {signal.Signals(-code).name} during {phase}"
            if -code == signal.SIGKILL:
                why += " (possibly the host's out-of-memory killer)"
        else:
            why = f"exited with code {code} during {phase} without writing a result"
        if run.lost:
            why = f"{run.lost}, during {phase}"
        result = _kept_measurement(trial_dir, _failure(spec, "crashed", why))
    if rounds:
        result["autotune"] = rounds
    result["phase"] = result.get("phase") or phase
    if not result.get("phase_s") and run.phase_seen_s:
        # Where a trial that left no phase record spent its time, for the tune's account.
        result["phase_s_seen"] = {k: round(v, 3) for k, v in run.phase_seen_s.items()}
    result["start"] = run.start.how
    if run.start.reason:
        result["start_reason"] = run.start.reason
    result["compile_cache"] = cache_dir or "fresh per trial"
    if lent is not None:
        result["compile_cache_lent"] = lent
        if lent["lent_from"]:
            whose = ", ".join(lent["lent_from"])
            result.setdefault("notes", []).append(
                f"its compile cache started with the caches of trials {whose} (their compiled "
                "code is loaded, not compiled again): its first call is no cold compile; theirs are"
            )
    if cache.given != cache.real:
        result["compile_cache_path"] = {"real": str(cache.real), "given": str(cache.given)}
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
    env = launcher_env(dict(os.environ, PYTHONUNBUFFERED="1"))
    run = _spawn("preflight", spec, work_dir, timeout_s, env, None)
    result, code = run.result, run.code
    if run.stopped_by:
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
