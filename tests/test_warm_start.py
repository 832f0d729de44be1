"""Trials forked from the warm-start server: the same result as a spawned trial, and a crash,
hang or memory-cap breach ends only its own trial."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchkiln.api import run_trials
from torchkiln.runner.launch import warm
from torchkiln.runner.launch.trial_process import run_trial
from torchkiln.runner.protocol.trial import TrialSpec

FIX = Path(__file__).parent / "fixtures"
WL = FIX / "workloads.py"
WARM_WL = FIX / "warm_workloads.py"
FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 1}


def _spec(workload: str, index: int = 0) -> TrialSpec:
    return TrialSpec(workload=workload, variant="eager", index=index, **FAST)


@pytest.mark.slow
def test_a_warm_trial_reports_what_a_cold_one_does(tmp_path, monkeypatch):
    monkeypatch.delenv(warm.WARM_ENV, raising=False)
    spec = _spec(f"{WL}:tiny_mlp")
    cold = run_trial(spec, tmp_path / "cold", timeout_s=120)
    with warm.scoped():
        hot = run_trial(spec, tmp_path / "warm", timeout_s=120)
    assert (cold["start"], hot["start"]) == ("cold", "warm")
    assert "no warm-start server" in cold["start_reason"] and "start_reason" not in hot
    assert cold["status"] == hot["status"] == "ok"
    assert set(cold) - {"start_reason"} == set(hot)
    for key in ("settings", "correctness", "changes_numerics", "flops_per_step", "phase"):
        assert cold[key] == hot[key], key
    assert hot["start_s"] >= 0 and cold["start_s"] >= 0


@pytest.mark.slow
def test_a_segfault_a_hang_and_a_memory_cap_end_only_their_own_trials(tmp_path, monkeypatch):
    monkeypatch.delenv(warm.WARM_ENV, raising=False)
    specs = [
        _spec(f"{WARM_WL}:segfaults", 0),
        _spec(f"{WL}:hangs", 1),
        _spec(f"{WARM_WL}:over_memory", 2),
        _spec(f"{WL}:tiny_mlp", 3),  # after the others: the server they forked from is intact
    ]
    results = run_trials(specs, tmp_path, timeout_s=20)
    by_wl = {r["workload"].split(":")[-1]: r for r in results}
    assert [r["start"] for r in results] == ["warm"] * 4, [r.get("start_reason") for r in results]
    assert by_wl["segfaults"]["status"] == "crashed"
    assert "killed by SIGSEGV during " in by_wl["segfaults"]["reason"]
    assert by_wl["hangs"]["status"] == "timeout"
    assert "no result after 20 s" in by_wl["hangs"]["reason"]
    assert by_wl["over_memory"]["status"] == "oom", by_wl["over_memory"]["reason"]
    assert by_wl["tiny_mlp"]["status"] == "ok"
    assert by_wl["tiny_mlp"]["steady_ms"]["median"] > 0
    # Each trial's process group was ended with it: nothing of theirs is left running.
    assert warm._active is None


def test_warm_start_off_spawns_cold_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv(warm.WARM_ENV, "0")
    with warm.scoped():
        (r,) = run_trials([_spec(f"{WL}:tiny_mlp")], tmp_path, timeout_s=120)
    assert r["start"] == "cold"
    assert r["start_reason"] == "KILN_WARM_START=0"
    assert r["status"] == "ok"


def test_a_server_that_cannot_start_falls_back_to_cold_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.delenv(warm.WARM_ENV, raising=False)
    # The server's command fails at once (no such module): the trial still runs, spawned.
    monkeypatch.setattr(warm, "SERVER_MODULE", "torchkiln.no_such_module")
    with warm.scoped():
        (r,) = run_trials([_spec(f"{WL}:tiny_mlp")], tmp_path, timeout_s=120)
    assert r["start"] == "cold"
    assert "the warm-start server exited (code 1)" in r["start_reason"]
    assert "No module named torchkiln.no_such_module" in r["start_reason"]
    assert r["status"] == "ok"


@pytest.mark.slow
def test_a_changed_import_time_variable_gets_a_server_of_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv(warm.WARM_ENV, raising=False)
    monkeypatch.delenv("KMP_INIT_AT_FORK", raising=False)
    with warm.scoped():
        first = run_trial(_spec(f"{WL}:tiny_mlp"), tmp_path / "a", timeout_s=120)
        # Set in kiln's own process after the first trial started, as a library it imports may.
        monkeypatch.setenv("KMP_INIT_AT_FORK", "FALSE")
        second = run_trial(_spec(f"{WL}:tiny_mlp", 1), tmp_path / "b", timeout_s=120)
        third = run_trial(_spec(f"{WL}:tiny_mlp", 2), tmp_path / "c", timeout_s=120)
        servers = list(warm._active.servers)
    assert [r["start"] for r in (first, second, third)] == ["warm"] * 3
    assert len(servers) == 2
    assert "KMP_INIT_AT_FORK" not in servers[0].env
    assert servers[1].env["KMP_INIT_AT_FORK"] == "FALSE"
    assert all(r["status"] == "ok" for r in (first, second, third))
    # One build of the workload in each trial process; every further arm is a copy of it.
    assert first["builds"]["built"] == 1 and first["builds"]["copied"] >= 2


@pytest.mark.slow
def test_a_built_in_workload_is_built_once_in_the_server_and_copied_by_its_trials(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(warm.WARM_ENV, raising=False)
    spec = TrialSpec(workload="simple", variant="eager", preset="tiny", **FAST)
    cold = run_trial(spec, tmp_path / "cold", timeout_s=120)
    with warm.scoped():
        hot = [
            run_trial(TrialSpec(**{**spec.__dict__, "index": i}), tmp_path / f"w{i}", timeout_s=120)
            for i in (1, 2)
        ]
    assert cold["builds"]["built"] == 1 and "built_by_server" not in cold["builds"]
    for r in hot:
        assert r["start"] == "warm" and r["status"] == "ok"
        assert r["builds"]["built"] == 0 and r["builds"]["built_by_server"] is True
        assert r["builds"]["copied"] >= 3
        # The same weights and inputs as a fresh build: the same outputs, so the same errors.
        assert r["correctness"] == cold["correctness"]
        assert r["flops_per_step"] == cold["flops_per_step"]


@pytest.mark.slow
def test_an_inference_tunes_preflight_and_trials_share_one_build(tmp_path, monkeypatch):
    from torchkiln.runner.launch.trial_process import preflight

    monkeypatch.delenv(warm.WARM_ENV, raising=False)
    spec = TrialSpec(workload="simple", variant="eager", preset="tiny", step="infer", **FAST)
    with warm.scoped():
        check = preflight(spec, tmp_path / "preflight", 120)
        trial = run_trial(spec, tmp_path / "t", timeout_s=120)
    assert check["ok"], check
    assert check["builds"]["built"] == 0 and check["builds"]["built_by_server"] is True
    assert trial["start"] == "warm" and trial["builds"]["built"] == 0


def test_only_a_built_in_trial_asks_the_server_to_build_ahead(tmp_path):
    spec = TrialSpec(workload="simple", variant="eager", preset="tiny", step="train")
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    asked = warm.prebuild_request(["trial", str(path), "r", "p"])
    assert asked == {"workload": "simple", "preset": "tiny", "batch_size": None,
                     "step": "train", "seed": 0}  # fmt: skip
    # A preflight builds for inference: it shares an inference tune's build, not a training one's.
    assert warm.prebuild_request(["preflight", str(path), "r", "p"]) is None
    path.write_text(TrialSpec(**{**spec.__dict__, "step": "infer"}).to_json())
    assert warm.prebuild_request(["preflight", str(path), "r", "p"])["step"] == "infer"
    path.write_text(TrialSpec(**{**spec.__dict__, "workload": f"{WL}:tiny_mlp"}).to_json())
    assert warm.prebuild_request(["trial", str(path), "r", "p"]) is None


def test_the_servers_imports_and_build_ahead_leave_children_that_can_use_cuda(tmp_path):
    """A CUDA build of torch marks the children of a process that has counted its devices (as
    torch.cuda.is_available does) as unable to initialise CUDA: the server's imports and build
    ahead must not count them, nor start a thread. Checked in a fresh interpreter, with a fork
    after them."""
    import subprocess
    import sys

    code = (
        "import os, torch\n"
        "from torchkiln.runner.launch import warm_server\n"
        "import threading\n"
        "warm_server.preload()\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "warm_server.prebuild({'workload': 'simple', 'preset': 'tiny', 'batch_size': None,\n"
        "                      'step': 'train', 'seed': 0})\n"
        "from torchkiln.runner.protocol import workload_copies\n"
        "assert workload_copies._kept, 'nothing was built ahead'\n"
        "print('children can use CUDA', warm_server.forks_can_use_cuda())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "children can use CUDA True" in out.stdout


def test_the_server_finds_out_when_its_children_could_not_use_cuda():
    import subprocess
    import sys

    import torch

    if torch.version.cuda is None:
        pytest.skip("a CPU-only build of torch never marks its children")

    code = (
        "import os, torch\n"
        "os.environ.pop('PYTORCH_NVML_BASED_CUDA_CHECK', None)\n"
        "from torchkiln.runner.launch import warm_server\n"
        "print(warm_server.forks_are_marked())\n"
        "torch.cuda.is_available()  # counts the devices (a CUDA build of torch)\n"
        "print(warm_server.forks_are_marked())\n"
        "print(warm_server.forks_can_use_cuda(), torch.cuda.device_count() == 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    # Marked; and on a host without a GPU the marked forks lose nothing (no device to use),
    # while on a GPU host they could not use its devices.
    before, after, can_use, no_device = out.stdout.split()
    assert (before, after) == ("False", "True"), out.stderr[-2000:]
    assert can_use == no_device
