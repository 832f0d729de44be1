"""Trial processes see the caller's import path: a model module beside the user's script."""

from __future__ import annotations

import os

import pytest

from torchkiln.runner.launch.import_path import caller_path
from torchkiln.runner.launch.trial_process import run_trial
from torchkiln.runner.protocol.trial import TrialSpec

FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 1}
MODULE = """
import torch


def factory():
    return torch.nn.Linear(8, 4), (torch.randn(2, 8),)
"""


def test_the_callers_path_comes_first_then_pythonpath(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    parts = caller_path("/elsewhere").split(os.pathsep)
    assert parts[0] == str(tmp_path.resolve()) and parts[-1] == "/elsewhere"


@pytest.mark.slow
def test_a_module_beside_the_callers_script_imports_in_the_trial(tmp_path, monkeypatch):
    beside = tmp_path / "script_dir"
    beside.mkdir()
    (beside / "kiln_model_beside.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(beside))  # as Python does for the script's own directory
    assert str(beside) not in os.environ.get("PYTHONPATH", "")
    spec = TrialSpec(workload="kiln_model_beside:factory", variant="eager", **FAST)
    result = run_trial(spec, tmp_path / "trial", timeout_s=120)
    assert result["status"] == "ok", result.get("reason")
