"""`kiln profile` on a CUDA device (marked `gpu`: skipped where there is none). These check the
assumptions the trace parser makes about a real CUDA export: kernels linked to their launches
by correlation id, CUDA-graph replays with their kernels, the idle split covering the window."""

from __future__ import annotations

import pytest

from torchkiln.diagnose.profile import run_profile
from torchkiln.diagnose.verdict import KINDS

pytestmark = pytest.mark.gpu


def _check_gpu_metrics(doc: dict) -> dict:
    assert doc["status"] == "ok", doc.get("error")
    assert doc["verdict"]["kind"] in KINDS
    gpu = doc["metrics"]["gpu"]
    assert gpu is not None, "a CUDA run must produce a device timeline"
    assert gpu["kernels_per_step"] > 0
    assert 0.0 < gpu["busy_share"] <= 1.0
    assert gpu["busy_share"] + sum(gpu["idle"].values()) == pytest.approx(1.0, abs=1e-6)
    assert gpu["idle"]["unattributed"] < 0.05, "kernels should be linked to their launches"
    assert doc["metrics"]["unavailable"] == []
    return gpu


def test_eager_cuda_profile_links_kernels_to_launches() -> None:
    doc = run_profile("simple", variant="eager", device="cuda", preset="tiny", steps=3)
    gpu = _check_gpu_metrics(doc)
    assert gpu["launch"]["calls_per_step"] >= gpu["kernels_per_step"] * 0.9
    assert gpu["launch"]["mean_queue_us"] is not None
    # Tiny eager inference on a big GPU is the textbook launch-bound case.
    assert doc["verdict"]["kind"] == "host/launch-bound"


def test_cuda_graph_replays_keep_their_kernels() -> None:
    doc = run_profile(
        "simple", variant="inductor:mode=reduce-overhead", device="cuda", preset="tiny", steps=3
    )
    gpu = _check_gpu_metrics(doc)
    assert gpu["launch"]["graph_launches_per_step"] >= 1
    assert gpu["launch"]["graph_kernels_per_step"] > 0
    assert gpu["launch"]["graph_kernels_missing"] is False
