"""Every plan in benchmarks/gpu_plan.sh calls the benchmark scripts with options they accept.

GPU time is scarce; a misspelt flag in a plan costs a job's share of it. The plans run here with
`python3`, `timeout`, `taskset`, `nvidia-smi`, `lscpu` and `ncu` stubbed (the stub python
records each command line), then each recorded script is run for real up to its
argument parsing, which must succeed, and each pytest path must exist.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAN_RUNNER = ROOT / "benchmarks" / "gpu_plan.sh"
PLANS = [
    "all", "zoo", "tune-infer", "tune-train", "tune-2gpu-infer", "tune-2gpu-train",
    "train-plain-fp32", "kernels", "kernels-table", "kernels-ncu", "serve", "xla", "dist",
    "gpu-tests",
]  # fmt: skip

# Runs a script as __main__ but stops at its first parse_args: exit 0 if the options parse,
# argparse's exit 2 (with its message) if not.
PARSE_ONLY = """
import argparse, runpy, sys
real = argparse.ArgumentParser.parse_args
def parse_only(self, args=None, namespace=None):
    real(self, args, namespace)
    raise SystemExit(0)
argparse.ArgumentParser.parse_args = parse_only
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
raise SystemExit("the script never parsed its arguments")
"""


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _record_plan(plan: str, tmp: Path, **extra_env: str) -> list[list[str]]:
    bin_dir, root, log = tmp / "bin", tmp / "root", tmp / "calls.txt"
    bin_dir.mkdir()
    (root / "logs").mkdir(parents=True)
    # `python3 -` is the plan's own helper (cpus_for): it runs for real.
    _stub(
        bin_dir,
        "python3",
        f'if [ "${{1:-}}" = "-" ]; then exec {sys.executable} "$@"; fi\n'
        f"( IFS=$'\\x1f'; echo \"$*\" ) >> {log}\n",
    )
    # timeout [-k N] LIMIT CMD...: run CMD.
    _stub(
        bin_dir,
        "timeout",
        'while [ "${1#-}" != "$1" ]; do [ "$1" = -k ] && shift; shift; done\nshift\nexec "$@"\n',
    )
    for name in ("taskset", "nvidia-smi", "lscpu"):
        _stub(bin_dir, name, "exit 0\n")
    # ncu [OPTIONS...] python3 SCRIPT...: run the profiled command.
    _stub(bin_dir, "ncu", 'while [ $# -gt 0 ] && [ "$1" != python3 ]; do shift; done\nexec "$@"\n')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", **extra_env}
    proc = subprocess.run(
        ["bash", str(PLAN_RUNNER), "plan", str(root), plan],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "all done" in (root / "status.txt").read_text()
    return [line.split("\x1f") for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.parametrize("plan", PLANS)
def test_a_plan_calls_its_scripts_with_options_they_accept(plan, tmp_path):
    calls = _record_plan(plan, tmp_path)
    scripts = [c for c in calls if c[0].startswith("benchmarks/") and c[0].endswith(".py")]
    # gpu-tests runs only pytest; every other plan runs benchmark scripts.
    assert scripts or (plan == "gpu-tests" and calls), f"plan {plan} runs no benchmark script"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for argv in {tuple(c) for c in scripts}:
        proc = subprocess.run(
            [sys.executable, "-c", PARSE_ONLY, *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stderr[-1500:]}"
    for argv in calls:
        if argv[:2] == ["-m", "pytest"]:
            paths = [a.split("::")[0] for a in argv[2:] if a.startswith("tests")]
            assert paths and all((ROOT / p).exists() for p in paths), argv


def test_jobs_past_the_deadline_are_skipped_and_said_so(tmp_path):
    # A deadline 30 s after the start, set for the whole plan: every job has under a minute.
    calls = _record_plan("kernels", tmp_path, DEADLINE_S="30")
    status = (tmp_path / "root" / "status.txt").read_text()
    for name in ["kernels_tests", "kernel_configs", "kernels"]:
        assert f"skip  {name}: " in status and f"start {name}\n" not in status
    assert calls == []


def test_the_parse_only_runner_catches_a_bad_option(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", PARSE_ONLY, "benchmarks/bench_tune.py", "--no-such-flag"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "--no-such-flag" in proc.stderr


def test_an_unknown_plan_is_refused_with_the_list(tmp_path):
    (tmp_path / "logs").mkdir()
    proc = subprocess.run(
        ["bash", str(PLAN_RUNNER), "plan", str(tmp_path), "no-such-plan"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "unknown plan 'no-such-plan'" in proc.stderr and "kernels-table" in proc.stderr


def test_the_plan_list_names_every_plan_tested_here():
    proc = subprocess.run(
        ["bash", str(PLAN_RUNNER), "list"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and sorted(proc.stdout.split()) == sorted(PLANS)
