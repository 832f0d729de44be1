"""A remedy is measured as a trial of its own: its arm is built from the rewritten copy with
the unmodified model's weights and judged against the unmodified model's fp64 reference; the
breaks after it come from Dynamo's counters; a remedy that changes the output fails the check
and is never picked, one that removes no break is marked so."""

from __future__ import annotations

import pytest

from repair.helpers import kiln_breaks, project
from torchkiln.api import run_trials
from torchkiln.repair import judge
from torchkiln.repair.arm import PLAN_KEY
from torchkiln.repair.loader import import_file
from torchkiln.repair.plan import build_plan
from torchkiln.runner.protocol.trial import TrialSpec
from torchkiln.tune.select import select

FAST = {"reps": 3, "rep_ms": 5.0, "warmup_s": 0.0, "warmup_steps": 1, "count_kernels": False}


def _plan(tmp_path):
    import torch

    proj = project(tmp_path, "scaled_head.py")
    torch.manual_seed(0)
    w = import_file(proj / "scaled_head.py").build(preset="tiny")
    spec = f"{proj / 'scaled_head.py'}:build"
    return spec, build_plan(spec, kiln_breaks(w.model, w.example_inputs), tmp_path / "run")


@pytest.mark.slow
def test_a_rewrite_trial_is_correct_and_has_no_break_and_a_wrong_one_is_never_picked(tmp_path):
    spec, plan = _plan(tmp_path)
    assert plan["fixes"][0] == "code:all"
    copy = tmp_path / "run" / "code-all" / "scaled_head.py"
    # A second plan whose copy computes something else: its trial must fail the check.
    bad_dir = tmp_path / "bad"
    bad = build_plan(spec, plan["breaks"], bad_dir)
    bad_copy = bad_dir / "code-all" / "scaled_head.py"
    bad_copy.write_text(copy.read_text().replace("* self.logit_scale", "* 1.5 * self.logit_scale"))
    common = {"workload": spec, "preset": "tiny", **FAST}
    specs = [
        TrialSpec(variant="eager", index=0, **common),
        TrialSpec(
            variant="inductor:dynamic=false+fix=code:all",
            index=1,
            extra={PLAN_KEY: plan["path"]},
            **common,
        ),
        TrialSpec(
            variant="inductor:dynamic=false+fix=code:all",
            index=2,
            extra={PLAN_KEY: bad["path"]},
            **common,
        ),
    ]
    eager, good, wrong = run_trials(specs, tmp_path / "trials", timeout_s=300)
    assert good["status"] == "ok", good["reason"]
    assert good["correctness"]["passed"]
    assert good["dynamo"]["graph_breaks"] == 0 and good["dynamo"]["graphs"] == 1
    judge.mark(good, [eager, good], explain_breaks=len(plan["breaks"]))
    assert good["status"] == "ok"
    assert good["repair"]["graph_breaks_after"] == 0
    assert wrong["status"] == "accuracy_fail"
    sel = select([eager, good, wrong], baseline=eager, allow_precision=set())
    assert wrong["variant"] in sel.rejected or sel.best is not wrong


def test_a_remedy_that_leaves_as_many_pieces_is_marked_no_effect():
    plain = {"variant": "inductor", "status": "ok", "dynamo": {"graph_breaks": 2, "graphs": 3}}
    same = {
        "variant": "inductor+fix=config:capture_scalar_outputs",
        "status": "ok",
        "dynamo": {"graph_breaks": 2, "graphs": 3},
    }
    fewer = {
        "variant": "inductor+fix=code:all",
        "status": "ok",
        "dynamo": {"graph_breaks": 0, "graphs": 1},
    }
    for r in (same, fewer):
        judge.mark(r, [plain, same, fewer], explain_breaks=2)
    assert same["status"] == judge.NO_EFFECT
    assert "removes no graph break" in same["reason"]
    assert fewer["status"] == "ok"
    # A frame Dynamo gave up on (no graph) is worse than any split: one graph is an effect.
    eager_fallback = {
        "variant": "inductor",
        "status": "ok",
        "dynamo": {"graph_breaks": 0, "graphs": 0},
    }
    whole = {
        "variant": "inductor+fix=code:all",
        "status": "ok",
        "dynamo": {"graph_breaks": 0, "graphs": 1},
    }
    judge.mark(whole, [eager_fallback, whole], explain_breaks=4)
    assert whole["status"] == "ok"
