"""The tune's graph-break evidence: a failed capture is an unknown count, never zero breaks."""

from __future__ import annotations

from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.tune import evidence


def _spec() -> TrialSpec:
    return TrialSpec(workload="simple", variant="eager", step="infer", device="cpu", preset="tiny")


def test_a_failed_capture_phase_leaves_the_break_count_unknown(monkeypatch):
    report = {
        "status": "phase-error",
        "error": "capture: timed out",
        "phases": {"capture": {"status": "error", "error": "timed out"}},
        "breaks": [],
    }
    monkeypatch.setattr("torchkiln.diagnose.explain.explain", lambda *a, **k: report)
    found = evidence.graph_breaks(_spec(), timeout_s=5.0)
    assert found["breaks"] is None
    assert found["reason"] == "capture: timed out"


def test_a_later_phase_failing_keeps_the_captured_breaks(monkeypatch):
    brk = {"file": "m.py", "line": 3, "source": "x.item()", "category": "item", "fix": "f"}
    report = {
        "status": "phase-error",
        "error": "recompiles: boom",
        "phases": {"capture": {"status": "ok"}, "recompiles": {"status": "error"}},
        "breaks": [brk],
        "graphs": {"count": 2, "captured_share": 0.5},
    }
    monkeypatch.setattr("torchkiln.diagnose.explain.explain", lambda *a, **k: report)
    found = evidence.graph_breaks(_spec(), timeout_s=5.0)
    assert found["breaks"] == 1
    assert found["graphs"] == 2


def test_the_model_facts_come_from_the_eager_trial_without_a_build_here(monkeypatch):
    def no_build(*a, **k):
        raise AssertionError("the tune's own process built the workload")

    monkeypatch.setattr("torchkiln.workloads.load_workload", no_build)
    spec = TrialSpec(workload="simple", variant="eager", preset="tiny", device="cpu")
    eager = {"model_facts": {"convolutional": True, "repeated_blocks": False}}
    assert evidence.model_facts(spec, eager) == (True, False)


def test_an_eager_trial_reads_the_model_facts_a_build_here_would(tmp_path):
    """The eager trial's facts equal those of a build in this process (the fallback for a
    reused result that lacks them)."""
    from torchkiln.runner.launch.trial_process import run_trial

    for workload in ("simple", "zoo-encoder"):
        spec = TrialSpec(workload=workload, variant="eager", preset="tiny", device="cpu")
        got = run_trial(spec, tmp_path / workload, timeout_s=300)
        assert got["status"] == "ok", got.get("reason")
        want = evidence.model_facts(spec)
        assert (got["model_facts"]["convolutional"], got["model_facts"]["repeated_blocks"]) == want
