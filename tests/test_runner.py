"""Isolated trials: crashes, hangs and errors become statuses; accuracy failures are caught;
results are written as they finish and resumed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from torchkiln.api import bench, run_trials
from torchkiln.runner.protocol.trial import TrialSpec, base_result

FIX = Path(__file__).parent / "fixtures"
WL = FIX / "workloads.py"
# Small reps keep each eager trial to a few seconds on 2 cores; the numbers are not the point.
FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 1}


@pytest.mark.slow
def test_abort_hang_and_raise_are_reported_while_the_others_finish(tmp_path):
    specs = [
        TrialSpec(workload=f"{WL}:aborts", variant="eager", index=0, **FAST),
        TrialSpec(workload=f"{WL}:hangs", variant="eager", index=1, **FAST),
        TrialSpec(workload=f"{WL}:raises", variant="eager", index=2, **FAST),
        TrialSpec(workload=f"{WL}:tiny_mlp", variant="eager", index=3, **FAST),
    ]
    results = run_trials(specs, tmp_path, timeout_s=25)
    by_wl = {r["workload"].split(":")[-1]: r for r in results}
    assert by_wl["aborts"]["status"] == "crashed"
    assert "SIGABRT" in by_wl["aborts"]["reason"]
    assert by_wl["hangs"]["status"] == "timeout"
    assert "no result after 25 s" in by_wl["hangs"]["reason"]
    # The hang printed two autotune rounds first: the reason says what the time went on.
    assert (
        "benchmarked 2 sets of kernel choices for 43 s (the longest 30 s)"
        in (by_wl["hangs"]["reason"])
    )
    assert by_wl["hangs"]["autotune"] == {"rounds": 2, "benchmark_s": 42.75, "longest_s": 30.25}
    assert by_wl["raises"]["status"] == "runtime_error"
    assert "planted failure in forward" in by_wl["raises"]["reason"]
    assert by_wl["tiny_mlp"]["status"] == "ok"
    assert by_wl["tiny_mlp"]["steady_ms"]["median"] > 0
    # A finished trial leaves no partial result behind; the hung one had none to leave.
    assert not list(tmp_path.glob("trials/*/trial-partial.json"))
    # Each result is on disk as soon as its trial ended.
    for spec in specs:
        saved = json.loads((tmp_path / "trials" / spec.id / "result.json").read_text())
        assert saved["status"] == by_wl[spec.workload.split(":")[-1]]["status"]


@pytest.mark.slow
def test_a_trial_stopped_in_its_correctness_check_keeps_its_step_times(tmp_path):
    spec = TrialSpec(workload=f"{WL}:hangs_in_check", variant="eager", index=0, **FAST)
    (r,) = run_trials([spec], tmp_path, timeout_s=20)
    assert r["status"] == "timeout"
    assert "during correctness" in r["reason"]
    assert r["measured_before_failure"] is True
    assert r["correctness"] is None
    assert r["steady_ms"]["median"] > 0 and r["speedup"]["median"] > 0
    assert any("correctness was not checked" in n for n in r["notes"])
    # Shown in the report's table with its times, never as checked.
    from torchkiln.report.table import rows

    (row,) = rows({"trials": [r]})
    assert row[1] == "timeout" and row[2] != "" and row[-1] == "not checked (stopped before)"


@pytest.mark.slow
def test_frozen_weights_run_for_inference_and_are_refused_for_training(tmp_path):
    kw = {"device": "cpu", "preset": "tiny", "timeout_s": 300, "spec_overrides": FAST}
    doc = bench("simple", ["inductor:freezing=true"], out=tmp_path / "infer", **kw)
    (t,) = doc["trials"]
    assert t["status"] == "ok", t.get("reason")
    assert t["correctness"]["passed"]
    doc = bench("simple", ["inductor:freezing=true"], step="train", out=tmp_path / "train", **kw)
    (t,) = doc["trials"]
    assert t["status"] == "unsupported"
    assert "freezing=true applies to inference only" in t["reason"]


@pytest.mark.slow
def test_a_variant_that_perturbs_outputs_is_an_accuracy_fail(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_PLUGINS", str(FIX / "perturb_plugin.py"))
    import torchkiln.variants.base as vb

    vb._plugins_loaded = False  # let this process see the plugin too (the CLI parses specs)
    doc = bench(
        "simple",
        ["perturb", "eager"],
        device="cpu",
        preset="tiny",
        out=tmp_path / "run",
        timeout_s=120,
        spec_overrides=FAST,
    )
    status = {t["variant"]: t for t in doc["trials"]}
    assert status["perturb"]["status"] == "accuracy_fail"
    assert status["perturb"]["correctness"]["worst_error_over_threshold"] > 1
    assert status["eager"]["status"] == "ok"
    assert status["eager"]["correctness"]["passed"]


@pytest.mark.slow
def test_train_step_correctness_checks_loss_and_updates(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_PLUGINS", str(FIX / "perturb_plugin.py"))
    import torchkiln.variants.base as vb

    vb._plugins_loaded = False
    doc = bench(
        "simple",
        ["eager+bf16", "perturb"],
        step="train",
        device="cpu",
        preset="tiny",
        out=tmp_path / "run",
        timeout_s=120,
        spec_overrides=FAST,
    )
    ok, bad = doc["trials"]
    names = [c["name"] for c in ok["correctness"]["checks"]]
    assert names[0] == "loss" and any(n.startswith("update.features.0") for n in names)
    assert ok["status"] == "ok" and ok["changes_numerics"] is True
    assert bad["status"] == "accuracy_fail"


@pytest.mark.slow
def test_resume_skips_finished_trials(tmp_path):
    out = tmp_path / "run"
    first = bench(f"{WL}:tiny_mlp", ["eager"], device="cpu", out=out, spec_overrides=FAST)
    result_file = out / "trials" / first["trials"][0]["id"] / "result.json"
    stamp = os.stat(result_file).st_mtime_ns
    second = bench(
        f"{WL}:tiny_mlp",
        ["eager", "eager+bf16"],
        device="cpu",
        resume=out,
        spec_overrides=FAST,
    )
    assert os.stat(result_file).st_mtime_ns == stamp  # not re-run
    assert [t["status"] for t in second["trials"]] == ["ok", "ok"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [t["status"] for t in manifest["trials"]] == ["ok", "ok"]


def _measure_recording_builds(monkeypatch, **spec_fields):
    """An eager+bf16 trial of the tiny MLP measured in-process, recording every arm it builds:
    (the built specs in order, the result)."""
    import torchkiln.runner.protocol.measure_trial as mt
    from torchkiln.runner.protocol.worker import Phases

    built = []
    real_build = mt.build_arm

    def recording_build(spec, variant, **kw):
        built.append(variant.spec)
        return real_build(spec, variant, **kw)

    monkeypatch.setattr(mt, "build_arm", recording_build)
    spec = TrialSpec(
        workload=f"{WL}:tiny_mlp",
        variant="eager+bf16",
        device="cpu",
        check_accuracy=False,
        count_kernels=False,
        **{**FAST, "reps": 4, **spec_fields},
    )
    result = base_result(spec)
    mt.measure_trial(spec, result, Phases(None))
    return built, result


def test_an_eager_baseline_is_two_instances_built_around_the_variant(monkeypatch):
    """Build order moves host-bound eager steps by ~1% (measure_trial.baseline_instances), so an
    eager baseline is built once before the variant and once after, and its per-rep time is the
    two instances' mean. Checked in-process, recording every build."""
    built, result = _measure_recording_builds(monkeypatch)
    assert result["status"] == "ok"
    assert built[:3] == ["eager", "eager+bf16", "eager"]
    inst = result["baseline_instances"]
    assert inst["built"] == ["before the variant", "after the variant"]
    before, after = inst["samples_ms"]
    assert len(before) == len(after) == 4
    # The baseline of each rep is the mean of the two instances' times in that rep.
    expected = [(b + a) / 2 for b, a in zip(before, after, strict=True)]
    assert result["baseline_ms"]["samples"] == pytest.approx(expected, rel=1e-12)
    ratios = [b / a for b, a in zip(before, after, strict=True)]
    assert inst["after_over_before"]["ratios"] == pytest.approx(ratios, rel=1e-12)


def test_only_an_eager_baseline_is_bracketed():
    from torchkiln.runner.protocol.measure_trial import bracketed
    from torchkiln.variants import parse_variant

    spec = TrialSpec(workload="simple", variant="inductor")
    assert bracketed(spec, parse_variant("eager+bf16"))
    assert not bracketed(spec, parse_variant("inductor:mode=reduce-overhead"))
    spec.bracket = False
    assert not bracketed(spec, parse_variant("eager"))


def test_replicas_build_k_instances_of_each_arm_in_balanced_order(monkeypatch):
    """With replicas=k every arm is k instances, built B V V B ..., all timed in each rep; the
    speedup is the geometric mean of the k pairs' ratios with a t interval over them."""
    import math

    from torchkiln.runner.protocol.replicas import t975

    built, result = _measure_recording_builds(monkeypatch, replicas=3)
    assert result["status"] == "ok"
    # (then the FLOP count builds its own)
    assert built[:6] == ["eager", "eager+bf16", "eager+bf16", "eager", "eager", "eager+bf16"]
    rep = result["replicas"]
    assert rep["k"] == 3 and rep["build_order"] == ["B", "V", "V", "B", "B", "V"]
    sp = result["speedup"]
    assert sp["n"] == 3 and sp["ratios"] == pytest.approx(rep["pair_ratios"])
    logs = [math.log(r) for r in rep["pair_ratios"]]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    assert sp["median"] == pytest.approx(math.exp(mean))
    lo, hi = sp["ci95"]
    assert lo == pytest.approx(math.exp(mean - t975(2) * sd / math.sqrt(3)))
    assert hi == pytest.approx(math.exp(mean + t975(2) * sd / math.sqrt(3)))
    assert "baseline_instances" not in result  # replication replaces the bracket


def test_replicated_speedup_interval_covers_instance_variation():
    from torchkiln.runner.protocol.replicas import build_order, replicated_speedup, t975

    # Three pairs whose instances differ by 2%, 0% and -2%: each pair's own reps agree
    # perfectly, so only the pairs' spread can widen the interval.
    base = [[10.2] * 5, [10.0] * 5, [9.8] * 5]
    var = [[10.0] * 5] * 3
    sp = replicated_speedup(base, var)
    assert sp.ci95[0] < 1.0 < sp.ci95[1] and not sp.significant
    assert sp.ci95[1] - sp.ci95[0] > 0.04  # wider than the pairs' spread: t with 2 df
    assert build_order(4) == ["B", "V", "V", "B", "B", "V", "V", "B"]
    assert t975(1) == 12.706 and t975(11) == 2.228 and t975(50) == 1.96
    with pytest.raises(ValueError):
        t975(0)


def test_baseline_instances_warm_up_by_steps_and_the_variant_by_steps_and_time(monkeypatch):
    """The time floor of a warm-up (for the device's clocks) is the variant's alone: each
    baseline instance runs exactly `warmup_steps` steps, however short a step is."""
    _, result = _measure_recording_builds(monkeypatch, warmup_s=0.2, warmup_steps=3)
    assert result["status"] == "ok"
    assert [w["steps"] for w in result["baseline_warmup"]] == [3, 3]
    assert result["warmup"]["seconds"] >= 0.2 and result["warmup"]["steps"] >= 3
