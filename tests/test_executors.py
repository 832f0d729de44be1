"""Trial executors: local, pool and Ray run the same sweep into the same run directory, each
result streaming in as it finishes; a worker killed mid-trial costs only its own trial."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from torchkiln.errors import KilnUserError
from torchkiln.runner.launch.executors import (
    LocalExecutor,
    PoolExecutor,
    make_executor,
)
from torchkiln.runner.launch.trial_process import run_trial
from torchkiln.runner.protocol.trial import TrialSpec

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

    def run_one(spec, gpu, host_lock=None):
        # The pool's lock file too: a trial killed while holding it must not stall the others
        # (the kernel drops a dead process's flock).
        assert host_lock is not None
        return run_trial(spec, tmp_path / spec.id, timeout_s=120, host_lock=host_lock)

    results = PoolExecutor(slots=[None, None]).run(
        specs, run_one, on_result=lambda s, r: streamed.__setitem__(s.id, r["status"])
    )
    killer.join()
    assert [r["status"] for r in results] == ["ok", "crashed", "ok"]
    assert "killed by SIGKILL" in results[1]["reason"]
    assert streamed == {"00-eager": "ok", "01-eager": "crashed", "02-eager_bf16": "ok"}


def test_pool_trials_share_one_lock_file_removed_after():
    seen = {}
    locks = set()

    def run_one(spec, gpu, host_lock=None):
        seen[spec.variant] = gpu
        locks.add(host_lock)
        return {"variant": spec.variant, "status": "ok"}

    specs = [TrialSpec("w", v, index=i) for i, v in enumerate("abcd")]
    PoolExecutor(slots=[0, 1]).run(specs, run_one)
    assert set(seen.values()) == {0, 1}
    (lock,) = locks  # one lock file for the whole pool, removed when the pool is done
    assert lock and not os.path.exists(lock)
    # A pool of one slot has nobody to take turns with.
    locks.clear()
    PoolExecutor(slots=[0]).run([TrialSpec("w", "a")], run_one)
    assert locks == {None}
