"""A finished trial in a run directory is reused only when it was measured the same way
(runner/store/reuse.py): a tune of one workload and step always writes to the same default
directory, so without this a GPU tune would read the CPU tune's eager baseline."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from torchkiln.api import bench
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.runner.store import reuse
from torchkiln.runner.store.rundir import REUSE_KEY, RunDir
from torchkiln.tune import inmemory

FIX = Path(__file__).parent / "fixtures"
WL = FIX / "workloads.py"
FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 1}


def _saved(tmp_path, spec: TrialSpec, with_key: bool = True) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.save_result(spec.id, {"id": spec.id, "status": "ok"}, spec if with_key else None)
    return run


def test_a_result_measured_the_same_way_is_reused(tmp_path):
    spec = TrialSpec(workload="simple", variant="eager", device="cpu")
    done, why = _saved(tmp_path, spec).reusable(spec)
    assert done == {"id": spec.id, "status": "ok"} and why is None


def test_another_device_or_setting_is_measured_again_and_says_why(tmp_path):
    spec = TrialSpec(workload="simple", variant="eager", device="cpu")
    run = _saved(tmp_path, spec)
    done, why = run.reusable(replace(spec, device="cuda"))
    assert done is None and "device 'cpu' -> 'cuda'" in why
    done, why = run.reusable(replace(spec, reps=30, batch_size=8))
    assert done is None and "reps 15 -> 30" in why and "batch_size None -> 8" in why


def test_a_baseline_is_reused_whatever_fixed_costs_it_paid_for_its_search(tmp_path):
    from torchkiln.runner.protocol.trial import PREPAY

    spec = TrialSpec(workload="simple", variant="eager", extra={PREPAY: [["bf16", False]]})
    run = _saved(tmp_path, spec)
    wider = replace(spec, extra={PREPAY: [["bf16", False], ["fp16", False]]})
    assert run.reusable(wider) == ({"id": spec.id, "status": "ok"}, None)
    done, why = run.reusable(replace(spec, extra={**spec.extra, "other": 1}))
    assert done is None and "other" in why


def test_another_kiln_or_torch_is_measured_again(tmp_path, monkeypatch):
    spec = TrialSpec(workload="simple", variant="eager", device="cpu")
    run = _saved(tmp_path, spec)
    installed = reuse._installed()
    monkeypatch.setattr(reuse, "_installed", lambda: {**installed, "torch": "2.99.0"})
    done, why = run.reusable(spec)
    assert done is None and "-> '2.99.0'" in why


def test_another_machine_or_inductor_setting_is_measured_again(tmp_path, monkeypatch):
    spec = TrialSpec(workload="simple", variant="inductor", device="cpu")
    monkeypatch.delenv("TORCHINDUCTOR_MAX_AUTOTUNE", raising=False)
    run = _saved(tmp_path, spec)
    monkeypatch.setattr(reuse.platform, "node", lambda: "another-host")
    done, why = run.reusable(spec)
    assert done is None and "-> 'another-host'" in why
    monkeypatch.undo()
    assert run.reusable(spec)[0] is not None
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    done, why = run.reusable(spec)
    assert done is None and "$TORCHINDUCTOR_MAX_AUTOTUNE None -> '1'" in why
    # Variables that are not settings, or are recorded otherwise, do not count.
    monkeypatch.delenv("TORCHINDUCTOR_MAX_AUTOTUNE")
    monkeypatch.setenv("HOME_OF_SOMETHING_ELSE", "x")
    monkeypatch.setenv(inmemory.ENV, str(tmp_path / "elsewhere.pt"))
    # Where compile caches live: each trial has its own, and Inductor writes its default here
    # the first time this process compiles (a pick applied between two tunes).
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    assert run.reusable(spec)[0] is not None


@pytest.mark.parametrize("status", ["timeout", "crashed", "oom"])
def test_an_outcome_of_the_run_that_ended_it_is_measured_again(tmp_path, status):
    # A timeout set by a 5-minute budget must not stand in a 15-minute tune.
    spec = TrialSpec(workload="simple", variant="inductor:mode=max-autotune", device="cpu")
    run = RunDir(tmp_path / "run")
    run.save_result(spec.id, {"id": spec.id, "status": status}, spec)
    done, why = run.reusable(spec)
    assert done is None and "which a new run may not" in why
    for kept in ("accuracy_fail", "compile_error", "unsupported"):
        run.save_result(spec.id, {"id": spec.id, "status": kept}, spec)
        assert run.reusable(spec)[0] == {"id": spec.id, "status": kept}


def test_a_result_without_its_record_is_not_reused(tmp_path):
    spec = TrialSpec(workload="simple", variant="eager", device="cpu")
    run = _saved(tmp_path, spec, with_key=False)
    assert not (run.trial_dir(spec.id) / REUSE_KEY).exists()
    done, why = run.reusable(spec)
    assert done is None and "no record" in why
    # Saving again without a spec drops an older record: it would describe another result.
    run.save_result(spec.id, {"status": "ok"}, spec)
    run.save_result(spec.id, {"status": "ok"})
    assert run.reusable(spec)[0] is None


def test_an_edited_workload_file_is_measured_again(tmp_path):
    model = tmp_path / "model.py"
    model.write_text("def factory(): ...\n")
    spec = TrialSpec(workload=f"{model}:factory", variant="eager", device="cpu")
    run = _saved(tmp_path, spec)
    assert run.reusable(spec)[0] is not None
    model.write_text("def factory(): return 1\n")
    done, why = run.reusable(spec)
    assert done is None and "workload_file" in why


def test_a_module_workload_is_found_without_importing_it(tmp_path, monkeypatch):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (pkg / "models.py").write_text("def factory(): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    digest = reuse.workload_digest("mypkg.models:factory")
    assert digest not in (None, reuse.UNKNOWN) and len(digest) == 64
    assert reuse.workload_digest("simple") is None  # kiln's own: its version covers it
    # Code kiln cannot find is never taken as unchanged.
    spec = TrialSpec(workload="nowhere.to_be_found:factory", variant="eager", device="cpu")
    done, why = _saved(tmp_path, spec).reusable(spec)
    assert done is None and "cannot find" in why


@pytest.mark.slow
def test_a_bench_into_a_used_directory_measures_changed_trials_again(tmp_path):
    out = tmp_path / "run"
    first = bench(f"{WL}:tiny_mlp", ["eager"], device="cpu", out=out, spec_overrides=FAST)
    result_file = out / "trials" / first["trials"][0]["id"] / "result.json"
    stamp = os.stat(result_file).st_mtime_ns
    again = bench(f"{WL}:tiny_mlp", ["eager"], device="cpu", out=out, spec_overrides=FAST)
    assert os.stat(result_file).st_mtime_ns == stamp  # the same settings: reused
    assert again["trials"][0]["status"] == "ok"
    other = bench(
        f"{WL}:tiny_mlp", ["eager"], device="cpu", out=out, spec_overrides={**FAST, "reps": 4}
    )
    assert os.stat(result_file).st_mtime_ns != stamp  # measured again
    notes = other["trials"][0]["notes"]
    assert any("not reused" in n and "reps 3 -> 4" in n for n in notes)
