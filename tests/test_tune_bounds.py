"""Candidates the device's peak rules out: a floor (the workload's FLOPs at the peak for the
candidate's precision) over 1.2x the fastest correct step measured is never run, and says why;
without FLOPs, a known device or a correct step to beat, nothing is ruled out."""

from __future__ import annotations

from tests_helpers import _trial, fake_tune_trials
from torchkiln.tune import pipeline
from torchkiln.tune.bounds import ruled_out

H200 = {"gpu": {"name": "NVIDIA H200"}}
GPT2_FLOPS = 1_089_283_817_472  # GPT-2 small, 8 x 512, one inference step


def _eager(flops=GPT2_FLOPS, env=H200):
    e = _trial("eager", 28.1, 1.0, 1.0)
    e.update(flops_per_step=flops, environment=env)
    return e


def test_fp32_cannot_beat_a_bf16_step_far_under_its_floor():
    eager = _eager()
    lead = _trial("inductor:mode=reduce-overhead+bf16", 2.92, 9.6, 15.0)
    results = [eager, lead]
    why = ruled_out("inductor:mode=max-autotune", results, eager, {"bf16"})
    assert why is not None and why.startswith("cannot win: at fp32")
    # 28.1 ms / 9.6 on the eager trial's clock: 2.93 ms.
    assert "16.28 ms" in why and "66.9 TFLOP/s" in why and "2.93 ms" in why
    # At bf16 the floor (1.1 ms) is under the step measured: it may win.
    assert ruled_out("inductor:mode=max-autotune+bf16", results, eager, {"bf16"}) is None
    # Within 1.2x of the floor: no proof (16.28 ms over 28.1 / 2.0 = 14.05 ms is 1.16x).
    slow = _trial("inductor+bf16", 14.0, 2.0, 15.0)
    assert ruled_out("inductor", [eager, slow], eager, {"bf16"}) is None
    # 1.45x: ruled out.
    assert ruled_out("inductor", [eager, _trial("inductor+bf16", 11.0, 2.5, 15.0)], eager, {"bf16"})


def test_resnet50_training_fp32_is_ruled_out_by_either_measured_mark():
    """The two marks two resnet50 training tunes on one H100 measured (7.67 and 8.20 ms for the
    fastest bf16 step) both rule the fp32 candidates out: 778 GFLOP at 66.9 TFLOP/s is 11.62 ms."""
    eager = _eager(flops=777_570_484_224, env={"gpu": {"name": "NVIDIA H100 80GB HBM3"}})
    eager["steady_ms"]["median"] = 44.29
    for step_ms in (7.67, 8.20):
        lead = _trial("inductor:mode=reduce-overhead+bf16", step_ms, 44.29 / step_ms, 60.0)
        why = ruled_out("inductor:mode=max-autotune", [eager, lead], eager, {"bf16"})
        assert why is not None and "11.62 ms" in why and f"{step_ms:.2f} ms" in why
        assert "over 1.2x" in why


def test_nothing_is_ruled_out_without_flops_a_known_device_or_a_correct_step():
    lead = _trial("inductor+bf16", 2.9, 9.6, 15.0)
    assert ruled_out("inductor", [_eager(flops=None), lead], _eager(flops=None), {"bf16"}) is None
    cpu = _eager(env={"gpu": None})
    assert ruled_out("inductor", [cpu, lead], cpu, {"bf16"}) is None
    eager = _eager()
    wrong = _trial("inductor+bf16", 2.9, 9.6, 15.0)
    wrong["correctness"] = {"passed": False, "worst_error_over_threshold": 3.0}
    # The only fast step failed its check, and eager's own 28.1 ms is over the fp32 floor.
    assert ruled_out("inductor", [eager, wrong], eager, {"bf16"}) is None
    # bf16 not allowed: a bf16 step is no mark.
    lead.update(changes_numerics=True, settings={"precision": {"variant": "bf16"}})
    assert ruled_out("inductor", [eager, lead], eager, set()) is None
    assert ruled_out("inductor", [eager, lead], eager, {"bf16"}) is not None


def test_the_search_rules_out_what_cannot_win_and_runs_the_rest(tmp_path, monkeypatch):
    ran = []

    def fake_run_trial(spec, trial_dir, **_):
        ran.append(spec.variant)
        bf16 = spec.variant.endswith("+bf16")
        ms = 28.1 if spec.variant == "eager" else (3.0 if bf16 else 25.0)
        r = _trial(spec.variant, ms, 28.1 / ms, 0.0 if spec.index == 0 else 2.0)
        r.update(id=spec.id, baseline=spec.baseline, process_wall_s=0.5,
                 flops_per_step=GPT2_FLOPS, environment=H200)  # fmt: skip
        return r

    fake_tune_trials(monkeypatch, fake_run_trial)
    doc = pipeline.tune("simple", device="cpu", preset="tiny", budget_s=600, out=tmp_path / "t",
                        history=False, allow_precision=("bf16",))  # fmt: skip
    search = doc["stages"]["search"]
    out = search["ruled_out"]
    # Every fp32 compiled candidate planned after the first bf16 result is ruled out, none ran.
    assert out and all(not s.endswith("+bf16") for s in out)
    assert all(why.startswith("cannot win: at fp32") for why in out.values())
    assert not set(out) & set(ran) and not set(out) & set(search["skipped"])
    assert any(v.endswith("+bf16") for v in ran)


def test_the_report_names_what_was_ruled_out_and_why():
    from tests_helpers import synthetic_tune_doc
    from torchkiln.report.evidence import evidence_lines

    doc = synthetic_tune_doc()
    why = "cannot win: at fp32 a step needs at least 16.28 ms (...), over 1.5x the 2.93 ms of x"
    doc["stages"]["search"]["ruled_out"] = {"inductor:mode=max-autotune": why}
    texts = [line.text for line in evidence_lines(doc)]
    assert f"Ruled out `inductor:mode=max-autotune`, never run: {why}" in texts
