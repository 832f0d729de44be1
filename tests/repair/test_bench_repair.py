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


def test_plain_only_times_what_the_tune_did_not_measure_and_recovers_a_stopped_runs_parts(
    tmp_path, monkeypatch
):
    # --plain-only: the tune measured default and reduce-overhead at bf16; the autotuned two
    # are timed against the pick and merged with them (each row saying where it came from);
    # a stopped run's finished part is taken as it is and its model not measured again
    import json

    br = _load()
    pick = "inductor:mode=reduce-overhead,dynamic=false+bf16+fix=code:all"
    tune_doc = {
        "trials": [
            _trial(pick, 6.0, 5.8, 6.2),
            _trial("inductor:dynamic=false+bf16", 2.0, 1.9, 2.1),
            _trial("inductor:mode=reduce-overhead,dynamic=false+bf16", 3.0, 2.9, 3.1),
        ]
    }
    for model in ("zoo-encoder", "zoo-gated-mlp"):
        (tmp_path / model).mkdir()
        (tmp_path / model / "results.json").write_text(json.dumps(tune_doc))
    asked: list[tuple[str, list[str]]] = []

    def fake_paired(args, model, pick_, plan, out, variants=None):
        asked.append((model, variants))
        return {"pick_over_plain": {v: {"ratio": 1.5, "ci95": [1.4, 1.6]} for v in variants},
                "not_measured": {}, "best_plain": variants[0]}  # fmt: skip

    monkeypatch.setattr(br, "plain_against_pick", fake_paired)
    monkeypatch.setattr(br, "rebuild_plan", lambda *a: "plan.json")
    rows = [{"model": m, "pick": pick, "breaks": 1} for m in ("zoo-encoder", "zoo-gated-mlp")]
    (tmp_path / "bench_repair.json").write_text(json.dumps({"rows": rows, "command": "tune"}))
    finished = {**rows[1], "plain": {}, "over_best_plain": {"ratio": 9.0}, "never_slower": True}
    (tmp_path / "bench_repair.part-0.json").write_text(
        json.dumps({"rows": [finished], "command": "stopped part"})
    )
    modes = "default,reduce-overhead,max-autotune-no-cudagraphs,max-autotune"
    assert br.main(["--out", str(tmp_path), "--plain-only", "--plain-modes", modes]) == 0
    autotuned = ["inductor:mode=max-autotune-no-cudagraphs+bf16", "inductor:mode=max-autotune+bf16"]
    assert asked == [("zoo-encoder", autotuned)]
    doc = json.loads((tmp_path / "bench_repair.json").read_text())
    enc, gated = doc["rows"]
    plain = enc["plain"]["pick_over_plain"]
    assert plain["inductor:dynamic=false+bf16"]["from"] == "the tune's own trials"
    assert plain["inductor:mode=max-autotune+bf16"]["from"] == "paired against the pick"
    assert enc["over_best_plain"]["ratio"] == 1.5  # below the tune's 3.0 and 2.0
    assert enc["plain"]["not_measured"] == {}
    assert gated["over_best_plain"]["ratio"] == 9.0  # the stopped part's row, as it was
    assert doc["commands"] == ["tune", "stopped part", doc["commands"][-1]]
    assert not list(tmp_path.glob("bench_repair.part-*.json"))


def test_an_eager_pick_is_timed_against_the_plain_modes_at_every_allowed_precision():
    import argparse

    br = _load()
    args = argparse.Namespace(allow_precision="bf16")
    got = br.plain_variants(args, "eager", ("default", "max-autotune"))
    assert got == ["inductor", "inductor:mode=max-autotune", "inductor+bf16",
                   "inductor:mode=max-autotune+bf16"]  # fmt: skip
    assert br.plain_variants(args, "inductor+bf16", ("default", "max-autotune")) == [
        "inductor:mode=max-autotune+bf16"
    ]
