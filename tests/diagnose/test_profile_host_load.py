"""`kiln profile` warns about a busy host, as bench and tune do."""

from __future__ import annotations

from pathlib import Path

from torchkiln.diagnose import profile_worker
from torchkiln.measure import host_load

FIXTURES = Path(__file__).parent / "fixtures"


def _profile_in_process(tmp_path, monkeypatch, loadavg):
    monkeypatch.setattr(host_load, "snapshot", lambda: {"loadavg": loadavg, "cpus": 2})
    req = {
        "workload": f"{FIXTURES / 'sleepy_loader.py'}:build",
        "variant": "eager",
        "step": "infer",
        "device": "cpu",
        "preset": "tiny",
        "batch_size": None,
        "steps": 2,
        "with_loader": False,
        "count_flops": False,
        "trace_path": str(tmp_path / "trace.json"),
    }
    return profile_worker.run(req, tmp_path / "result.json")


def test_a_busy_host_is_a_note_of_the_verdict(tmp_path, monkeypatch):
    doc = _profile_in_process(tmp_path, monkeypatch, [40.0, 30.0, 20.0])
    assert doc["status"] == "ok", doc.get("error")
    assert doc["host_load"]["after"]["loadavg"][0] == 40.0
    assert any("host busy" in n for n in doc["verdict"]["notes"])


def test_a_quiet_host_adds_no_note(tmp_path, monkeypatch):
    doc = _profile_in_process(tmp_path, monkeypatch, [0.0, 0.0, 0.0])
    assert doc["status"] == "ok", doc.get("error")
    assert not any("host busy" in n for n in doc["verdict"]["notes"])
