"""`kiln bench` end to end on the CPU, and bad input giving exit code 2 with a clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchkiln.report.schema import validate

ROOT = Path(__file__).resolve().parents[1]

WL = Path(__file__).parent / "fixtures" / "workloads.py"


def kiln(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    # Piped, as a user's script or CI log reads kiln; a COLUMNS left by the test session (set
    # to 80 in this suite's processes) would fold the table instead of its natural width.
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "torchkiln.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.slow
def test_bench_simple_tiny_cpu_end_to_end(tmp_path):
    out_json = tmp_path / "r.json"
    proc = kiln(
        "bench",
        "simple",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--variants",
        "eager,inductor",
        "--json",
        str(out_json),
        "--out",
        str(tmp_path / "run"),
        "--reps",
        "5",
        "--rep-ms",
        "20",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out_json.read_text())
    validate(doc)
    assert [t["variant"] for t in doc["trials"]] == ["eager", "inductor"]
    eager, ind = doc["trials"]
    assert eager["status"] == "ok", eager.get("reason")
    assert ind["status"] == "ok", ind.get("reason")
    # Compile time is reported apart from the steady state, which is far shorter.
    assert ind["first_call_s"] > 10 * ind["steady_ms"]["median"] / 1e3
    assert ind["dynamo"]["graphs"] >= 1 and ind["dynamo"]["graph_breaks"] == 0
    assert ind["correctness"]["passed"]
    assert ind["flops_per_step"] == eager["flops_per_step"] > 0
    # The host's load around the timed reps; on the CPU the trial's own threads count as its own.
    load = ind["host_load"]
    assert load["own_threads"] == ind["settings"]["threads"]
    assert load["after"]["cpus"] >= 1 and len(load["after"]["loadavg"]) == 3
    # What ran on the CPUs during the reps, read from /proc (Linux); the tables stay out.
    assert load["during"]["wall_s"] > 0 and load["during"]["other_cpus"] >= 0
    # The thread that timed the reps, by the scheduler's counters: it ran for most of them.
    timing = load["during"]["timing_thread"]
    assert timing is not None and timing["cpu_s"] > 0 and timing["runqueue_wait_s"] >= 0
    assert "cpu" not in load["before"] and "cpu" not in load["after"]
    assert ind["environment"]["torch"].startswith("2.")
    assert len(ind["steady_ms"]["samples"]) == 5
    assert "inductor" in proc.stdout and "speedup" in proc.stdout
    assert (tmp_path / "run" / "manifest.json").exists()


@pytest.mark.parametrize(
    "args, expect",
    [
        (["bench", "nope"], "unknown workload 'nope'; choose from"),
        (["bench", "simple", "--variants", "inductor:mode=warp"], "choose from ['default'"),
        # A spec's own commas stay inside it: the bad value is reported, not "dynamic=..." as a
        # backend name.
        (
            ["bench", "simple", "--variants", "eager,inductor:dynamic=false,mode=warp+bf16"],
            "inductor: mode='warp'; choose from",
        ),
        (["bench", "missing.py:f"], "does not exist"),
        (["bench", f"{WL}:broken_factory"], "the factory itself is broken"),
        (["bench", f"{WL}:mismatch", "--device", "cpu"], "do not run through the model"),
        (["bench", "simple", "--device", "cpu", "--replicas", "0"], "1 or more instances"),
    ],
)
def test_bad_input_exits_2_with_a_message(args, expect, tmp_path):
    proc = kiln(*args, "--out", str(tmp_path / "run"), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert expect in proc.stderr
    assert "Traceback" not in proc.stderr


def test_device_cuda_without_a_gpu_exits_2():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = kiln("bench", "simple", "--device", "cuda")
    assert proc.returncode == 2
    assert "no CUDA GPU" in proc.stderr


def test_lists_come_from_the_registries():
    proc = kiln("variants")
    assert proc.returncode == 0
    assert "inductor" in proc.stdout and "mode=default" in proc.stdout
    assert "+channels_last" in proc.stdout
    # Each parameter's allowed values, read from the backend's own check.
    assert "mode: default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs" in (
        proc.stdout
    )
    proc = kiln("workloads")
    assert all(name in proc.stdout for name in ("simple", "resnet50", "bert-base"))


@pytest.mark.parametrize(
    "command, target, says",
    [
        (["tune", "--device", "cpu"], "torchkiln.tune.pipeline", "same --out, reuses them"),
        (
            ["bench", "simple", "--device", "cpu", "--out", "kiln-runs/b"],
            "torchkiln.api",
            "--resume kiln-runs/b",
        ),
    ],
)
def test_a_ctrl_c_exits_130_saying_how_to_go_on(command, target, says, monkeypatch, capsys):
    import importlib

    from torchkiln import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    # The command's own entry (tune, bench), named by the module the CLI calls it from.
    monkeypatch.setattr(importlib.import_module(target), command[0], interrupted)
    assert cli.main(command) == 130
    err = capsys.readouterr().err
    assert "interrupted; finished trials are saved in the run directory" in err and says in err


def test_the_tune_console_gathers_deferrals_and_second_turn_skips_into_one_line_each():
    import io

    from rich.console import Console

    from torchkiln.cli import _TuneProgress

    sink = io.StringIO()
    progress = _TuneProgress(Console(file=sink, width=400, color_system=None))
    room = "would not fit the budget (estimated {} s, 12 s left after the time kept for ...)"
    progress.deferred("inductor", room.format(41) + "; tried again when the queue is empty")
    progress.deferred("cudagraphs", room.format(31) + "; tried again when the queue is empty")
    progress.stage("search", "inductor:fullgraph=true (of 6)", 62.0)
    progress.skipped("inductor", room.format(30))
    progress.skipped("cudagraphs", room.format(24))
    progress.skipped("x vs y", "would not fit [the budget]")  # not deferred: its own line
    progress.flush()
    lines = sink.getvalue().splitlines()
    assert lines == [
        "  deferred to a second turn (not fitting what is left yet): inductor (~41 s), "
        "cudagraphs (~31 s); 12 s left",
        "search inductor:fullgraph=true (of 6)  (62 s left)",
        "  skipped at their second turn (still not fitting): inductor (~30 s), cudagraphs "
        "(~24 s); 12 s left",
        "  skipped x vs y: would not fit [the budget]",
    ]
