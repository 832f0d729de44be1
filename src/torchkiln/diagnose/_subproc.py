"""Run a kiln module in a fresh Python process with a timeout: a hang becomes a result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from torchkiln.runner.launch import spawn
from torchkiln.runner.launch.host_lock import HOST_LOCK_ENV, HOST_TURNS_ENV, host_turns, shared_turn
from torchkiln.runner.launch.orphan import TrialsStopped, launcher_env, stopping

# How often a wait on the child looks for a stop (orphan.stop_trials): a tune's diagnosis runs
# in a thread beside its trials, out of a Ctrl-C's reach.
POLL_S = 0.5
# src/ (or site-packages/) holding the torchkiln package, so children import this same copy.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class ProcResult:
    returncode: int | None  # None when it was killed for running past the timeout
    stdout: str
    stderr: str
    timed_out: bool
    elapsed_s: float

    def tail(self, lines: int = 15) -> str:
        text = (self.stderr or self.stdout).strip().splitlines()
        return "\n".join(text[-lines:])


def child_env(overrides: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The caller's environment, this kiln first on PYTHONPATH, ``overrides`` applied (None
    removes a variable)."""
    env = launcher_env(dict(os.environ))  # the child ends itself if this process dies
    env.pop(HOST_TURNS_ENV, None)  # the parent holds the turn; a nested run takes none
    env.pop(HOST_LOCK_ENV, None)  # only a child given its own turns (run_module) takes them
    env["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *filter(None, [env.get("PYTHONPATH")])])
    for key, value in (overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run_module(
    module: str,
    args: list[str],
    *,
    timeout: float,
    env: Mapping[str, str | None] | None = None,
    cwd: str | None = None,
    own_turns: str | None = None,
    timed: bool = False,
    over: Callable[[float], bool] | None = None,
) -> ProcResult:
    """``python -m module args...``; on timeout the child's whole process group is killed
    (compile workers included), and whatever it printed so far is returned; on a stop
    (orphan.stop_trials) it is killed and TrialsStopped raised.

    Turns on the host (host_lock.py): with ``own_turns`` (a lock file) the child takes its own,
    shared for its busy work and exclusive for its timed steps (the profile worker); else this
    process holds a turn on KILN_HOST_TURNS's file, if set, while the child runs: shared, or
    with ``timed`` exclusive (a child whose whole run is its timing, as a stream replay's).
    ``over(elapsed_s)``, polled, ends the child early as a timeout when it returns True."""
    if own_turns is not None:
        return _run(module, args, timeout=timeout, env={**(env or {}), HOST_LOCK_ENV: own_turns},
                    cwd=cwd, over=over)  # fmt: skip
    with shared_turn(host_turns(), timed=timed):
        return _run(module, args, timeout=timeout, env=env, cwd=cwd, over=over)


def _run(
    module: str,
    args: list[str],
    *,
    timeout: float,
    env: Mapping[str, str | None] | None,
    cwd: str | None,
    over: Callable[[float], bool] | None = None,
) -> ProcResult:
    start = time.perf_counter()
    # Own session: Inductor forks compile workers; killing the group ends them too.
    proc = spawn.start(
        [sys.executable, "-m", module, *args],
        env=child_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        text=True,
    )
    # A Ctrl-C: the child's own session is out of the signal's reach.
    with spawn.ended_on_error(proc, end=spawn.kill_group):
        while True:
            remaining = timeout - (time.perf_counter() - start)
            try:
                out, err = proc.communicate(timeout=max(0.0, min(POLL_S, remaining)))
                timed_out = False
                break
            except subprocess.TimeoutExpired:
                if stopping():
                    raise TrialsStopped("the run was interrupted") from None
                if remaining <= POLL_S or (over is not None and over(time.perf_counter() - start)):
                    spawn.kill_group(proc)
                    out, err = proc.communicate()
                    timed_out = True
                    break
    return ProcResult(
        returncode=None if timed_out else proc.returncode,
        stdout=out or "",
        stderr=err or "",
        timed_out=timed_out,
        elapsed_s=time.perf_counter() - start,
    )


def run_json_worker(
    module: str,
    request: dict,
    workdir: str | Path,
    *,
    timeout: float,
    env: Mapping[str, str | None] | None = None,
    own_turns: str | None = None,
) -> tuple[ProcResult, dict | None]:
    """Write ``request`` as JSON, run ``python -m module REQUEST RESULT`` in its own process,
    and read its JSON result back; None when the worker left no readable result (it crashed
    or timed out, which ``ProcResult`` says)."""
    req_file, out_file = Path(workdir) / "request.json", Path(workdir) / "result.json"
    req_file.write_text(json.dumps(request))
    proc = run_module(
        module, [str(req_file), str(out_file)], timeout=timeout, env=env, own_turns=own_turns
    )
    try:
        return proc, json.loads(out_file.read_text())
    except (OSError, ValueError):
        return proc, None
