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
