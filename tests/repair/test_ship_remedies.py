"""A pick with remedies for graph breaks, applied and shipped: `TuneResult.apply` and
`torchkiln.load` run its configuration remedies around each call; `kiln ship` builds it on the
tune's rewritten copy and ships the patch production applies to its source."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from repair.helpers import kiln_breaks, project, sha256s
from torchkiln.errors import KilnUserError
from torchkiln.repair.loader import import_file
from torchkiln.repair.plan import build_plan
from torchkiln.repair.remedies import Remedies

HELPER_MODULE = """
import torch


def helper(x):
    return x * 2


class Net(torch.nn.Module):
    def forward(self, x):
        return helper(x)
"""


class _Records(torch.nn.Module):
    """Reads, inside its forward, the Dynamo setting a configuration remedy patches."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def forward(self, x):
        self.seen.append(bool(torch._dynamo.config.capture_scalar_outputs))
        return x + 1


def test_apply_runs_the_configuration_remedies_around_each_call_and_leaves_them_after():
    from torchkiln.tune.recommend import apply

    model = _Records()
    before = torch._dynamo.config.capture_scalar_outputs
    run = apply(model, "eager", "cpu", remedies=Remedies(config=("capture_scalar_outputs",)))
    run(torch.ones(2))
    run(torch.ones(2))
    assert model.seen == [True, True]
    assert torch._dynamo.config.capture_scalar_outputs == before
    plain = _Records()
    apply(plain, "eager", "cpu")(torch.ones(2))
    assert plain.seen == [before]


def test_the_disable_remedy_wraps_the_helper_once_in_the_models_module(tmp_path):
    path = tmp_path / "helper_net.py"
    path.write_text(HELPER_MODULE)
    module = import_file(path)
    model = module.Net()
    remedies = Remedies(config=("disable",), helpers=("helper",))
    assert remedies.prepare(model) == 1
    assert getattr(module.helper, "_torchdynamo_disable", False)
    # Applied again where the same model is loaded: not wrapped twice.
    assert remedies.prepare(model) == 0
    assert Remedies().prepare(model) == 0


def test_remedies_read_from_the_tunes_document():
    doc = {
        "fixes": ["all"],
        "config": {"remedies": ["disable"], "helpers": ["helper"], "lines": []},
        "code": {"patch_file": "fixes.patch", "patch": "diff"},
    }
    r = Remedies.of(doc)
    assert r == Remedies(config=("disable",), helpers=("helper",), patch="fixes.patch")
    assert r and not Remedies.of(None)


def test_tune_result_apply_says_the_source_patch_is_the_users_to_apply(tmp_path):
    from torchkiln.tune.api import TuneResult

    fixes = {"config": {"remedies": []}, "code": {"patch_file": "fixes.patch"}}
    doc = {
        "selection": {"best": "eager+fix=code:all"},
        "device": "cpu",
        "step": "infer",
        "recommendation": {"fixes": fixes},
    }
    with pytest.warns(UserWarning, match="fixes.patch applied: apply that patch"):
        TuneResult(doc, tmp_path).apply(_Records())
    doc["recommendation"]["fixes"] = None
    doc["selection"]["best"] = "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TuneResult(doc, tmp_path).apply(_Records())


def test_a_pick_with_remedies_needs_its_tunes_repair_plan(tmp_path):
    from torchkiln.ship import ship_workload

    with pytest.raises(KilnUserError, match="ships from its tune's run directory"):
        ship_workload("simple", "inductor+fix=code:all", to=tmp_path / "ship", preset="tiny")


def _fixed_run(tmp_path, spec: str):
    """A tune's run directory whose pick is ``spec`` on the zoo's scaled head (an `.item()`
    break), with the plan `kiln tune` writes."""
    proj = project(tmp_path, "scaled_head.py")
    entry = proj / "scaled_head.py"
    torch.manual_seed(0)
    w = import_file(entry).build(preset="tiny")
    run = tmp_path / "run"
    build_plan(f"{entry}:build", kiln_breaks(w.model, w.example_inputs), run / "repair")
    trial = {"variant": spec, "status": "ok", "correctness": {"passed": True}}
    doc = {"workload": f"{entry}:build", "step": "infer", "device": "cpu", "preset": "tiny"}
    doc |= {"selection": {"best": spec}, "trials": [trial]}
    (run / "results.json").write_text(json.dumps(doc))
    return proj, run


@pytest.mark.slow
def test_a_pick_with_a_source_patch_ships_built_on_the_patched_copy(tmp_path):
    """The forward compiles whole ahead of time, which only the rewritten source can (the
    original's `.item()` breaks the graph); production, its source patched, loads it with no
    tracing; production unpatched is told which patch it lacks and compiles cold."""
    import torchkiln
    from torchkiln.runner.protocol.settings import seed_everything
    from torchkiln.ship import ShipFallbackWarning, ship

    proj, run = _fixed_run(tmp_path, "inductor+fix=code:all")
    before = sha256s(proj)
    m = ship(run, package="precompiled")
    assert sha256s(proj) == before
    shipdir = run / "ship"
    assert m["fixes"]["code"]["patch_file"] == "fixes.patch"
    assert (shipdir / "fixes.patch").read_text() == m["fixes"]["code"]["patch"]
    assert "precompiled" in m["artifacts"], m["precompile"]
    probe = m["routes"]["precompiled"]
    assert probe["ok"] and probe["route"] == "precompiled", probe
    assert probe["matches_cold"] and probe["dynamo_frames"] == 0
    assert "fixes.patch" in (shipdir / "pick.py").read_text()

    prod = tmp_path / "prod"
    shutil.copytree(proj, prod)
    p = subprocess.run(
        ["patch", "-p1", "-i", str(shipdir / "fixes.patch")], cwd=prod, capture_output=True
    )
    assert p.returncode == 0, p.stdout
    x = torch.randn(4, 32)
    seed_everything(0)
    patched = import_file(prod / "scaled_head.py").build(preset="tiny").model.eval()
    out = torchkiln.load(shipdir, patched)
    assert out.kiln_route == "precompiled", out.kiln_reason
    with torch.no_grad():
        assert torch.allclose(out(x), patched(x), atol=1e-5)
    assert out.kiln_fallback_calls == 0

    seed_everything(0)
    original = import_file(proj / "scaled_head.py").build(preset="tiny").model.eval()
    with pytest.warns(ShipFallbackWarning, match="apply fixes.patch from the ship directory"):
        cold = torchkiln.load(shipdir, original)
    assert cold.kiln_route == "cold"


@pytest.mark.slow
def test_a_configuration_remedy_is_applied_where_the_ship_loads(tmp_path):
    """`capture_scalar_outputs` keeps the `.item()` in the graph: with it around each call the
    unmodified model compiles whole, ahead of time, and loads with no tracing."""
    import torchkiln
    from torchkiln.runner.protocol.settings import seed_everything
    from torchkiln.ship import ship

    spec = "inductor+fix=config:capture_scalar_outputs"
    proj, run = _fixed_run(tmp_path, spec)
    m = ship(run, package="precompiled")
    assert m["fixes"]["config"]["remedies"] == ["capture_scalar_outputs"]
    assert not (run / "ship" / "fixes.patch").exists()
    assert "precompiled" in m["artifacts"], m["precompile"]
    assert m["routes"]["precompiled"]["dynamo_frames"] == 0, m["routes"]["precompiled"]
    seed_everything(0)
    model = import_file(proj / "scaled_head.py").build(preset="tiny").model.eval()
    out = torchkiln.load(run / "ship", model)
    assert out.kiln_route == "precompiled", out.kiln_reason
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert torch.allclose(out(x), model(x), atol=1e-5)


def test_ship_cli_of_a_remedied_pick_without_its_plan_is_one_line_and_exit_2(tmp_path):
    spec = "inductor+fix=code:all"
    run = tmp_path / "run"
    run.mkdir()
    trial = {"variant": spec, "status": "ok", "correctness": {"passed": True}}
    doc = {"workload": "simple", "step": "infer", "device": "cpu", "preset": "tiny"}
    doc |= {"selection": {"best": spec}, "trials": [trial]}
    (run / "results.json").write_text(json.dumps(doc))
    r = subprocess.run(
        [sys.executable, "-m", "torchkiln.cli", "ship", str(run)], capture_output=True, text=True
    )
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1
    assert "repair/plan.json" in r.stderr
