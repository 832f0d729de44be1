"""bench_repair.py's summaries as pure functions over made-up documents (no trial runs): the
pick against the plain modes the tune measured, and the goals (geometric mean over the best
plain mode, no pick slower)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "bench_repair", ROOT / "benchmarks" / "bench_repair.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _trial(variant: str, median: float, lo: float, hi: float) -> dict:
    return {"variant": variant, "status": "ok", "speedup": {"median": median, "ci95": [lo, hi]}}


def test_the_pick_is_compared_with_the_plain_modes_the_tune_measured():
    br = _load()
    pick = "inductor:mode=reduce-overhead,dynamic=false+bf16+fix=code:all"
    doc = {
        "trials": [
            _trial("eager", 1.0, 0.99, 1.01),
            _trial("inductor:dynamic=false+bf16", 1.5, 1.4, 1.6),
            _trial("inductor:mode=reduce-overhead,dynamic=false+bf16", 2.0, 1.9, 2.1),
            _trial("inductor:dynamic=false+bf16+fix=code:all", 5.0, 4.8, 5.2),
            _trial(pick, 8.0, 7.6, 8.4),
        ]
    }
    got = br.plain_from_tune(doc, pick, ("default", "reduce-overhead", "max-autotune"))
    assert got["best_plain"] == "inductor:mode=reduce-overhead,dynamic=false+bf16"
    assert got["pick_over_best_plain"]["ratio"] == 4.0
    assert got["pick_over_best_plain"]["ci95"] == [7.6 / 2.1, 8.4 / 1.9]
    assert got["not_measured"] == {"max-autotune@bf16": "not measured by the tune"}


def test_an_eager_pick_faces_the_plain_modes_at_every_allowed_precision():
    br = _load()
    doc = {
        "trials": [
            _trial("eager", 1.0, 0.99, 1.01),
            _trial("inductor:dynamic=false+bf16", 0.5, 0.45, 0.55),
            _trial("inductor:mode=reduce-overhead,dynamic=false+bf16", 0.8, 0.75, 0.85),
        ]
    }
    got = br.plain_from_tune(doc, "eager", ("default", "reduce-overhead"), ("bf16",))
    assert got["best_plain"] == "inductor:mode=reduce-overhead,dynamic=false+bf16"
    assert got["pick_over_best_plain"]["ratio"] == 1.0 / 0.8
    assert set(got["not_measured"]) == {"default@fp32", "reduce-overhead@fp32"}


def test_goals_geomean_over_broken_models_and_no_pick_slower():
    br = _load()
    rows = [
        {"model": "a", "breaks": 3, "over_best_plain": {"ratio": 4.0}, "never_slower": True},
        {"model": "b", "breaks": 1, "over_best_plain": {"ratio": 1.0}, "never_slower": True},
        {"model": "clean", "breaks": 0, "over_best_plain": {"ratio": 0.9}, "never_slower": False},
    ]
    goals = br.judge(rows)
    assert goals["geomean_over_best_plain"] == 2.0
    assert goals["goal_geomean_2x"] is True
    assert goals["slower_than_best_plain"] == ["clean"]
    assert goals["goal_never_slower"] is False


def test_reverify_applies_the_picks_patch_to_a_pristine_copy_and_finds_no_break(tmp_path):
    import argparse

    import torch

    from repair.helpers import kiln_breaks, project, sha256s
    from torchkiln.repair import judge
    from torchkiln.repair.loader import import_file
    from torchkiln.repair.plan import build_plan

    br = _load()
    proj = project(tmp_path, "smooth_net.py", "_smoothing.py")
    before = sha256s(proj)
    torch.manual_seed(0)
    w = import_file(proj / "smooth_net.py").build(preset="tiny")
    plan = build_plan(f"{proj / 'smooth_net.py'}:build", kiln_breaks(w.model, w.example_inputs),
                      tmp_path / "repair")  # fmt: skip
    out = tmp_path / "run"
    out.mkdir()
    fixes = judge.shipped(plan, "inductor+fix=code:all", out)
    doc = {"recommendation": {"fixes": fixes}, "stages": {"repair": {"plan": plan["path"]}}}
    got = br.reverify(doc, argparse.Namespace(preset="tiny", device="cpu"), out)
    assert got["applied"] is True, got
    assert got["claims_zero"] is True
    assert got["breaks_after_patch"] == 0 and got["verified"] is True
    assert sha256s(proj) == before


def test_resume_keeps_the_models_measured_and_runs_only_the_others(tmp_path, monkeypatch):
    import json

    br = _load()
    ran: list[str] = []

    def fake_run(args, model, out):
        ran.append(model)
        return {"model": model, "pick": "inductor+bf16", "breaks": 2, "environment": {"gpu": "x"}}

    monkeypatch.setattr(br, "run_model", fake_run)
    kept = {"model": "zoo-encoder", "pick": "inductor+bf16+fix=code:all", "breaks": 3}
    failed = {"model": "zoo-gated-mlp", "pick": None, "breaks": None}
    (tmp_path / "bench_repair.json").write_text(
        json.dumps({"rows": [kept, failed], "command": "first", "environment": {"gpu": "x"}})
    )
    models = "zoo-encoder,zoo-gated-mlp,zoo-checked-mlp"
    assert br.main(["--out", str(tmp_path), "--models", models, "--resume"]) == 0
    assert ran == ["zoo-gated-mlp", "zoo-checked-mlp"]  # the row with no pick is run again
    doc = json.loads((tmp_path / "bench_repair.json").read_text())
    assert [r["model"] for r in doc["rows"]] == ["zoo-encoder", "zoo-gated-mlp", "zoo-checked-mlp"]
    assert doc["commands"][0] == "first" and len(doc["commands"]) == 2


def test_parts_get_the_options_less_the_ones_the_parent_splits():
    br = _load()
    argv = ["--out", "o", "--models=a,b", "--jobs", "4", "--budget", "3m", "--resume", "--paired"]
    kept = br.argv_without(argv, {"--models", "--jobs", "--part"})
    assert kept == ["--out", "o", "--budget", "3m", "--resume", "--paired"]
