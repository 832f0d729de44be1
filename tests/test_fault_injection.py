"""A tune killed (SIGKILL, no clean-up) at a dozen points, each re-run going on from what the
last one left: during the baseline's build, warm-up and reps, its correctness check, the
profile and explain stages, a search trial's build, compile, reps and check, and the report.
After each kill no process of that run is left and every result on disk is whole; the final
run completes, and no trial's figures come from a compile cache it did not build (the
workload's factory refuses to run over a cache that is not empty)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WL = f"{Path(__file__).parent / 'fixtures' / 'workloads.py'}:needs_empty_cache"
# A trial's phases in the order it goes through them (runner/protocol/measure_trial.py).
PHASES = ["start", "environment", "setup", "build", "first_call", "warmup", "baseline",
          "measure", "correctness", "correctness_compile", "flops", "kernels"]  # fmt: skip
# (what to watch, where, which phase): a trial's phase file, or a stage line the tune prints.
KILLS = [
    ("trial", "00-", "build"),
    ("trial", "00-", "baseline"),
    ("trial", "00-", "measure"),
    ("trial", "00-", "correctness"),
    ("stage", "profile", None),
    ("stage", "graph breaks", None),
    ("trial", "01-", "build"),
    ("trial", "01-", "first_call"),
    ("trial", "01-", "measure"),
    ("trial", "01-", "correctness"),
    ("stage", "select", None),
    ("file", "results.json", None),
]


def _tune(out: Path, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torchkiln.cli", "tune", WL, "--device", "cpu"]
    cmd += ["--budget", "240s", "--reps", "3", "--out", str(out)]
    with open(log, "w") as sink:
        return subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            env={**_fresh_env(), "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip


def _fresh_env() -> dict[str, str]:
    """A user's shell: nothing another test of this session left in os.environ (the fixture's
    built-once flag, a terminal width, compiler cache settings) reaches the tune."""
    drop = ("_NEEDS_EMPTY_CACHE_BUILT", "COLUMNS", "KILN_INMEMORY_PATH")
    return {
        k: v
        for k, v in os.environ.items()
        if k not in drop and not k.startswith(("TORCHINDUCTOR_", "TRITON_"))
    }


def _reached(out: Path, lines: list[str], kind: str, where: str, phase: str | None) -> bool:
    if kind == "stage":
        return any(line.startswith(where) for line in lines)
    if kind == "file":
        return (out / where).exists()
    for trial in (out / "trials").glob(f"{where}*"):
        try:
            now = (trial / "trial-phase.txt").read_text().strip()
        except OSError:
            continue
        # At the phase or past it (a short phase may pass between two polls), still running.
        if now in PHASES and PHASES.index(now) >= PHASES.index(phase):
            return not (trial / "result.json").exists()
    return False


def _launched_by(pid: int) -> list[int]:
    """Processes whose environment names ``pid`` as their kiln launcher."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"KILN_LAUNCHER_PID={pid}".encode() in env:
            found.append(int(entry.name))
    return found


def _kill_when(proc: subprocess.Popen, log: Path, out: Path, kind: str, where: str, phase):
    """SIGKILL the tune once it reaches the point; False when it ended first."""
    while proc.poll() is None:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
        if _reached(out, lines, kind, where, phase):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.05)
    return False


def _whole_results(out: Path) -> None:
    for path in (out / "trials").glob("*/result.json"):
        assert isinstance(json.loads(path.read_text()).get("status"), str), path


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_a_tune_killed_anywhere_goes_on_from_what_it_left(tmp_path):
    out = tmp_path / "run"
    killed = []
    log = tmp_path / "tune.log"
    for kind, where, phase in KILLS:
        proc = _tune(out, log)
        if not _kill_when(proc, log, out, kind, where, phase):
            continue  # the run ended before this point (the budget skipped it)
        killed.append((where, phase))
        deadline = time.monotonic() + 30
        while _launched_by(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.5)  # each child notices its launcher is gone and ends itself
        assert _launched_by(proc.pid) == [], f"processes left after a kill at {where} {phase}"
        _whole_results(out)
    first_log = log.read_text(errors="replace")[-3000:]
    proc = _tune(out, log)
    assert proc.wait(timeout=600) == 0, log.read_text()
    doc = json.loads((out / "results.json").read_text())
    assert doc["trials"] and all(isinstance(t.get("status"), str) for t in doc["trials"])
    assert doc["trials"][0]["status"] == "ok"
    for trial in doc["trials"]:
        assert "compile cache was not empty" not in (trial.get("reason") or ""), trial
    assert not list(out.glob("trials/*/compile-cache"))
    # A busy host can make the budget skip the search trial, whose points are then not reached;
    # the re-run above is checked either way, and too few kills is reported, not passed.
    if len(killed) < 6:
        pytest.skip(f"only {len(killed)} of {len(KILLS)} kill points reached: {first_log}")
