"""A trial's two time limits (launch._spawn): its own, whose clock stops while the trial waits
for its turn on the host, and the wall limit, which counts everything; and a trial that has
written its result is never reported as stopped, however slowly its process exits.

The worker here is a stand-in shell script (it is launched as `sys.executable -m
torchkiln.runner.protocol.worker MODE SPEC RESULT PHASE`), so the limits are tested in seconds,
not in a real trial's minutes."""

from __future__ import annotations

import stat
import sys
import time
from pathlib import Path

import pytest

from torchkiln.runner.launch import trial_process as launch
from torchkiln.runner.launch.host_lock import WAITING_SUFFIX
from torchkiln.runner.protocol.trial import TrialSpec

# $6: the phase file, $5: the result file. WAIT_S seconds waiting for the host, WORK_S working,
# then the result, then EXIT_S seconds before the process ends.
FAKE_WORKER = """#!/usr/bin/env bash
echo "measure{suffix}" > "$6"
sleep "$WAIT_S"
echo measure > "$6"
sleep "$WORK_S"
echo '{{"status": "ok", "reason": null}}' > "$5.tmp" && mv "$5.tmp" "$5"
echo done > "$6"
sleep "$EXIT_S"
"""


@pytest.fixture
def fake_worker(tmp_path, monkeypatch):
    script = tmp_path / "fake-worker.sh"
    script.write_text(FAKE_WORKER.format(suffix=WAITING_SUFFIX))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(script))  # a cold spawn runs it

    def run(wait_s: float, work_s: float, exit_s: float = 0.0, **limits) -> tuple:
        env = {"PATH": "/usr/bin:/bin", "WAIT_S": str(wait_s), "WORK_S": str(work_s),
               "EXIT_S": str(exit_s)}  # fmt: skip
        spec = TrialSpec(workload="simple", variant="eager", device="cpu")
        t0 = time.monotonic()
        out = launch._spawn("trial", spec, Path(tmp_path / "trial"), env=env, on_phase=None,
                            **limits)  # fmt: skip
        return out, time.monotonic() - t0

    return run


def test_waiting_for_the_host_does_not_count_against_the_trials_own_limit(fake_worker):
    # 2.5 s waiting + 1 s working against a 2 s limit of its own: it finishes.
    out, _ = fake_worker(2.5, 1.0, timeout_s=2.0)
    assert out.stopped_by is None and out.result["status"] == "ok"
    assert out.host_wait_s >= 2.0


def test_working_past_its_own_limit_stops_the_trial(fake_worker):
    out, took = fake_worker(0.0, 5.0, timeout_s=1.5)
    assert out.stopped_by == "own" and out.result is None
    assert took < 4.5  # stopped, not waited for


def test_a_stopped_trial_keeps_the_phases_its_launcher_saw(fake_worker):
    # 1 s waiting for the host, then working past a 2.5 s limit of its own.
    out, took = fake_worker(1.0, 5.0, timeout_s=2.5)
    assert out.stopped_by == "own" and out.result is None
    seen = out.phase_seen_s
    assert {"host_wait", "measure"} <= set(seen) <= {"start", "host_wait", "measure"}
    assert seen["host_wait"] == pytest.approx(out.host_wait_s)  # one account of the waits
    assert seen["measure"] > 0 and sum(seen.values()) <= took


def test_the_result_of_a_stopped_trial_carries_that_account(fake_worker, tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_WARM_START", "0")
    spec = TrialSpec(workload="simple", variant="eager", device="cpu")
    monkeypatch.setenv("WAIT_S", "0")
    monkeypatch.setenv("WORK_S", "5")
    monkeypatch.setenv("EXIT_S", "0")
    r = launch.run_trial(spec, tmp_path / "run", timeout_s=1.5)
    assert r["status"] == "timeout" and r["phase"] == "measure"
    assert "measure" in r["phase_s_seen"] and "phase_s" not in r
    assert sum(r["phase_s_seen"].values()) <= r["process_wall_s"]


def test_the_wall_limit_counts_the_waits(fake_worker):
    out, _ = fake_worker(3.0, 0.5, timeout_s=2.0, wall_s=1.5)
    assert out.stopped_by == "wall" and out.result is None
    assert out.phase == f"measure{WAITING_SUFFIX}"


def test_a_result_written_before_a_slow_exit_is_kept_and_the_exit_not_waited_for(
    fake_worker, tmp_path
):
    # On two H200s (94c62e6) a trial finished (phase "done", its result written) while its process
    # was still exiting when the search's share of the budget ended, and was reported as a timeout.
    out, took = fake_worker(0.0, 0.5, exit_s=30.0, timeout_s=20.0)
    assert out.stopped_by is None and out.result == {"status": "ok", "reason": None}
    assert out.phase == "done"
    assert took < 10.0
    # Not waited for, and not left running either: its group was ended.
    script = str(tmp_path / "fake-worker.sh").encode()
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and _running(script):
        time.sleep(0.1)
    assert not _running(script)


def _running(needle: bytes) -> bool:
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if needle in cmdline.read_bytes():
                return True
        except OSError:
            continue  # it ended while we looked
    return False


COMPILING_WORKER = """#!/usr/bin/env bash
echo "{phase}" > "$6"
sleep 20
echo '{{"status": "ok", "reason": null}}' > "$5.tmp" && mv "$5.tmp" "$5"
"""


@pytest.mark.parametrize(
    ("phase", "waiter", "early"),
    [
        ("first_call", True, True),  # compiling, trials wait behind it: stopped early
        ("first_call", False, False),  # compiling, nobody waits: its full wall limit
        ("measure", True, False),  # not compiling: it blocks nobody's timed turn
        (f"first_call{WAITING_SUFFIX}", True, False),  # waiting for a compile slot itself
    ],
)
def test_a_compile_that_holds_compiled_trials_back_is_stopped_before_the_wall_limit(
    tmp_path, monkeypatch, phase, waiter, early
):
    """Trials waiting for their timed turn behind a compile would all be stopped at the
    search's wall limit with nothing measured: the compile is stopped BLOCKER_MARGIN_S
    earlier, and says why."""
    import fcntl
    import os

    from torchkiln.runner.launch.host_lock import HOST_LOCK_ENV, WRITERS_SUFFIX

    script = tmp_path / "compiling-worker.sh"
    script.write_text(COMPILING_WORKER.format(phase=phase))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(sys, "executable", str(script))
    monkeypatch.setattr(launch, "BLOCKER_MARGIN_S", 2.5)
    lock = str(tmp_path / "turns")
    waiting = os.open(lock + WRITERS_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
    if waiter:
        fcntl.flock(waiting, fcntl.LOCK_SH)  # a trial waiting for its timed turn
    try:
        env = {"PATH": "/usr/bin:/bin", HOST_LOCK_ENV: lock}
        spec = TrialSpec(workload="simple", variant="inductor", device="cpu")
        out = launch._spawn("trial", spec, tmp_path / "trial", 60.0, env, None, wall_s=4.0)
    finally:
        os.close(waiting)
    assert out.stopped_by == "wall" and out.result is None
    assert out.for_waiters is early


def test_waiting_trials_are_seen_on_the_writers_file(tmp_path):
    import fcntl
    import os

    from torchkiln.runner.launch.host_lock import WRITERS_SUFFIX, trials_wait_for_compiles

    lock = str(tmp_path / "turns")
    assert trials_wait_for_compiles(lock) is False  # no trial has waited: no file yet
    fd = os.open(lock + WRITERS_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert trials_wait_for_compiles(lock) is False
        fcntl.flock(fd, fcntl.LOCK_SH)
        assert trials_wait_for_compiles(lock) is True
        assert trials_wait_for_compiles(lock) is True  # asking takes nothing away
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert trials_wait_for_compiles(lock) is False
    finally:
        os.close(fd)
