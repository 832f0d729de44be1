"""`kiln tune --variants`: a given plan replaces the search's. Exactly the given candidates are
measured (canonical, in order, eager and repeats dropped), with no profile or explain stage
and no refinements, one trial in flight or several. The trials are fakes."""

from __future__ import annotations

import pytest

from tests_helpers import _trial
from torchkiln.errors import KilnUserError
from torchkiln.tune import evidence, pipeline

GIVEN = ["eager", "eager+bf16", "inductor", "inductor:mode=max-autotune-no-cudagraphs", "inductor"]


def _tune(tmp_path, monkeypatch, gpus: list, variants: list[str], specs=None) -> dict:
    def fake_run_trial(spec, trial_dir, **_):
        if specs is not None:
            specs.append(spec)
        speedup = 1.0 if spec.variant == "eager" else 1.5 + 0.1 * spec.index
        result = _trial(spec.variant, 10.0 / speedup, speedup, 0.0 if spec.index == 0 else 2.0)
        result.update(id=spec.id, baseline=spec.baseline, process_wall_s=0.5)
        return result

    def never(*_a, **_k):
        raise AssertionError("the diagnosis ran for a given plan")

    monkeypatch.setattr(pipeline, "run_trial", fake_run_trial)
    monkeypatch.setattr(pipeline, "visible_gpus", lambda device: gpus)
    monkeypatch.setattr(pipeline, "preflight", lambda *a, **k: {"ok": True})
    for name in ("profile_verdict", "graph_breaks", "repair_plan"):
        monkeypatch.setattr(evidence, name, never)
    monkeypatch.setenv("KILN_WARM_START", "0")
    return pipeline.tune(
        "simple", device="cpu", preset="tiny", budget_s=600, out=tmp_path / str(len(gpus)),
        history=False, variants=variants,
    )  # fmt: skip


@pytest.mark.parametrize("gpus", [[None], [0, 1, 2]], ids=["one-in-flight", "three-in-flight"])
def test_a_given_plan_is_measured_as_given(tmp_path, monkeypatch, gpus):
    doc = _tune(tmp_path, monkeypatch, gpus, GIVEN)
    search = doc["stages"]["search"]
    expected = ["eager+bf16", "inductor", "inductor:mode=max-autotune-no-cudagraphs"]
    assert search["planned"] == expected and search["given"] is True
    assert [t["variant"] for t in doc["trials"]] == ["eager", *expected]
    assert search["refined"] == [] and search["skipped"] == {}
    assert "before_diagnosis" not in search
    for key in ("profile", "graph_breaks", "repair"):
        assert doc["stages"][key]["status"] == "skipped"
        assert "variants=" in doc["stages"][key]["reason"]
    assert doc["selection"]["best"] in expected


def test_the_baseline_pays_the_fixed_costs_of_the_given_precisions(tmp_path, monkeypatch):
    from torchkiln.runner.protocol.trial import PREPAY

    specs = []
    _tune(tmp_path, monkeypatch, [None], GIVEN, specs)
    assert specs[0].variant == "eager" and specs[0].extra[PREPAY] == [["bf16", False]]
    assert all(PREPAY not in s.extra for s in specs[1:])


def test_a_bad_or_empty_given_plan_stops_before_anything_runs(tmp_path):
    with pytest.raises(KilnUserError, match="unknown backend"):
        pipeline.tune("simple", device="cpu", out=tmp_path / "bad", variants=["nosuch"])
    with pytest.raises(KilnUserError, match="no candidate besides eager"):
        pipeline.tune("simple", device="cpu", out=tmp_path / "empty", variants=["eager"])
    assert not (tmp_path / "bad").exists() and not (tmp_path / "empty").exists()


def test_the_command_passes_its_variants_split_into_specs(monkeypatch, tmp_path):
    from torchkiln import cli

    seen = {}

    def fake_tune(workload, **kwargs):
        seen.update(kwargs)
        raise KilnUserError("stop here")

    monkeypatch.setattr(pipeline, "tune", fake_tune)
    text = "eager+bf16,inductor:mode=max-autotune,dynamic=false+bf16"
    code = cli.main(["tune", "simple", "--device", "cpu", "--out", str(tmp_path / "o"),
                     "--variants", text])  # fmt: skip
    assert code == 2
    assert seen["variants"] == ["eager+bf16", "inductor:mode=max-autotune,dynamic=false+bf16"]
