"""The fixed costs of a tune (fp64 reference, FLOP count) paid once per workload: a second trial
of the same workload reads them from the run directory, a changed workload file, preset or
device computes them again, and a damaged stored file is recomputed with a note."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchkiln.runner.protocol.trial import PREPAY, TrialSpec, base_result
from torchkiln.runner.store.fixed import FixedStore, fixed_dir_for, workload_key

FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 1, "min_reps": 3}

WORKLOAD = """
import torch
from torch import nn


def mlp(batch_size=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, (torch.randn(batch_size or 4, 8),)


def cnn(batch_size=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    return model, (torch.randn(batch_size or 2, 3, 8, 8),)


# Writes a variable into the process as it runs, as a compile writes Inductor's default cache
# directory or the path of its bundled ptxas.
class WritesTheEnvironment(nn.Module):

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)
        self.calls = 0

    def forward(self, x):
        import os

        self.calls += 1
        os.environ["TORCH_WRITTEN_AS_IT_RUNS"] = str(self.calls)
        return self.linear(x)


def writer(batch_size=None):
    torch.manual_seed(0)
    return WritesTheEnvironment(), (torch.randn(batch_size or 4, 8),)
"""


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "wl.py"
    path.write_text(WORKLOAD)
    return path


def measure(
    workload: Path, fixed: Path, variant: str = "eager+bf16", factory: str = "mlp", **fields
) -> dict:
    """One trial in-process (the worker's path, less the process), sharing ``fixed``."""
    from torchkiln.runner.protocol.measure_trial import measure_trial
    from torchkiln.runner.protocol.worker import Phases

    spec = TrialSpec(
        workload=f"{workload}:{factory}",
        variant=variant,
        **{"count_kernels": False, "bracket": False, **FAST, **fields},
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
    assert first["fixed_store"] == second["fixed_store"]  # the folder both used
    assert (fixed / first["fixed_store"]).is_dir()
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


def test_a_tunes_baseline_pays_the_searchs_fixed_costs_ahead(workload, tmp_path):
    fixed = tmp_path / "run" / "fixed"
    pairs = [["bf16", False], ["bf16", True], ["fp32", True]]
    base = measure(workload, fixed, variant="eager", extra={PREPAY: pairs})
    # Its own first; then bf16's; channels-last only for a model with convolutions.
    assert base["fixed_costs"] == {**COMPUTED, "paid_ahead": [["bf16", False]]}
    assert measure(workload, fixed)["fixed_costs"] == REUSED  # eager+bf16 computes nothing
    conv = measure(workload, fixed, variant="eager", factory="cnn", extra={PREPAY: pairs})
    assert conv["fixed_costs"]["paid_ahead"] == pairs
    for variant in ("eager+bf16", "eager+channels_last", "eager+bf16+channels_last"):
        assert measure(workload, fixed, variant=variant, factory="cnn")["fixed_costs"] == REUSED
    # The same values as a trial computes for itself.
    alone = measure(workload, tmp_path / "other" / "fixed", variant="eager+bf16", factory="cnn")
    paid = measure(workload, fixed, variant="eager+bf16", factory="cnn")
    assert paid["flops_per_step"] == alone["flops_per_step"]
    assert paid["correctness"] == alone["correctness"]


def test_without_a_store_nothing_is_paid_ahead(workload):
    base = measure(workload, None, variant="eager", extra={PREPAY: [["bf16", False]]})
    assert "paid_ahead" not in base["fixed_costs"] and "fixed_store" not in base
    assert base["fixed_costs"]["computed"] == ["flops", "fp64_reference", "eager_error"]


def test_variables_written_as_the_trial_runs_do_not_key_the_store_apart(
    workload, tmp_path, monkeypatch
):
    fixed = tmp_path / "run" / "fixed"
    monkeypatch.delenv("TORCH_WRITTEN_AS_IT_RUNS", raising=False)
    first = measure(workload, fixed, factory="writer")
    assert first["fixed_costs"] == COMPUTED
    # Launched as the first was: without the variable, which its own steps write again.
    monkeypatch.delenv("TORCH_WRITTEN_AS_IT_RUNS")
    assert measure(workload, fixed, factory="writer")["fixed_costs"] == REUSED


def _store_in_process(root: str, log: str, out: str) -> None:
    import json

    from torchkiln.runner.store.fixed import FixedStore

    store = FixedStore(Path(root), {"workload": "w"})
    value = store.get_or_compute("flops", {"precision": "fp32"}, lambda: _slow(log))
    Path(out).write_text(json.dumps({"value": value, **store.record()}))


def _slow(log: str) -> int:
    import time

    with open(log, "a") as f:
        f.write("computed\n")
    time.sleep(1.0)  # long enough for the other process to ask while this one computes
    return 42


def test_trials_in_flight_together_compute_a_value_once(tmp_path):
    import json
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    log = tmp_path / "log"
    outs = [tmp_path / f"out{i}.json" for i in range(2)]
    procs = [
        ctx.Process(target=_store_in_process, args=(str(tmp_path / "fixed"), str(log), str(o)))
        for o in outs
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert log.read_text().splitlines() == ["computed"]
    docs = [json.loads(o.read_text()) for o in outs]
    assert [d["value"] for d in docs] == [42, 42]
    assert sorted(d["computed"] + d["reused"] for d in docs) == [["flops"], ["flops"]]
    assert sorted(len(d["computed"]) for d in docs) == [0, 1]


def test_the_baselines_kernel_count_is_counted_once_per_workload(workload, tmp_path, monkeypatch):
    """Where kernels are counted (CUDA; the profiler stands in here), the baseline's count is a
    fixed cost: the second trial reads it, and counts only its own variant's."""
    from torchkiln.runner.protocol import measure_trial

    counted: list[str] = []

    def count(step, steps, device):
        counted.append(device)
        return 7.0

    monkeypatch.setattr(measure_trial, "counts_kernels", lambda device: True)
    monkeypatch.setattr(measure_trial, "kernels_per_step", count)
    fixed = tmp_path / "run" / "fixed"
    first = measure(workload, fixed, count_kernels=True)
    second = measure(workload, fixed, count_kernels=True)
    assert len(counted) == 3  # the first trial's two counts, the second trial's own
    assert first["baseline_kernels_per_step"] == second["baseline_kernels_per_step"] == 7.0
    assert "baseline_kernels" in first["fixed_costs"]["computed"]
    assert "baseline_kernels" in second["fixed_costs"]["reused"]
