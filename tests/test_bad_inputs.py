"""Bad input to every command: exit 2, one line naming what was wrong and what is allowed, no
traceback, no run directory left behind, no earlier result touched. In-process (cli.main), so
the table stays fast; nothing here may reach a trial process."""

from __future__ import annotations

import os

import pytest
import torch

from torchkiln.cli import main

# (argv, words the one line must hold). FILE is a plain file, TRACE a valid request trace,
# OLD an earlier run's results: set up in `sandbox`.
CASES = [
    # bench: numbers
    ("bench simple --reps 0", "--reps: must be a positive integer, got 0"),
    ("bench simple --reps -3", "--reps: must be a positive integer, got -3"),
    ("bench simple --reps many", "--reps: must be a positive integer, got 'many'"),
    ("bench simple --batch-size 0", "--batch-size: must be a positive integer"),
    ("bench simple --batch-size 1.5", "--batch-size: must be a positive integer"),
    ("bench simple --rep-ms 0", "--rep-ms: must be a positive number"),
    ("bench simple --rep-ms nan", "--rep-ms: must be a positive number"),
    ("bench simple --timeout 0", "--timeout: must be a positive number"),
    ("bench simple --timeout -1", "--timeout: must be a positive number"),
    ("bench simple --nproc 0", "--nproc: must be a positive integer"),
    ("bench simple --replicas 0", "1 or more instances"),
    # bench: names and choices
    ("bench simple --variants nosuch", "unknown backend 'nosuch'; choose from"),
    ("bench simple --variants inductor:mode=fast", "mode='fast'; choose from"),
    ("bench simple --variants eager+bf17", "unknown policy 'bf17'; choose from"),
    ("bench simple --variants inductor:speed=1", "unknown parameter 'speed'; choose from"),
    ("bench simple --variants inductor:fullgraph", "must be key=value"),
    ("bench simple --baseline nosuch", "unknown backend 'nosuch'"),
    ("bench simple --step validate", "--step: invalid choice: 'validate'"),
    ("bench simple --preset huge", "--preset: invalid choice: 'huge'"),
    ("bench simple --device tpu", "--device 'tpu'; choose from"),
    ("bench simple --executor farm", "--executor: invalid choice"),
    ("bench simple --dist mpi", "--dist: invalid choice"),
    ("bench simple --fail-on sometimes", "--fail-on: invalid choice"),
    ("bench nosuch", "unknown workload 'nosuch'; choose from"),
    ("bench missing.py:factory", "'missing.py' does not exist"),
    ("bench simple --resume never-ran", "no manifest.json there"),
    # bench: outputs
    ("bench simple --out /proc/kiln-run", "cannot write in '/proc'"),
    ("bench simple --out FILE/run", "is a file, so nothing can be written under it"),
    ("bench simple --out FILE", "it is a file, not a directory"),
    ("bench simple --json FILE/r.json", "is a file, so nothing can be written under it"),
    ("bench simple --json /proc/r.json", "cannot write in '/proc'"),
    ("bench simple --cache-dir FILE/cache", "is a file"),
    # tune
    ("tune simple --budget 0", "--budget: must be more than 0 s"),
    ("tune simple --budget=-5m", "write it like 15m"),
    ("tune simple --budget soon", "write it like 15m"),
    ("tune simple --steps 0", "--steps: must be a positive integer, got 0"),
    ("tune simple --steps -1", "--steps: must be a positive integer, got -1"),
    ("tune simple --reps 0", "--reps: must be a positive integer"),
    ("tune simple --batch-size 0", "--batch-size: must be a positive integer"),
    ("tune simple --allow-precision bf17", "--allow-precision ['bf17']; choose from"),
    ("tune simple --device tpu", "--device 'tpu'; choose from"),
    ("tune simple --preset huge", "--preset: invalid choice"),
    ("tune simple --step fwd", "--step: invalid choice"),
    ("tune simple --out /proc/kiln-tune", "cannot write in '/proc'"),
    ("tune simple --out FILE/run", "is a file"),
    ("tune nosuch", "unknown workload 'nosuch'"),
    ("tune missing/model.py:build", "'missing/model.py' does not exist"),
    # report, compare
    ("report never-ran", "does not exist"),
    ("compare never-ran.json OLD", "does not exist"),
    ("compare OLD OLD --threshold -1", "--threshold: must be a number >= 0"),
    ("compare OLD OLD --threshold x", "--threshold: must be a number >= 0"),
    ("compare OLD", "compare takes OLD and NEW"),
    # doctor
    ("doctor --timeout 0", "--timeout: must be a positive number"),
    ("doctor --json /proc/doctor.json", "cannot write in '/proc'"),
    ("doctor --json FILE/doctor.json", "is a file"),
    # explain
    ("explain simple --json /proc/x.json", "cannot write in '/proc'"),
    ("explain simple --json FILE/x.json", "is a file"),
    ("explain simple --trace FILE/t", "is a file"),
    ("explain simple --timeout 0", "--timeout: must be a positive number"),
    ("explain simple --recompile-limit 0", "--recompile-limit: must be a positive integer"),
    ("explain simple --batch-sizes 0", "give positive batch sizes"),
    ("explain simple --batch-sizes 2,a", "not a comma-separated list of ints"),
    ("explain simple --preset huge", "--preset: invalid choice"),
    ("explain simple --device tpu", "--device 'tpu'; choose from"),
    ("explain nosuch", "unknown workload 'nosuch'"),
    # profile
    ("profile simple --steps 0", "--steps: must be a positive integer"),
    ("profile simple --steps 201", "--steps 201; give 1 to 200"),
    ("profile simple --batch-size 0", "--batch-size: must be a positive integer"),
    ("profile simple --timeout 0", "--timeout: must be a positive number"),
    ("profile simple --variant nosuch", "unknown backend 'nosuch'"),
    ("profile simple --json /proc/p.json", "cannot write in '/proc'"),
    ("profile simple --trace FILE/trace.json", "is a file"),
    ("profile simple --device tpu", "--device 'tpu'; choose from"),
    ("profile nosuch", "unknown workload 'nosuch'"),
    # serve-bench
    ("serve-bench simple --trace missing.jsonl", "no such file"),
    ("serve-bench simple --trace t.jsonl --generate 0", "--generate: must be a positive integer"),
    ("serve-bench simple --trace TRACE --sample 0", "--sample: must be a positive integer"),
    ("serve-bench simple --trace TRACE --max-buckets 0", "--max-buckets: must be a positive"),
    ("serve-bench simple --trace TRACE --seed -1", "--seed: must be an integer >= 0"),
    ("serve-bench simple --trace FILE/t.jsonl --generate 5", "is a file"),
    ("serve-bench simple --trace TRACE --out /proc/s.json", "cannot write in '/proc'"),
    ("serve-bench simple --trace TRACE --arms fast", "unknown arm(s) ['fast']; choose from"),
    ("serve-bench simple --trace TRACE --preset huge", "--preset: invalid choice"),
    ("serve-bench simple", "the following arguments are required: --trace"),
    # kernels bench
    ("kernels bench --rows 0", "--rows: must be a positive integer"),
    ("kernels bench --cols 0", "--cols: must be a positive integer"),
    ("kernels bench --rep-ms 0", "--rep-ms: must be a positive number"),
    ("kernels bench --kernel nosuch", "--kernel: invalid choice"),
    ("kernels bench --json /proc/k.json", "cannot write in '/proc'"),
    ("kernels", "the following arguments are required: kernels_command"),
    # the command line itself
    ("nosuch", "invalid choice: 'nosuch'"),
    ("", "the following arguments are required: command"),
    ("workloads --all", "unrecognized arguments: --all"),
    ("variants inductor", "unrecognized arguments: inductor"),
    ("tune --debug-all", "unrecognized arguments: --debug-all"),
]


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("a plain file\n")
    (tmp_path / "TRACE").write_text('{"batch": 2, "seq": 8}\n')
    old = tmp_path / "old"
    old.mkdir()
    (old / "results.json").write_text('{"schema": "torchkiln.bench/1", "trials": []}\n')
    return tmp_path


def _snapshot(root):
    return {
        str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")
    }


def test_the_table_is_large_enough():
    assert len(CASES) >= 60
    commands = {argv.split(" ")[0] for argv, _ in CASES}
    for cmd in ("bench", "tune", "report", "compare", "doctor", "explain", "profile"):
        assert cmd in commands
    assert {"serve-bench", "kernels", "workloads", "variants"} <= commands


@pytest.mark.parametrize(("argv", "says"), CASES, ids=[c[0] or "(none)" for c in CASES])
def test_bad_input_exits_2_with_one_line(argv, says, sandbox, capsys):
    if "--device cuda" in argv and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    args = [
        {"FILE": "FILE", "TRACE": "TRACE", "OLD": "old/results.json"}.get(a, a)
        for a in argv.split()
    ]
    before = _snapshot(sandbox)
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (out, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("kiln") and "error:" in lines[0]
    assert says in lines[0]
    assert "Traceback" not in err + out
    # Nothing made (no run directory), nothing earlier touched.
    assert _snapshot(sandbox) == before
    assert not os.path.exists(sandbox / "kiln-runs")
