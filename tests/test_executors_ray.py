"""The Ray executor on a local 2-CPU Ray cluster: the same 4-trial sweep as the local executor,
with the same results in the run directory; a Ray worker killed mid-trial costs only that trial.
Skipped, saying so, where the 'ray' extra is not installed."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from torchkiln.api import bench
from torchkiln.runner.launch.executors import LocalExecutor, RayExecutor
from torchkiln.runner.protocol.trial import TrialSpec

ray = pytest.importorskip("ray", reason="the 'ray' extra is not installed (pip install ray)")

MLP = "tests/fixtures/workloads.py:tiny_mlp"
SWEEP = ["eager", "eager+bf16", "eager+channels_last", "eager+tf32"]
FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 2, "check_accuracy": False}


def _sweep(tmp_path: Path, executor, name: str) -> dict:
    return bench(
        MLP,
        SWEEP,
        step="infer",
        preset="tiny",
        out=tmp_path / name,
        timeout_s=120,
        spec_overrides=FAST,
        executor=executor,
    )


def _same_results(a: dict, b: dict) -> None:
    key = [(t["id"], t["variant"], t["status"]) for t in a["trials"]]
    assert key == [(t["id"], t["variant"], t["status"]) for t in b["trials"]]
    for doc in (a, b):
        manifest = json.loads(Path(doc["run_dir"], "manifest.json").read_text())
        assert [t["status"] for t in manifest["trials"]] == [t["status"] for t in doc["trials"]]
        for t in doc["trials"]:
            saved = json.loads(Path(doc["run_dir"], "trials", t["id"], "result.json").read_text())
            assert saved["status"] == t["status"] and saved["variant"] == t["variant"]


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    return _sweep(tmp_path_factory.mktemp("local"), LocalExecutor(), "local")


def test_local_sweep_writes_every_trial(local_sweep):
    assert [t["variant"] for t in local_sweep["trials"]] == SWEEP
    assert local_sweep["executor"] == {"name": "local"}
    assert all(t["status"] in ("ok", "unsupported") for t in local_sweep["trials"])
    assert local_sweep["trials"][0]["status"] == "ok"


@pytest.fixture(scope="module")
def ray_cluster():
    # A local Ray cluster of 2 CPUs, started once; the executor leaves it running when it finds
    # one already up.
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_sweep_writes_the_same_results_as_local(tmp_path, ray_cluster, local_sweep):
    doc = _sweep(tmp_path, RayExecutor(), "ray")
    assert doc["executor"]["name"] == "ray"
    _same_results(local_sweep, doc)
    assert all(any("ran on Ray node" in n for n in t["notes"]) for t in doc["trials"])


def fake_specs() -> list[TrialSpec]:
    return [TrialSpec("w", v, index=i) for i, v in enumerate(["a", "boom", "c", "d"])]


def _dies_on_boom(spec: TrialSpec, gpu: int | None) -> dict:
    if spec.variant == "boom":
        os.kill(os.getpid(), signal.SIGKILL)  # the Ray worker process itself
    return {"id": spec.id, "variant": spec.variant, "status": "ok", "notes": []}


def test_a_lost_ray_worker_loses_only_its_trial(ray_cluster):
    streamed = []
    results = RayExecutor(retries=1).run(
        fake_specs(), _dies_on_boom, on_result=lambda s, r: streamed.append(s.id)
    )
    assert [r["status"] for r in results] == ["ok", "crashed", "ok", "ok"]
    assert "the Ray worker running the trial was lost after 2 attempt(s)" in results[1]["reason"]
    assert sorted(streamed) == sorted(r["id"] for r in results)
