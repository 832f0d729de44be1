"""The fixed costs of a tune (fp64 reference, FLOP count) paid once per workload: a second trial
of the same workload reads them from the run directory, a changed workload file, preset or
device computes them again, and a damaged stored file is recomputed with a note."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchkiln.runner.protocol.trial import TrialSpec, base_result
from torchkiln.runner.store.fixed import FixedStore, fixed_dir_for, workload_key

FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 1, "min_reps": 3}

WORKLOAD = """
import torch
from torch import nn


def mlp(batch_size=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, (torch.randn(batch_size or 4, 8),)
"""


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "wl.py"
    path.write_text(WORKLOAD)
    return path


def measure(workload: Path, fixed: Path, variant: str = "eager+bf16", **fields) -> dict:
    """One trial in-process (the worker's path, less the process), sharing ``fixed``."""
    from torchkiln.runner.protocol.measure_trial import measure_trial
    from torchkiln.runner.protocol.worker import Phases

    spec = TrialSpec(
        workload=f"{workload}:mlp",
        variant=variant,
        count_kernels=False,
        bracket=False,
        **{**FAST, **fields},
    )
    result = base_result(spec)
    measure_trial(spec, result, Phases(None), fixed)
    assert result["status"] == "ok", result["reason"]
    return result


COMPUTED = {"reused": [], "computed": ["flops", "fp64_reference", "eager_error"]}
REUSED = {"reused": ["flops", "fp64_reference", "eager_error"], "computed": []}


def test_the_second_trial_of_a_workload_reuses_the_reference_and_the_flops(workload, tmp_path):
    fixed = tmp_path / "run" / "fixed"
    first = measure(workload, fixed)
    second = measure(workload, fixed)
    assert first["fixed_costs"] == COMPUTED
    assert second["fixed_costs"] == REUSED
    # The check reads the same reference, so it reports what the first trial's check did.
    assert second["correctness"] == first["correctness"]
    assert second["flops_per_step"] == first["flops_per_step"] > 0
    # A variant at another precision shares the fp64 reference, not the FLOPs or eager's
    # error at its own precision (each under its own autocast, as without a store).
    other = measure(workload, fixed, variant="eager")
    assert other["fixed_costs"] == {
        "reused": ["fp64_reference"],
        "computed": ["flops", "eager_error"],
    }


def test_an_edited_workload_file_or_another_preset_computes_them_again(workload, tmp_path):
    fixed = tmp_path / "run" / "fixed"
    measure(workload, fixed)
    assert measure(workload, fixed, preset="tiny")["fixed_costs"] == COMPUTED
    workload.write_text(WORKLOAD.replace("nn.Linear(16, 4)", "nn.Linear(16, 5)"))
    edited = measure(workload, fixed)
    assert edited["fixed_costs"] == COMPUTED
    assert [c["name"] for c in edited["correctness"]["checks"]] == ["out"]


def test_the_key_holds_the_device_the_inputs_and_the_settings(workload, tmp_path, monkeypatch):
    import torch

    spec = TrialSpec(workload=f"{workload}:mlp", variant="eager")
    inputs = (torch.ones(4, 8),)
    key = workload_key(spec, None, inputs)
    assert key is not None
    assert workload_key(TrialSpec(**{**spec.__dict__, "device": "cuda"}), None, inputs) != key
    assert workload_key(spec, "NVIDIA H200", inputs) != key
    assert workload_key(spec, None, (torch.zeros(4, 8),)) != key
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "a"))  # per trial: not a setting
    assert workload_key(spec, None, inputs) == key
    monkeypatch.setenv("TORCH_SOMETHING", "1")
    assert workload_key(spec, None, inputs) != key
    # An in-memory model's bytes are not in its spec: never shared.
    assert workload_key(TrialSpec("torchkiln.tune.inmemory:load", "eager"), None, inputs) is None
    assert not FixedStore(tmp_path, None).shared


def test_a_damaged_stored_reference_is_recomputed_with_a_note(workload, tmp_path):
    fixed = tmp_path / "run" / "fixed"
    first = measure(workload, fixed)
    (stored,) = fixed.glob("*/fp64_reference-*.pt")
    stored.write_bytes(b"not a torch file")
    again = measure(workload, fixed)
    assert again["fixed_costs"] == {
        "reused": ["flops", "eager_error"],
        "computed": ["fp64_reference"],
    }
    assert any("fp64_reference" in n and "unreadable" in n for n in again["notes"])
    assert again["correctness"] == first["correctness"]
    # Rewritten whole: the next trial reads it.
    assert measure(workload, fixed)["fixed_costs"] == REUSED


def test_a_stored_reference_made_for_another_key_is_recomputed(workload, tmp_path):
    import torch

    fixed = tmp_path / "run" / "fixed"
    measure(workload, fixed)
    (stored,) = fixed.glob("*/fp64_reference-*.pt")
    data = torch.load(stored, weights_only=True)
    data["key"]["seed"] = 99
    torch.save(data, stored)
    again = measure(workload, fixed)
    assert "fp64_reference" in again["fixed_costs"]["computed"]
    assert any("another key" in n for n in again["notes"])


def test_the_store_lives_in_the_run_directory_of_a_trial(tmp_path):
    assert fixed_dir_for(tmp_path / "run" / "trials" / "01-eager") == tmp_path / "run" / "fixed"
    assert fixed_dir_for(tmp_path / "elsewhere") is None
