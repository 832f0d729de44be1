"""Trial processes do not outlive the kiln that launched them (runner/launch/orphan.py): a launcher
killed outright leaves no trial behind, a Ctrl-C while a trial runs ends it, and a pool stopped by
one ends the trials its threads wait on instead of waiting for them to finish. An H200 run (kiln
0a7b0dc) found an orphaned max-autotune trial timing its steps beside the next benchmark."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchkiln.runner.launch import executors, orphan
from torchkiln.runner.launch import trial_process as launch
from torchkiln.runner.protocol.trial import TrialSpec

SRC = str(Path(__file__).resolve().parents[1] / "src")


def gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet (a container's PID 1 may
    not reap)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_until(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


# The launcher (a stand-in for kiln) starts a trial the way launch._spawn does: its own
# process session, KILN_LAUNCHER_PID naming the launcher. The trial starts a worker of its own (as
# Inductor's compile workers), writes both pids, and would sleep for a minute.
LAUNCHER = """
import subprocess, sys, time
from torchkiln.runner.launch.orphan import launcher_env
import os
trial = '''
import os, subprocess, sys, time
from torchkiln.runner.launch.orphan import exit_with_launcher
exit_with_launcher(poll_s=0.05)
child = subprocess.Popen(["sleep", "60"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(60)
'''
subprocess.Popen([sys.executable, "-c", trial, sys.argv[1]], env=launcher_env(dict(os.environ)),
                 start_new_session=True)
time.sleep(60)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_trial_and_its_workers_end_when_the_launcher_is_killed(tmp_path):
    pids = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop(orphan.LAUNCHER_ENV, None)
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(pids)], env=env, start_new_session=True
    )
    try:
        assert wait_until(lambda: pids.exists() and pids.read_text().strip(), 30)
        trial, worker = (int(p) for p in pids.read_text().split())
        assert not gone(trial) and not gone(worker)
        launcher.kill()  # SIGKILL: no handler of the launcher's runs
        launcher.wait()
        assert wait_until(lambda: gone(trial) and gone(worker), 10)
    finally:
        launcher.kill()
        launcher.wait()


def test_no_watch_where_no_kiln_launched_the_process(monkeypatch):
    monkeypatch.delenv(orphan.LAUNCHER_ENV, raising=False)
    assert orphan.exit_with_launcher() is None
    env = orphan.launcher_env({})
    assert env[orphan.LAUNCHER_ENV] == str(os.getpid())
    assert orphan.alive(os.getpid())
    assert not orphan.launcher_gone(os.getpid(), os.getppid())
    assert orphan.launcher_gone(None, os.getppid() + 1)  # re-parented


# launch._spawn runs `sys.executable -m torchkiln.runner.protocol.worker MODE SPEC RESULT PHASE`:
# here a shell script that writes its pid, enters a phase and would work for a minute.
FAKE_WORKER = """#!/usr/bin/env bash
echo $$ > "$PIDFILE"
echo measure > "$6"
sleep 60
"""


@pytest.fixture
def slow_worker(tmp_path, monkeypatch):
    script = tmp_path / "fake-worker.sh"
    script.write_text(FAKE_WORKER)
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(script))  # a cold spawn runs it
    return tmp_path / "worker.pid"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_ctrl_c_while_a_trial_runs_ends_the_trial(slow_worker, tmp_path):
    def interrupt(phase: str) -> None:
        raise KeyboardInterrupt

    spec = TrialSpec(workload="simple", variant="eager", device="cpu")
    env = {"PATH": "/usr/bin:/bin", "PIDFILE": str(slow_worker)}
    with pytest.raises(KeyboardInterrupt):
        launch._spawn("trial", spec, tmp_path / "trial", 120.0, env, interrupt)
    pid = int(slow_worker.read_text())
    assert wait_until(lambda: gone(pid), 10)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_an_interrupted_pool_ends_the_trials_its_threads_wait_on(slow_worker, tmp_path):
    # Two slots: trial 0 ends at once, and handling its result is interrupted (a Ctrl-C lands
    # in the main thread); trial 1's thread is waiting on a worker that would run a minute.
    spec = TrialSpec(workload="simple", variant="eager", device="cpu")
    started = []

    def run_one(s: TrialSpec, gpu, host_lock=None) -> dict:
        if s.index == 0:
            assert wait_until(lambda: slow_worker.exists(), 30)  # trial 1 is running
            return {"status": "ok"}
        env = {"PATH": "/usr/bin:/bin", "PIDFILE": str(slow_worker)}
        started.append(time.monotonic())
        out = launch._spawn("trial", s, tmp_path / "t1", 120.0, env, None)
        return {"status": "ran to its end", "out": out}

    specs = [spec, TrialSpec(workload="simple", variant="eager", device="cpu", index=1)]
    queue = [(s.index, s) for s in specs]

    def on_done(tag, result):
        raise KeyboardInterrupt

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        executors.stream([0, 1], lambda: queue.pop(0) if queue else None, run_one, on_done)
    # The pool's shutdown waited for trial 1's thread; it ended its worker instead of a minute.
    assert time.monotonic() - t0 < 40
    pid = int(slow_worker.read_text())
    assert gone(pid)
    assert not orphan.stopping()  # later runs in this process are not stopped


def test_a_stop_raises_in_the_waiting_thread_and_clears(slow_worker, tmp_path):
    spec = TrialSpec(workload="simple", variant="eager", device="cpu")
    env = {"PATH": "/usr/bin:/bin", "PIDFILE": str(slow_worker)}
    orphan.stop_trials()
    try:
        with pytest.raises(orphan.TrialsStopped):
            launch._spawn("trial", spec, tmp_path / "trial", 120.0, env, None)
    finally:
        orphan.trials_may_run()
    assert not orphan.stopping()
    # A stopped trial's worker does not run on.
    if slow_worker.exists():
        pid = int(slow_worker.read_text())
        assert wait_until(lambda: gone(pid), 10)


def test_sigkill_of_the_group_leader_is_what_end_self_sends(monkeypatch):
    # end_self ends its group only where it leads it; a torchrun rank ends itself alone.
    sent = []
    monkeypatch.setattr(orphan.os, "getpgrp", lambda: 4242)
    monkeypatch.setattr(orphan.os, "getpid", lambda: 7)
    monkeypatch.setattr(orphan.os, "killpg", lambda *a: sent.append(("group", *a)))
    monkeypatch.setattr(orphan.os, "kill", lambda *a: sent.append(("self", *a)))
    orphan.end_self()
    assert sent == [("self", 7, signal.SIGKILL)]
    sent.clear()
    monkeypatch.setattr(orphan.os, "getpid", lambda: 4242)
    orphan.end_self()
    assert sent[0] == ("group", 4242, signal.SIGKILL)
