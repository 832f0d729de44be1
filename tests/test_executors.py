"""Trial executors: local, pool and Ray run the same sweep into the same run directory, each
result streaming in as it finishes; a worker killed mid-trial costs only its own trial."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from torchkiln.errors import KilnUserError
from torchkiln.runner.executors import (
    LocalExecutor,
    PoolExecutor,
    cpu_shares,
    make_executor,
)
from torchkiln.runner.launch import run_trial
from torchkiln.runner.trial import TrialSpec

MLP = "tests/fixtures/workloads.py:tiny_mlp"
KILLABLE = "tests/fixtures/dist_workloads.py:waits_to_be_killed"
FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 2, "check_accuracy": False}


def fake_run_one(spec: TrialSpec, gpu: int | None, **share: object) -> dict:
    if spec.variant == "boom":
        raise OSError("disk full")
    time.sleep(0.05 * (3 - spec.index))  # later trials finish first
    return {"id": spec.id, "variant": spec.variant, "status": "ok", "gpu_index": gpu}


def fake_specs() -> list[TrialSpec]:
    return [TrialSpec("w", v, index=i) for i, v in enumerate(["a", "boom", "c", "d"])]


@pytest.mark.parametrize("executor", [LocalExecutor(), PoolExecutor(slots=[0, 1])])
def test_results_stream_in_and_a_failing_runner_costs_one_trial(executor):
    seen, started = [], []
    results = executor.run(
        fake_specs(),
        fake_run_one,
        on_start=lambda s: started.append(s.id),
        on_result=lambda s, r: seen.append((s.id, r["status"])),
    )
    assert [r["variant"] for r in results] == ["a", "boom", "c", "d"]  # spec order
    assert [r["status"] for r in results] == ["ok", "crashed", "ok", "ok"]
    assert "OSError: disk full" in results[1]["reason"]
    assert sorted(seen) == sorted((r["id"], r["status"]) for r in results)
    assert sorted(started) == sorted(r["id"] for r in results)
    if isinstance(executor, PoolExecutor):
        # two slots: "c" (index 2) started after a or boom freed a slot, and finished first
        assert {r["gpu_index"] for r in results if r["status"] == "ok"} <= {0, 1}
    else:
        assert [s for s, _ in seen] == [r["id"] for r in results]


def test_make_executor_checks_its_options():
    assert isinstance(make_executor("local"), LocalExecutor)
    with pytest.raises(KilnUserError, match=r"choose from \['local', 'pool', 'ray'\]"):
        make_executor("slurm")
    with pytest.raises(KilnUserError, match="--address is for --executor ray"):
        make_executor("local", address="auto")


def test_make_executor_ray_asks_for_one_gpu_per_trial_on_gpu_machines():
    pytest.importorskip("ray", reason="the 'ray' extra is not installed (pip install ray)")
    ray = make_executor("ray", device="cuda", address="auto")
    assert ray.gpus_per_trial == 1 and ray.address == "auto"
    assert make_executor("ray", device="cpu").gpus_per_trial == 0


def test_make_executor_ray_without_ray_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    with pytest.raises(KilnUserError, match=r"pip install 'torchkiln\[ray\]'"):
        make_executor("ray")


def test_pool_without_gpus_says_so(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(KilnUserError, match="one trial per visible GPU"):
        PoolExecutor()


def test_a_trial_process_killed_mid_trial_is_reported_and_the_others_kept(tmp_path, monkeypatch):
    pidfile = tmp_path / "pid"
    monkeypatch.setenv("KILN_TEST_PIDFILE", str(pidfile))
    specs = [
        TrialSpec(MLP, "eager", preset="tiny", index=0, **FAST),
        TrialSpec(KILLABLE, "eager", preset="tiny", index=1, **FAST),
        TrialSpec(MLP, "eager+bf16", preset="tiny", index=2, **FAST),
    ]

    def kill_when_ready() -> None:
        deadline = time.monotonic() + 90
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)

    killer = threading.Thread(target=kill_when_ready)
    killer.start()
    streamed = {}

    def run_one(spec, gpu, cpus=None, host_lock=None):
        # The pool's lock file too: a trial killed while holding it must not stall the others
        # (the kernel drops a dead process's flock).
        assert host_lock is not None
        return run_trial(spec, tmp_path / spec.id, timeout_s=120, cpus=cpus, host_lock=host_lock)

    results = PoolExecutor(slots=[None, None]).run(
        specs, run_one, on_result=lambda s, r: streamed.__setitem__(s.id, r["status"])
    )
    killer.join()
    assert [r["status"] for r in results] == ["ok", "crashed", "ok"]
    assert "killed by SIGKILL" in results[1]["reason"]
    assert streamed == {"00-eager": "ok", "01-eager": "crashed", "02-eager_bf16": "ok"}


def test_cpu_shares_split_whole_physical_cores():
    # Two SMT threads per core (siblings numbered 16 apart, as on many hosts): a share never
    # splits a core, so two trials never run on the two threads of one core.
    cores = [[0, 16], [1, 17], [2, 18], [3, 19]]
    assert cpu_shares(2, cores) == [[0, 16, 1, 17], [2, 18, 3, 19]]
    assert cpu_shares(3, cores) == [[0, 16], [1, 17], [2, 18, 3, 19]]
    assert cpu_shares(1, cores) == [[0, 16, 1, 17, 2, 18, 3, 19]]
    assert cpu_shares(5, cores) is None  # fewer cores than trials: no partition at all


def test_pool_slots_get_disjoint_cpus_and_each_trial_its_slots(monkeypatch):
    import torchkiln.runner.executors as ex

    monkeypatch.setattr(ex, "cpu_shares", lambda n: [[0, 1], [2, 3]][:n])
    pool = PoolExecutor(slots=[0, 1])
    assert pool.describe()["cpus"] == [[0, 1], [2, 3]]
    seen = {}

    locks = set()

    def run_one(spec, gpu, cpus=None, host_lock=None):
        seen[spec.variant] = (gpu, cpus)
        locks.add(host_lock)
        return {"variant": spec.variant, "status": "ok"}

    pool.run([TrialSpec("w", v, index=i) for i, v in enumerate("abcd")], run_one)
    assert {gpu: cpus for gpu, cpus in seen.values()} == {0: [0, 1], 1: [2, 3]}
    # One lock file for the whole pool, removed when the pool is done.
    (lock,) = locks
    assert lock and not os.path.exists(lock)
    # A host with fewer cores than slots: trials still run, unpinned.
    monkeypatch.setattr(ex, "cpu_shares", lambda n: None)
    assert PoolExecutor(slots=[0, 1]).cpus == [None, None]


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs CPU affinity (Linux)")
def test_a_trial_given_cpus_runs_on_them_with_as_many_threads(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    spec = TrialSpec(MLP, "eager", preset="tiny", index=0, **FAST)
    result = run_trial(spec, tmp_path / "t", timeout_s=120, cpus=[cpu])
    assert result["status"] == "ok", result.get("reason")
    assert result["cpus"] == [cpu]
    assert result["settings"]["threads"] == 1  # OMP_NUM_THREADS held to the share
    # The worker pins itself before anything else: a child given the variable runs there.
    code = (
        "import os; from torchkiln.runner.worker import pin_cpus; pin_cpus(); "
        "print(sorted(os.sched_getaffinity(0)))"
    )
    env = {**os.environ, "KILN_TRIAL_CPUS": str(cpu)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == f"[{cpu}]", out.stderr
