"""A trial's compile cache: empty when the trial (re)starts, at a path every compiler takes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchkiln.cli import main
from torchkiln.runner.launch import compile_cache
from torchkiln.runner.launch.trial_process import run_trial
from torchkiln.runner.protocol.trial import TrialSpec

WL = Path(__file__).parent / "fixtures" / "workloads.py"
FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 1}


def test_a_fresh_cache_is_emptied_of_what_an_interrupted_trial_left(tmp_path):
    left = tmp_path / "compile-cache" / "inductor" / "fxgraph"
    left.mkdir(parents=True)
    (left / "entry").write_text("compiled by a killed trial")
    cache = compile_cache.prepare(tmp_path, None)
    assert cache.fresh and list(cache.real.iterdir()) == []
    cache.remove()
    assert not cache.real.exists()


def test_a_shared_cache_is_kept(tmp_path):
    shared = tmp_path / "shared"
    (shared / "inductor").mkdir(parents=True)
    cache = compile_cache.prepare(tmp_path / "t", str(shared))
    cache.remove()
    assert not cache.fresh and (shared / "inductor").is_dir()


def test_a_path_with_spaces_unicode_and_colons_is_reached_through_a_plain_link(tmp_path):
    trial = tmp_path / "x y:ü" / "trials" / "00-eager"
    cache = compile_cache.prepare(trial, None)
    assert compile_cache.is_plain(cache.given) and cache.given != cache.real
    assert cache.given.resolve() == cache.real
    cache.remove()
    assert not cache.given.exists() and not cache.real.exists()


@pytest.mark.slow
def test_a_trial_measured_again_starts_from_an_empty_cache(tmp_path):
    spec = TrialSpec(workload=f"{WL}:needs_empty_cache", variant="eager", **FAST)
    trial_dir = tmp_path / "trials" / spec.id
    # What a killed run leaves: a compile cache with content and no result.
    (trial_dir / "compile-cache" / "inductor").mkdir(parents=True)
    (trial_dir / "compile-cache" / "inductor" / "leftover").write_text("x")
    result = run_trial(spec, trial_dir, timeout_s=120)
    assert result["status"] == "ok", result.get("reason")
    assert not (trial_dir / "compile-cache").exists()


@pytest.mark.slow
def test_an_inductor_trial_compiles_under_an_out_dir_with_spaces_unicode_and_colons(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    out = "runs/x y:ü"
    code = main(
        ["bench", f"{WL}:tiny_mlp", "--variants", "inductor", "--device", "cpu",
         "--out", out, "--reps", "3", "--rep-ms", "5", "--no-check"]
    )  # fmt: skip
    assert code == 0
    doc = json.loads((tmp_path / out / "bench.json").read_text())
    (trial,) = doc["trials"]
    assert trial["status"] == "ok", trial.get("reason")
    assert trial["compile_cache_path"]["real"].endswith("compile-cache")


@pytest.mark.slow
def test_a_kept_cache_lent_to_a_later_trial_is_loaded_not_compiled_and_said(tmp_path):
    spec = TrialSpec(workload=f"{WL}:tiny_mlp", variant="inductor", check_accuracy=False,
                     count_kernels=False, **FAST)  # fmt: skip
    first_dir = tmp_path / "trials" / "01-inductor"
    first = run_trial(spec, first_dir, timeout_s=300, keep_cache=True)
    assert first["status"] == "ok", first.get("reason")
    assert first["dynamo"]["cache_hits"]["fx_graph"] == 0  # a cold compile
    assert compile_cache.kept(first_dir).is_dir()
    later_dir = tmp_path / "trials" / "100-inductor"
    lend = {"01-inductor": compile_cache.kept(first_dir), "02-gone": tmp_path / "no-such"}
    later = run_trial(spec, later_dir, timeout_s=300, lend_caches=lend)
    assert later["status"] == "ok", later.get("reason")
    assert later["compile_cache_lent"]["lent_from"] == ["01-inductor"]
    assert later["compile_cache_lent"]["bytes"] > 0
    assert later["dynamo"]["cache_hits"]["fx_graph"] >= 1  # loaded, not compiled
    assert any("no cold compile" in n for n in later["notes"])
    # Not kept: its own cache went with it; the lender's stays until its owner drops it.
    assert not compile_cache.kept(later_dir).exists()
    compile_cache.drop([first_dir, later_dir])
    assert not compile_cache.kept(first_dir).exists()
